"""`tpuctl`: one CLI; each verb lives in its own module and registers itself here."""

from __future__ import annotations

import importlib
import warnings

import typer

from ops.terminal import PROG

# google-api-core warns on every import about Python 3.11's end of life (2027).
warnings.filterwarnings("ignore", message="You are using a Python version",
                        category=FutureWarning)

app = typer.Typer(
    name=PROG,
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
    # click takes the usage line's program name from argv[0] ("python -m ops.cli")
    # unless told (typer/_click/core.py, Command.main(prog_name=...)).
    app(prog_name=PROG)


if __name__ == "__main__":
    main()
