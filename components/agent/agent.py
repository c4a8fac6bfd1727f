"""tpu-stack node agent: install the training package from GCS and supervise the job.

Runs on every TPU VM worker at every boot (the bootstrap writes this file and starts
it), with nothing but the image's Python and TensorFlow: standard library only.
Its only input is the node's metadata (docs/design.md, "What a TPU node carries in
metadata"); every output goes to guest attributes and to GCS, so nothing is lost
when a spot node disappears.

    python3 agent.py run            one pass: install, run the job, exit with its outcome
    python3 agent.py run --stay     as a service: after the job ends keep watching metadata

Environment: GCE_METADATA_HOST, STORAGE_EMULATOR_HOST (google-auth and
google-cloud-storage conventions), TPU_STACK_ROOT (default /opt/tpu-stack).
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import hashlib
import http.client
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TypeVar

PACKAGE_KEY = "tpu-stack-package"
PACKAGE_SHA256_KEY = "tpu-stack-package-sha256"
JOB_KEY = "tpu-stack-job"
WORKERS_KEY = "tpu-stack-workers"
STATUS_KEY = "tpu-stack-status"
STARTUP_SCRIPT_KEY = "startup-script"
WORKER_NUMBER_KEY = "agent-worker-number"
TPU_ENV_KEY = "tpu-env"
GUEST_NAMESPACE = "tpu-stack"

DEFAULT_ROOT = "/opt/tpu-stack"
DEFAULT_METADATA_HOST = "metadata.google.internal"
DEFAULT_STORAGE_ENDPOINT = "https://storage.googleapis.com"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_PREEMPTED = 75  # the training package's "stopped on SIGTERM after a checkpoint"

STOP_GRACE_SECONDS = 120.0  # the unit's TimeoutStopSec leaves room above this
STATUS_UPLOAD_SECONDS = 30.0
STEP_PUBLISH_SECONDS = 2.0
WATCH_TIMEOUT_SECONDS = 60
RETRY_ATTEMPTS = 6
RETRY_BASE_SECONDS = 0.5
RETRY_CAP_SECONDS = 20.0
CHUNK = 1 << 20

STEP_LINE = re.compile(r"^tpu_training step=(\d+)")
RESUMED_LINE = re.compile(r"^tpu_training resumed_from=(\d+)")
TF_KERAS_WHEEL = re.compile(r"^tf_keras-(\d+)\.(\d+)(?:\.[^-]*)?-.*\.whl$")

T = TypeVar("T")


class AgentError(Exception):
    """A problem the agent cannot get past; its text becomes the status message."""


class TransientError(Exception):
    """A failure worth retrying (connection trouble, HTTP 429 or 5xx)."""


# -- retries --------------------------------------------------------------------


def retrying(action: Callable[[], T], what: str, attempts: int = RETRY_ATTEMPTS) -> T:
    """`action()`, retried on TransientError with exponential backoff and jitter."""
    for attempt in range(attempts):
        try:
            return action()
        except TransientError as error:
            if attempt == attempts - 1:
                raise AgentError(f"{what}: gave up after {attempts} attempts: {error}") from None
            delay = min(RETRY_CAP_SECONDS, RETRY_BASE_SECONDS * 2 ** attempt)
            log(f"{what}: {error}; retrying in about {delay:.1f}s")
            time.sleep(delay / 2 + random.uniform(0, delay / 2))
    raise AssertionError("unreachable")


def open_url(request: urllib.request.Request, timeout: float) -> http.client.HTTPResponse:
    """urlopen, sorting failures into TransientError or HTTPError (to the caller)."""
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as error:
        if error.code == 429 or error.code >= 500:
            raise TransientError(f"HTTP {error.code}") from None
        raise
    except (OSError, http.client.HTTPException) as error:
        raise TransientError(str(error)) from None


def read_body(response: IO[bytes], out: IO[bytes] | None = None) -> tuple[bytes, str]:
    """The body (or its copy into `out`) and its sha256; a broken transfer is transient."""
    digest, chunks = hashlib.sha256(), []
    try:
        while chunk := response.read(CHUNK):
            digest.update(chunk)
            if out is None:
                chunks.append(chunk)
            else:
                out.write(chunk)
    except (ConnectionError, TimeoutError, http.client.HTTPException) as error:
        raise TransientError(f"transfer interrupted: {error}") from None
    return b"".join(chunks), digest.hexdigest()


# -- metadata -------------------------------------------------------------------


class Metadata:
    """The GCE metadata server (cloud.google.com/compute/docs/metadata/querying-metadata).

    It answers 503 for moments during maintenance events, hence retries everywhere.
    """

    def __init__(self, host: str):
        self.base = f"http://{host}/computeMetadata/v1/"
        self._token: tuple[str, float] | None = None

    def get(self, path: str, query: Mapping[str, str] | None = None,
            timeout: float = 10.0) -> tuple[str | None, str]:
        """(value or None when absent, ETag)."""
        url = self.base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})

        def fetch() -> tuple[str | None, str]:
            try:
                with open_url(request, timeout) as response:
                    return read_body(response)[0].decode(), response.headers.get("ETag", "")
            except urllib.error.HTTPError as error:
                if error.code == 404:
                    return None, ""
                raise AgentError(f"metadata {path}: HTTP {error.code}") from None

        return retrying(fetch, f"metadata {path}")

    def attributes(self, last_etag: str | None = None) -> tuple[dict[str, str], str]:
        """Every instance attribute; with `last_etag`, wait until they change."""
        query = {"recursive": "true"}
        timeout = 10.0
        if last_etag is not None:
            query |= {"wait_for_change": "true", "last_etag": last_etag,
                      "timeout_sec": str(WATCH_TIMEOUT_SECONDS)}
            timeout += WATCH_TIMEOUT_SECONDS
        value, etag = self.get("instance/attributes/", query, timeout)
        return json.loads(value or "{}"), etag

    def token(self) -> str:
        if self._token is None or self._token[1] < time.monotonic():
            value, _ = self.get("instance/service-accounts/default/token")
            if value is None:
                raise AgentError("the metadata server has no token for the node's "
                                 "service account (is one attached to the TPU node?)")
            answer = json.loads(value)
            expires = time.monotonic() + float(answer.get("expires_in", 300)) - 60
            self._token = (answer["access_token"], expires)
        return self._token[0]

    def put_guest_attribute(self, key: str, value: str) -> None:
        url = f"{self.base}instance/guest-attributes/{GUEST_NAMESPACE}/{key}"
        request = urllib.request.Request(url, data=value.encode(), method="PUT",
                                         headers={"Metadata-Flavor": "Google"})
        with urllib.request.urlopen(request, timeout=5) as response:
            response.read()


# -- Cloud Storage (JSON API) ----------------------------------------------------


def split_gs_uri(uri: str, setting: str) -> tuple[str, str]:
    """("bucket", "object/name") of a gs:// URI; a bad one is an AgentError naming `setting`."""
    if not uri.startswith("gs://") or "/" not in uri[5:]:
        raise AgentError(f"{setting}: {uri!r} is not a gs://bucket/object URI")
    bucket, name = uri[5:].split("/", 1)
    return bucket, name


def storage_endpoint() -> str:
    host = os.environ.get("STORAGE_EMULATOR_HOST")
    if not host:
        return DEFAULT_STORAGE_ENDPOINT
    return host.rstrip("/") if "://" in host else f"http://{host}"


class Storage:
    """Download and upload objects with the metadata server's token."""

    def __init__(self, metadata: Metadata, endpoint: str):
        self.metadata = metadata
        self.endpoint = endpoint

    def _request(self, url: str, data: bytes | None = None,
                 content_type: str | None = None) -> urllib.request.Request:
        headers = {"Authorization": f"Bearer {self.metadata.token()}"}
        if content_type:
            headers["Content-Type"] = content_type
        return urllib.request.Request(url, data=data, headers=headers,
                                      method="POST" if data is not None else "GET")

    def download(self, uri: str, destination: Path, setting: str) -> str:
        """Stream `uri` into `destination`; returns the sha256 of what arrived."""
        bucket, name = split_gs_uri(uri, setting)
        url = (f"{self.endpoint}/storage/v1/b/{bucket}/o/"
               f"{urllib.parse.quote(name, safe='')}?alt=media")

        def fetch() -> str:
            try:
                with open_url(self._request(url), timeout=60) as response, \
                        destination.open("wb") as out:
                    return read_body(response, out)[1]
            except urllib.error.HTTPError as error:
                raise AgentError(_download_refusal(uri, setting, error.code)) from None

        return retrying(fetch, f"download {uri}")

    def upload(self, uri: str, data: bytes, content_type: str) -> None:
        """A multipart upload: the object gets its content type and may be empty."""
        bucket, name = split_gs_uri(uri, STATUS_KEY)
        boundary = uuid.uuid4().hex
        meta = json.dumps({"name": name, "contentType": content_type})
        body = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n"
                f"{meta}\r\n--{boundary}\r\nContent-Type: {content_type}\r\n\r\n").encode()
        body += data + f"\r\n--{boundary}--\r\n".encode()
        url = f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=multipart"
        request = self._request(url, body, f"multipart/related; boundary={boundary}")

        def send() -> None:
            with open_url(request, timeout=30) as response:
                read_body(response)

        retrying(send, f"upload {uri}", attempts=3)


def _download_refusal(uri: str, setting: str, code: int) -> str:
    if code == 404:
        return f"{setting}: {uri} does not exist (HTTP 404)"
    if code in (401, 403):
        return (f"{setting}: the node's service account may not read {uri} "
                f"(HTTP {code}); it needs storage.objects.get on the bucket")
    return f"{setting}: downloading {uri} failed with HTTP {code}"


# -- what the node should run ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Desired:
    """The metadata keys that decide what runs; a change of any of them restarts the job."""

    package_uri: str
    package_sha256: str
    job_json: str
    workers: str

    @classmethod
    def from_attributes(cls, attributes: Mapping[str, str]) -> Desired:
        missing = [key for key in (PACKAGE_KEY, PACKAGE_SHA256_KEY, JOB_KEY)
                   if not attributes.get(key)]
        if missing:
            raise AgentError(f"node metadata lacks {', '.join(missing)} (set by the "
                             "tpu-stack TpuNode component)")
        sha = attributes[PACKAGE_SHA256_KEY].strip().lower()
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise AgentError(f"{PACKAGE_SHA256_KEY}: {sha!r} is not a hex sha256")
        workers = attributes.get(WORKERS_KEY, "all").strip()
        if workers not in ("all", "0"):
            raise AgentError(f"{WORKERS_KEY}: {workers!r} is not allowed; use 'all' "
                             "(single host) or '0' (pod slice: worker 0 runs the client)")
        try:
            json.loads(attributes[JOB_KEY])
        except ValueError as error:
            raise AgentError(f"{JOB_KEY}: not valid JSON ({error})") from None
        return cls(attributes[PACKAGE_KEY].strip(), sha, attributes[JOB_KEY], workers)

    @property
    def run_key(self) -> str:
        """Names one (package, job) pair: the local memory of a finished job."""
        return hashlib.sha256(f"{self.package_sha256}\n{self.job_json}".encode()).hexdigest()[:24]


def worker_number(attributes: Mapping[str, str]) -> int:
    value = attributes.get(WORKER_NUMBER_KEY)
    if value is None:
        value = parse_tpu_env(attributes.get(TPU_ENV_KEY, "")).get("WORKER_ID", "0")
    try:
        return int(value)
    except ValueError:
        raise AgentError(f"{WORKER_NUMBER_KEY}: {value!r} is not a worker number") from None


def parse_tpu_env(text: str) -> dict[str, str]:
    """The `tpu-env` attribute: lines of `KEY: 'value'` (MaxText multihost_job.py)."""
    pairs = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            pairs[key.strip()] = value.strip().strip("'\"")
    return pairs


def node_name(attributes: Mapping[str, str], metadata: Metadata) -> str:
    name = parse_tpu_env(attributes.get(TPU_ENV_KEY, "")).get("NODE_ID")
    return name or metadata.get("instance/name")[0] or ""


def job_environment(base: Mapping[str, str], package_dir: Path, workers: str,
                    tpu_name: str) -> dict[str, str]:
    """The job's environment: the package beside the image's TensorFlow.

    `site/` holds the wheels pip installed with --target and `src/` the job's own
    modules; PYTHONPATH puts them in front of the image's site-packages. A venv
    (even with system site packages) would not do: where the image's Python is
    itself a venv, a venv made from it does not see the parent's packages.
    """
    env = dict(base)
    paths = [str(package_dir / "site"), str(package_dir / "src")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [base.get("PYTHONPATH")] if p])
    # On the VM the job must use the TPU, never fall back to CPU (docs/tpu-facts.md);
    # an explicit setting (tests, `tpuctl rehearse` on CPU) wins.
    env.setdefault("TPU_STACK_STRATEGY", "tpu")
    env["PYTHONUNBUFFERED"] = "1"  # step lines reach the status as they are printed
    if workers == "0":
        # Pod slice: one TF client on worker 0, addressing the slice by node name
        # (docs/tpu-facts.md, "TensorFlow on TPU"; ml-auto-solutions).
        env["TPU_NAME"] = tpu_name
        env["TPU_LOAD_LIBRARY"] = "0"
    return env


# -- installing a package ----------------------------------------------------------


def tensorflow_version() -> str:
    """The image's TensorFlow version, from its installed distribution's metadata.

    Reading metadata costs milliseconds where `import tensorflow` costs seconds;
    an import in a child process is the fallback for unusual installs.
    """
    import importlib.metadata  # here, not at the top: only an install needs it

    for dist in importlib.metadata.packages_distributions().get("tensorflow", []):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    code = "import tensorflow; print(tensorflow.__version__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        raise AgentError(f"the image's Python ({sys.executable}) cannot import tensorflow")
    return result.stdout.strip()


def pick_wheels(names: list[str], tf_version: str) -> list[str]:
    """Every wheel in the archive, with the tf-keras one matching TensorFlow's major.minor."""
    tf_minor = ".".join(tf_version.split(".")[:2])
    keras = {f"{m[1]}.{m[2]}": name for name in names if (m := TF_KERAS_WHEEL.match(name))}
    if keras and tf_minor not in keras:
        raise AgentError(f"the package carries tf-keras for TensorFlow {', '.join(sorted(keras))}; "
                         f"this image has TensorFlow {tf_version}: pick a runtimeVersion "
                         "with one of those or add its tf-keras to training/wheels.lock")
    others = [name for name in names if not TF_KERAS_WHEEL.match(name)]
    return others + ([keras[tf_minor]] if keras else [])


def extract(archive: Path, destination: Path) -> None:
    """Regular files and folders only, every name inside `destination`."""
    import tarfile  # here, not at the top: only an install needs it

    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            parts = Path(member.name).parts
            plain = member.isfile() or member.isdir()
            if member.name.startswith("/") or ".." in parts or not plain:
                raise AgentError(f"{PACKAGE_KEY}: archive entry {member.name!r} is not a plain "
                                 "file inside the package; refusing it")
            target = destination.joinpath(*parts)
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            with target.open("wb") as out:
                shutil.copyfileobj(source or io.BytesIO(), out)


class Installer:
    """Packages live in `<root>/packages/<sha256>`; the folder exists only once complete."""

    def __init__(self, root: Path, storage: Storage):
        self.root = root
        self.storage = storage

    def package_dir(self, sha256: str) -> Path:
        return self.root / "packages" / sha256

    def ensure(self, desired: Desired) -> Path:
        final = self.package_dir(desired.package_sha256)
        if final.is_dir():
            return final
        work = final.with_name(f".{desired.package_sha256}.partial")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        try:
            archive = work / "package.tar.gz"
            self._download(desired, archive)
            extract(archive, work / "src")
            archive.unlink()
            self._install_wheels(work)
            work.rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return final

    def _download(self, desired: Desired, archive: Path) -> None:
        got = self.storage.download(desired.package_uri, archive, PACKAGE_KEY)
        if got != desired.package_sha256:
            raise AgentError(f"{PACKAGE_SHA256_KEY}: {desired.package_uri} has sha256 {got}, "
                             f"not {desired.package_sha256}; refusing to run it")

    def _install_wheels(self, work: Path) -> None:
        wheel_dir = work / "src" / "wheels"
        names = sorted(p.name for p in wheel_dir.glob("*.whl")) if wheel_dir.is_dir() else []
        wheels = [str(wheel_dir / name) for name in pick_wheels(names, tensorflow_version())]
        if not wheels:
            return
        # --no-index --no-deps: the node has no route to PyPI, and nothing may
        # replace the image's TensorFlow. --no-compile: byte-compiling all of
        # tf-keras costs more than the job compiling what it imports, once
        # (bench/boot.py).
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                   "--disable-pip-version-check", "--no-cache-dir", "--no-compile", "--target",
                   str(work / "site"), *wheels]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise AgentError(f"pip could not install {', '.join(Path(w).name for w in wheels)}: "
                             f"{result.stderr.strip()[-400:]}")


# -- status ------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"tpu-stack-agent: {message}", file=sys.stderr, flush=True)


def utc_now() -> str:
    # timezone.utc, not datetime.UTC: TPU images on Ubuntu 22.04 run Python 3.10.
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


class Status:
    """One worker's status: guest attributes, `status.json` and `job.log` in GCS.

    Publishing never raises: losing a status update must not stop training. Fields
    and the log file are guarded by one lock, network calls by another, so a slow
    upload never blocks the thread that drains the job's output.
    """

    def __init__(self, metadata: Metadata, storage: Storage, root: Path, worker: int):
        self.metadata = metadata
        self.storage = storage
        self.worker = worker
        self.prefix: str | None = None
        self.dir = root / "status" / f"worker-{worker}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.dir / "job.log"
        self.fields = {"state": "installing", "step": "0", "package": "", "message": "",
                       "updated": utc_now()}
        self._lock = threading.Lock()
        self._network = threading.Lock()
        self._last_step_publish = 0.0
        self._uploaded: dict[str, bytes] = {}  # uri -> sha256 of what is there
        self._stop = threading.Event()
        threading.Thread(target=self._upload_periodically, daemon=True).start()

    def set(self, **fields: str | int) -> None:
        """Change fields and publish everywhere (status changes are rare)."""
        with self._lock:
            self.fields |= {key: str(value) for key, value in fields.items()}
            self.fields["updated"] = utc_now()
            summary = f"state={self.fields['state']} {self.fields['message']}".strip()
        if "state" in fields or "message" in fields:
            self.note(summary)
        self._publish(upload=True)

    def step(self, step: int) -> None:
        """A step from the job's output: published at most every few seconds."""
        with self._lock:
            self.fields["step"] = str(step)
            self.fields["updated"] = utc_now()
            due = time.monotonic() - self._last_step_publish >= STEP_PUBLISH_SECONDS
        if due:
            self._publish(upload=False)

    def note(self, message: str) -> None:
        """An agent line, in the agent's log and in job.log."""
        log(message)
        self.append_job_line(f"tpu-stack-agent: {utc_now()} {message}\n")

    def append_job_line(self, line: str) -> None:
        with self._lock, self.log_path.open("a") as out:
            out.write(line)

    def close(self) -> None:
        self._stop.set()
        self._upload()

    def _snapshot(self) -> dict[str, str]:
        with self._lock:
            self._last_step_publish = time.monotonic()
            return dict(self.fields)

    def _publish(self, upload: bool) -> None:
        fields = self._snapshot()
        (self.dir / "status.json").write_text(self._json(fields))
        with self._network:
            for key, value in fields.items():
                try:
                    self.metadata.put_guest_attribute(key, value)
                except (OSError, http.client.HTTPException) as error:
                    log(f"guest attribute {key}: {error}")
                    break
        if upload:
            self._upload()

    def _json(self, fields: Mapping[str, str]) -> str:
        return json.dumps(dict(fields) | {"worker": self.worker}, indent=2, sort_keys=True)

    def _upload(self) -> None:
        if not self.prefix:
            return
        base = f"{self.prefix.rstrip('/')}/worker-{self.worker}/"
        status = self._json(self._snapshot()).encode()
        with self._lock:
            log_bytes = self.log_path.read_bytes() if self.log_path.exists() else b""
        with self._network:
            try:
                self._upload_if_changed(base + "status.json", status, "application/json")
                self._upload_if_changed(base + "job.log", log_bytes, "text/plain")
            except AgentError as error:
                log(f"status upload: {error}")

    def _upload_if_changed(self, uri: str, data: bytes, content_type: str) -> None:
        digest = hashlib.sha256(data).digest()
        if self._uploaded.get(uri) != digest:
            self.storage.upload(uri, data, content_type)
            self._uploaded[uri] = digest

    def _upload_periodically(self) -> None:
        while not self._stop.wait(STATUS_UPLOAD_SECONDS):
            self._upload()


# -- the job process ---------------------------------------------------------------


def process_start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat, telling a pid apart from a later reuse of it;
    None when no such process lives (a zombie has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


class Job:
    """The training process: its own session, a pid file, output parsed for steps."""

    def __init__(self, root: Path, status: Status):
        self.pid_file = root / "run" / "job.pid"
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        self.status = status
        self.process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    def start(self, config: Path, env: Mapping[str, str], cwd: Path) -> None:
        command = [sys.executable, "-m", "tpu_training", "run", "--config", str(config)]
        self.process = subprocess.Popen(command, env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self.pid_file.write_text(f"{self.process.pid} {process_start_time(self.process.pid)}\n")
        self._reader = threading.Thread(target=self._read_output, args=(self.process.stdout,),
                                        daemon=True)
        self._reader.start()

    def poll(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def stop(self, grace: float = STOP_GRACE_SECONDS) -> int:
        """SIGTERM (the job checkpoints and exits 75), SIGKILL after `grace` seconds."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.status.note(f"job ignored SIGTERM for {grace:.0f}s; killing it")
                self.process.kill()
        return self.wait()

    def wait(self) -> int:
        assert self.process is not None
        code = self.process.wait()
        if self._reader is not None:
            self._reader.join(timeout=10)
        self.pid_file.unlink(missing_ok=True)
        return code

    def _read_output(self, stream: IO[bytes]) -> None:
        for raw in stream:
            line = raw.decode(errors="replace")
            self.status.append_job_line(line)
            if match := STEP_LINE.match(line) or RESUMED_LINE.match(line):
                self.status.step(int(match[1]))


def stop_stale_job(root: Path) -> None:
    """A job left by an earlier agent still holds the TPU ("TPU in use"): stop it by pid."""
    pid_file = root / "run" / "job.pid"
    try:
        pid_text, started = pid_file.read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return
    if process_start_time(pid) != started:
        pid_file.unlink(missing_ok=True)
        return
    log(f"stopping job pid {pid} left by an earlier agent")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    while process_start_time(pid) == started and time.monotonic() < deadline:
        time.sleep(0.5)
    if process_start_time(pid) == started:
        os.kill(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)


# -- watching metadata -------------------------------------------------------------


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
            except AgentError as error:
                log(f"watching metadata: {error}")
                time.sleep(RETRY_CAP_SECONDS)
                continue
            if etag == self.etag or self._stopped.is_set():
                continue
            self.etag = etag
            with self._lock:
                self.attributes = attributes
            self.wake.set()


# -- the agent ---------------------------------------------------------------------


class Agent:
    def __init__(self, root: Path, stay: bool):
        self.root = root
        self.stay = stay
        self.metadata = Metadata(os.environ.get("GCE_METADATA_HOST") or DEFAULT_METADATA_HOST)
        self.storage = Storage(self.metadata, storage_endpoint())
        self.installer = Installer(root, self.storage)
        # One request for every attribute: a reboot's time to launch is mostly requests.
        self.attributes, self.etag = self.metadata.attributes()
        self.worker = worker_number(self.attributes)
        self.status = Status(self.metadata, self.storage, root, self.worker)
        self.job = Job(root, self.status)
        self.wake = threading.Event()
        self.terminated = threading.Event()
        self.watcher: Watcher | None = None

    def terminate(self, *_: object) -> None:
        self.terminated.set()
        self.wake.set()

    def run(self) -> int:
        """Run what metadata asks for. As a service, a success is followed by
        watching for new metadata; a failure exits so systemd restarts the agent."""
        attributes = self.attributes
        self.watcher = Watcher(self.metadata, self.etag, self.wake)
        try:
            while True:
                code = self._run_once(attributes)
                if not self.stay or code != EXIT_OK or self.terminated.is_set():
                    return code
                self.status.note("waiting for a metadata change")
                next_attributes = self._wait_for_change()
                if next_attributes is None:
                    return code
                attributes = next_attributes
        finally:
            self.watcher.stop()
            self.status.close()

    def _wait_for_change(self) -> dict[str, str] | None:
        """New attributes, or None on SIGTERM."""
        while not self.terminated.is_set():
            self.wake.wait()
            self.wake.clear()
            if (attributes := self._changed_attributes()) is not None:
                return attributes
        return None

    def _changed_attributes(self) -> dict[str, str] | None:
        return self.watcher.take() if self.watcher else None

    def _run_once(self, attributes: dict[str, str]) -> int:
        """Install and run what `attributes` ask for, following updates; the exit code."""
        self.status.prefix = attributes.get(STATUS_KEY) or None
        try:
            desired: Desired | int = Desired.from_attributes(attributes)
            while isinstance(desired, Desired):
                desired = self._supervise(desired)
            return desired
        except AgentError as error:
            self.status.set(state="failed", message=str(error))
            return EXIT_FAILED

    def _supervise(self, desired: Desired) -> int | Desired:
        """Run `desired` to its outcome (an exit code) or to an update (the new Desired)."""
        if desired.workers == "0" and self.worker != 0:
            self.status.set(state="idle", package=desired.package_sha256,
                            message="pod slice: worker 0 runs the TensorFlow client")
            return EXIT_OK
        done = self.root / "done" / desired.run_key
        if done.exists():
            self.status.set(state="succeeded", package=desired.package_sha256,
                            step=done.read_text().strip() or "0",
                            message="finished earlier; not rerun")
            return EXIT_OK
        if not self.installer.package_dir(desired.package_sha256).is_dir():
            self.status.set(state="installing", package=desired.package_sha256, message="")
        package_dir = self.installer.ensure(desired)
        self._start(desired, package_dir)
        return self._follow(desired)

    def _start(self, desired: Desired, package_dir: Path) -> None:
        config = self.root / "jobs" / f"{desired.run_key}.json"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(desired.job_json)
        env = job_environment(os.environ, package_dir, desired.workers,
                              node_name(self.attributes, self.metadata)
                              if desired.workers == "0" else "")
        self.status.note(f"starting job: package {desired.package_sha256}, config {config}")
        self.job.start(config, env, cwd=package_dir)
        self.status.set(state="running", package=desired.package_sha256, message="")

    def _follow(self, desired: Desired) -> int | Desired:
        while self.job.poll() is None:
            self.wake.wait(1.0)
            self.wake.clear()
            if self.terminated.is_set():
                self.status.note("SIGTERM: stopping the job so it checkpoints")
                return self._outcome(desired, self.job.stop())
            update = self._update(desired)
            if update is not None:
                code = self.job.stop()
                self.status.note(f"job stopped for the update (exit code {code})")
                return update
        return self._outcome(desired, self.job.wait())

    def _update(self, desired: Desired) -> Desired | None:
        """A new package or job, installed while the old job still runs; None if none."""
        attributes = self._changed_attributes()
        if attributes is None:
            return None
        self.status.prefix = attributes.get(STATUS_KEY) or self.status.prefix
        try:
            new = Desired.from_attributes(attributes)
            if new == desired:
                return None
            self.status.set(message=f"update: installing package {new.package_sha256}")
            self.installer.ensure(new)
        except AgentError as error:
            self.status.set(message=f"update refused, still running the current job: {error}")
            return None
        self.status.note("update installed: stopping the job so it checkpoints")
        return new

    def _outcome(self, desired: Desired, code: int) -> int:
        if code == EXIT_OK:
            done = self.root / "done" / desired.run_key
            done.parent.mkdir(parents=True, exist_ok=True)
            done.write_text(self.status.fields["step"] + "\n")
            self.status.set(state="succeeded", message="job finished")
        elif code == EXIT_PREEMPTED:
            self.status.set(state="preempted", message="job stopped on SIGTERM after a checkpoint")
        else:
            self.status.set(state="failed", message=f"job exited with code {code}; see job.log")
        return code if code in (EXIT_OK, EXIT_PREEMPTED) else EXIT_FAILED


def hold_lock(root: Path) -> IO[str] | None:
    """One agent per node: an exclusive lock held for the agent's lifetime."""
    lock = (root / "agent.lock").open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    return lock


def main(argv: list[str] | None = None) -> int:
    # No argparse: importing it is a noticeable part of a reboot's time to launch.
    args = sys.argv[1:] if argv is None else argv
    if args[:1] != ["run"] or any(arg != "--stay" for arg in args[1:]):
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(os.environ.get("TPU_STACK_ROOT") or DEFAULT_ROOT)
    root.mkdir(parents=True, exist_ok=True)
    lock = hold_lock(root)
    if lock is None:
        log(f"another agent already supervises {root}; leaving it alone")
        return EXIT_OK
    stop_stale_job(root)
    try:
        agent = Agent(root, stay="--stay" in args)
    except AgentError as error:
        log(str(error))
        return EXIT_FAILED
    signal.signal(signal.SIGTERM, agent.terminate)
    signal.signal(signal.SIGINT, agent.terminate)
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
