"""Deadlines per phase of a job, timed from its own stdout lines (docs/design.md, "Deadlines")."""

# Pure: no process, no clock of its own (every call takes `now`), so the decision is
# unit-tested without a job. `job.Job` feeds it the job's lines and the agent asks it,
# once a second, whether the phase under way has passed its deadline.
#
# A phase's deadline counts from the job's last progress line (any `tpu_training ...`
# line of the stdout contract; the process's start before the first one):
#
# - `tpu_init`, from the process's start to `tpu_ready`: the job's own bound on TPU
#   initialisation (`tpu_init_seconds` on its `started` line, from
#   `TPU_STACK_TPU_INIT_SECONDS`) plus a grace for TensorFlow's import and the last attempt;
# - `first_execution`, to the first `step=` line: reading the first records, the model,
#   the restore, tracing and compilation: generous;
# - `execution`: a multiple of the longest execution measured (step line to step line),
#   never under a floor; the first execution's deadline until one is measured;
# - `final`, after the step line at `trainSteps`: the final save, evaluation, the export:
#   as the first execution;
# - `stop`, from the agent's SIGTERM, whatever the job prints then (`job.Job.stop`):
#   then SIGKILL.
#
# `progressDeadlineSeconds` (the job's key), when set, is the deadline of every phase
# after `tpu_init`; the stop's never passes STOP_CEILING_SECONDS, inside the unit's
# TimeoutStopSec. Any `tpu_training ...` line is progress: the job's evaluation prints
# `eval_progress step=<N> batch=<i>` (seam S1) at least every 10 s, so `final` restarts its
# deadline on each.

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

PHASES = ("tpu_init", "first_execution", "execution", "final", "stop")

# The job's default for TPU_STACK_TPU_INIT_SECONDS (tpu_training.config). The job
# announces its bound on its `started` line; this is assumed only until that line
# comes (an older package never sends it).
ASSUMED_TPU_INIT_SECONDS = 300.0
# Above the job's own bound: TensorFlow's import (tens of seconds on a busy VM) and the
# attempt under way when the bound passes (the job's retry pauses reach 30 s).
TPU_INIT_GRACE_SECONDS = 120.0
# Reading the first records, building the model, restoring, tracing and XLA compilation
# (minutes for the package's models, unconfirmed): far above that, and under the half
# hour users' own watchdogs wait (issue 31).
FIRST_EXECUTION_SECONDS = 1200.0
# Each later execution: this many times the longest one measured, never under the floor
# (a checkpoint write the loop waits for, a summary flush to GCS, a pause of the host).
EXECUTION_MULTIPLE = 5.0
EXECUTION_FLOOR_SECONDS = 60.0
# SIGTERM to SIGKILL: the agent's stop grace (job.STOP_GRACE_SECONDS keeps this value).
STOP_SECONDS = 120.0
# The unit's TimeoutStopSec (bootstrap.sh; tests/agent/test_deadlines.py holds them equal):
# systemd SIGKILLs the whole cgroup that long after its SIGTERM (systemd.service(5),
# TimeoutStopSec=). The stop deadline, whatever progressDeadlineSeconds or the
# environment say, leaves room inside it for the agent's last status upload
# (status.FLUSH_WAIT_SECONDS) and its exit.
UNIT_STOP_TIMEOUT_SECONDS = 150.0
STOP_CEILING_SECONDS = UNIT_STOP_TIMEOUT_SECONDS - 20.0
# After the stack signal, before SIGTERM: the job's faulthandler writes at once; this is
# for the agent's reader to take the lines into job.log.
STACKS_WAIT_SECONDS = 2.0

# The agent's environment may shorten any of them (tests, the bench).
ENVIRONMENT = {
    "tpu_init_grace": "TPU_STACK_TPU_INIT_GRACE_SECONDS",
    "first_execution": "TPU_STACK_FIRST_EXECUTION_DEADLINE_SECONDS",
    "execution_multiple": "TPU_STACK_EXECUTION_DEADLINE_MULTIPLE",
    "execution_floor": "TPU_STACK_EXECUTION_DEADLINE_FLOOR_SECONDS",
    "stop": "TPU_STACK_STOP_DEADLINE_SECONDS",
    "stacks_wait": "TPU_STACK_STACKS_WAIT_SECONDS",
}


@dataclasses.dataclass(frozen=True)
class Deadlines:
    """The seconds each phase may go without a progress line."""

    tpu_init_grace: float = TPU_INIT_GRACE_SECONDS
    first_execution: float = FIRST_EXECUTION_SECONDS
    execution_multiple: float = EXECUTION_MULTIPLE
    execution_floor: float = EXECUTION_FLOOR_SECONDS
    stop: float = STOP_SECONDS
    stacks_wait: float = STACKS_WAIT_SECONDS
    progress: float | None = None  # the job's progressDeadlineSeconds

    @classmethod
    def for_job(cls, job: Mapping[str, object], environ: Mapping[str, str]) -> Deadlines:
        """The job's deadlines: its `progressDeadlineSeconds`, the environment's
        overrides (a value that is not a number > 0 is ignored), else the defaults."""
        values: dict[str, float] = {}
        for field, variable in ENVIRONMENT.items():
            if (seconds := positive(environ.get(variable))) is not None:
                values[field] = seconds
        progress = job.get("progressDeadlineSeconds")
        if isinstance(progress, (int, float)) and not isinstance(progress, bool) and progress > 0:
            values["progress"] = float(progress)
        return cls(**values)

    def of(self, phase: str, *, tpu_init_seconds: float, longest_execution: float | None) -> float:
        """The deadline of `phase`, given the job's bound on TPU initialisation and the
        longest execution measured so far (None: none yet)."""
        if phase == "tpu_init":
            return tpu_init_seconds + self.tpu_init_grace
        if phase == "stop":
            return min(self.progress or self.stop, STOP_CEILING_SECONDS)
        if self.progress is not None:
            return self.progress
        if phase == "execution" and longest_execution is not None:
            return max(self.execution_floor, self.execution_multiple * longest_execution)
        return self.first_execution


def positive(text: str | None) -> float | None:
    try:
        value = float(text) if text else None
    except ValueError:
        return None
    return value if value is not None and 0 < value < float("inf") else None


@dataclasses.dataclass(frozen=True)
class Hang:
    """A phase that passed its deadline: `seconds` without a progress line."""

    phase: str
    seconds: float
    deadline: float

    def view(self) -> dict[str, object]:
        return {"phase": self.phase, "seconds": round(self.seconds, 1),
                "deadline": round(self.deadline, 1)}


class PhaseClock:
    """The phase a job is in and when it last made progress, from its lines."""

    def __init__(self, deadlines: Deadlines, train_steps: int, now: float):
        self.deadlines = deadlines
        self.train_steps = train_steps
        self.phase = "tpu_init"
        self.last_progress = now
        self.tpu_init_seconds = ASSUMED_TPU_INIT_SECONDS
        self.executions = 0
        self.last_execution_at: float | None = None
        self.longest_execution: float | None = None

    def started(self, tpu_init_seconds: float | None, now: float) -> None:
        """The job's `started` line: its own bound on TPU initialisation."""
        if tpu_init_seconds is not None and tpu_init_seconds >= 0:
            self.tpu_init_seconds = tpu_init_seconds
        self.progressed(now)

    def tpu_ready(self, now: float) -> None:
        if self.phase == "tpu_init":
            self.phase = "first_execution"
        self.progressed(now)

    def executed(self, executions: int, step: int, now: float) -> None:
        """A `step=` line: the job's `executions`-th of this process, at `step`."""
        if executions > self.executions and self.phase != "stop":
            if self.last_execution_at is not None and self.executions > 0:
                took = now - self.last_execution_at
                self.longest_execution = max(self.longest_execution or 0.0, took)
            self.executions, self.last_execution_at = executions, now
            self.phase = "final" if step >= self.train_steps else "execution"
        self.progressed(now)

    def progressed(self, now: float) -> None:
        self.last_progress = max(self.last_progress, now)

    def stopping(self, now: float) -> None:
        """The agent sent SIGTERM: the stop deadline counts from now."""
        self.phase = "stop"
        self.progressed(now)

    def deadline(self) -> float:
        return self.deadlines.of(self.phase, tpu_init_seconds=self.tpu_init_seconds,
                                 longest_execution=self.longest_execution)

    def since_progress(self, now: float) -> float:
        return max(0.0, now - self.last_progress)

    def overdue(self, now: float) -> Hang | None:
        """The hang, once the phase under way has gone past its deadline (never in
        `stop`: that deadline is the SIGKILL's, which the stop itself enforces)."""
        deadline, seconds = self.deadline(), self.since_progress(now)
        if self.phase == "stop" or seconds <= deadline:
            return None
        return Hang(self.phase, seconds, deadline)


# A pod's TensorFlow client names the worker it lost as a task of the job `worker`
# (tensorflow/python/distribute/cluster_resolver/tpu/tpu_cluster_resolver.py,
# `TPUClusterResolver(job_name='worker')`: one task per address of TPU_NAME, which the
# agent lists in `worker-network-endpoints` order; TF's RPC errors name the remote
# target "/job:worker/replica:0/task:<n>"; the wording of a dead runtime's error on a
# TPU pod is unconfirmed), or by its address.
TASK = re.compile(r"/job:worker/replica:\d+/task:(\d+)")


def named_worker(lines: Iterable[str], endpoints: str) -> str | None:
    """The pod worker the job's last lines name ("worker 2 (10.130.0.6)"), newest
    first; None when they name none. `endpoints`: `worker-network-endpoints`, worker 0
    first (`<a>:<b>:<ip>,...`)."""
    ips = [entry.rsplit(":", 1)[-1] for entry in endpoints.split(",") if entry.strip()]
    for line in reversed(list(lines)):
        if match := TASK.search(line):
            number = int(match[1])
            address = f" ({ips[number]})" if number < len(ips) else ""
            return f"worker {number}{address}"
        for number, ip in enumerate(ips):
            if re.search(rf"(?<![\d.]){re.escape(ip)}(?![\d])", line):
                return f"worker {number} ({ip})"
    return None


def hang_message(hang: Hang, stacks: bool, worker: str | None) -> str:
    """The status message of a hung job."""
    where = (f"no progress line for {hang.seconds:.0f}s in phase {hang.phase} "
             f"(deadline {hang.deadline:.0f}s)")
    said = f"; the job's last lines name {worker}: its TPU runtime may have died" \
        if worker else ""
    how = "its stacks are in job.log; stopping it" if stacks else \
        "the job registers no stack signal; stopping it"
    return f"{where}{said}; {how} to restart from the last checkpoint"
