"""Installing in the background: an install never stands between a notice and the job.

One supervised thread installs the packages the agent asks for, one at a time, in
the order asked; the agent's main loop keeps following the job (SIGTERM,
`instance/preempted`, maintenance) and looks at `result()` once a second, switching
to a new package only once it is installed. Every step of an install is bounded in
time (a download's `DOWNLOAD_DEADLINE_SECONDS`, pip's `PIP_TIMEOUT_SECONDS`); a
transient failure is forgotten so the next offer tries again.
"""

from __future__ import annotations

import threading
from pathlib import Path

from node_agent.common import AgentError, TransientError, log
from node_agent.desired import Desired
from node_agent.install import PIP_TIMEOUT_SECONDS, Installer
from node_agent.storage import DOWNLOAD_DEADLINE_SECONDS
from node_agent.supervise import Loops

Result = Path | AgentError | TransientError
# One install's worst case (supervise.Loop's bound): the download's deadline, pip's
# timeout, and room for the extraction.
INSTALL_BOUND_SECONDS = DOWNLOAD_DEADLINE_SECONDS + PIP_TIMEOUT_SECONDS + 300.0


class Updater:
    def __init__(self, installer: Installer, loops: Loops):
        self.installer = installer
        self._cond = threading.Condition()
        self._queue: list[Desired] = []
        self._busy: str | None = None
        self._results: dict[str, Result] = {}
        self._stopped = threading.Event()
        loops.start("installer", self._work, self._stopped, INSTALL_BOUND_SECONDS)

    def stop(self) -> None:
        self._stopped.set()
        with self._cond:
            self._cond.notify_all()

    def offer(self, desired: Desired) -> None:
        """Install `desired`'s package unless it is installed, queued or being installed."""
        sha = desired.package_sha256
        with self._cond:
            if isinstance(self._results.get(sha), Path) and not self._results[sha].is_dir():
                del self._results[sha]  # pruned since it was installed
            if sha in self._results or sha == self._busy or \
                    any(q.package_sha256 == sha for q in self._queue):
                return
            if self.installer.package_dir(sha).is_dir():
                self._results[sha] = self.installer.package_dir(sha)
                return
            self._queue.append(desired)
            self._cond.notify_all()

    def busy(self, desired: Desired) -> bool:
        """Being installed or waiting to be."""
        sha = desired.package_sha256
        with self._cond:
            return sha == self._busy or any(q.package_sha256 == sha for q in self._queue)

    def result(self, desired: Desired) -> Result | None:
        """The installed folder or the install's error (once: a transient error is
        forgotten, so the next offer tries again); None while it is not done."""
        sha = desired.package_sha256
        with self._cond:
            result = self._results.get(sha)
            if isinstance(result, TransientError) or \
                    (isinstance(result, Path) and not result.is_dir()):
                # An installed folder pruned since (the running package and the one
                # before it are kept): forgotten, so the next offer installs it again.
                del self._results[sha]
                return None if isinstance(result, Path) else result
            return result

    def _work(self) -> bool:
        with self._cond:
            self._cond.wait_for(lambda: self._queue or self._stopped.is_set(), timeout=1.0)
            if not self._queue or self._stopped.is_set():
                return True
            desired = self._queue.pop(0)
            self._busy = desired.package_sha256
        result: Result
        try:
            result = self.installer.ensure(desired.package_uri, desired.package_sha256)
        except (AgentError, TransientError) as error:
            result = error
        except Exception as error:  # recorded as transient, then the loop logs it
            self._finish(desired, TransientError(f"install failed: {type(error).__name__}: "
                                                 f"{error}"))
            raise
        self._finish(desired, result)
        return True

    def _finish(self, desired: Desired, result: Result) -> None:
        with self._cond:
            self._results[desired.package_sha256] = result
            self._busy = None
            self._cond.notify_all()
        if not isinstance(result, Path):
            log(f"install of {desired.package_uri}: {result}")
