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
LOG_ROLL_BYTES = 8 << 20  # job.log rolls to job.log.1 past this
LOG_TAIL_BYTES = 256 << 10  # what goes to GCS: the last this many bytes
# status.json also carries the fields as custom metadata, so `tpuctl status` reads every
# node's status from one listing of the logs bucket (docs/design.md, "Status"). GCS
# allows 8 KiB of custom metadata an object (google.storage.v1 ServiceConstants,
# docs/tpu-facts.md): the one free-text field is cut to this many bytes.
MESSAGE_METADATA_BYTES = 1024


class Status:
    """One worker's status: guest attributes, `status.json` and `job.log` in GCS.

    Publishing never raises: losing a status update must not stop training. Fields
    and the log file are guarded by one lock, network calls by another, so a slow
    upload never blocks the thread that drains the job's output. Fields are strings
    or objects (goodput, lastSave, stopSave); a guest attribute carries an object as
    compact JSON. job.log rolls locally and only its bounded tail goes to GCS.
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
        self._lock = threading.Lock()
        self._network = threading.Lock()
        self._last_step_publish = 0.0
        self._uploaded: dict[str, bytes] = {}  # uri -> sha256 of what is there
        self._stop = threading.Event()
        (loops or Loops()).start("status-upload", self._upload_periodically, self._stop)

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
        """Change fields (None removes one) and publish everywhere (changes are rare).
        Never raises: a status that cannot be published is logged, training goes on."""
        try:
            self._set(fields)
        except Exception as error:  # publishing never raises
            log(f"status not published: {type(error).__name__}: {error}")

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
        self._publish(upload=True)

    def progress(self, **fields: str | int | dict[str, object]) -> None:
        """Steps and goodput from the job's output: published at most every few seconds."""
        with self._lock:
            self.fields |= {k: v if isinstance(v, dict) else str(v) for k, v in fields.items()}
            self.fields["updated"] = utc_now()
            due = time.monotonic() - self._last_step_publish >= STEP_PUBLISH_SECONDS
        if due:
            try:
                self._publish(upload=False)
            except Exception as error:  # publishing never raises
                log(f"status not published: {type(error).__name__}: {error}")

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

    def close(self) -> None:
        self._stop.set()
        self._upload()

    def flush(self) -> None:
        """Publish the fields and upload now (before a hand-over to a new agent)."""
        try:
            self._publish(upload=True)
        except Exception as error:  # publishing never raises
            log(f"status not published: {type(error).__name__}: {error}")

    def _snapshot(self) -> dict[str, str | dict[str, object]]:
        with self._lock:
            self._last_step_publish = time.monotonic()
            return dict(self.fields)

    def _publish(self, upload: bool) -> None:
        fields = self._snapshot()
        try:
            (self.dir / "status.json").write_text(self._json(fields))
        except OSError as error:
            log(f"status.json: {error}")
        with self._network:
            for key, text in attribute_texts(fields).items():
                try:
                    self.metadata.put_guest_attribute(key, text)
                except Exception as error:  # the fault model's transient ones, and any other
                    log(f"guest attribute {key}: {error}")
                    break
        if upload:
            self._upload()

    def _json(self, fields: Mapping[str, object]) -> str:
        return json.dumps(dict(fields) | {"worker": self.worker}, indent=2, sort_keys=True)

    def _upload(self) -> None:
        uri = self.status_uri()
        if not uri:
            return
        try:
            fields = self._snapshot()
            status = self._json(fields).encode()
            with self._lock:
                log_bytes = log_tail(self.log_path, LOG_TAIL_BYTES)
            with self._network:
                self._upload_if_changed(uri, status, "application/json",
                                        status_metadata(fields))
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

    def _upload_periodically(self) -> None:
        if not self._stop.wait(STATUS_UPLOAD_SECONDS):
            self._upload()


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

