"""tpuctl's help: what every verb's options say, and that --stack means the same everywhere."""

from __future__ import annotations

import re

import pytest
import typer
from typer.testing import CliRunner

from ops.cli import app

VERBS = sorted(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
PYTHON_TYPE = re.compile(r"<(bool|str|int|float|path)>")


def help_text(verb: str) -> str:
    result = CliRunner().invoke(app, [verb, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def option(verb: str, name: str) -> typer.core.TyperOption:
    command = typer.main.get_command(app).commands[verb]  # type: ignore[attr-defined]
    return next(p for p in command.params if name in p.opts)


def test_every_verb_is_checked() -> None:
    assert {"plan", "rehearse", "preflight", "status", "wait", "recover", "janitor",
            "logs"} <= set(VERBS)


@pytest.mark.parametrize("verb", VERBS)
def test_no_option_shows_a_python_type(verb: str) -> None:
    text = help_text(verb)

    assert PYTHON_TYPE.findall(text) == []
    flags = [line for line in text.splitlines() if "--help" in line]
    assert flags and "Show this message and exit." in flags[0]


def test_flags_show_no_value_and_values_show_a_word() -> None:
    status = help_text("status")

    assert re.search(r"--watch\s+-w\s+Refresh until Ctrl-C\.", status)
    assert re.search(r"--stack\s+-s\s+NAME\s+Stack name", status)
    assert re.search(r"--interval\s+DURATION\s+Refresh period", status)


def test_plan_format_names_its_default() -> None:
    assert option("plan", "--format").help.endswith(
        "default table, markdown with --against.")
    assert "FORMAT" in help_text("plan")


@pytest.mark.parametrize("verb", VERBS)
def test_stack_defaults_to_dev_on_every_verb(verb: str) -> None:
    stack = option(verb, "--stack")

    assert (stack.default, stack.required, stack.opts) == ("dev", False, ["--stack", "-s"])
    assert "[default: dev]" in help_text(verb)
