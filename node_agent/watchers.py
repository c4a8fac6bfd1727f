"""Threads that wake the agent: a new release, a notice on the metadata server."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable

from node_agent.common import AgentError, Backoff, TransientError, log
from node_agent.contract import RELEASE_POLL_SECONDS
from node_agent.desired import Release, current_release
from node_agent.metadata import WATCH_TIMEOUT_SECONDS, Metadata
from node_agent.storage import Storage
from node_agent.supervise import Loops

# Compute Engine's notices (cloud.google.com/compute/docs/instances/preemptible#detecting,
# .../metadata/getting-live-migration-notice): both support wait_for_change.
PREEMPTED_PATH = "instance/preempted"  # FALSE, then TRUE when the VM is being preempted
MAINTENANCE_PATH = "instance/maintenance-event"  # NONE, or the event about to happen
# The value TensorFlow itself treats as "this VM goes down" on GCE
# (tensorflow/python/distribute/failure_handling/gce_util.py,
# termination_watcher_function_gce); MIGRATE_ON_HOST_MAINTENANCE keeps the VM running.
TERMINATE_EVENT = "TERMINATE_ON_HOST_MAINTENANCE"
# A long-poll starts at most this often: a key (or proxy) that ignores
# wait_for_change and answers at once must not turn the watch into a busy loop.
LONG_POLL_FLOOR_SECONDS = 1.0
NOTICE_RETRY_CAP_SECONDS = 10.0  # a notice matters within seconds: retry it soon
MAINTENANCE_RETRY_CAP_SECONDS = 600.0  # a window is announced days ahead: no storm
RELEASE_LIST_BOUND_SECONDS = 600.0  # a listing's pages, each with its retries


def release_poll_seconds() -> float:
    """Contract C1: every 30 s; TPU_STACK_RELEASE_POLL_SECONDS shortens it for tests."""
    return float(os.environ.get("TPU_STACK_RELEASE_POLL_SECONDS") or RELEASE_POLL_SECONDS)


class ReleaseWatcher:
    """Lists the release prefix now and every poll interval (contract C1); `wake` is
    set when a release appears that the agent has not taken yet, and after every poll
    until it has taken one. A failed or empty listing changes nothing: what runs
    keeps running, and the next poll tries again."""

    def __init__(self, storage: Storage, prefix: str, wake: threading.Event,
                 note: Callable[[str], None] = log, loops: Loops | None = None):
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
        self._first = True
        (loops or Loops()).start("release-watcher", self._watch, self._stopped,
                                 RELEASE_LIST_BOUND_SECONDS)

    def stop(self) -> None:
        self._stopped.set()

    def take(self) -> Release | None:
        """The newest release not taken yet, or None."""
        with self._lock:
            release, self._pending = self._pending, None
            if release is not None:
                self._taken = release.uri
            return release

    def taken(self, release: Release) -> None:
        """`release` is already running (a job adopted from an earlier agent)."""
        with self._lock:
            self._taken = release.uri
            if self._pending is not None and self._pending.uri == release.uri:
                self._pending = None

    def forget(self, release: Release) -> None:
        """Offer `release` again at the next poll (its install failed transiently)."""
        with self._lock:
            if self._taken == release.uri:
                self._taken = None

    def _watch(self) -> None:
        """One poll, then the interval (a fault in the poll: the loop runs it again)."""
        if not self._first:
            self._stopped.wait(release_poll_seconds())
        self._first = False
        if not self._stopped.is_set():
            self._poll()

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

    def __init__(self, metadata: Metadata, wake: threading.Event,
                 loops: Loops | None = None):
        self.metadata = metadata
        self.wake = wake
        self.values: dict[str, str] = {}
        self._stopped = threading.Event()
        loops = loops or Loops()
        for path in self.PATHS:
            poll = LongPoll(metadata, path, self._stopped, self._changer(path),
                            retry_cap=NOTICE_RETRY_CAP_SECONDS)
            loops.start(f"watch {path}", poll.step, self._stopped,
                        long_poll_bound(NOTICE_RETRY_CAP_SECONDS))

    def stop(self) -> None:
        self._stopped.set()

    def reason(self) -> str | None:
        """Why the VM is going down (the notice as `path=value`), or None."""
        if self.values.get(PREEMPTED_PATH, "").upper() == "TRUE":
            return f"{PREEMPTED_PATH}=TRUE"
        if self.values.get(MAINTENANCE_PATH, "").upper() == TERMINATE_EVENT:
            return f"{MAINTENANCE_PATH}={TERMINATE_EVENT}"
        return None

    def _changer(self, path: str) -> Callable[[str], None]:
        def changed(value: str) -> None:
            self.values[path] = value.strip()
            self.wake.set()

        return changed


def long_poll_bound(retry_cap: float) -> float:
    """A long-poll step's worst case: the server's wait, the request's own timeout, a
    backoff pause (supervise.Loop's bound, for liveness)."""
    return WATCH_TIMEOUT_SECONDS + 10 + retry_cap + 60


class LongPoll:
    """Calls `changed` with the value at `path` now and at every change (the metadata
    server's wait_for_change with the last ETag). `step()` is one request, for a
    supervised loop: a failed one backs off (doubling to `retry_cap`), requests start
    at most every LONG_POLL_FLOOR_SECONDS, and a path the server does not serve ends
    the watch (step returns False)."""

    def __init__(self, metadata: Metadata, path: str, stopped: threading.Event,
                 changed: Callable[[str], None], params: dict[str, str] | None = None,
                 retry_cap: float = NOTICE_RETRY_CAP_SECONDS):
        self.metadata, self.path, self.stopped = metadata, path, stopped
        self.changed, self.params = changed, params
        self.etag: str | None = None
        self.backoff = Backoff(base=1.0, cap=retry_cap)
        self._last_start = -LONG_POLL_FLOOR_SECONDS
        self._failing = ""

    def step(self) -> bool:
        self.stopped.wait(max(0.0, self._last_start + LONG_POLL_FLOOR_SECONDS
                              - time.monotonic()))
        if self.stopped.is_set():
            return False
        self._last_start = time.monotonic()
        try:
            value, new_etag = self.metadata.watch(self.path, self.etag, self.params)
        except (AgentError, TransientError) as error:
            delay = self.backoff.next_delay()
            if str(error) != self._failing:  # one line per kind of failure, not per try
                log(f"watching {self.path}: {error}; retrying with backoff (now {delay:.0f}s)")
                self._failing = str(error)
            self.stopped.wait(delay)
            return True
        self.backoff.reset()
        self._failing = ""
        if value is None:
            log(f"{self.path} is not served here; not watching it")
            return False
        if new_etag != self.etag or not new_etag:
            self.etag = new_etag or None
            self.changed(value)
        return True



# Compute Engine announces scheduled host maintenance days ahead at this key, as
# JSON with `window_start_time`, `window_end_time`, `type` (SCHEDULED,
# UNSCHEDULED), `maintenance_status` (PENDING, ONGOING), ... and answers `NONE` (or
# an {"error": ...} object) when nothing is scheduled
# (cloud.google.com/compute/docs/instances/monitor-plan-host-maintenance-event).
# Whether TPU VMs serve it is unconfirmed (Cloud TPU documents the node's own
# `upcomingMaintenance` in the TPU API); where it answers 404 the agent stops asking.
UPCOMING_MAINTENANCE_PATH = "instance/upcoming-maintenance"


# Cloud TPU shows the same window in camelCase (`windowStartTime`, ... in the TPU API's
# UpcomingMaintenance, cloud.google.com/tpu/docs/reference/rest/v2/projects.locations.
# nodes#UpcomingMaintenance): which casing a TPU VM's metadata server uses is
# unconfirmed, so both are read.
MAINTENANCE_FIELDS = {"start": ("window_start_time", "windowStartTime"),
                      "end": ("window_end_time", "windowEndTime"),
                      "type": ("type",),
                      "status": ("maintenance_status", "maintenanceStatus")}


def parse_maintenance(text: str | None) -> dict[str, str] | None:
    """The window as the status shows it, {start, end, type, status}, or None."""
    try:
        value = json.loads(text or "")
    except ValueError:
        return None  # `NONE`, or nothing
    if not isinstance(value, dict):
        return None
    window = {key: str(found) for key, names in MAINTENANCE_FIELDS.items()
              if (found := next((value[n] for n in names if value.get(n)), None))}
    return window if window.get("start") else None


class MaintenanceWatcher:
    """Long-polls `instance/upcoming-maintenance`; `window` is the announced window
    (or None) and `wake` is set when it changes."""

    def __init__(self, metadata: Metadata, wake: threading.Event,
                 on_change: Callable[[dict[str, str] | None], None] = lambda _window: None,
                 loops: Loops | None = None):
        self.metadata = metadata
        self.wake = wake
        self.on_change = on_change
        self.window: dict[str, str] | None = None
        self._stopped = threading.Event()
        # A 503 here (some hosts answer it when nothing is scheduled) backs off to
        # MAINTENANCE_RETRY_CAP_SECONDS and keeps the window as it was.
        poll = LongPoll(metadata, UPCOMING_MAINTENANCE_PATH, self._stopped, self._changed,
                        {"alt": "json"}, retry_cap=MAINTENANCE_RETRY_CAP_SECONDS)
        (loops or Loops()).start("watch maintenance", poll.step, self._stopped,
                                 long_poll_bound(MAINTENANCE_RETRY_CAP_SECONDS))

    def stop(self) -> None:
        self._stopped.set()

    def _changed(self, value: str) -> None:
        window = parse_maintenance(value)
        if window != self.window:
            self.window = window
            self.on_change(window)
        self.wake.set()
