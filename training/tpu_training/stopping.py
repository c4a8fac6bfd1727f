"""SIGTERM as "save now": a flag the training loop checks between executions.

Standard library only, so `__main__` can install it before TensorFlow loads (a
SIGTERM during the import would otherwise kill the job without a checkpoint).
Cloud TPU documents no preemption notice for spot TPUs and TF's
`PreemptionCheckpointHandler` does nothing on TPU VMs (docs/tpu-facts.md, "On the VM"
and "TensorFlow on TPU"), so the job handles SIGTERM itself.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped after saving; run again to resume


class StopFlag:
    """Records that a stop signal arrived; never interrupts the work under way."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signal is not None

    def install(self, signals: tuple[int, ...] = (signal.SIGTERM,)) -> StopFlag:
        """Handle `signals` from now on (a no-op outside the main thread)."""
        if threading.current_thread() is threading.main_thread():
            for signum in signals:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signal = signum
