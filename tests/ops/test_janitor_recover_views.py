"""`tpuctl janitor` and `tpuctl recover` are views of the controller's plan (issue 43): on
one fake fleet their actions are exactly the planner's steps of their kinds (limits; and
placement and recovery), no step is shown by both, and together with the steps neither
shows they are the whole plan."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from io import StringIO

import pytest
from rich.console import Console
from typer.testing import CliRunner

from model.manifest import Manifest
from ops.cli import app
from ops.commands import tpu as tpu_cmds
from ops.controller import plan as planner
from ops.controller import views
from ops.tpu import status as node_status
from ops.tpu.actions import Action
from ops.tpu.api import TpuApi
from tests.fakes.tpu_api import CAPACITY_MESSAGE, FakeTpuApi
from tests.ops.test_fallback_recover import FALLBACK_NODE, NODE, queue_request
from tests.ops.tpu_world import STACK_LABELS, ZONE, expected_node, target

IDLE_MINUTES = 30.0
FLEET = target(FALLBACK_NODE, expected_node("dev-done"), expected_node("dev-busy"),
               expected_node("dev-lost"), replace(expected_node("dev-failed"), queued=True))


def build_fleet(fake: FakeTpuApi) -> None:
    """A fallback node refused for capacity, a finished job, a busy one, a preempted
    node, a plain queued node's FAILED request."""
    fake.script_queued(NODE, "FAILED", zone=ZONE, error=(8, CAPACITY_MESSAGE.format(zone=ZONE)))
    queue_request(ZONE)
    fake.script_queued("dev-failed", "FAILED", zone=ZONE, error=(9, "Insufficient reserved "
                                                                     "capacity."))
    queue_request(ZONE, "dev-failed")
    for node_id, states in (("dev-done", ()), ("dev-busy", ()), ("dev-lost", ("PREEMPTED",))):
        fake.add_node(ZONE, node_id, *states, labels=STACK_LABELS)
    fake.set_guest_attributes(ZONE, "dev-done", 0, {"state": "succeeded"})
    fake.set_guest_attributes(ZONE, "dev-busy", 0, {"state": "running"})


@pytest.fixture
def shown(fake_tpu: FakeTpuApi, monkeypatch: pytest.MonkeyPatch):
    """Runs a verb (dry run); the actions it showed."""
    monkeypatch.setattr(tpu_cmds, "load_target", lambda _stack: FLEET)
    monkeypatch.setattr(tpu_cmds, "console", Console(file=StringIO(), width=250))
    seen: list[Action] = []
    original = tpu_cmds._act

    def recorded(api, actions, apply, nothing):  # type: ignore[no-untyped-def]
        seen.extend(actions)
        return original(api, actions, apply, nothing)

    monkeypatch.setattr(tpu_cmds, "_act", recorded)

    def run(*args: str) -> list[tuple[str, str]]:
        seen.clear()
        result = CliRunner().invoke(app, list(args))
        assert result.exit_code == 0, result.output
        return sorted((a.verb, a.name) for a in seen)

    return run


def the_plan() -> list[planner.Step]:
    """The planner's plan for FLEET from the same lists (the janitor's idle rule)."""
    api = TpuApi()
    nodes = node_status.read_stack(api, FLEET).items
    queued = node_status.read_queued(api, FLEET).items
    return planner.plan(planner.Inputs([Manifest(FLEET, IDLE_MINUTES)],
                                       planner.Actual(nodes, queued),
                                       datetime.now(timezone.utc), unreported_idle=True))


def test_janitor_and_recover_show_exactly_the_plans_steps_of_their_kinds(
        shown, fake_tpu: FakeTpuApi) -> None:
    build_fleet(fake_tpu)
    made = len(fake_tpu.mutating_calls())

    janitor = shown("janitor", "--stack", "dev", "--idle-minutes", str(IDLE_MINUTES))
    recover = shown("recover", "--stack", "dev")
    plan = the_plan()

    def of(kinds: set[str]) -> list[tuple[str, str]]:
        return sorted((s.verb, s.name) for s in plan if s.kind in kinds)

    assert janitor == of({"limits"})
    assert recover == of({"placement", "recovery"})
    assert not set(janitor) & set(recover)
    assert sorted(janitor + recover) == sorted((s.verb, s.name) for s in plan)
    assert [verb for verb, _ in janitor] == ["delete-queued", "stop-node"]
    assert sorted(verb for verb, _ in recover) == ["delete-node", "move-queued"]
    assert len(fake_tpu.mutating_calls()) == made  # dry runs
    assert set(planner.KINDS) > views.JANITOR_KINDS | views.RECOVER_KINDS
