"""Where this process's seconds went, in the categories of Google's ML Goodput Measurement.

Standard library only: `__main__` starts the clock before TensorFlow loads, so the
import counts as program start-up. Every second of the process is in exactly one
category (docs/tpu-facts.md, "Goodput vocabulary"; docs/design.md, "Job stdout lines"):

- `tpu_init`: finding and initialising the TPU, with the job's own retries;
- `checkpoint_restore`, `checkpoint_save`: reading and writing checkpoints (and the export);
- `program_startup`: everything else before the first execution of this process has
  finished, so the import, the model, the input pipeline and the first execution's
  tracing and compilation (on a TPU the first execution is mostly XLA compilation).
  ml-goodput-measurement's program start-up is tracing, compilation and runtime
  initialisation; its training preparation (model, checkpoint manager) has no
  category of its own in the job's line and is counted here too
  (AI-Hypercomputer/ml-goodput-measurement README, "Badput Breakdown Details");
- `productive`: everything else after it: training steps, summaries, evaluation;
- after training and evaluation end (stopped or complete), `program_startup` again: the
  process winding down (the input pipeline's and the model's teardown took 25 s of a
  test's in-process run on a busy 2-core machine), as the agent counts a clean exit.

The agent adds what only it sees (waiting for data, progress lost to a disruption,
boot and recovery) and sums every category across restarts.

An `Observer` (tpu_training.goodput_recording, with `goodputRecording: true`) hears of
every timed block, every execution and the end of training, to mirror them as
ml-goodput-measurement events; this accounting stays the one tpuctl and dollars use.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Protocol

CATEGORIES = ("productive", "tpu_init", "program_startup", "checkpoint_save",
              "checkpoint_restore")


class Observer(Protocol):
    """Told of the job's phases as they end (seconds ago: how long since it began)."""

    def job_started(self, seconds_ago: float) -> None: ...
    def block(self, category: str, phase: str | None, seconds: float) -> None: ...
    def execution(self, first_step: int, steps: int, seconds: float) -> None: ...
    def trained(self, step: int) -> None: ...
    def finished(self) -> None: ...
    def close(self) -> None: ...


class Goodput:
    """Cumulative seconds per category of one process run."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._start = self._mark = clock()
        self._rest = "program_startup"  # where unclaimed seconds go
        self._seconds = dict.fromkeys(CATEGORIES, 0.0)
        self.observer: Observer | None = None

    def observe(self, observer: Observer) -> None:
        """Tell `observer` of every phase from now on, and when this process began."""
        self.observer = observer
        observer.job_started(self._clock() - self._start)

    @contextlib.contextmanager
    def timed(self, category: str, phase: str | None = None) -> Iterator[None]:
        """Count the block's seconds as `category`, the seconds before it as the rest.
        `phase` names a part of start-up for the observer (training_preparation,
        data_loading); the accounting only knows the category."""
        self._settle()
        began = self._mark
        try:
            yield
        finally:
            now = self._clock()
            self._seconds[category] += now - self._mark
            self._mark = now
            if self.observer is not None:
                self.observer.block(category, phase, now - began)

    def winding_down(self) -> None:
        """Training and evaluation are over (stopped or complete): the rest of the process
        (freeing the input pipeline and the model, the exit) is start-up again, as the
        agent counts a clean exit's unreported seconds (node_agent/goodput.py)."""
        self._settle()
        self._rest = "program_startup"

    def executed(self, first_step: int, steps: int, seconds: float) -> None:
        """An execution of `steps` steps from `first_step` took `seconds` (observer only)."""
        if self.observer is not None:
            self.observer.execution(first_step, steps, seconds)

    def trained(self, step: int) -> None:
        """Training of this process ended at `step`, its last save written (observer only)."""
        if self.observer is not None:
            self.observer.trained(step)

    def finished(self) -> None:
        """The job is complete (observer only)."""
        if self.observer is not None:
            self.observer.finished()

    def close(self) -> None:
        """The process's run is over: the observer writes what it holds and flushes."""
        if self.observer is not None:
            self.observer.close()

    def started_training(self) -> None:
        """The first execution has finished: from now on unclaimed seconds are productive."""
        self._settle()
        self._rest = "productive"

    def totals(self) -> dict[str, float]:
        """Seconds per category up to now."""
        self._settle()
        return dict(self._seconds)

    def line(self, step: int) -> str:
        """`goodput step=<N> productive=<s> …`, the job's stdout line (without its prefix)."""
        totals = self.totals()
        fields = " ".join(f"{name}={totals[name]:.3f}" for name in CATEGORIES)
        return f"goodput step={step} {fields}"

    def _settle(self) -> None:
        now = self._clock()
        self._seconds[self._rest] += now - self._mark
        self._mark = now
