"""`tpuctl reconcile` (the controller's plan for a stack, dry run by default) and the
controller's last run in `tpuctl status`, against the fake TPU API and the GCS emulator."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from io import StringIO

import pytest
from rich.console import Console
from typer.testing import CliRunner

from components.fallback_tpu import FallbackTpuProvider
from ops.cli import app
from ops.commands import reconcile as reconcile_cmd
from ops.controller import view as controller_view
from ops.controller.run import last_run_lines
from tests.controller.world import (
    BUCKET,
    NODE,
    TAKES,
    WAITS,
    World,
    fallback_node,
    provider_props,
    stack,
)


@pytest.fixture
def tpuctl(world: World, monkeypatch: pytest.MonkeyPatch):
    from dataclasses import replace

    target = stack(replace(fallback_node(WAITS, TAKES), max_wait_seconds=0))
    monkeypatch.setattr(reconcile_cmd, "load_target", lambda _stack: target)

    def run(*args: str) -> str:
        out = StringIO()
        monkeypatch.setattr(reconcile_cmd, "console",
                            Console(file=out, width=600, color_system=None))
        result = CliRunner().invoke(app, list(args))
        if result.exception and not isinstance(result.exception, SystemExit):
            raise result.exception
        assert result.exit_code == 0, out.getvalue()
        return out.getvalue()

    return run


def test_reconcile_shows_the_plan_and_changes_nothing_then_apply_moves_the_node(
        tpuctl, world: World) -> None:
    world.tpu.script_queued(NODE, "WAITING_FOR_RESOURCES", zone=WAITS)
    FallbackTpuProvider().create(provider_props(WAITS, TAKES))
    before = len(world.tpu.mutating_calls())

    dry = tpuctl("reconcile", "--stack", "dev")
    assert "move-queued" in dry and "longer than maxWait" in dry
    assert "dry run: nothing changed" in dry
    assert len(world.tpu.mutating_calls()) == before
    assert "controller: no run recorded yet" in dry

    applied = tpuctl("reconcile", "--stack", "dev", "--apply")
    assert "move-queued" in applied and "moved to" in applied
    assert world.tpu.queued_resource(TAKES, f"{NODE}-c2") is not None
    assert world.tpu.queued_resource(WAITS, NODE) is None


def test_status_shows_the_controllers_last_run_and_warns_after_three_intervals(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    world.publish(stack(fallback_node(WAITS, TAKES)))
    world.run(minutes=0)
    monkeypatch.setattr(controller_view, "controller_enabled", lambda _stack: True)
    out = StringIO()

    controller_view.show_last_run(Console(file=out, width=250, color_system=None),
                                  stack(), now=world.clock(20))
    lines, stale = last_run_lines(world.store.last_run(), world.clock(4))

    assert "controller: last run" in out.getvalue() and "20 min ago" in out.getvalue()
    assert "warning: the controller has not run for 20 min" in out.getvalue()
    assert not stale and "0 step(s)" in lines[0]
    assert BUCKET in stack().artifacts_bucket
    assert datetime.now(timezone.utc) - world.clock(0) < timedelta(minutes=5)
