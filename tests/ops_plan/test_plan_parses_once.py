"""One `tpuctl plan` parses the stack's settings once (issue 42): the offline plan
hands the settings it parsed to the program, which would otherwise parse the same
config again (components/program.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest
from typer.testing import CliRunner

import model.settings.load
from ops.cli import app
from ops.plan import mock_engine, platform_facts


def _count_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The stacks load_settings is called for, wherever a module imported it from."""
    original: Callable[..., Any] = model.settings.load.load_settings
    calls: list[str] = []

    def counted(raw: Any, stack: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(stack)
        return original(raw, stack, *args, **kwargs)

    for module in list(sys.modules.values()):
        if vars(module).get("load_settings") is original:
            monkeypatch.setattr(module, "load_settings", counted)
    return calls


# A team stack's plan also reads its platform stack's settings: once for the outputs its
# StackReference would read (ops/plan/mock_engine.py, referenced_stack_outputs), once for
# what the team's plan shows of its platform (ops/plan/platform_facts.py: its data's
# location, the team's caps and budget), each once per process.
@pytest.mark.parametrize(("stack", "parsed"), [
    ("dev", ["dev"]), ("team-vision", ["team-vision", "platform", "platform"])])
def test_one_plan_parses_the_settings_once(monkeypatch: pytest.MonkeyPatch, stack: str,
                                           parsed: list[str]) -> None:
    calls = _count_calls(monkeypatch)
    platform_facts.read_platform.cache_clear()
    mock_engine.planned_stack_run.cache_clear()  # another test of this process may have run it

    result = CliRunner().invoke(app, ["plan", "--stack", stack, "--format", "json"])

    assert result.exit_code == 0, result.output
    assert calls == parsed
