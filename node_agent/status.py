"""One worker's status: guest attributes, `status.json` and `job.log` in GCS."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from node_agent.common import AgentError, TransientError, log, utc_now, write_atomically
from node_agent.contract import STATUS_KEY
from node_agent.metadata import Metadata
from node_agent.storage import Storage
from node_agent.supervise import Loops

STATUS_UPLOAD_SECONDS = 30.0
STEP_PUBLISH_SECONDS = 2.0
# Cloud Storage: "There is an update limit on each object of once per second"
# (cloud.google.com/storage/quotas, Objects; docs/tpu-facts.md "The node agent").
OBJECT_WRITE_SECONDS = 1.0
# What a flush (before a hand-over) or the last upload at exit waits at most: a stalled
# GCS must not hold a stop past the unit's TimeoutStopSec (bootstrap.sh).
FLUSH_WAIT_SECONDS = 10.0
UPLOAD_BOUND_SECONDS = 600.0  # two objects, each 3 attempts of 30 s and their backoff
LOG_ROLL_BYTES = 8 << 20  # job.log rolls to job.log.1 past this
LOG_TAIL_BYTES = 256 << 10  # what goes to GCS: the last this many bytes
# status.json also carries the fields as custom metadata, so `tpuctl status` reads every
# node's status from one listing of the logs bucket (docs/design.md, "Status"). GCS
# allows 8 KiB of custom metadata an object (google.storage.v1 ServiceConstants,
# docs/tpu-facts.md): the one free-text field is cut to this many bytes.
MESSAGE_METADATA_BYTES = 1024


class Due:
    """When one publication is next due, for the thread that makes it: `ask(within)`
    coalesces requests (the earliest wins), `interval` spaces two runs at least that far
    apart, `period` asks again that long after each run (None: never); `wait(timeout)`
    waits for a run that starts after the call."""

    def __init__(self, interval: float = 0.0, period: float | None = None):
        self.interval, self.period = interval, period
        self._cond = threading.Condition()
        self._at: float | None = time.monotonic() + period if period else None
        self._last = -interval
        self._started = self._finished = 0
        self.stopped = False

    def ask(self, within: float = 0.0) -> None:
        with self._cond:
            at = time.monotonic() + within
            self._at = at if self._at is None else min(self._at, at)
            self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self.stopped = True
            self._cond.notify_all()

    def next_run(self) -> bool:
        """Wait until a run is due (True), at most a period; False when stopped or when
        nothing came due meanwhile (the caller asks again)."""
        with self._cond:
            waited = 0.0
            while not self.stopped and (left := self._left()) > 0 and \
                    waited < STATUS_UPLOAD_SECONDS:
                pause = min(left, STATUS_UPLOAD_SECONDS - waited)
                self._cond.wait(pause)  # an ask() wakes it to look again
                waited += pause
            if self.stopped or self._left() > 0:
                return False
            self._at, self._last = None, time.monotonic()
            self._started += 1
            return True

    def ran(self) -> None:
        """The run ended: the interval counts from here (a run that wrote an object
        late, after a stall, is not followed by another write within the interval)."""
        with self._cond:
            self._last = time.monotonic()
            if self._at is None and self.period:
                self._at = time.monotonic() + self.period
            self._finished = self._started
            self._cond.notify_all()

    def wait(self, timeout: float) -> bool:
        """Ask for a run now and wait for one that starts after this call."""
        with self._cond:
            target = self._started + 1
        self.ask()
        with self._cond:
            return self._cond.wait_for(lambda: self._finished >= target or self.stopped,
                                       timeout) and self._finished >= target

    def _left(self) -> float:
        if self._at is None:
            return float("inf")
        return max(self._at, self._last + self.interval) - time.monotonic()


class Status:
    """One worker's status: guest attributes, `status.json` and `job.log` in GCS.

    The paths that read the job's output or act on a notice only record: `set`,
    `progress` and `note` change the fields (and the local files) under a lock held for
    no network call, and ask the publishers. Two supervised threads publish, so a
    stalled GCS never delays a guest attribute, a step line or a stop: one puts the
    guest attributes (at once for a `set`, within STEP_PUBLISH_SECONDS for progress);
    one uploads `status.json` and `job.log` (on a state change and every
    STATUS_UPLOAD_SECONDS, coalesced), each object written at most once a second (Cloud
    Storage's update limit on each object, OBJECT_WRITE_SECONDS). Publishing never
    raises. Fields are strings or objects (goodput, lastSave, stopSave); a guest
    attribute carries an object as compact JSON. job.log rolls locally and only its
    bounded tail goes to GCS.
    """

    def __init__(self, metadata: Metadata, storage: Storage, root: Path, worker: int,
                 loops: Loops | None = None):
        self.metadata = metadata
        self.storage = storage
        self.worker = worker
        self.prefix: str | None = None
        self.dir = root / "status" / f"worker-{worker}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "job.log"
        self.fields: dict[str, str | dict[str, object]] = {
            "state": "installing", "step": "0", "package": "", "message": "",
            "updated": utc_now()}
        self._lock = threading.Lock()  # fields and local files: never held over a network call
        self._last_local = 0.0
        self._published: dict[str, str] = {}  # guest attribute -> the text it has
        self._uploaded: dict[str, bytes] = {}  # uri -> sha256 of what is there
        self.attributes_due = Due()
        self.uploads_due = Due(OBJECT_WRITE_SECONDS, STATUS_UPLOAD_SECONDS)
        self._stop = threading.Event()
        loops = loops or Loops()
        self._threads = [loops.start("status-attributes", self._publish_when_due, self._stop),
                         loops.start("status-upload", self._upload_periodically, self._stop,
                                     UPLOAD_BOUND_SECONDS)]

    def status_uri(self, worker: int | None = None) -> str | None:
        """This worker's status object (or another worker's: the prefix is the node's)."""
        number = self.worker if worker is None else worker
        return f"{self.prefix.rstrip('/')}/worker-{number}/status.json" \
            if self.prefix else None

    def read_worker(self, worker: int) -> dict[str, object] | None:
        """Another worker's published status: {} when there is none, None when it
        could not be read (try again)."""
        uri = self.status_uri(worker)
        try:
            value = json.loads(self.storage.read(uri, STATUS_KEY, attempts=1) or b"{}") \
                if uri else {}
        except (AgentError, TransientError, ValueError) as error:
            log(f"worker {worker}'s status: {error}")
            return None
        return value if isinstance(value, dict) else {}

    def previous(self) -> dict[str, object]:
        """The status an earlier agent left: the GCS object (it outlives the node's
        disk), else the local file; {} when there is none or it cannot be read."""
        uri = self.status_uri()
        candidates: list[Callable[[], bytes | None]] = [
            lambda: self.storage.read(uri, STATUS_KEY) if uri else None,
            lambda: local.read_bytes() if (local := self.dir / "status.json").exists()
            else None]  # a first boot has none: nothing to say about it
        for read in candidates:
            try:
                data = read()
                if data:
                    value = json.loads(data)
                    if isinstance(value, dict):
                        return value
            except (AgentError, TransientError, OSError, ValueError) as error:
                log(f"earlier status unreadable: {error}")
        return {}

    def set(self, **fields: str | int | dict[str, object] | None) -> None:
        """Change fields (None removes one); published at once, by the publishers.
        Never raises and never waits on the network."""
        try:
            self._set(fields)
        except Exception as error:  # publishing never raises
            log(f"status not recorded: {type(error).__name__}: {error}")

    def _set(self, fields: Mapping[str, str | int | dict[str, object] | None]) -> None:
        with self._lock:
            for key, value in fields.items():
                if value is None:
                    self.fields.pop(key, None)
                else:
                    self.fields[key] = value if isinstance(value, dict) else str(value)
            self.fields["updated"] = utc_now()
            summary = f"state={self.fields['state']} {self.fields['message']}".strip()
        if "state" in fields or "message" in fields:
            self.note(summary)
        self._write_local()
        self.attributes_due.ask()
        self.uploads_due.ask()

    def progress(self, **fields: str | int | dict[str, object]) -> None:
        """Steps and goodput from the job's output: recorded now, published within
        STEP_PUBLISH_SECONDS (the publisher's time, never this caller's)."""
        try:
            with self._lock:
                self.fields |= {k: v if isinstance(v, dict) else str(v)
                                for k, v in fields.items()}
                self.fields["updated"] = utc_now()
                due = time.monotonic() - self._last_local >= STEP_PUBLISH_SECONDS
            if due:
                self._write_local()
            self.attributes_due.ask(STEP_PUBLISH_SECONDS)
        except Exception as error:  # publishing never raises
            log(f"status not recorded: {type(error).__name__}: {error}")

    def note(self, message: str) -> None:
        """An agent line, in the agent's log and in job.log."""
        log(message)
        self.append_job_line(f"tpu-stack-agent: {utc_now()} {message}\n")

    def append_job_line(self, line: str) -> None:
        """A line into job.log; a full or failing disk loses the line, nothing more."""
        try:
            with self._lock:
                with self.log_path.open("a") as out:
                    out.write(line)
                    rolled = out.tell() > LOG_ROLL_BYTES
                if rolled:
                    self.log_path.replace(self.log_path.with_name("job.log.1"))
        except OSError as error:
            log(f"job.log: {error}")

    def flush(self, timeout: float = FLUSH_WAIT_SECONDS) -> bool:
        """Publish everything now and wait, at most `timeout` seconds in all; whether
        it all finished (a stalled GCS makes it False, and the upload goes on behind)."""
        if any(thread.done.is_set() for thread in self._threads):
            return False
        deadline = time.monotonic() + timeout
        attributes = self.attributes_due.wait(timeout)
        return self.uploads_due.wait(max(0.0, deadline - time.monotonic())) and attributes

    def close(self, timeout: float = FLUSH_WAIT_SECONDS) -> None:
        """The last publication (waited for at most `timeout`: the unit's stop timeout
        bounds an agent's exit), then the publishers end."""
        self.flush(timeout)
        self._stop.set()
        self.attributes_due.stop()
        self.uploads_due.stop()

    def _snapshot(self) -> dict[str, str | dict[str, object]]:
        with self._lock:
            return dict(self.fields)

    def _write_local(self) -> None:
        try:
            text = self._json(self._snapshot())
            with self._lock:  # the publisher's thread writes it too
                write_atomically(self.dir / "status.json", text.encode())
                self._last_local = time.monotonic()
        except OSError as error:
            log(f"status.json: {error}")

    def _json(self, fields: Mapping[str, object]) -> str:
        return json.dumps(dict(fields) | {"worker": self.worker}, indent=2, sort_keys=True)

    def _publish_when_due(self) -> bool:
        """The guest attributes' loop body."""
        return _when_due(self.attributes_due, self._publish_attributes)

    def _upload_periodically(self) -> bool:
        """The upload loop's body: status.json and job.log when due."""
        return _when_due(self.uploads_due, self._upload)

    def _publish_attributes(self) -> None:
        """The guest attributes whose text changed."""
        self._write_local()
        for key, text in attribute_texts(self._snapshot()).items():
            if self._published.get(key) == text:
                continue
            try:
                self.metadata.put_guest_attribute(key, text)
            except Exception as error:  # the fault model's transient ones, and any other
                log(f"guest attribute {key}: {error}")
                self.attributes_due.ask(STEP_PUBLISH_SECONDS)  # try again soon
                return
            self._published[key] = text

    def _upload(self) -> None:
        uri = self.status_uri()
        if not uri:
            return
        try:
            fields = self._snapshot()
            status = self._json(fields).encode()
            with self._lock:
                log_bytes = log_tail(self.log_path, LOG_TAIL_BYTES)
            self._upload_if_changed(uri, status, "application/json", status_metadata(fields))
            self._upload_if_changed(uri.rsplit("/", 1)[0] + "/job.log", log_bytes,
                                    "text/plain")
        except Exception as error:  # publishing never raises
            log(f"status upload: {type(error).__name__}: {error}")

    def _upload_if_changed(self, uri: str, data: bytes, content_type: str,
                           metadata: Mapping[str, str] | None = None) -> None:
        digest = hashlib.sha256(data).digest()
        if self._uploaded.get(uri) != digest:
            self.storage.upload(uri, data, content_type, STATUS_KEY, metadata)
            self._uploaded[uri] = digest


def _when_due(due: Due, work: Callable[[], None]) -> bool:
    """A publishing loop's body: `work` once `due` says so; False once it stopped."""
    if due.next_run():
        try:
            work()
        finally:
            due.ran()
    return not due.stopped


def attribute_texts(fields: Mapping[str, object]) -> dict[str, str]:
    """Each field as its guest attribute's text: a string as it is, an object as
    compact JSON."""
    return {key: value if isinstance(value, str) else json.dumps(
        value, sort_keys=True, separators=(",", ":")) for key, value in fields.items()}


def status_metadata(fields: Mapping[str, object]) -> dict[str, str]:
    """status.json's custom metadata: the guest attributes' texts, the message cut to
    MESSAGE_METADATA_BYTES (the whole one is in the object)."""
    texts = attribute_texts(fields)
    message = texts.get("message", "").encode()[:MESSAGE_METADATA_BYTES]
    return texts | {"message": message.decode(errors="ignore")} if "message" in texts else texts


def log_tail(path: Path, limit: int) -> bytes:
    """The last `limit` bytes of job.log, reaching back into job.log.1 after a roll,
    starting at a line boundary."""
    data = b""
    for part in (path, path.with_name("job.log.1")):
        try:
            with part.open("rb") as log_file:
                size = log_file.seek(0, os.SEEK_END)
                log_file.seek(max(0, size - (limit - len(data))))
                data = log_file.read() + data
        except OSError:
            continue
        if len(data) >= limit:
            break
    if len(data) >= limit and b"\n" in data:
        data = data[data.index(b"\n") + 1:]
    return data

