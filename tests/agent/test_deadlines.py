"""Deadlines per phase (node_agent/deadlines.py): the decision, without a process."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from node_agent import build, deadlines, goodput, job_lines, status
from node_agent.contract import EXIT_PREEMPTED
from node_agent.deadlines import Deadlines, Hang, PhaseClock, hang_message, named_worker

ENDPOINTS = "unknown:unknown:10.130.0.4,unknown:unknown:10.130.0.5,unknown:unknown:10.130.0.40"


def test_defaults_and_the_documented_values() -> None:
    d = Deadlines.for_job({}, {})
    assert (d.tpu_init_grace, d.first_execution, d.execution_multiple, d.execution_floor,
            d.stop, d.progress) == (120.0, 1200.0, 5.0, 60.0, 120.0, None)
    assert d.of("tpu_init", tpu_init_seconds=300, longest_execution=None) == 420
    assert d.of("first_execution", tpu_init_seconds=300, longest_execution=None) == 1200
    # No execution measured yet: the second one may be as long as the first.
    assert d.of("execution", tpu_init_seconds=300, longest_execution=None) == 1200
    assert d.of("execution", tpu_init_seconds=300, longest_execution=4) == 60  # the floor
    assert d.of("execution", tpu_init_seconds=300, longest_execution=30) == 150
    assert d.of("final", tpu_init_seconds=300, longest_execution=30) == 1200
    assert d.of("stop", tpu_init_seconds=300, longest_execution=30) == 120


def test_progress_deadline_is_every_phase_after_tpu_initialisation() -> None:
    d = Deadlines.for_job({"progressDeadlineSeconds": 45}, {})
    for phase in ("first_execution", "execution", "final", "stop"):
        assert d.of(phase, tpu_init_seconds=300, longest_execution=30) == 45
    assert d.of("tpu_init", tpu_init_seconds=300, longest_execution=None) == 420


def test_the_tpu_init_deadline_follows_the_bound_the_job_announces() -> None:
    clock = PhaseClock(Deadlines(), 100, now=0.0)
    assert clock.deadline() == deadlines.ASSUMED_TPU_INIT_SECONDS + 120  # until it says
    clock.started(30.0, now=1.0)
    assert clock.deadline() == 150
    assert clock.overdue(now=150.0) is None
    assert clock.overdue(now=152.0) == Hang("tpu_init", 151.0, 150.0)


def test_environment_overrides_and_ignores_what_is_not_a_positive_number() -> None:
    environ = {"TPU_STACK_FIRST_EXECUTION_DEADLINE_SECONDS": "15",
               "TPU_STACK_EXECUTION_DEADLINE_FLOOR_SECONDS": "soon",
               "TPU_STACK_EXECUTION_DEADLINE_MULTIPLE": "-2",
               "TPU_STACK_STOP_DEADLINE_SECONDS": "5", "TPU_STACK_STACKS_WAIT_SECONDS": "0.5"}
    d = Deadlines.for_job({"progressDeadlineSeconds": True}, environ)  # a bool is no number
    assert (d.first_execution, d.execution_floor, d.execution_multiple, d.stop,
            d.stacks_wait, d.progress) == (15.0, 60.0, 5.0, 5.0, 0.5, None)


def _training(clock: PhaseClock, executions: list[float], start: float = 10.0) -> float:
    """tpu_ready at 0, then step lines at `start` + the cumulative `executions`."""
    clock.started(300, now=0.0)
    clock.tpu_ready(now=0.0)
    now = start
    for number, seconds in enumerate([0.0, *executions], start=1):
        now += seconds
        clock.executed(number, number * 10, now)
    return now


def test_a_slow_first_execution_is_judged_by_its_own_deadline() -> None:
    clock = PhaseClock(Deadlines(first_execution=15, execution_floor=1, execution_multiple=2),
                       80, now=0.0)
    clock.started(300, now=0.0)
    clock.tpu_ready(now=0.0)
    assert clock.phase == "first_execution"
    assert clock.overdue(now=14.0) is None  # 14 s without a line: above any later floor
    assert clock.overdue(now=15.5) == Hang("first_execution", 15.5, 15.0)


def test_an_execution_hangs_past_a_multiple_of_the_longest_measured() -> None:
    clock = PhaseClock(Deadlines(execution_floor=1, execution_multiple=3), 1000, now=0.0)
    last = _training(clock, [2.0, 4.0, 3.0])
    assert clock.phase == "execution"
    assert clock.longest_execution == 4.0
    assert clock.overdue(now=last + 12.0) is None
    assert clock.overdue(now=last + 12.5) == Hang("execution", 12.5, 12.0)
    clock.progressed(now=last + 12.0)  # a `saved` line is progress too
    assert clock.overdue(now=last + 12.5) is None


def test_the_floor_holds_for_short_executions_and_after_the_last_step_the_final_phase() -> None:
    clock = PhaseClock(Deadlines(), 30, now=0.0)
    last = _training(clock, [0.1, 0.1])
    assert clock.phase == "final"  # step 30 = trainSteps: save, evaluation, export
    assert clock.deadline() == 1200
    clock = PhaseClock(Deadlines(), 1000, now=0.0)
    last = _training(clock, [0.1, 0.1])
    assert clock.deadline() == 60
    assert clock.overdue(now=last + 59) is None


def test_a_stopping_job_is_never_overdue_its_deadline_is_the_kill() -> None:
    clock = PhaseClock(Deadlines(stop=5), 1000, now=0.0)
    _training(clock, [1.0, 1.0])
    clock.stopping(now=100.0)
    clock.executed(4, 40, now=101.0)  # the execution under way ends after the SIGTERM
    assert clock.phase == "stop"
    assert clock.deadline() == 5
    assert clock.overdue(now=10_000.0) is None


def test_the_job_lines_feed_the_phases() -> None:
    run = job_lines.JobRun()
    said = [run.read(line) for line in (
        "tpu_training started stacks=SIGUSR1 tpu_init_seconds=42",
        "2026-12-04 W tensorflow/core/...: some log line",
        "tpu_training tpu_ready replicas=8",
        "tpu_training resumed_from=0", "tpu_training step=5 loss=1.0",
        "tpu_training stopped_at=5")]
    assert said == ["started", None, "ready", "step", "step", "step"]
    assert (run.stacks_signal, run.tpu_init_seconds, run.executions) == ("SIGUSR1", 42.0, 1)
    assert list(run.recent) == ["2026-12-04 W tensorflow/core/...: some log line"]


@pytest.mark.parametrize(("lines", "named"), [
    (["UnavailableError: Socket closed", "Additional GRPC error information from remote "
      "target /job:worker/replica:0/task:2: connection reset"], "worker 2 (10.130.0.40)"),
    (["failed to connect to all addresses; last error: 10.130.0.5:8470: Connection refused"],
     "worker 1 (10.130.0.5)"),
    (["/job:worker/replica:0/task:1 gone", "then /job:worker/replica:0/task:0 gone"],
     "worker 0 (10.130.0.4)"),  # the newest line speaks
    (["10.130.0.400 is another address", "nothing here"], None),
    (["Socket closed"], None),
])
def test_a_worker_is_named_when_the_jobs_lines_name_it(lines: list[str], named: str | None) -> None:
    assert named_worker(lines, ENDPOINTS) == named


def test_the_message_says_phase_seconds_deadline_and_the_worker() -> None:
    hang = Hang("execution", 75.4, 60.0)
    assert hang_message(hang, True, "worker 2 (10.130.0.40)") == (
        "no progress line for 75s in phase execution (deadline 60s); the job's last lines "
        "name worker 2 (10.130.0.40): its TPU runtime may have died; its stacks are in "
        "job.log; stopping it to restart from the last checkpoint")
    assert "registers no stack signal" in hang_message(hang, False, None)


def test_a_hung_run_loses_its_hung_seconds_whatever_its_phase() -> None:
    run = job_lines.JobRun()
    for line in ("tpu_training started stacks=SIGUSR1 tpu_init_seconds=300",
                 "tpu_training tpu_ready replicas=1"):
        run.read(line)
    run.hang = Hang("first_execution", 11.0, 10.0).view() | {"lost": 24.0}
    added = goodput.settle_run(run, -9, wall=40.0)
    assert added["lost_progress"] == 24.0
    assert added["program_startup"] == 16.0
    added = goodput.settle_run(run, EXIT_PREEMPTED, wall=20.0)  # never more than unreported
    assert added["lost_progress"] == 20.0


def test_the_stop_deadline_stays_inside_the_units_stop_timeout() -> None:
    unit_timeout = float(build.HERE.joinpath("bootstrap.sh").read_text()
                         .split("TimeoutStopSec=", 1)[1].split()[0])
    assert unit_timeout == deadlines.UNIT_STOP_TIMEOUT_SECONDS
    longest = Deadlines.for_job({"progressDeadlineSeconds": 3600},
                                {"TPU_STACK_STOP_DEADLINE_SECONDS": "900"})
    assert longest.of("final", tpu_init_seconds=300, longest_execution=None) == 3600
    stop = longest.of("stop", tpu_init_seconds=300, longest_execution=None)
    # The stop, then the last status upload (bounded), then the agent's exit.
    assert stop + status.FLUSH_WAIT_SECONDS < unit_timeout


def test_evaluation_progress_restarts_the_final_deadline(tmp_path: Path) -> None:
    from node_agent.job import Job
    from node_agent.supervise import Loops

    recorded = SimpleNamespace(append_job_line=lambda line: None,
                               progress=lambda **fields: None)
    job = Job(tmp_path, recorded, Loops())  # type: ignore[arg-type]
    job.clock = PhaseClock(Deadlines(), 24, now=0.0)
    job._take(b"tpu_training step=24 loss=0.1\n")  # the last step: `final` begins
    assert job.clock.phase == "final"
    before = job.clock.last_progress
    job._take(b"tpu_training eval_progress step=24 batch=3\n")  # seam S1
    assert job.clock.last_progress > before
    assert job.clock.phase == "final"
    assert job.run.step == 24  # the evaluated step is not a training step
