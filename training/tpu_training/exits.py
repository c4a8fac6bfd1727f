"""The job's exit codes and the errors that choose them (docs/design.md, "Exit codes").

Standard library only: `__main__` maps errors to codes before and after TensorFlow
loads, and the node agent maps the codes to states and retries. Codes follow BSD's
sysexits.h where one fits.
"""

from __future__ import annotations

from tpu_training.config import JobConfigError

EXIT_FINISHED = 0
EXIT_FAILED = 1  # anything else: the agent retries with backoff (docs/design.md)
EXIT_USAGE = 2  # a bad setting or usage: permanent
EXIT_DATA = 65  # EX_DATAERR: records that do not fit the model, malformed records: permanent
EXIT_NO_INPUT = 66  # EX_NOINPUT: the training data matches no file yet: transient
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE: TPU not ready or held, storage 5xx: transient
EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped on a stop signal after saving; run again to resume
EXIT_STOP_SAVE_FAILED = 76  # stopped on a stop signal, but the stop save failed


class RecordsError(JobConfigError):
    """Records that do not fit the model, or are not records at all (exit 65)."""


class NoDataError(JobConfigError):
    """A data pattern matches no file yet (exit 66); the agent waits and retries."""

    def __init__(self, key: str, pattern: str):
        self.pattern = pattern
        super().__init__([(key, f"no files match {pattern!r}")])


class UnavailableError(RuntimeError):
    """A transient failure outside the job (exit 69): the TPU, or storage answering 5xx."""


class TpuBusyError(UnavailableError):
    """Another process holds the TPU (libtpu's lock): exit 69 at once, naming its holders.

    `holders` are the pids found (none: unknown).
    """

    def __init__(self, message: str, holders: tuple[int, ...] = ()):
        self.holders = holders
        super().__init__(message)

    @property
    def line(self) -> str:
        """`tpu_busy holders=<pids or unknown>`, the job's stdout line (without its prefix)."""
        return f"tpu_busy holders={','.join(map(str, self.holders)) or 'unknown'}"


class StopSaveError(RuntimeError):
    """The work under way or the save after a stop signal failed (exit 76)."""


class CheckpointError(JobConfigError):
    """A published checkpoint (`initCheckpoint`) that does not fit the model (exit 65)."""
