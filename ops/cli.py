"""`tpuctl`: one CLI; each verb lives in its own module and registers itself here."""

from __future__ import annotations

import importlib
import warnings

import typer

# google-api-core warns on every import about Python 3.11's end of life (2027).
warnings.filterwarnings("ignore", message="You are using a Python version",
                        category=FutureWarning)

app = typer.Typer(
    name="tpuctl",
    help="Plan, check and operate tpu-stack TPU capacity.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

@app.callback()
def _root() -> None:
    """Plan, check and operate tpu-stack TPU capacity."""


# Each module defines `register(app: typer.Typer) -> None`.
_VERB_MODULES = ("ops.plan.command", "ops.local.rehearse", "ops.tpu.commands")


def _register_verbs() -> None:
    for name in _VERB_MODULES:
        importlib.import_module(name).register(app)


_register_verbs()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
