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
- `productive`: everything else after it: training steps, summaries, evaluation.

The agent adds what only it sees (waiting for data, progress lost to a disruption,
boot and recovery) and sums every category across restarts.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

CATEGORIES = ("productive", "tpu_init", "program_startup", "checkpoint_save",
              "checkpoint_restore")


class Goodput:
    """Cumulative seconds per category of one process run."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._mark = clock()
        self._rest = "program_startup"  # where unclaimed seconds go
        self._seconds = dict.fromkeys(CATEGORIES, 0.0)

    @contextlib.contextmanager
    def timed(self, category: str) -> Iterator[None]:
        """Count the block's seconds as `category`, the seconds before it as the rest."""
        self._settle()
        try:
            yield
        finally:
            now = self._clock()
            self._seconds[category] += now - self._mark
            self._mark = now

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
