"""`tpuctl`: one CLI; each verb lives in its own module and registers itself here."""

from __future__ import annotations

import importlib
import warnings

import typer
from typer.core import TyperOption

from ops.terminal import PROG

# google-api-core warns on every import about Python 3.11's end of life (2027).
warnings.filterwarnings("ignore", message="You are using a Python version",
                        category=FutureWarning)

# typer 0.29 labels every option with its Python type (`--watch <bool>`, `--stack <str>`,
# typer/core.py `display_type`). A flag takes no value, so it shows none; a value shows
# click's word for it (TEXT, INTEGER, PATH), or the option's own metavar.
_VALUE_WORDS = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "path": "PATH"}
_typer_type_label = TyperOption.display_type_rich


def _type_label(self: TyperOption, ctx: typer.Context) -> str | None:
    if self.is_flag or self.count:
        return None
    label = _typer_type_label(self, ctx)
    if label is None or self.metavar is not None:
        return label
    bare = label.removeprefix("<").removesuffix(">")
    return _VALUE_WORDS.get(bare.split(" ")[0], bare)


TyperOption.display_type_rich = _type_label  # type: ignore[method-assign]

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
_VERB_MODULES = ("ops.plan.command", "ops.local.rehearse", "ops.tpu.commands",
                 "ops.tpu.reconcile")


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
