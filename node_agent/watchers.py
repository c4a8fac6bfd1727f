"""Threads that watch metadata and wake the agent: attribute changes, notices."""

from __future__ import annotations

import threading
import time

from node_agent.common import RETRY_CAP_SECONDS, AgentError, TransientError, log
from node_agent.metadata import Metadata

# Compute Engine's notices (cloud.google.com/compute/docs/instances/preemptible#detecting,
# .../metadata/getting-live-migration-notice): both support wait_for_change.
PREEMPTED_PATH = "instance/preempted"  # FALSE, then TRUE when the VM is being preempted
MAINTENANCE_PATH = "instance/maintenance-event"  # NONE, or the event about to happen
# The value TensorFlow itself treats as "this VM goes down" on GCE
# (tensorflow/python/distribute/failure_handling/gce_util.py,
# termination_watcher_function_gce); MIGRATE_ON_HOST_MAINTENANCE keeps the VM running.
TERMINATE_EVENT = "TERMINATE_ON_HOST_MAINTENANCE"


class Watcher:
    """Long-polls every attribute (one request covers the package and job keys);
    `wake` is set when they change. A poll that times out returns the same ETag."""

    def __init__(self, metadata: Metadata, etag: str, wake: threading.Event):
        self.metadata = metadata
        self.etag = etag
        self.wake = wake
        self.attributes: dict[str, str] | None = None
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def stop(self) -> None:
        """No new long-poll after the current one."""
        self._stopped.set()

    def take(self) -> dict[str, str] | None:
        with self._lock:
            attributes, self.attributes = self.attributes, None
            return attributes

    def _watch(self) -> None:
        while not self._stopped.is_set():
            try:
                attributes, etag = self.metadata.attributes(last_etag=self.etag)
            except (AgentError, TransientError) as error:
                log(f"watching metadata: {error}")
                time.sleep(RETRY_CAP_SECONDS)
                continue
            if etag == self.etag or self._stopped.is_set():
                continue
            self.etag = etag
            with self._lock:
                self.attributes = attributes
            self.wake.set()


class NoticeWatcher:
    """Long-polls `instance/preempted` and `instance/maintenance-event` (one thread
    each, wait_for_change with the last ETag, as Compute Engine documents); `wake` is
    set whenever either changes, so the agent stops the job the moment a notice comes."""

    PATHS = (PREEMPTED_PATH, MAINTENANCE_PATH)

    def __init__(self, metadata: Metadata, wake: threading.Event):
        self.metadata = metadata
        self.wake = wake
        self.values: dict[str, str] = {}
        self._stopped = threading.Event()
        for path in self.PATHS:
            threading.Thread(target=self._watch, args=(path,), daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()

    def reason(self) -> str | None:
        """Why the VM is going down (the notice as `path=value`), or None."""
        if self.values.get(PREEMPTED_PATH, "").upper() == "TRUE":
            return f"{PREEMPTED_PATH}=TRUE"
        if self.values.get(MAINTENANCE_PATH, "").upper() == TERMINATE_EVENT:
            return f"{MAINTENANCE_PATH}={TERMINATE_EVENT}"
        return None

    def _watch(self, path: str) -> None:
        etag: str | None = None
        while not self._stopped.is_set():
            try:
                value, new_etag = self.metadata.watch(path, etag)
            except (AgentError, TransientError) as error:
                log(f"watching {path}: {error}")
                self._stopped.wait(RETRY_CAP_SECONDS)
                continue
            if value is None:
                log(f"{path} is not served here; not watching it")
                return
            if new_etag != etag:
                etag = new_etag
                self.values[path] = value.strip()
                self.wake.set()

