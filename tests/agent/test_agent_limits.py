"""Run-time limits, idle stops and stop requests (issue 36): the pure conditions
(node_agent/limits.py) and the real agent on loopback stopping a job with a save."""

from __future__ import annotations

import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from node_agent.contract import IDLE_STOP_KEY, STOP_REQUEST_KEY
from node_agent.limits import IDLE_DUTY_PERCENT, Limits, NodeView, StopConditions, node_started
from tests.agent.conftest import Node, stop

IDLE_TPU_INFO = """\
TPU Duty Cycle
Core ID   Duty Cycle (%)
0         0.00%
1         1.50%
"""


def fake_tpu_info(tmp_path: Path, text: str) -> Path:
    script = tmp_path / "tpu-info"
    script.write_text(f"#!/bin/sh\ncat <<'END'\n{text}END\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


# ---- through the real agent -------------------------------------------------------

def test_a_node_past_idle_stop_saves_before_it_goes(
        make_node: Callable[..., Node], stand_in: tuple[str, str], tmp_path: Path) -> None:
    # The job trains slowly: after its resume line it prints nothing for 6 s while the
    # TPU's duty cycle reads 0.75% (the mean over cores). idleStop 3 s: the agent stops
    # it and it saves step 1.
    out = tmp_path / "steps"
    node = make_node(*stand_in, {"standIn": "train", "out": str(out), "steps": 3,
                                 "stepSeconds": 6},
                     extra={IDLE_STOP_KEY: "3"},
                     env={"TPU_STACK_TPU_INFO": str(fake_tpu_info(tmp_path, IDLE_TPU_INFO))})

    result = node.boot(timeout=120)

    status = node.status_object()
    assert status is not None
    assert status["state"] == "stopped", (status, result.stdout[-2000:])
    assert status["message"].startswith("stopped (idleStop: no progress line for "), status
    assert "duty cycle at 0.75% (under 5% on every worker read; idleStop 3s)) after saving " \
           "step 1" in status["message"]
    assert status["stopSave"]["step"] == 1
    log = node.job_log()
    assert "tpu_training saved step=1 seconds=0.01 bytes=1 reason=stop" in log
    assert "tpu_training stopped_at=1" in log
    assert out.read_text() == "1", "the job saved where it stopped"
    assert log.count("starting job") == 1, "not started again"


def test_a_stop_request_set_on_the_running_node_stops_the_job_with_a_save(
        make_node: Callable[..., Node], stand_in: tuple[str, str], tmp_path: Path) -> None:
    out = tmp_path / "steps"
    node = make_node(*stand_in, {"standIn": "train", "out": str(out), "steps": 10_000,
                                 "stepSeconds": 0.2})
    boot = node.start()
    try:
        node.wait_for(lambda: node.guest.get("state") == "running"
                      and int(node.guest.get("step") or 0) >= 2, "a few steps")
        node.metadata.set_attributes({STOP_REQUEST_KEY: "budget vision: spend 1000.00 "
                                                         "reached the budget's stop"})
        boot.communicate(timeout=60)
    finally:
        stop(boot)

    status = node.status_object()
    assert status is not None and status["state"] == "stopped", status
    assert status["message"].startswith("stopped (stop requested: budget vision: spend "
                                        "1000.00 reached the budget's stop) after saving "
                                        "step "), status
    assert int(out.read_text()) == status["stopSave"]["step"] >= 2
    assert boot.returncode == 75


# ---- the pure conditions ----------------------------------------------------------

def view(job: bool = True, quiet: float = 0.0, duty: tuple[float | None, ...] = (),
         request: str = "", now: float = 1000.0) -> NodeView:
    return NodeView(started=0.0, job_running=job, last_progress=now - quiet if job else None,
                    duty_cycles=duty, stop_request=request)


def test_max_runtime_counts_the_nodes_whole_life_and_stays_due() -> None:
    conditions = StopConditions(Limits(max_runtime=3600))
    assert conditions.due(3599.0, view(now=3599.0)) is None
    reason = conditions.due(3600.0, view(now=3600.0))
    assert reason == "maxRuntime: the node has run 3600s of its 3600s"
    assert conditions.due(3601.0, view(job=False, now=3601.0)) == reason


@pytest.mark.parametrize(("duty", "quiet", "idle"), [
    ((0.0,), 599.0, False),  # quiet, but not for idleStop yet
    ((0.0,), 600.0, True),
    ((0.0, IDLE_DUTY_PERCENT), 900.0, False),  # a pod: one worker busy, not idle
    ((0.0, 2.0), 900.0, True),  # every worker idle
    ((None,), 900.0, False),  # unreadable: busy, for one more idleStop ...
    ((), 1199.0, False),
    ((None,), 1200.0, True),  # ... only
    ((0.0, None), 1000.0, False),  # a worker unreadable: busy for the bound
])
def test_idle_needs_no_progress_and_every_readable_worker_idle(
        duty: tuple[float | None, ...], quiet: float, idle: bool) -> None:
    conditions = StopConditions(Limits(idle_stop=600))
    reason = conditions.due(5000.0, view(quiet=quiet, duty=duty, now=5000.0))
    assert (reason is not None) == idle, reason
    if idle:
        assert reason.startswith(f"idleStop: no progress line for {quiet:.0f}s")


def test_no_job_holding_the_tpu_for_idle_stop_is_idle_and_a_job_resets_it() -> None:
    conditions = StopConditions(Limits(idle_stop=60))
    assert conditions.due(100.0, view(job=False, now=100.0)) is None
    assert conditions.due(130.0, view(job=True, now=130.0)) is None  # a job ran: reset
    assert conditions.due(140.0, view(job=False, now=140.0)) is None
    assert conditions.due(199.0, view(job=False, now=199.0)) is None
    assert conditions.due(200.0, view(job=False, now=200.0)) == (
        "idleStop: no job has held the TPU for 60s (idleStop 60s)")


def test_a_stop_request_holds_while_set_and_no_limit_means_no_polling() -> None:
    conditions = StopConditions(Limits())
    assert conditions.poll_seconds is None
    reason = conditions.due(1.0, view(request="budget nlp: over"))
    assert reason == "stop requested: budget nlp: over"
    assert conditions.due(2.0, view()) is None
    assert StopConditions(Limits(idle_stop=5)).poll_seconds == 1.0


def test_limits_come_from_metadata_and_the_node_start_is_kept(tmp_path: Path) -> None:
    limits = Limits.from_attributes({"tpu-stack-max-runtime": "86400",
                                     IDLE_STOP_KEY: "1800"})
    assert limits == Limits(max_runtime=86400.0, idle_stop=1800.0)
    assert Limits.from_attributes({IDLE_STOP_KEY: "soon"}) == Limits()
    assert node_started(tmp_path, 10.0) == 10.0
    assert node_started(tmp_path, 99.0) == 10.0  # a restart (or reboot) keeps it
