"""When a node stops working for good: its run-time limit, an idle TPU, a stop request.

Pure (docs/design.md, "Run-time limits, idle stops and stop requests"): the agent polls
`StopConditions.due(now, view)` once a second with what it sees (`NodeView`) and gets
None, or the reason, which names the condition first (`maxRuntime: ...`, `idleStop:
...`, `stop requested: ...`). The agent then stops the job with a save, as it does on a
preemption notice, and does not start it again while the reason holds; the node itself
is deleted from outside (the budget-stop function, `tpuctl janitor`), since an agent
cannot delete the VM it runs on.

- `maxRuntime` (metadata `tpu-stack-max-runtime`, seconds): the node's whole life, counted
  from the agent's first start on it (`node_started`, kept on the node's disk: a reboot
  keeps it, a new node starts again).
- `idleStop` (metadata `tpu-stack-idle-stop`, seconds): no job holding the TPU for that
  long; or the job printed no progress line for that long and the TPU's duty cycle is
  under IDLE_DUTY_PERCENT on every worker the agent can read. A duty cycle it cannot read
  (no `tpu-info`, node_agent/runtime_metrics.py) counts as busy for one more `idleStop`
  only: past twice `idleStop` without a progress line the node is idle whatever it says.
- A stop request (metadata `tpu-stack-stop`, any text: the budget-stop function sets it
  through the TPU API, functions/budget_stop) holds for as long as the key is set.

maxRuntime and idleStop, once due, stay due (the agent does not start the job again).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from node_agent.contract import IDLE_STOP_KEY, MAX_RUNTIME_KEY

# Under this mean duty cycle a TPU does no work worth keeping it for. Our own choice,
# not a Google figure (unconfirmed what an input-bound job's duty cycle dips to: a job
# whose progress lines stop is also judged by its deadlines, node_agent/deadlines.py).
IDLE_DUTY_PERCENT = 5.0
NODE_STARTED_FILE = "node-started"


@dataclass(frozen=True)
class Limits:
    max_runtime: float | None = None  # seconds of the node's life
    idle_stop: float | None = None  # seconds without progress

    @classmethod
    def from_attributes(cls, attributes: Mapping[str, str]) -> Limits:
        return cls(_seconds(attributes.get(MAX_RUNTIME_KEY)),
                   _seconds(attributes.get(IDLE_STOP_KEY)))

    @property
    def any(self) -> bool:
        return self.max_runtime is not None or self.idle_stop is not None


def _seconds(text: str | None) -> float | None:
    """A positive whole number of seconds, else None (the stack writes only those)."""
    text = (text or "").strip()
    return float(text) if text.isdigit() and int(text) > 0 else None


@dataclass(frozen=True)
class NodeView:
    """What the agent sees now, every time on the same clock (seconds since the epoch)."""

    started: float  # the node's life began (node_started)
    job_running: bool
    last_progress: float | None = None  # the running job's last progress line (or start)
    duty_cycles: tuple[float | None, ...] = ()  # per worker read; None: unreadable
    stop_request: str = ""


class StopConditions:
    def __init__(self, limits: Limits):
        self.limits = limits
        self._idle_since: float | None = None  # no job holding the TPU since
        self._latched: str | None = None

    @property
    def poll_seconds(self) -> float | None:
        """How often the agent must look even when nothing wakes it (None: never)."""
        return 1.0 if self.limits.any else None

    def quiet_for(self, now: float, view: NodeView) -> float:
        """Seconds the running job has gone without a progress line (0 when none runs)."""
        if not view.job_running or view.last_progress is None:
            return 0.0
        return max(0.0, now - view.last_progress)

    def wants_duty_cycle(self, now: float, view: NodeView) -> bool:
        """Whether the duty cycle matters now: the job is quiet past idleStop."""
        idle_stop = self.limits.idle_stop
        return idle_stop is not None and self.quiet_for(now, view) >= idle_stop

    def due(self, now: float, view: NodeView) -> str | None:
        if view.stop_request.strip():
            return f"stop requested: {view.stop_request.strip()}"
        if self._latched is None:
            self._latched = self._max_runtime(now, view) or self._idle(now, view)
        return self._latched

    def _max_runtime(self, now: float, view: NodeView) -> str | None:
        limit = self.limits.max_runtime
        if limit is None or now - view.started < limit:
            return None
        return f"maxRuntime: the node has run {now - view.started:.0f}s of its {limit:.0f}s"

    def _idle(self, now: float, view: NodeView) -> str | None:
        idle_stop = self.limits.idle_stop
        if idle_stop is None:
            return None
        if not view.job_running:
            self._idle_since = now if self._idle_since is None else self._idle_since
            if now - self._idle_since >= idle_stop:
                return (f"idleStop: no job has held the TPU for {now - self._idle_since:.0f}s "
                        f"(idleStop {idle_stop:.0f}s)")
            return None
        self._idle_since = None
        quiet = self.quiet_for(now, view)
        if quiet < idle_stop:
            return None
        readings = view.duty_cycles or (None,)
        if any(duty is not None and duty >= IDLE_DUTY_PERCENT for duty in readings):
            return None  # a worker's TPU is working: every worker must agree it is idle
        if all(duty is not None for duty in readings):
            busiest = max(duty for duty in readings if duty is not None)
            return (f"idleStop: no progress line for {quiet:.0f}s and the TPU's duty cycle at "
                    f"{busiest:g}% (under {IDLE_DUTY_PERCENT:g}% on every worker read; "
                    f"idleStop {idle_stop:.0f}s)")
        if quiet >= 2 * idle_stop:
            return (f"idleStop: no progress line for {quiet:.0f}s and the TPU's duty cycle "
                    f"unreadable (busy for one more idleStop at most; idleStop "
                    f"{idle_stop:.0f}s)")
        return None


def node_started(root: Path, now: float) -> float:
    """When the agent first ran on this node: written once on the node's disk."""
    path = root / NODE_STARTED_FILE
    try:
        return float(path.read_text().strip())
    except (OSError, ValueError):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{now:.3f}\n")
        return now
