"""Threads that wake the agent: a new release, a notice on the metadata server."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable

from node_agent.common import RETRY_CAP_SECONDS, AgentError, TransientError, log
from node_agent.contract import RELEASE_POLL_SECONDS
from node_agent.desired import Release, current_release
from node_agent.metadata import Metadata
from node_agent.storage import Storage

# Compute Engine's notices (cloud.google.com/compute/docs/instances/preemptible#detecting,
# .../metadata/getting-live-migration-notice): both support wait_for_change.
PREEMPTED_PATH = "instance/preempted"  # FALSE, then TRUE when the VM is being preempted
MAINTENANCE_PATH = "instance/maintenance-event"  # NONE, or the event about to happen
# The value TensorFlow itself treats as "this VM goes down" on GCE
# (tensorflow/python/distribute/failure_handling/gce_util.py,
# termination_watcher_function_gce); MIGRATE_ON_HOST_MAINTENANCE keeps the VM running.
TERMINATE_EVENT = "TERMINATE_ON_HOST_MAINTENANCE"


def release_poll_seconds() -> float:
    """Contract C1: every 30 s; TPU_STACK_RELEASE_POLL_SECONDS shortens it for tests."""
    return float(os.environ.get("TPU_STACK_RELEASE_POLL_SECONDS") or RELEASE_POLL_SECONDS)


class ReleaseWatcher:
    """Lists the release prefix now and every poll interval (contract C1); `wake` is
    set when a release appears that the agent has not taken yet, and after every poll
    until it has taken one. A failed or empty listing changes nothing: what runs
    keeps running, and the next poll tries again."""

    def __init__(self, storage: Storage, prefix: str, wake: threading.Event,
                 note: Callable[[str], None] = log):
        self.storage = storage
        self.prefix = prefix
        self.wake = wake
        self.note = note
        self.problem = ""  # why the last poll found nothing ("" when it found one)
        self.polls = 0
        self._pending: Release | None = None
        self._taken: str | None = None  # the uri of the release the agent took last
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()

    def take(self) -> Release | None:
        """The newest release not taken yet, or None."""
        with self._lock:
            release, self._pending = self._pending, None
            if release is not None:
                self._taken = release.uri
            return release

    def forget(self, release: Release) -> None:
        """Offer `release` again at the next poll (its install failed transiently)."""
        with self._lock:
            if self._taken == release.uri:
                self._taken = None

    def _watch(self) -> None:
        while not self._stopped.is_set():
            self._poll()
            self._stopped.wait(release_poll_seconds())

    def _poll(self) -> None:
        try:
            release = current_release(self.storage, self.prefix)
            problem = "" if release else f"no release under {self.prefix} yet"
        except (AgentError, TransientError) as error:
            release, problem = None, f"release listing failed: {error}"
        if problem and problem != self.problem:
            self.note(f"{problem}; trying again every {release_poll_seconds():.0f}s")
        with self._lock:
            self.problem = problem
            self.polls += 1
            fresh = release is not None and release.uri != self._taken
            if fresh:
                self._pending = release
            if fresh or self._taken is None:
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
        def changed(value: str) -> None:
            self.values[path] = value.strip()
            self.wake.set()

        long_poll(self.metadata, path, self._stopped, changed)


def long_poll(metadata: Metadata, path: str, stopped: threading.Event,
              changed: Callable[[str], None], params: dict[str, str] | None = None) -> None:
    """Call `changed` with the value at `path` now and at every change, until `stopped`
    (the metadata server's wait_for_change with the last ETag); a failed call retries,
    a path the server does not serve ends the watch."""
    etag: str | None = None
    while not stopped.is_set():
        try:
            value, new_etag = metadata.watch(path, etag, params)
        except (AgentError, TransientError) as error:
            log(f"watching {path}: {error}")
            stopped.wait(RETRY_CAP_SECONDS)
            continue
        if value is None:
            log(f"{path} is not served here; not watching it")
            return
        if new_etag != etag:
            etag = new_etag
            changed(value)



# Compute Engine announces scheduled host maintenance days ahead at this key, as
# JSON with `window_start_time`, `window_end_time`, `type` (SCHEDULED,
# UNSCHEDULED), `maintenance_status` (PENDING, ONGOING), ... and answers `NONE` (or
# an {"error": ...} object) when nothing is scheduled
# (cloud.google.com/compute/docs/instances/monitor-plan-host-maintenance-event).
# Whether TPU VMs serve it is unconfirmed (Cloud TPU documents the node's own
# `upcomingMaintenance` in the TPU API); where it answers 404 the agent stops asking.
UPCOMING_MAINTENANCE_PATH = "instance/upcoming-maintenance"


def parse_maintenance(text: str | None) -> dict[str, str] | None:
    """The window as the status shows it, {start, end, type, status}, or None."""
    try:
        value = json.loads(text or "")
    except ValueError:
        return None  # `NONE`, or nothing
    if not isinstance(value, dict) or not value.get("window_start_time"):
        return None
    fields = {"start": "window_start_time", "end": "window_end_time", "type": "type",
              "status": "maintenance_status"}
    return {key: str(value[name]) for key, name in fields.items() if value.get(name)}


class MaintenanceWatcher:
    """Long-polls `instance/upcoming-maintenance`; `window` is the announced window
    (or None) and `wake` is set when it changes."""

    def __init__(self, metadata: Metadata, wake: threading.Event,
                 on_change: Callable[[dict[str, str] | None], None] = lambda _window: None):
        self.metadata = metadata
        self.wake = wake
        self.on_change = on_change
        self.window: dict[str, str] | None = None
        self._stopped = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        def changed(value: str) -> None:
            window = parse_maintenance(value)
            if window != self.window:
                self.window = window
                self.on_change(window)
            self.wake.set()

        long_poll(self.metadata, UPCOMING_MAINTENANCE_PATH, self._stopped, changed,
                  {"alt": "json"})
