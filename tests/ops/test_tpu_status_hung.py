"""`tpuctl status` of a hung job: state, phase and seconds since its last progress line
(docs/design.md, "Deadlines"), from the guest attributes and from status.json's listing."""

from __future__ import annotations

import json

from ops.tpu.api import NodeStatus, TpuApi
from ops.tpu.status import collect
from ops.tpu.status_views import COLUMNS, status_rows
from tests.fakes.tpu_api import FakeTpuApi
from tests.ops.tpu_world import STACK_LABELS, ZONE, expected_node, target

HUNG = {"state": "hung", "step": "700", "phase": "first_execution",
        "progressAt": "2026-12-02T13:00:00+00:00", "updated": "2026-12-02T13:01:05+00:00",
        "hang": json.dumps({"phase": "first_execution", "seconds": 63.0, "deadline": 60.0}),
        "message": "no progress line for 63s in phase first_execution (deadline 60s); ..."}
NOW = 1_796_216_470.0  # 2026-12-02T13:01:10Z


def row_of(job: dict[str, str]) -> tuple[str, ...]:
    node = NodeStatus(ZONE, "dev-a", "READY", "HEALTHY", "v2-8", "r", False, {}, {}, "", job=job)
    ((cells, _),) = status_rows(target(expected_node("dev-a")), [node], [], "ABSENT", now=NOW)
    return cells


def test_a_hung_job_shows_its_phase_and_the_seconds_since_its_last_progress_line() -> None:
    cells = row_of(HUNG)
    assert cells[5:8] == ("hung", "700", "first_execution 70s")


def test_a_running_job_shows_its_phase_and_a_finished_one_none() -> None:
    running = HUNG | {"state": "running", "phase": "execution",
                      "progressAt": "2026-12-02T13:01:08+00:00"}
    assert row_of(running)[7] == "execution 2s"
    assert row_of(HUNG | {"state": "succeeded", "phase": "final"})[7] == ""
    assert row_of({"state": "running", "step": "3"})[7] == ""  # an agent without phases


def test_the_hang_fields_come_through_the_guest_attributes(
    fake_tpu: FakeTpuApi, tpu: TpuApi
) -> None:
    fake_tpu.add_node(ZONE, "dev-a", labels=STACK_LABELS)
    fake_tpu.set_guest_attributes(ZONE, "dev-a", 0, HUNG)
    stack = target(expected_node("dev-a"))

    (node,) = collect(tpu, stack)

    assert {key: node.job[key] for key in ("state", "phase", "progressAt", "hang")} == {
        key: HUNG[key] for key in ("state", "phase", "progressAt", "hang")}


def test_the_agent_column_shows_its_version_and_health() -> None:
    healthy = {"version": "3f2a1b9c0d1e", "threadFaults": 0, "threadRestarts": 0}
    agent = [column.header for column in COLUMNS].index("agent")
    assert row_of(HUNG | {"agent": json.dumps(healthy)})[agent] == "3f2a1b9c0d1e ok"
    sick = healthy | {"stuck": ["main", "status-upload"], "threadFaults": 2,
                      "refused": "0a1b2c3d4e5f"}
    assert row_of(HUNG | {"agent": json.dumps(sick)})[agent] == (
        "3f2a1b9c0d1e stuck: main,status-upload; 2 faults; refused 0a1b2c3d4e5f")
    assert row_of(HUNG)[agent] == ""  # an agent that publishes none


def test_the_agent_column_is_shown_once_an_agent_publishes_its_health() -> None:
    from ops.tpu.status_views import shown

    node = NodeStatus(ZONE, "dev-a", "READY", "HEALTHY", "v2-8", "r", False, {}, {}, "",
                      job=HUNG)
    rows = status_rows(target(expected_node("dev-a")), [node], [], "ABSENT", now=NOW)
    headers = [COLUMNS[i].header for i in shown(True, rows)]
    assert "agent" not in headers  # no agent says anything: no column
    node.job["agent"] = json.dumps({"version": "3f2a1b9c0d1e"})
    rows = status_rows(target(expected_node("dev-a")), [node], [], "ABSENT", now=NOW)
    columns = shown(True, rows)
    assert COLUMNS[columns[-1]].header == "agent"
    assert rows[0][0][columns[-1]] == "3f2a1b9c0d1e ok"
    assert "agent" not in [COLUMNS[i].header for i in shown(False, rows)]  # --wide only
