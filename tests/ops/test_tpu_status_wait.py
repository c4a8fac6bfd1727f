"""tpuctl status and wait: nodes from one list per zone, job status, state transitions."""

from __future__ import annotations

import json
from dataclasses import replace
from io import StringIO

from rich.console import Console

from ops.tpu.api import NodeStatus, TpuApi
from ops.tpu.status import collect, collect_queued, wait_until
from ops.tpu.status_views import status_table
from tests.fakes.tpu_api import FakeTpuApi
from tests.ops.tpu_world import OTHER_ZONE, STACK_LABELS, ZONE, expected_node, target

RUNNING = {"state": "running", "step": "700", "message": "", "updated": "2026-12-02T13:00:00+00:00"}


def render(table) -> str:
    out = StringIO()
    Console(file=out, width=200, color_system=None).print(table)
    return out.getvalue()


def test_status_table_has_one_row_per_node_and_marks_absent_ones(
    fake_tpu: FakeTpuApi, tpu: TpuApi
) -> None:
    fake_tpu.add_node(ZONE, "dev-a", labels=STACK_LABELS, symptoms=["OUT_OF_MEMORY"])
    fake_tpu.set_guest_attributes(ZONE, "dev-a", 0, RUNNING)
    stack = target(expected_node("dev-a"), expected_node("dev-gone"))

    text = render(status_table(stack, collect(tpu, stack)))

    row = next(line for line in text.splitlines() if "dev-a" in line)
    assert "READY" in row and "running" in row and "700" in row
    assert "OUT_OF_MEMORY" in row
    assert "ABSENT" in next(line for line in text.splitlines() if "dev-gone" in line)
    assert fake_tpu.mutating_calls() == []


def test_the_jobs_message_is_shown_as_it_is_brackets_included(
    fake_tpu: FakeTpuApi, tpu: TpuApi
) -> None:
    message = "tpu-stack:jobs.x: [line 3, column 5] expected ',' or ']'"
    fake_tpu.add_node(ZONE, "dev-a", labels=STACK_LABELS)
    fake_tpu.set_guest_attributes(ZONE, "dev-a", 0, RUNNING | {"message": message})
    stack = target(expected_node("dev-a"))

    assert message in render(status_table(stack, collect(tpu, stack)))


def test_status_shows_goodput_percent_per_node_from_worker_0(
    fake_tpu: FakeTpuApi, tpu: TpuApi
) -> None:
    fake_tpu.add_node(ZONE, "dev-a", labels=STACK_LABELS)
    fake_tpu.add_node(ZONE, "dev-b", labels=STACK_LABELS)
    goodput = json.dumps({"productive": 965, "total": 1000, "percent": 96.5, "job": "j"})
    fake_tpu.set_guest_attributes(ZONE, "dev-a", 0, RUNNING | {"goodput": goodput})
    fake_tpu.set_guest_attributes(ZONE, "dev-a", 1, {"state": "idle", "goodput": "{}"})
    fake_tpu.set_guest_attributes(ZONE, "dev-b", 0, RUNNING)
    stack = target(expected_node("dev-a"), expected_node("dev-b"))

    text = render(status_table(stack, collect(tpu, stack)))

    rows = {name: next(line for line in text.splitlines() if name in line)
            for name in ("dev-a", "dev-b")}
    assert "96.5%" in rows["dev-a"] and "running" in rows["dev-a"]
    assert "%" not in rows["dev-b"]  # an agent that publishes no goodput yet
    assert "goodput" in text.splitlines()[2]  # the header


def test_a_queued_node_without_a_node_yet_shows_its_request(
    fake_tpu: FakeTpuApi, tpu: TpuApi
) -> None:
    fake_tpu.add_queued_request(ZONE, "dev-q", "WAITING_FOR_RESOURCES")
    stack = target(replace(expected_node("dev-q"), queued=True))

    text = render(status_table(stack, collect(tpu, stack), collect_queued(tpu, stack)))

    assert "QUEUED WAITING_FOR_RESOURCES" in next(
        row for row in text.splitlines() if "dev-q" in row
    )
    assert [(c.action, c.collection) for c in fake_tpu.calls] == [
        ("list", "nodes"),
        ("list", "queuedResources"),
    ]


def test_wait_follows_creating_to_ready(fake_tpu: FakeTpuApi, tpu: TpuApi) -> None:
    fake_tpu.add_node(ZONE, "dev-a", "CREATING", "CREATING", "READY", labels=STACK_LABELS)
    seen: list[str] = []

    outcome = wait_until(
        tpu,
        target(expected_node("dev-a")),
        "ready",
        timeout=5,
        poll=0,
        on_poll=lambda nodes, _t: seen.append(nodes[0].state),
    )

    assert outcome.reached
    assert seen == ["CREATING", "CREATING", "READY"]
    assert fake_tpu.count("list") == 3 and fake_tpu.count("get") == 0


def test_wait_for_running_needs_the_agent_to_report(fake_tpu: FakeTpuApi, tpu: TpuApi) -> None:
    fake_tpu.add_node(ZONE, "dev-a", labels=STACK_LABELS)
    polls = []

    def on_poll(nodes, _elapsed) -> None:
        polls.append(nodes[0].job.get("state"))
        fake_tpu.set_guest_attributes(ZONE, "dev-a", 0, RUNNING)

    outcome = wait_until(tpu, target(expected_node("dev-a")), "running", 5, 0, on_poll=on_poll)

    assert outcome.reached and polls == [None, "running"]


def test_wait_stops_early_when_a_node_is_preempted(fake_tpu: FakeTpuApi, tpu: TpuApi) -> None:
    fake_tpu.add_node(ZONE, "dev-a", "READY", "PREEMPTED", labels=STACK_LABELS, spot=True)

    outcome = wait_until(tpu, target(expected_node("dev-a")), "done", timeout=60, poll=0)

    assert not outcome.reached
    assert outcome.reason == "dev-a is PREEMPTED"


def test_wait_follows_a_queued_request_and_stops_when_it_fails(
    fake_tpu: FakeTpuApi, tpu: TpuApi
) -> None:
    """`create` returns once the request is queued; `tpuctl wait` follows it."""
    name = fake_tpu.add_queued_request(ZONE, "dev-q", "WAITING_FOR_RESOURCES", "FAILED")
    stack = target(replace(expected_node("dev-q"), queued=True))

    outcome = wait_until(tpu, stack, "ready", timeout=2, poll=0)

    assert not outcome.reached
    assert outcome.reason == (
        f"queued resource {name} is FAILED: `tpuctl recover --apply` moves a fallback "
        f"node's request on, `tpuctl janitor --apply` deletes another's")


def test_wait_gives_up_after_the_timeout(fake_tpu: FakeTpuApi, tpu: TpuApi) -> None:
    ticks = iter(range(100))

    outcome = wait_until(
        tpu,
        target(expected_node("dev-a")),
        "ready",
        timeout=3,
        poll=1,
        clock=lambda: float(next(ticks)),
        sleep=lambda _s: None,
    )

    assert (outcome.reached, outcome.reason) == (False, "not ready after 3 s")


def test_status_of_200_nodes_lists_each_zone_once_and_never_gets_a_node(
    fake_tpu: FakeTpuApi, tpu: TpuApi
) -> None:
    zones = (ZONE, OTHER_ZONE)
    for index in range(200):
        fake_tpu.add_node(zones[index % 2], f"dev-n{index:03d}", labels=STACK_LABELS)
    stack = target(*(expected_node(f"dev-n{i:03d}", zones[i % 2]) for i in range(200)))

    nodes = collect(tpu, stack)

    assert len(nodes) == 200
    assert (fake_tpu.count("list"), fake_tpu.count("get")) == (2, 0)
    assert fake_tpu.count("getGuestAttributes") == 200


def test_a_large_stack_is_shown_as_plain_columns_with_every_row() -> None:
    nodes = [expected_node(f"dev-n{i:03d}") for i in range(250)]
    statuses = [
        NodeStatus(ZONE, n.node_id, "READY", "HEALTHY", "v2-8", "r", False, {}, {}, "",
                   job={"state": "running", "step": str(i), "message": "[line 3] as is"})
        for i, n in enumerate(nodes[:-1])
    ]

    lines = render(status_table(target(*nodes), statuses, wide=True)).splitlines()

    assert lines[0] == "stack dev (acme-ml-dev)"
    assert lines[1].split() == ["node", "zone", "type", "state", "health", "job", "step",
                                "phase", "goodput", "input", "wait", "MFU", "message",
                                "updated"]
    assert lines[2].split() == ["dev-n000", ZONE, "v2-8", "READY", "HEALTHY", "running", "0",
                                "[line", "3]", "as", "is"]
    assert lines[-1].split() == ["dev-n249", ZONE, "ABSENT", "-"]
    assert len(lines) == 252
