"""tpuctl recover and janitor: plans are pure, dry runs change nothing, --apply acts."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from node_agent.contract import MAX_RUNTIME_KEY
from ops.tpu.actions import apply_actions, janitor_plan, recovery_plan
from ops.tpu.api import TpuApi, node_name
from ops.tpu.status import collect, collect_queued
from tests.fakes.tpu_api import FakeTpuApi
from tests.ops.tpu_world import PROJECT, STACK_LABELS, ZONE, expected_node, target

NOW = datetime(2026, 12, 2, 14, 0, tzinfo=timezone.utc)


def plan_of(actions) -> list[tuple[str, str]]:
    return [(a.verb, a.subject) for a in actions]


def test_recover_deletes_lost_nodes_and_requeues_queued_ones(
    fake_tpu: FakeTpuApi, tpu: TpuApi
) -> None:
    fake_tpu.add_node(ZONE, "dev-ok", labels=STACK_LABELS)
    fake_tpu.add_node(ZONE, "dev-spot", "PREEMPTED", labels=STACK_LABELS, spot=True)
    fake_tpu.add_node(ZONE, "dev-old", "TERMINATED", labels=STACK_LABELS)
    fake_tpu.add_queued_node(ZONE, "dev-q", "PREEMPTED", labels=STACK_LABELS, spot=True)

    actions = recovery_plan(tpu.stack_nodes([(PROJECT, ZONE)], "dev"))

    assert plan_of(actions) == [
        ("delete-node", "dev-old"),
        ("reset-queued", f"projects/{PROJECT}/locations/{ZONE}/queuedResources/dev-q-qr"),
        ("delete-node", "dev-spot"),
    ]
    assert fake_tpu.mutating_calls() == [], "planning is a dry run"

    apply_actions(tpu, actions)

    assert fake_tpu.node(ZONE, "dev-spot") is None and fake_tpu.node(ZONE, "dev-old") is None
    assert fake_tpu.node(ZONE, "dev-ok") is not None
    assert fake_tpu.queued_resource(ZONE, "dev-q-qr").state.state.name == "WAITING_FOR_RESOURCES"


def test_recover_requeues_a_suspended_request_whose_node_is_gone(
    fake_tpu: FakeTpuApi, tpu: TpuApi
) -> None:
    fake_tpu.add_queued_node(ZONE, "dev-q", labels=STACK_LABELS)
    fake_tpu.add_queued_node(ZONE, "other-q", labels={"stack": "other"})
    for node_id in ("dev-q", "other-q"):
        # the request goes SUSPENDING, then SUSPENDED
        tpu.delete_node(node_name(PROJECT, ZONE, node_id))
    stack = target(replace(expected_node("dev-q"), queued=True))
    collect_queued(tpu, stack)  # one read: SUSPENDING -> SUSPENDED
    fake_tpu.calls.clear()

    actions = recovery_plan(tpu.stack_nodes(stack.places, "dev"), collect_queued(tpu, stack))

    assert plan_of(actions) == [
        ("reset-queued", f"projects/{PROJECT}/locations/{ZONE}/queuedResources/dev-q-qr")
    ]
    assert fake_tpu.mutating_calls() == []
    apply_actions(tpu, actions)
    assert fake_tpu.queued_resource(ZONE, "dev-q-qr").state.state.name == "WAITING_FOR_RESOURCES"
    assert fake_tpu.queued_resource(ZONE, "other-q-qr").state.state.name == "SUSPENDED"


def test_janitor_stops_finished_and_idle_single_hosts_and_reports_pods(
    fake_tpu: FakeTpuApi, tpu: TpuApi
) -> None:
    long_ago = NOW - timedelta(hours=3)
    for node_id in ("dev-done", "dev-busy", "dev-idle", "dev-fresh"):
        fake_tpu.add_node(ZONE, node_id, labels=STACK_LABELS, created=long_ago)
    fake_tpu.add_node(
        ZONE, "dev-pod", accelerator_type="v3-32", labels=STACK_LABELS, created=long_ago
    )
    fake_tpu.set_guest_attributes(ZONE, "dev-done", 0, {"state": "succeeded"})
    fake_tpu.set_guest_attributes(ZONE, "dev-busy", 0, {"state": "running"})
    fake_tpu.set_guest_attributes(
        ZONE, "dev-idle", 0, {"state": "failed", "updated": long_ago.isoformat()}
    )
    fake_tpu.set_guest_attributes(
        ZONE, "dev-fresh", 0, {"state": "failed", "updated": NOW.isoformat()}
    )
    fake_tpu.set_guest_attributes(ZONE, "dev-pod", 0, {"state": "succeeded"})
    stack = target(*(expected_node(n) for n in ("dev-done", "dev-busy", "dev-idle", "dev-fresh")))

    actions = janitor_plan(collect(tpu, stack), idle_minutes=60, now=NOW)

    assert plan_of(actions) == [
        ("stop-node", "dev-done"),
        ("stop-node", "dev-idle"),
        ("report", "dev-pod"),
    ]
    assert actions[1].reason == "idle 180 min (job failed)"
    assert "a pod slice cannot be stopped" in actions[2].reason
    assert fake_tpu.mutating_calls() == []

    apply_actions(tpu, actions)

    states = {n: fake_tpu.node(ZONE, n).state.name for n in ("dev-done", "dev-idle", "dev-pod")}
    assert states == {"dev-done": "STOPPED", "dev-idle": "STOPPED", "dev-pod": "READY"}
    assert [c.action for c in fake_tpu.mutating_calls()] == ["stop", "stop"]


def test_janitor_deletes_nodes_past_max_runtime_whose_agent_is_dead(
    fake_tpu: FakeTpuApi, tpu: TpuApi
) -> None:
    # maxRuntime 1 h (metadata, node_agent/contract.py); the agents published nothing
    # for hours: dead (or never started). The grace is 10 minutes past maxRuntime.
    limit = {MAX_RUNTIME_KEY: "3600"}
    for node_id, age in (("dev-old", 71), ("dev-in-grace", 69), ("dev-unlimited", 600)):
        fake_tpu.add_node(ZONE, node_id, labels=STACK_LABELS,
                          created=NOW - timedelta(minutes=age),
                          metadata=limit if node_id != "dev-unlimited" else {})
    fake_tpu.add_queued_node(ZONE, "dev-q", labels=STACK_LABELS, accelerator_type="v3-32",
                             created=NOW - timedelta(hours=5), metadata=limit)
    fake_tpu.add_node(ZONE, "dev-idle-pod", accelerator_type="v3-32", labels=STACK_LABELS,
                      created=NOW - timedelta(minutes=30))
    fake_tpu.add_node(ZONE, "dev-idle-host", labels=STACK_LABELS,
                      created=NOW - timedelta(minutes=30))
    for node_id in ("dev-idle-pod", "dev-idle-host"):
        fake_tpu.set_guest_attributes(ZONE, node_id, 0, {
            "state": "stopped", "updated": NOW.isoformat(),
            "message": "stopped (idleStop: no job has held the TPU for 600s)"})
    stack = target(*(expected_node(n) for n in ("dev-old", "dev-in-grace", "dev-unlimited")))

    # The idle rule (no job activity for idle_minutes) out of the way: a day.
    actions = janitor_plan(collect(tpu, stack), idle_minutes=24 * 60, now=NOW)

    queued = f"projects/{PROJECT}/locations/{ZONE}/queuedResources/dev-q-qr"
    assert plan_of(actions) == [("stop-node", "dev-idle-host"), ("delete-node", "dev-idle-pod"),
                                ("delete-node", "dev-old"), ("delete-queued", queued)]
    assert actions[2].reason == "past maxRuntime: up 1.2 h, maxRuntime 1 h plus 10 min grace"
    assert actions[1].reason.startswith("stopped for good: stopped (idleStop: ")
    assert fake_tpu.mutating_calls() == []

    apply_actions(tpu, actions)

    for node_id in ("dev-old", "dev-q", "dev-idle-pod"):
        assert fake_tpu.node(ZONE, node_id) is None, node_id
    assert fake_tpu.queued_resource(ZONE, "dev-q-qr") is None, "not re-queued: deleted"
    assert fake_tpu.node(ZONE, "dev-idle-host").state.name == "STOPPED"
    assert fake_tpu.node(ZONE, "dev-in-grace").state.name == "READY"
    assert fake_tpu.node(ZONE, "dev-unlimited").state.name == "READY"
