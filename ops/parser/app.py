"""The `tpuctl` typer application, its help labels in click's words."""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

from ops.terminal import PROG

# typer 0.29 labels every option with its Python type (`--watch <bool>`, `--stack <str>`,
# typer/core.py `display_type_rich`). A flag takes no value, so it shows none; a value shows
# click's word for it (TEXT, INTEGER, PATH), or the option's own metavar.
_VALUE_WORDS = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "path": "PATH"}


class _LabelledOption(TyperOption):
    """An option whose help shows click's word for its value, none for a flag."""

    def display_type_rich(self, ctx: Any) -> str | None:
        if self.is_flag or self.count:
            return None
        label = super().display_type_rich(ctx)
        if label is None or self.metavar is not None:
            return label
        bare = label.removeprefix("<").removesuffix(">")
        return _VALUE_WORDS.get(bare.split(" ")[0], bare)


def _labelled(params: list[Any]) -> list[Any]:
    for param in params:
        if type(param) is TyperOption:
            param.__class__ = _LabelledOption
    return params


class _LabelledCommand(TyperCommand):
    def get_params(self, ctx: Any) -> list[Any]:
        return _labelled(super().get_params(ctx))


class _LabelledGroup(TyperGroup):
    """tpuctl's root command: its own and its commands' options (`--help` too) label
    their values as click does. typer builds each option as a TyperOption (typer/main.py,
    get_click_param; the help option in get_help_option) with no way to name another
    class, so the commands hand theirs over as this one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for command in self.commands.values():
            if type(command) is TyperCommand:
                command.__class__ = _LabelledCommand

    def get_params(self, ctx: Any) -> list[Any]:
        return _labelled(super().get_params(ctx))


def new_app() -> typer.Typer:
    app = typer.Typer(
        name=PROG,
        cls=_LabelledGroup,
        help="Plan, check and operate tpu-stack TPU capacity.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )

    @app.callback()
    def _root() -> None:
        """Plan, check and operate tpu-stack TPU capacity."""

    return app
