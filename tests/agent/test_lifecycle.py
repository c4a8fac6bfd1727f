"""The job's life on the node (node_agent/lifecycle.py): the table, held to docs/design.md."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from node_agent import build, contract, install, life, lifecycle, metadata
from node_agent.agent import Agent
from ops.local.storage_emulator import StorageEmulator
from ops.tpu import status as tpu_status
from tests.agent.conftest import Node
from tests.agent.test_agent_chaos import stand_in_package, training
from tests.agent.test_agent_handover import job_pids

DESIGN = Path(__file__).resolve().parents[2] / "docs/design.md"


def documented_table() -> list[tuple[str, str, str, tuple[str, ...]]]:
    text = DESIGN.read_text()
    section = text.split("#### The job's life on the node (node_agent/lifecycle.py)", 1)[1]
    section = section.split("\n#### ", 1)[0].split("\n### ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`"):
            state, event, next_state = (re.sub(r"`", "", cell) for cell in cells[:3])
            rows.append((state, event, next_state, tuple(cells[3].split())))
    return rows


def test_the_design_documents_every_transition_of_the_code_and_no_other() -> None:
    code = [(row.state, row.event, row.next, row.actions) for row in lifecycle.TABLE]
    assert documented_table() == code


def test_a_stop_of_the_vm_stops_the_job_with_a_save_and_ends_preempted() -> None:
    state, actions = lifecycle.step("running", "SIGTERM")
    assert (state, actions) == ("stopping-sigterm", ("note", "stop_job"))
    assert lifecycle.step(state, "EXIT_STOPPED") == ("preempted", ("publish_stop",))
    # Whatever the job's exit code: the agent asked for the stop.
    assert lifecycle.step(state, "EXIT_CRASH")[0] == "preempted"


def test_a_stop_request_ends_stopped_and_starts_again_only_once_withdrawn() -> None:
    state, actions = lifecycle.step("running", "STOP_REQUESTED")
    assert "stop_job" in actions
    state, _ = lifecycle.step(state, "EXIT_STOPPED")
    assert state == "stopped"
    with pytest.raises(lifecycle.NoTransitionError):
        lifecycle.step(state, "UPDATE")  # nothing starts the job but the withdrawal
    assert lifecycle.step(state, "STOP_CLEARED")[0] == "restarting"
    assert lifecycle.step("stopped", "SIGTERM")[0] == "preempted"


def test_a_hang_sends_stacks_then_stops_and_the_job_starts_again() -> None:
    state, actions = lifecycle.step("running", "HANG")
    assert actions == ("publish_hang", "send_stacks", "stop_job")
    assert lifecycle.step(state, "EXIT_STOPPED")[0] == "restarting"


@pytest.mark.parametrize(("code", "stop_sent", "start_up", "event"), [
    (0, False, False, "EXIT_OK"), (75, False, False, "EXIT_STOPPED"),
    (76, False, False, "EXIT_STOPPED"), (1, True, False, "EXIT_STOPPED"),
    (-15, False, True, "EXIT_STOPPED"), (2, False, False, "EXIT_PERMANENT"),
    (65, False, False, "EXIT_PERMANENT"), (66, False, False, "EXIT_NO_DATA"),
    (69, False, False, "EXIT_TRANSIENT"), (1, False, False, "EXIT_CRASH"),
    (-9, False, False, "EXIT_CRASH")])
def test_every_exit_is_one_event(code: int, stop_sent: bool, start_up: bool, event: str) -> None:
    assert lifecycle.exit_event(code, stop_sent=stop_sent, stopped_in_start_up=start_up) == event


def test_a_stop_request_stops_the_job_with_a_save_and_holds_it_until_withdrawn(
        make_node: Callable[..., Node], gcs: StorageEmulator, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Seam S4 through the real Agent, in this process: the stand-in job, preinstalled.
    uri, sha = stand_in_package(gcs, tmp_path, "stop-request")
    out = tmp_path / "steps"
    node = make_node(uri, sha, training(out))
    archive = tmp_path / "stand-in.tar.gz"
    archive.write_bytes(gcs.read(uri) or b"")
    install.extract(archive, node.root / "packages" / sha / "src")
    for key in ("GCE_METADATA_HOST", "STORAGE_EMULATOR_HOST", "TPU_STACK_ROOT",
                "TPU_STACK_RELEASE_POLL_SECONDS"):
        monkeypatch.setenv(key, node.env[key])
    # Long-polls of a second: the watchers' loops end soon after the agent stops them.
    monkeypatch.setattr(metadata, "WATCH_TIMEOUT_SECONDS", 1)
    request: dict[str, str | None] = {"reason": None}
    agent = Agent(node.root, stay=True, stop_requested=lambda: request["reason"])
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(agent.run()))
    runner.start()
    try:
        node.wait_for(lambda: int(node.guest.get("step", 0)) >= 3, "training")
        request["reason"] = "maxRuntime: 3600s reached"
        node.wait_for(lambda: node.guest.get("state") == "stopped", "the stop")
        assert "maxRuntime: 3600s reached" in node.guest["message"]
        saved = int(out.read_text())
        assert f"tpu_training stopped_at={saved}" in node.job_log_path().read_text()
        time.sleep(2)  # the request holds: nothing starts the job
        assert len(job_pids(out)) == 1 and node.guest["state"] == "stopped"
        request["reason"] = None
        node.wait_for(lambda: len(job_pids(out)) == 2 and
                      node.guest.get("state") == "running", "the job to start again")
    finally:
        agent.terminate()
        runner.join(120)
    assert codes == [75]
    assert f"tpu_training resumed_from={saved}" in node.job_log_path().read_text()


def test_the_published_job_states_are_one_str_enum_the_status_shows_as_before() -> None:
    assert [state.value for state in contract.JobState] == [
        "idle", "installing", "running", "succeeded", "failed", "preempted", "stopped",
        "retrying", "waiting-for-data", "hung"]
    assert json.dumps({"state": contract.JobState.WAITING_FOR_DATA}) == \
        '{"state": "waiting-for-data"}'
    assert f"{contract.JobState.RUNNING}" == "running"
    # A status read back from JSON holds plain strings: they are found in the set.
    assert json.loads('"preempted"') in contract.UNFINISHED_STATES


def test_ops_and_the_agent_read_unfinished_jobs_from_one_definition() -> None:
    assert tpu_status.ACTIVE_JOB == set(contract.UNFINISHED_STATES) == {
        "installing", "running", "retrying", "waiting-for-data", "preempted", "hung"}


def test_the_agent_publishes_no_state_literal() -> None:
    for path in (DESIGN.parents[1] / "node_agent").glob("*.py"):
        assert not re.findall(r'state="[a-z-]+"', path.read_text()), path.name


def test_the_startup_script_carries_no_comment_lines_but_the_shebang() -> None:
    lines = build.startup_script().splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert not [line for line in lines[1:] if line.lstrip().startswith("#")]
    assert not [line for line in lines if line.startswith(" ")]
    assert "TimeoutStopSec=" in build.startup_script()
    # The script goes without indentation: a here-document keeps its lines' blanks.
    bootstrap = (build.HERE / "bootstrap.sh").read_text()
    unit = bootstrap.split("<<UNIT\n", 1)[1].split("\nUNIT\n", 1)[0]
    assert not [line for line in unit.splitlines() if line[:1].isspace()]


def test_every_action_has_one_handler_and_every_handler_is_an_action() -> None:
    handlers = {name for name in vars(life.Actions) if not name.startswith("_")}
    assert handlers == {action.value for action in lifecycle.Action}
    assert set(life.HANDLERS) == set(lifecycle.Action)
    assert all(life.HANDLERS[action] is getattr(life.Actions, action.value)
               for action in lifecycle.Action)


def test_every_state_is_left_by_an_observer_or_an_action_or_is_an_end() -> None:
    observed = {state for state in lifecycle.State
                if hasattr(life.Observers, f"on_{state.name.lower()}")}
    assert set(life.OBSERVERS) == observed
    left_by_actions = {row.to for row in lifecycle.TABLE if lifecycle.Action.STOP_JOB in
                       row.actions}  # stopping-* and hung: the stop returns the exit
    ends = {row.to for row in lifecycle.TABLE if row.to not in observed | left_by_actions}
    assert {state.value for state in ends} == {"idle", "succeeded", "failed", "preempted",
                                                "updating"}


def test_the_crash_limit_is_a_row_and_progress_resets_the_count() -> None:
    crash = lifecycle.Happened(lifecycle.Event.EXIT_CRASH)
    now = lifecycle.Life(lifecycle.State.RUNNING)
    for count in (1, 2, 3):
        now, actions = lifecycle.step(now, crash)
        assert (now.state, now.crashes, actions) == ("retrying", count, ("back_off",))
        now = dataclasses.replace(now, state=lifecycle.State.RUNNING)
    last, actions = lifecycle.step(now, crash)
    assert (last.state, last.crashes, actions) == ("failed", 4, ("publish_error",))
    progressed = dataclasses.replace(crash, progressed=True)
    after, actions = lifecycle.step(now, progressed)
    assert (after.state, after.crashes) == ("retrying", 1)
    assert actions == ("reset_backoff", "back_off")


def test_a_second_hang_without_a_new_save_backs_off_and_a_new_save_restarts_at_once() -> None:
    exited = lifecycle.Happened(lifecycle.Event.EXIT_STOPPED)
    first, actions = lifecycle.step(lifecycle.Life(lifecycle.State.HUNG), exited)
    assert (first.state, first.hangs, actions) == ("restarting", 1, ("note_hang",))
    again = dataclasses.replace(first, state=lifecycle.State.HUNG)
    second, actions = lifecycle.step(again, exited)
    assert (second.state, second.hangs, actions) == ("retrying", 2, ("note_hang", "back_off"))
    saved = dataclasses.replace(exited, saved_new=True)
    fresh, actions = lifecycle.step(dataclasses.replace(second, state=lifecycle.State.HUNG),
                                    saved)
    assert (fresh.state, fresh.hangs) == ("restarting", 1)
    assert actions == ("note_hang", "reset_backoff")


def test_the_vms_stop_wins_over_every_stop_of_the_agents() -> None:
    exited = lifecycle.Happened(lifecycle.Event.EXIT_STOPPED, vm_stop=True)
    for state in ("stopping-request", "stopping-maintenance", "stopping-update", "hung"):
        now, actions = lifecycle.step(lifecycle.Life(lifecycle.State(state)), exited)
        assert (now.state, actions) == ("preempted", ("publish_stop",))


def test_every_waiting_state_answers_a_stop_and_an_update() -> None:
    release = lifecycle.Happened(lifecycle.Event.RELEASE, detail="the next release")
    for state in ("starting", "installing", "waiting-for-data", "retrying", "stopped"):
        for event in ("SIGTERM", "NOTICE"):
            assert lifecycle.step(state, event)[0] == "preempted"
        now, actions = lifecycle.step(lifecycle.Life(lifecycle.State(state)), release)
        assert (now.state, now.update_to, actions[-1]) == ("updating", "the next release",
                                                           "run_update")


def test_a_stop_request_before_the_start_is_kept_and_held() -> None:
    requested = lifecycle.Happened(lifecycle.Event.STOP_REQUESTED, detail="budget")
    now, actions = lifecycle.step(lifecycle.Life(lifecycle.State.STARTING), requested)
    assert (now.state, now.stop_reason, actions) == ("stopped", "budget",
                                                     ("publish_stopped",))
    assert lifecycle.step(now, "ONE_PASS")[1] == ("exit_preempted",)


def test_the_agent_is_wiring_and_no_agent_module_is_long() -> None:
    source = (DESIGN.parents[1] / "node_agent" / "agent.py").read_text()
    (agent_class,) = [node for node in ast.parse(source).body
                      if isinstance(node, ast.ClassDef) and node.name == "Agent"]
    assert agent_class.end_lineno is not None
    assert agent_class.end_lineno - agent_class.lineno + 1 <= 300
    for path in (DESIGN.parents[1] / "node_agent").glob("*.py"):
        assert path.read_text().count("\n") <= 800, path.name
