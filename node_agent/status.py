"""One worker's status: guest attributes, `status.json` and `job.log` in GCS."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from node_agent.common import AgentError, TransientError, log, utc_now
from node_agent.contract import STATUS_KEY
from node_agent.metadata import Metadata
from node_agent.storage import Storage
from node_agent.supervise import Loops

STATUS_UPLOAD_SECONDS = 30.0
STEP_PUBLISH_SECONDS = 2.0
# Cloud Storage takes one write a second to the same object name (cloud.google.com/
# storage/quotas, "Maximum rate of writes to the same object name"; docs/tpu-facts.md).
OBJECT_WRITE_SECONDS = 1.0
# What a flush (before a hand-over) or the last upload at exit waits at most: a stalled
# GCS must not hold a stop past the unit's TimeoutStopSec (bootstrap.sh).
FLUSH_WAIT_SECONDS = 10.0
LOG_ROLL_BYTES = 8 << 20  # job.log rolls to job.log.1 past this
LOG_TAIL_BYTES = 256 << 10  # what goes to GCS: the last this many bytes
# status.json also carries the fields as custom metadata, so `tpuctl status` reads every
# node's status from one listing of the logs bucket (docs/design.md, "Status"). GCS
# allows 8 KiB of custom metadata an object (google.storage.v1 ServiceConstants,
# docs/tpu-facts.md): the one free-text field is cut to this many bytes.
MESSAGE_METADATA_BYTES = 1024


class Status:
    """One worker's status: guest attributes, `status.json` and `job.log` in GCS.

    The paths that read the job's output or act on a notice only record: `set`,
    `progress` and `note` change the fields (and the local files) under a lock held for
    no network call, and wake the uploader. One supervised thread publishes: guest
    attributes at once for a `set`, at most every STEP_PUBLISH_SECONDS for progress;
    `status.json` and `job.log` on a state change and every STATUS_UPLOAD_SECONDS,
    coalesced, each object written at most once a second (Cloud Storage: "a maximum
    rate of one write per second to the same object name", cloud.google.com/storage/
    quotas, and cloud.google.com/storage/docs/request-rate; docs/tpu-facts.md). A
    stalled GCS therefore delays only the uploads, never a step line or a stop.
    Publishing never raises. Fields are strings or objects (goodput, lastSave,
    stopSave); a guest attribute carries an object as compact JSON. job.log rolls
    locally and only its bounded tail goes to GCS.
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
        self._wake = threading.Condition()
        self._attributes_at: float | None = None  # when the guest attributes are due
        self._upload_at: float | None = time.monotonic() + STATUS_UPLOAD_SECONDS
        self._last_attributes = 0.0
        self._last_upload = -OBJECT_WRITE_SECONDS
        self._published: dict[str, str] = {}  # guest attribute -> the text it has
        self._uploaded: dict[str, bytes] = {}  # uri -> sha256 of what is there
        self._cycles = 0  # uploads finished, for flush()
        self._busy = False  # an upload under way
        self._stop = threading.Event()
        self._uploader = (loops or Loops()).start("status-upload", self._upload_periodically,
                                                  self._stop)

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
        """Change fields (None removes one); the uploader publishes them at once.
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
        self._due(attributes=0.0, upload=0.0)

    def progress(self, **fields: str | int | dict[str, object]) -> None:
        """Steps and goodput from the job's output: recorded now, published at most
        every STEP_PUBLISH_SECONDS (the uploader's, never this caller's, time)."""
        try:
            with self._lock:
                self.fields |= {k: v if isinstance(v, dict) else str(v)
                                for k, v in fields.items()}
                self.fields["updated"] = utc_now()
                due = time.monotonic() - self._last_attributes >= STEP_PUBLISH_SECONDS
            if due:
                self._write_local()
            self._due(attributes=STEP_PUBLISH_SECONDS)
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
        """Ask for an upload now and wait for it, at most `timeout` seconds; whether it
        finished (a stalled GCS makes it False, and the upload goes on behind)."""
        if self._uploader.done.is_set():
            return False
        with self._wake:
            target = self._cycles + (2 if self._busy else 1)
        self._due(attributes=0.0, upload=0.0)
        with self._wake:
            return self._wake.wait_for(lambda: self._cycles >= target or self._stop.is_set(),
                                       timeout)

    def close(self, timeout: float = FLUSH_WAIT_SECONDS) -> None:
        """The last upload (waited for at most `timeout`: the unit's stop timeout
        bounds an agent's exit), then the uploader ends."""
        self.flush(timeout)
        self._stop.set()
        with self._wake:
            self._wake.notify_all()

    def _due(self, attributes: float | None = None, upload: float | None = None) -> None:
        """Publish the guest attributes (and upload) within these many seconds."""
        now = time.monotonic()
        with self._wake:
            if attributes is not None:
                at = max(now, self._last_attributes + attributes)
                self._attributes_at = min(self._attributes_at or at, at)
            if upload is not None:
                self._upload_at = min(self._upload_at or now + upload, now + upload)
            self._wake.notify_all()

    def _snapshot(self) -> dict[str, str | dict[str, object]]:
        with self._lock:
            return dict(self.fields)

    def _write_local(self) -> None:
        try:
            text = self._json(self._snapshot())
            with self._lock:
                (self.dir / "status.json").write_text(text)
        except OSError as error:
            log(f"status.json: {error}")

    def _json(self, fields: Mapping[str, object]) -> str:
        return json.dumps(dict(fields) | {"worker": self.worker}, indent=2, sort_keys=True)

    def _upload_periodically(self) -> bool:
        """The uploader's loop body: wait until something is due, publish it."""
        with self._wake:
            self._wake.wait_for(lambda: self._stop.is_set() or self._next_due() <= 0,
                                max(0.0, min(self._next_due(), STATUS_UPLOAD_SECONDS)))
            if self._stop.is_set():
                return False
            now = time.monotonic()
            attributes = self._attributes_at is not None and self._attributes_at <= now
            upload = self._upload_at is not None and \
                max(self._upload_at, self._last_upload + OBJECT_WRITE_SECONDS) <= now
            if attributes:
                self._attributes_at, self._last_attributes = None, now
            if upload:
                self._upload_at, self._last_upload = None, now
            self._busy = attributes or upload
        try:
            if attributes:
                self._publish_attributes()
            if upload:
                self._upload()
        finally:
            with self._wake:
                if upload and self._upload_at is None:
                    self._upload_at = time.monotonic() + STATUS_UPLOAD_SECONDS
                self._busy = False
                self._cycles += 1 if upload else 0
                self._wake.notify_all()
        return True

    def _next_due(self) -> float:
        """Seconds until the next publication is due (0 or less: now)."""
        now, due = time.monotonic(), []
        if self._attributes_at is not None:
            due.append(self._attributes_at - now)
        if self._upload_at is not None:
            due.append(max(self._upload_at, self._last_upload + OBJECT_WRITE_SECONDS) - now)
        return min(due) if due else STATUS_UPLOAD_SECONDS

    def _publish_attributes(self) -> None:
        """The guest attributes whose text changed (the uploader's thread)."""
        self._write_local()
        for key, text in attribute_texts(self._snapshot()).items():
            if self._published.get(key) == text:
                continue
            try:
                self.metadata.put_guest_attribute(key, text)
            except Exception as error:  # the fault model's transient ones, and any other
                log(f"guest attribute {key}: {error}")
                with self._wake:  # try again soon
                    self._attributes_at = min(self._attributes_at or float("inf"),
                                              time.monotonic() + STEP_PUBLISH_SECONDS)
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

