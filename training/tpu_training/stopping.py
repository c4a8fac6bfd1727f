"""SIGTERM as "save now": a flag the training loop checks between executions.

Standard library only, so `__main__` can install it before TensorFlow loads (a
SIGTERM during the import would otherwise kill the job without a checkpoint).

The node agent sends SIGTERM the moment `instance/preempted` or
`instance/maintenance-event` changes; a spot or preemptible VM powers off 30 s after
its ACPI soft-off, a standard VM 120 s after (Compute Engine API, `Scheduling.
skipGuestOsShutdown`; docs/tpu-facts.md, "Preemption notice"), so the execution
under way and the stop save must fit in that.

Why not TF's `PreemptionCheckpointHandler` (read in TF 2.18 and 2.20,
tensorflow/python/distribute/failure_handling/failure_handling.py): on a Cloud TPU VM
`failure_handling_util.detect_platform()` answers `GCE_TPU` (the metadata server
answers and TPU devices exist); for `GCE_TPU` the constructor only logs "does not
support usage with TPU or CPU device on GCP", `run()` calls the train function
unchanged and `save_checkpoint_if_preempted()` returns without looking. Its
TPUStrategy support is for `INTERNAL_TPU` (Google's own clusters, the
`check_preemption` op). Its GCE watcher also reads only `instance/maintenance-event`,
never `instance/preempted`. So the job handles SIGTERM itself.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType


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
