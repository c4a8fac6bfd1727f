"""What a node's job did over time, read from what a rehearsal leaves (offline).

A rehearsal keeps, per node, the status objects its agents wrote (`status.json`, the
job's stdout as `job.log`: ops/tpu/rehearsal_record.py) and the job's checkpoint
folder. job.log lines carry no time, but the job prints its goodput line (every second
of its process in one category, docs/design.md "Goodput") after every step and save
line: their sum is the seconds the process has run. So the clock here is the job's own:
seconds of job processes, one after the other (a restart's `started` line begins a new
process, which continues the clock); the agent's seconds between processes (boot,
installs, restarts) are in its status totals, not on this axis.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from model import spend
from model.fleet import StackTarget
from model.meter import price_table
from ops.tpu import rehearsal_record as record

STARTED = "tpu_training started"
STEP_LINE = re.compile(r"tpu_training step=(\d+) loss=(\S+)")
SAVED_LINE = re.compile(r"tpu_training saved step=(\d+) ")
GOODPUT_LINE = re.compile(r"tpu_training goodput step=(\d+) (.*)")
GOODPUT_FIELD = re.compile(r"(\w+)=([\d.]+)")


@dataclass
class Series:
    """(seconds, value) points of one quantity, in time order."""

    name: str
    unit: str
    points: list[tuple[float, float]] = field(default_factory=list)


@dataclass
class NodeHistory:
    """One node's job over the job's seconds: step, loss, goodput (its own accounting so
    far) and spend (the node's list price over those seconds), its saves and restarts."""

    node: str
    accelerator_type: str
    spot: bool
    hourly_usd: float | None
    step: Series = field(default_factory=lambda: Series("step", "step"))
    loss: Series = field(default_factory=lambda: Series("loss", "loss"))
    goodput: Series = field(default_factory=lambda: Series("goodput", "%"))
    spend: Series = field(default_factory=lambda: Series("spend", "USD"))
    saves: list[tuple[float, int]] = field(default_factory=list)  # (seconds, step)
    restarts: list[float] = field(default_factory=list)  # seconds a new process began
    status: dict[str, object] = field(default_factory=dict)  # worker 0's last status
    checkpoints: list[int] = field(default_factory=list)  # the checkpoint folder's steps

    def series(self) -> list[Series]:
        return [self.step, self.loss, self.goodput, self.spend]


class JobClock:
    """The job's seconds from its goodput lines, continued across its processes."""

    def __init__(self) -> None:
        self.earlier = 0.0  # seconds of the processes before this one
        self.process = 0.0  # this process's seconds at its last goodput line
        self.earlier_productive = 0.0
        self.productive = 0.0

    @property
    def now(self) -> float:
        return self.earlier + self.process

    def restart(self) -> None:
        self.earlier, self.process = self.now, 0.0
        self.earlier_productive, self.productive = self.earlier_productive + self.productive, 0.0

    def goodput(self, fields: dict[str, float]) -> float | None:
        """Move the clock to a goodput line; the goodput percent so far."""
        self.process = sum(fields.values())
        self.productive = fields.get("productive", 0.0)
        return 100.0 * (self.earlier_productive + self.productive) / self.now if self.now else None


def read_job_log(lines: Iterable[str], history: NodeHistory) -> None:
    """Fill `history`'s series from the job's stdout lines. A step or saved line takes
    the time of the goodput line printed right after it."""
    clock, waiting = JobClock(), []
    for line in lines:
        if line.startswith(STARTED):
            clock.restart()
            history.restarts.append(clock.now)
        elif match := STEP_LINE.match(line):
            waiting.append(("step", int(match[1]), _number(match[2])))
        elif match := SAVED_LINE.match(line):
            waiting.append(("saved", int(match[1]), None))
        elif match := GOODPUT_LINE.match(line):
            percent = clock.goodput({name: float(value)
                                     for name, value in GOODPUT_FIELD.findall(match[2])})
            _place(history, waiting, clock, percent)
            waiting = []
    history.restarts = history.restarts[1:]  # the first process is a start, not a restart


def _place(history: NodeHistory, waiting: list[tuple[str, int, float | None]],
           clock: JobClock, percent: float | None) -> None:
    now = clock.now
    for kind, step, loss in waiting:
        if kind == "saved":
            history.saves.append((now, step))
            continue
        history.step.points.append((now, float(step)))
        if loss is not None:
            history.loss.points.append((now, loss))
    if percent is not None:
        history.goodput.points.append((now, percent))
    if history.hourly_usd is not None:
        if not history.spend.points:  # nothing is spent before the job's first second
            history.spend.points.append((0.0, 0.0))
        history.spend.points.append((now, history.hourly_usd * now / 3600.0))


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if value == value and abs(value) != float("inf") else None  # NaN, inf


def checkpoint_steps(folder: Path) -> list[int]:
    """The steps of the checkpoints the rehearsal's job left (`ckpt-<N>.index`, the
    CheckpointManager's names) anywhere under the node's folder."""
    steps = {int(name[5:-6]) for path in folder.rglob("ckpt-*.index")
             if (name := path.name)[5:-6].isdigit()}
    return sorted(steps)


def node_history(folder: Path, target: StackTarget) -> NodeHistory | None:
    """One rehearsed node's history; None for a folder of a node the stack no longer has."""
    status = record.worker0_status(folder)
    node = target.expected(str(status.get("node", "")))
    if node is None:
        return None
    accelerator_type = node.tpu.accelerator_type
    history = NodeHistory(node.node_id, accelerator_type, node.spot,
                          spend.hourly_usd(price_table(), accelerator_type, node.spot),
                          status=status, checkpoints=checkpoint_steps(folder))
    log = record.job_log(folder, 0)
    if log.is_file():
        read_job_log(log.read_text(errors="replace").splitlines(), history)
    return history


def stack_history(target: StackTarget, stack_dir: Path) -> list[NodeHistory]:
    """Every rehearsed node of the stack, by node id."""
    found = (node_history(folder, target) for folder in record.node_folders(stack_dir))
    return sorted((history for history in found if history is not None),
                  key=lambda history: history.node)


def agent_goodput(history: NodeHistory) -> dict[str, object]:
    """The agent's goodput totals in the node's status (every category, restarts too)."""
    goodput = history.status.get("goodput")
    if isinstance(goodput, str):
        try:
            goodput = json.loads(goodput)
        except ValueError:
            return {}
    return goodput if isinstance(goodput, dict) else {}
