"""tpu-stack node agent: install the training package from GCS and supervise the job.

Runs on every TPU VM worker at every boot (the bootstrap writes this file and starts
it), with nothing but the image's Python and TensorFlow: standard library only.
Its only input is the node's metadata (docs/design.md, "What a TPU node carries in
metadata"); every output goes to guest attributes and to GCS, so nothing is lost
when a spot node disappears.

    python3 agent.py run            one pass: install, run the job, exit with its outcome
    python3 agent.py run --stay     as a service: after the job ends keep watching metadata

Transient failures (TPU not ready or in use, storage 5xx, data not there yet) are
retried with backoff for as long as the node lives; permanent ones (a bad job
config, records that do not fit the model, a package whose sha256 differs) stop
with state `failed` and the job's last error line as the message. A preemption
or host-maintenance notice stops the job at once so it saves inside the notice.

Environment: GCE_METADATA_HOST, STORAGE_EMULATOR_HOST (google-auth and
google-cloud-storage conventions), TPU_STACK_ROOT (default /opt/tpu-stack).
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import fnmatch
import glob
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
NODE_KEY = "tpu-stack-node"  # the TPU node's own id (instance/name is the worker VM's)
RUNTIME_KEY = "tpu-stack-runtime-version"  # the node's runtimeVersion, e.g. tpu-vm-tf-2.18.0-pjrt
STARTUP_SCRIPT_KEY = "startup-script"
WORKER_NUMBER_KEY = "agent-worker-number"
NETWORK_ENDPOINTS_KEY = "worker-network-endpoints"
TPU_ENV_KEY = "tpu-env"
GUEST_NAMESPACE = "tpu-stack"
# Compute Engine's notices (cloud.google.com/compute/docs/instances/preemptible#detecting,
# .../metadata/getting-live-migration-notice): both support wait_for_change.
PREEMPTED_PATH = "instance/preempted"  # FALSE, then TRUE when the VM is being preempted
MAINTENANCE_PATH = "instance/maintenance-event"  # NONE, or the event about to happen
# The value TensorFlow itself treats as "this VM goes down" on GCE
# (tensorflow/python/distribute/failure_handling/gce_util.py,
# termination_watcher_function_gce); MIGRATE_ON_HOST_MAINTENANCE keeps the VM running.
TERMINATE_EVENT = "TERMINATE_ON_HOST_MAINTENANCE"

DEFAULT_ROOT = "/opt/tpu-stack"
DEFAULT_METADATA_HOST = "metadata.google.internal"
DEFAULT_STORAGE_ENDPOINT = "https://storage.googleapis.com"

# The job's exit codes (docs/design.md, "The training package").
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2  # a bad setting: permanent
EXIT_BAD_RECORDS = 65  # records that do not fit the model: permanent
EXIT_NO_DATA = 66  # trainData matches no file yet: wait for it
EXIT_TRANSIENT = 69  # TPU not ready or in use, storage 5xx: retry
EXIT_PREEMPTED = 75  # stopped on SIGTERM after saving a checkpoint
EXIT_STOP_SAVE_FAILED = 76  # stopped on SIGTERM, the stop save failed (a pod losing hosts)
PERMANENT_EXITS = (EXIT_USAGE, EXIT_BAD_RECORDS)
STOPPED_EXITS = (EXIT_PREEMPTED, EXIT_STOP_SAVE_FAILED)
CRASH_RETRIES = 3  # exit 1 or a signal, in a row without progress, before `failed`

STOP_GRACE_SECONDS = 120.0  # the unit's TimeoutStopSec leaves room above this
EXIT_AFTER_STOP_SECONDS = 3.0  # after `stopped_at=N` (its checkpoint saved) the job gets this
STATUS_UPLOAD_SECONDS = 30.0
STEP_PUBLISH_SECONDS = 2.0
WATCH_TIMEOUT_SECONDS = 60
RETRY_ATTEMPTS = 6
RETRY_BASE_SECONDS = 0.5
RETRY_CAP_SECONDS = 20.0
BACKOFF_BASE_SECONDS = 2.0  # between job runs after a transient failure ...
BACKOFF_CAP_SECONDS = 300.0  # ... doubling up to this, for as long as the node lives
DATA_POLL_CAP_SECONDS = 15.0  # a listing every 15 s costs nothing; data starts soon
LOG_ROLL_BYTES = 8 << 20  # job.log rolls to job.log.1 past this
LOG_TAIL_BYTES = 256 << 10  # what goes to GCS: the last this many bytes
CHUNK = 1 << 20
LIBTPU_PATHS = ("/lib/libtpu.so",)  # where TPU VM images keep libtpu (ml-auto-solutions)

STEP_LINE = re.compile(r"^tpu_training step=(\d+)")
RESUMED_LINE = re.compile(r"^tpu_training resumed_from=(\d+)")
STOPPED_LINE = re.compile(r"^tpu_training stopped_at=(\d+)")
SAVED_LINE = re.compile(r"^tpu_training saved (.*)$")
GOODPUT_LINE = re.compile(r"^tpu_training goodput (.*)$")
WAITING_LINE = re.compile(r"^tpu_training waiting_for_data pattern=(.*)$")
ERROR_LINE = re.compile(r"^tpu_training: error: (.*)$")
TF_KERAS_WHEEL = re.compile(r"^tf_keras-(\d+)\.(\d+)(?:\.[^-]*)?-.*\.whl$")

T = TypeVar("T")


class AgentError(Exception):
    """A problem the agent cannot get past; its text becomes the status message."""


class TransientError(Exception):
    """A failure worth retrying (connection trouble, HTTP 429 or 5xx)."""


# -- retries --------------------------------------------------------------------


class Backoff:
    """Delays that double from `base` up to `cap`, with jitter, and never run out:
    a transient failure is retried for as long as the node lives."""

    def __init__(self, base: float = BACKOFF_BASE_SECONDS, cap: float = BACKOFF_CAP_SECONDS):
        self.base = base
        self.cap = cap
        self.attempts = 0

    def next_delay(self) -> float:
        delay = min(self.cap, self.base * 2 ** min(self.attempts, 32))
        self.attempts += 1
        return delay / 2 + random.uniform(0, delay / 2)

    def reset(self) -> None:
        self.attempts = 0


def retrying(action: Callable[[], T], what: str, attempts: int = RETRY_ATTEMPTS) -> T:
    """`action()`, retried on TransientError with exponential backoff and jitter; after
    `attempts` the TransientError goes to the caller, whose own loop may back off further."""
    backoff = Backoff(RETRY_BASE_SECONDS, RETRY_CAP_SECONDS)
    for attempt in range(attempts):
        try:
            return action()
        except TransientError as error:
            if attempt == attempts - 1:
                raise TransientError(f"{what}: gave up after {attempts} attempts: {error}") \
                    from None
            delay = backoff.next_delay()
            log(f"{what}: {error}; retrying in about {delay:.1f}s")
            time.sleep(delay)
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
        value, etag = self.watch("instance/attributes/", last_etag, {"recursive": "true"})
        return json.loads(value or "{}"), etag

    def watch(self, path: str, last_etag: str | None,
              query: Mapping[str, str] | None = None) -> tuple[str | None, str]:
        """`path` now (no `last_etag`), or once its ETag differs from `last_etag`; a
        long-poll that times out answers the same value and ETag."""
        query = dict(query or {})
        timeout = 10.0
        if last_etag is not None:
            query |= {"wait_for_change": "true", "last_etag": last_etag,
                      "timeout_sec": str(WATCH_TIMEOUT_SECONDS)}
            timeout += WATCH_TIMEOUT_SECONDS
        return self.get(path, query, timeout)

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

    def read(self, uri: str, setting: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        bucket, name = split_gs_uri(uri, setting)
        url = (f"{self.endpoint}/storage/v1/b/{bucket}/o/"
               f"{urllib.parse.quote(name, safe='')}?alt=media")

        def fetch() -> bytes | None:
            try:
                with open_url(self._request(url), timeout=30) as response:
                    return read_body(response)[0]
            except urllib.error.HTTPError as error:
                if error.code == 404:
                    return None
                raise AgentError(_download_refusal(uri, setting, error.code)) from None

        return retrying(fetch, f"read {uri}", attempts=3)

    def any_match(self, pattern: str, setting: str) -> bool:
        """Does any object match the gs:// glob `pattern`? One listing of the prefix
        before the first wildcard, in pages, stopping at the first match."""
        bucket, name_glob = split_gs_uri(pattern, setting)
        prefix = re.split(r"[*?\[]", name_glob, maxsplit=1)[0]
        token = ""
        while True:
            query = {"prefix": prefix, "fields": "items(name),nextPageToken"}
            if token:
                query["pageToken"] = token
            url = f"{self.endpoint}/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}"

            def fetch(url: str = url) -> dict:
                try:
                    with open_url(self._request(url), timeout=30) as response:
                        return json.loads(read_body(response)[0] or b"{}")
                except urllib.error.HTTPError as error:
                    raise AgentError(f"{setting}: listing gs://{bucket}/{prefix} failed with "
                                     f"HTTP {error.code}") from None

            page = retrying(fetch, f"list gs://{bucket}/{prefix}", attempts=3)
            if any(fnmatch.fnmatchcase(item.get("name", ""), name_glob)
                   for item in page.get("items") or []):
                return True
            token = page.get("nextPageToken") or ""
            if not token:
                return False

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


def node_id(attributes: Mapping[str, str], metadata: Metadata) -> str:
    """The TPU node's own id: `tpu-stack-node` (set by the TpuNode component), else
    tpu-env's NODE_ID, else the VM's name (on a pod, a worker's name, not the node's)."""
    return (attributes.get(NODE_KEY, "").strip()
            or parse_tpu_env(attributes.get(TPU_ENV_KEY, "")).get("NODE_ID")
            or metadata.get("instance/name")[0] or "")


def grpc_tpu_name(endpoints: str) -> str:
    """TPU_NAME for a pod slice's one TF client: `grpc://<ip>:8470,...` in worker order.

    `worker-network-endpoints` lists `<a>:<b>:<ip>` per worker, worker 0 first (JAX
    jax/_src/clusters/cloud_tpu_cluster.py takes the third field, the first entry
    being the coordinator). A `grpc://` name makes TensorFlow's Cloud TPU client skip
    the TPU API (tensorflow/python/tpu/client/client.py: `_use_api` is false and
    `_environment_var_to_network_endpoints` splits the list; default port 8470),
    which needs googleapiclient and oauth2client, absent on the node.
    """
    names = []
    for entry in endpoints.split(","):
        parts = entry.strip().split(":")
        if len(parts) < 3 or not parts[2]:
            raise AgentError(f"{NETWORK_ENDPOINTS_KEY}: entry {entry.strip()!r} is not "
                             "'<a>:<b>:<ip>'; cannot address the pod slice's workers")
        names.append(f"grpc://{parts[2]}:8470")
    return ",".join(names)


def is_pjrt(runtime_version: str) -> bool:
    """`tpu-vm-tf-2.18.0-pjrt`, `tpu-vm-tf-2.19.0-pod-pjrt`, `...-pjrt-v5e-and-v6`."""
    return "pjrt" in runtime_version.strip().lower().split("-")


def libtpu_path(candidates: tuple[str, ...] = LIBTPU_PATHS) -> str | None:
    """Where this image keeps libtpu: /lib/libtpu.so on TPU VM images; where TensorFlow
    came from pip (tensorflow-tpu), the `libtpu` package's own copy (ml-auto-solutions
    moved its PJRT path there in a96327ca when it switched to pip). None when neither
    exists: TensorFlow's import raises on a plugin path that is not a file
    (tensorflow/__init__.py, load_pluggable_device_library), so none is set then."""
    for path in candidates:
        if Path(path).is_file():
            return path
    import importlib.util  # here: only a PJRT single host needs it

    spec = importlib.util.find_spec("libtpu")  # finds the package without importing it
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / "libtpu.so").is_file():
            return str(Path(folder) / "libtpu.so")
    return None


def read_environment_file(path: Path) -> dict[str, str]:
    """`KEY=value` lines of /etc/environment (pam_env's format; systemd units never
    read it, so the agent looks there for what the image sets)."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    pairs = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            pairs[key.strip()] = value.strip().strip("'\"")
    return pairs


PJRT_KEYS = ("TF_PLUGGABLE_DEVICE_LIBRARY_PATH", "NEXT_PLUGGABLE_DEVICE_USE_C_API")


def job_environment(base: Mapping[str, str], package_dir: Path, workers: str, *,
                    tpu_name: str = "", runtime_version: str = "",
                    image_env: Mapping[str, str] | None = None,
                    libtpu: Callable[[], str | None] = libtpu_path) -> dict[str, str]:
    """The job's environment: the package beside the image's TensorFlow.

    `site/` holds the wheels pip installed with --target and `src/` the job's own
    modules; PYTHONPATH puts them in front of the image's site-packages. A venv
    (even with system site packages) would not do: where the image's Python is
    itself a venv, a venv made from it does not see the parent's packages.

    TensorFlow follows Google's own TF-on-TPU CI (ml-auto-solutions
    dags/solutions_team/configs/tensorflow/common.py, export_env_variables): a
    single host on a `-pjrt` runtime loads libtpu as a PJRT plugin with
    TF_PLUGGABLE_DEVICE_LIBRARY_PATH and NEXT_PLUGGABLE_DEVICE_USE_C_API=true; a
    pod slice's client sets TPU_NAME and TPU_LOAD_LIBRARY=0 and loads no libtpu
    itself (the workers' TPU runtime serves it). A value already in the agent's
    environment or the image's /etc/environment wins over these.
    """
    env = dict(base)
    paths = [str(package_dir / "site"), str(package_dir / "src")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [base.get("PYTHONPATH")] if p])
    # On the VM the job must use the TPU, never fall back to CPU (docs/tpu-facts.md);
    # an explicit setting (tests, `tpuctl rehearse` on CPU) wins.
    env.setdefault("TPU_STACK_STRATEGY", "tpu")
    env["PYTHONUNBUFFERED"] = "1"  # step lines reach the status as they are printed
    image = image_env or {}
    if workers == "0":
        env.setdefault("TPU_NAME", image.get("TPU_NAME") or tpu_name)
        env.setdefault("TPU_LOAD_LIBRARY", image.get("TPU_LOAD_LIBRARY") or "0")
    elif is_pjrt(runtime_version):
        for key in PJRT_KEYS:
            if key not in env and key in image:
                env[key] = image[key]
        if "TF_PLUGGABLE_DEVICE_LIBRARY_PATH" not in env and (found := libtpu()):
            env["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] = found
        if "TF_PLUGGABLE_DEVICE_LIBRARY_PATH" in env:
            env.setdefault("NEXT_PLUGGABLE_DEVICE_USE_C_API", "true")
        else:
            log("a -pjrt runtime without libtpu.so (looked in /lib and the libtpu package): "
                "the job starts without the PJRT plugin variables")
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
    upload never blocks the thread that drains the job's output. Fields are strings
    or objects (goodput, lastSave, stopSave); a guest attribute carries an object as
    compact JSON. job.log rolls locally and only its bounded tail goes to GCS.
    """

    def __init__(self, metadata: Metadata, storage: Storage, root: Path, worker: int):
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
        threading.Thread(target=self._upload_periodically, daemon=True).start()

    def status_uri(self) -> str | None:
        return f"{self.prefix.rstrip('/')}/worker-{self.worker}/status.json" \
            if self.prefix else None

    def previous(self) -> dict[str, object]:
        """The status an earlier agent left: the GCS object (it outlives the node's
        disk), else the local file; {} when there is none or it cannot be read."""
        uri = self.status_uri()
        candidates: list[Callable[[], bytes | None]] = [
            lambda: self.storage.read(uri, STATUS_KEY) if uri else None,
            lambda: (self.dir / "status.json").read_bytes()]
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
        """Change fields (None removes one) and publish everywhere (changes are rare)."""
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
            self._publish(upload=False)

    def note(self, message: str) -> None:
        """An agent line, in the agent's log and in job.log."""
        log(message)
        self.append_job_line(f"tpu-stack-agent: {utc_now()} {message}\n")

    def append_job_line(self, line: str) -> None:
        with self._lock:
            with self.log_path.open("a") as out:
                out.write(line)
                rolled = out.tell() > LOG_ROLL_BYTES
            if rolled:
                self.log_path.replace(self.log_path.with_name("job.log.1"))

    def close(self) -> None:
        self._stop.set()
        self._upload()

    def _snapshot(self) -> dict[str, str | dict[str, object]]:
        with self._lock:
            self._last_step_publish = time.monotonic()
            return dict(self.fields)

    def _publish(self, upload: bool) -> None:
        fields = self._snapshot()
        (self.dir / "status.json").write_text(self._json(fields))
        with self._network:
            for key, value in fields.items():
                text = value if isinstance(value, str) else json.dumps(
                    value, sort_keys=True, separators=(",", ":"))
                try:
                    self.metadata.put_guest_attribute(key, text)
                except (OSError, http.client.HTTPException) as error:
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
        status = self._json(self._snapshot()).encode()
        with self._lock:
            log_bytes = log_tail(self.log_path, LOG_TAIL_BYTES)
        with self._network:
            try:
                self._upload_if_changed(uri, status, "application/json")
                self._upload_if_changed(uri.rsplit("/", 1)[0] + "/job.log", log_bytes,
                                        "text/plain")
            except (AgentError, TransientError) as error:
                log(f"status upload: {error}")

    def _upload_if_changed(self, uri: str, data: bytes, content_type: str) -> None:
        digest = hashlib.sha256(data).digest()
        if self._uploaded.get(uri) != digest:
            self.storage.upload(uri, data, content_type)
            self._uploaded[uri] = digest

    def _upload_periodically(self) -> None:
        while not self._stop.wait(STATUS_UPLOAD_SECONDS):
            self._upload()


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


# -- goodput -----------------------------------------------------------------------

# Google's ML Goodput Measurement categories (docs/design.md, "Goodput"). The job
# reports the first five for its own process run; the agent owns the last three.
JOB_CATEGORIES = ("productive", "tpu_init", "program_startup", "checkpoint_save",
                  "checkpoint_restore")
CATEGORIES = (*JOB_CATEGORIES, "waiting_for_data", "lost_progress", "infrastructure_recovery")


def key_values(text: str) -> dict[str, str]:
    """`a=1 b=x` -> {"a": "1", "b": "x"}."""
    return dict(part.split("=", 1) for part in text.split() if "=" in part)


def seconds_fields(text: str) -> dict[str, float]:
    found = {}
    for key, value in key_values(text).items():
        try:
            found[key] = float(value)
        except ValueError:
            continue
    return found


@dataclasses.dataclass
class JobRun:
    """What one job process said on stdout: steps, saves, goodput, errors."""

    start_step: int = 0  # resumed_from
    step: int = 0  # the furthest step reached
    saved_step: int | None = None  # the last checkpoint this run wrote
    stopped_at: int | None = None  # `stopped_at=N`: stopped on a signal after saving N
    last_save: dict[str, object] | None = None
    stop_save: dict[str, object] | None = None
    reported: dict[str, float] = dataclasses.field(default_factory=dict)
    reported_step: int = 0
    waiting_pattern: str | None = None
    error: str | None = None

    def read(self, line: str) -> str | None:
        """Take in one line; which part changed ("step", "save", "goodput") or None."""
        line = line.rstrip("\n")
        if match := RESUMED_LINE.match(line):
            self.start_step = self.step = int(match[1])
            return "step"
        if match := STOPPED_LINE.match(line):
            self.stopped_at = int(match[1])
            self.saved_step = self.stopped_at
        if match := STEP_LINE.match(line) or STOPPED_LINE.match(line):
            self.step = max(self.step, int(match[1]))
            return "step"
        if match := SAVED_LINE.match(line):
            return self._saved(key_values(match[1]))
        if match := GOODPUT_LINE.match(line):
            values = seconds_fields(match[1])
            self.reported_step = int(values.pop("step", self.reported_step))
            self.reported = {k: v for k, v in values.items() if k in JOB_CATEGORIES}
            return "goodput"
        if match := WAITING_LINE.match(line):
            self.waiting_pattern = match[1].strip()
        elif match := ERROR_LINE.match(line):
            self.error = match[1].strip()
        return None

    def _saved(self, values: dict[str, str]) -> str | None:
        try:
            save: dict[str, object] = {"step": int(values["step"]),
                                       "seconds": float(values.get("seconds", 0)),
                                       "bytes": int(values.get("bytes", 0)),
                                       "reason": values.get("reason", "")}
        except (KeyError, ValueError):
            return None
        self.saved_step = int(save["step"])  # type: ignore[arg-type]
        self.step = max(self.step, self.saved_step)
        self.last_save = save
        if save["reason"] == "stop":
            self.stop_save = {k: save[k] for k in ("step", "seconds", "bytes")}
        return "save"


def settle_run(run: JobRun, code: int, wall: float) -> dict[str, float]:
    """The seconds one finished job process adds to each category.

    The job's own report counts; what it did not report (interpreter start and exit,
    or the time after its last report when it died) is the remainder of its wall time.
    A run that ended without saving its last steps (a crash, a kill, a failed stop
    save) lost them: their share of its productive seconds moves to `lost_progress`,
    and so does the unreported remainder of a run that had been training.
    """
    added = {category: run.reported.get(category, 0.0) for category in JOB_CATEGORIES}
    remainder = max(0.0, wall - sum(added.values()))
    clean = code in (EXIT_OK, EXIT_PREEMPTED) or run.step <= run.start_step
    if clean:
        added["program_startup"] += remainder
        return added
    durable = max(run.start_step, run.saved_step or 0)
    trained = run.reported_step - run.start_step
    per_step = added["productive"] / trained if trained > 0 else 0.0
    lost = min(added["productive"], per_step * max(0, run.step - durable))
    added["productive"] -= lost
    added["lost_progress"] = lost + remainder
    return added


class Goodput:
    """Seconds per category over every run of one job on this node (restarts too:
    the totals live in the status object). `percent`: productive (kept) seconds over
    all accounted seconds."""

    def __init__(self, job: str, totals: Mapping[str, object] | None = None):
        self.job = job
        self.totals = {category: 0.0 for category in CATEGORIES}
        for category in CATEGORIES:
            value = (totals or {}).get(category)
            if isinstance(value, (int, float)) and value >= 0:
                self.totals[category] = float(value)

    @classmethod
    def resume(cls, job: str, previous: Mapping[str, object]) -> Goodput:
        """The totals an earlier agent published for this same job, else zeros."""
        earlier = previous.get("goodput")
        if isinstance(earlier, dict) and earlier.get("job") == job:
            return cls(job, earlier)
        return cls(job)

    def add(self, category: str, seconds: float) -> None:
        self.totals[category] += max(0.0, seconds)

    def merge(self, added: Mapping[str, float]) -> None:
        for category, seconds in added.items():
            self.add(category, seconds)

    def view(self, live: Mapping[str, float] | None = None) -> dict[str, object]:
        """The status object: totals (plus a running job's report so far) and percent."""
        totals = dict(self.totals)
        for category, seconds in (live or {}).items():
            totals[category] = totals.get(category, 0.0) + seconds
        accounted = sum(totals.values())
        percent = round(100.0 * totals["productive"] / accounted, 1) if accounted else None
        return {k: round(v, 3) for k, v in totals.items()} | {
            "total": round(accounted, 3), "percent": percent, "job": self.job}


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
    """The training process: its own session, a pid file, output parsed into a JobRun."""

    def __init__(self, root: Path, status: Status):
        self.pid_file = root / "run" / "job.pid"
        self.pid_file.parent.mkdir(parents=True, exist_ok=True)
        self.status = status
        self.process: subprocess.Popen[bytes] | None = None
        self.run = JobRun()
        self.on_progress: Callable[[JobRun, str], None] = lambda _run, _what: None
        self._reader: threading.Thread | None = None

    def start(self, config: Path, env: Mapping[str, str], cwd: Path) -> None:
        command = [sys.executable, "-m", "tpu_training", "run", "--config", str(config)]
        self.run = JobRun()
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
        """SIGTERM (the job checkpoints and exits 75), SIGKILL after `grace` seconds, or
        EXIT_AFTER_STOP_SECONDS after the job said its stop checkpoint is saved: a
        TensorFlow process can spend longer than a spot VM's notice tearing itself down
        (16 s for mnist_cnn on a loaded 2-core machine), and the checkpoint is durable."""
        assert self.process is not None
        deadline = time.monotonic() + grace
        saved_at: float | None = None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        while self.process.poll() is None:
            now = time.monotonic()
            if saved_at is None and self.run.stopped_at is not None:
                saved_at = now
            if saved_at is not None and now - saved_at > EXIT_AFTER_STOP_SECONDS:
                self.status.note(f"job saved step {self.run.stopped_at} but had not exited "
                                 f"{EXIT_AFTER_STOP_SECONDS:.0f}s later; killing it")
                self.process.kill()
                self.wait()
                return EXIT_PREEMPTED
            if now > deadline:
                self.status.note(f"job ignored SIGTERM for {grace:.0f}s; killing it")
                self.process.kill()
                break
            time.sleep(0.1)
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
            changed = self.run.read(line)
            if changed:
                self.on_progress(self.run, changed)


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


# -- the agent ---------------------------------------------------------------------

ACTIVE_STATES = ("installing", "running", "retrying", "waiting-for-data", "preempted")


class Agent:
    def __init__(self, root: Path, stay: bool):
        self.root = root
        self.stay = stay
        self.started_at = time.time()
        self.metadata = Metadata(os.environ.get("GCE_METADATA_HOST") or DEFAULT_METADATA_HOST)
        self.storage = Storage(self.metadata, storage_endpoint())
        self.installer = Installer(root, self.storage)
        # One request for every attribute: a reboot's time to launch is mostly requests.
        self.attributes, self.etag = self.metadata.attributes()
        self.worker = worker_number(self.attributes)
        self.status = Status(self.metadata, self.storage, root, self.worker)
        self.status.prefix = self.attributes.get(STATUS_KEY) or None
        self.previous = self.status.previous()
        self.job = Job(root, self.status)
        self.job.on_progress = self._progress
        self.wake = threading.Event()
        self.terminated = threading.Event()
        self.watcher: Watcher | None = None
        self.notices: NoticeWatcher | None = None
        self.goodput = Goodput("")
        self._since = time.monotonic()  # start of the span not yet accounted

    def terminate(self, *_: object) -> None:
        self.terminated.set()
        self.wake.set()

    def run(self) -> int:
        """Run what metadata asks for. As a service, an outcome is followed by watching
        for new metadata (or, after a notice, for the notice to clear); the agent
        itself exits only when stopped, so systemd restarts only a crashed agent."""
        attributes = self.attributes
        self.watcher = Watcher(self.metadata, self.etag, self.wake)
        self.notices = NoticeWatcher(self.metadata, self.wake)
        try:
            while True:
                code = self._run_once(attributes)
                if not self.stay or self.terminated.is_set():
                    return code
                if self._notice():
                    self.status.note("waiting for the notice to clear")
                    if not self._wait_until(lambda: self._notice() is None):
                        return code
                    attributes = self._changed_attributes() or attributes
                    continue
                self.status.note("waiting for a metadata change")
                next_attributes = self._wait_for_change()
                if next_attributes is None:
                    return code
                attributes = next_attributes
        finally:
            self.watcher.stop()
            self.notices.stop()
            self.status.close()

    def _notice(self) -> str | None:
        return self.notices.reason() if self.notices else None

    def _wait_until(self, done: Callable[[], bool]) -> bool:
        """Wake-ups until `done()`; False on SIGTERM."""
        while not self.terminated.is_set():
            if done():
                return True
            self.wake.wait()
            self.wake.clear()
        return False

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
        self.attributes = attributes
        self.status.prefix = attributes.get(STATUS_KEY) or None
        backoff = Backoff()
        try:
            desired: Desired | int = Desired.from_attributes(attributes)
            while isinstance(desired, Desired):
                try:
                    desired = self._supervise(desired)
                except TransientError as error:  # e.g. the metadata server, for a moment
                    interrupted = self._pause(backoff, desired, str(error))
                    desired = desired if interrupted is None else interrupted
            return desired
        except AgentError as error:
            self.status.set(state="failed", message=str(error))
            return EXIT_FAILED

    def _supervise(self, desired: Desired) -> int | Desired:
        """Run `desired` to its outcome (an exit code) or to an update (the new Desired):
        transient failures back off and run it again, for as long as the node lives."""
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
        self._begin_accounting(desired)
        retry, data_poll, crashes = Backoff(), Backoff(cap=DATA_POLL_CAP_SECONDS), 0
        while True:
            if (interrupted := self._interrupted(desired)) is not None:
                return interrupted
            try:
                package_dir = self._install(desired)
            except TransientError as error:
                if (interrupted := self._pause(retry, desired, str(error))) is not None:
                    return interrupted
                continue
            # No data yet: wait here rather than start TensorFlow (and the TPU) only to
            # hear exit 66; the job still checks every pattern itself.
            train_data = str(json.loads(desired.job_json).get("trainData") or "")
            if train_data and not self._data_present(train_data):
                if (interrupted := self._wait_for_data(data_poll, desired, train_data)) \
                        is not None:
                    return interrupted
                continue
            code, update = self._run_job(desired, package_dir)
            if update is not None:
                return update
            run = self.job.run
            if code == EXIT_OK:
                return self._succeeded(desired)
            if code in STOPPED_EXITS or self.terminated.is_set() or self._notice():
                return self._stopped(code, run)
            if code in PERMANENT_EXITS:
                self.status.set(state="failed", message=self._job_error(code, run))
                return EXIT_FAILED
            if run.step > run.start_step:
                retry.reset()
                crashes = 0
            if code == EXIT_NO_DATA:
                pattern = run.waiting_pattern or train_data
                if (interrupted := self._wait_for_data(data_poll, desired, pattern)) is not None:
                    return interrupted
                continue
            if code != EXIT_TRANSIENT:
                crashes += 1
                if crashes > CRASH_RETRIES:
                    self.status.set(state="failed", message=self._job_error(code, run) +
                                    f" ({crashes} times in a row without progress)")
                    return EXIT_FAILED
            if (interrupted := self._pause(retry, desired, self._job_error(code, run))) \
                    is not None:
                return interrupted

    def _install(self, desired: Desired) -> Path:
        if not self.installer.package_dir(desired.package_sha256).is_dir():
            self.status.set(state="installing", package=desired.package_sha256, message="")
        return self.installer.ensure(desired)

    def _job_error(self, code: int, run: JobRun) -> str:
        what = f"job exited with code {code}" if code >= 0 else f"job killed by signal {-code}"
        return f"{what}: {run.error}" if run.error else f"{what}; see job.log"

    def _interrupted(self, desired: Desired) -> int | Desired | None:
        """SIGTERM or a notice (nothing to stop: the job is not running), or an update."""
        if self.terminated.is_set() or self._notice():
            if reason := self._notice():
                self.status.set(state="preempted", message=f"{reason}: not starting the job")
            return EXIT_PREEMPTED
        return self._update(desired)

    def _pause(self, backoff: Backoff, desired: Desired, why: str) -> int | Desired | None:
        """State `retrying` for the next backoff delay; what interrupted it, if anything."""
        delay = backoff.next_delay()
        self.status.set(state="retrying", message=f"{why}; retrying in {delay:.0f}s "
                                                  f"(attempt {backoff.attempts})")
        deadline = time.monotonic() + delay
        while (left := deadline - time.monotonic()) > 0:
            self.wake.wait(left)
            self.wake.clear()
            if (interrupted := self._interrupted(desired)) is not None:
                return interrupted
        return None

    def _wait_for_data(self, backoff: Backoff, desired: Desired,
                       pattern: str) -> int | Desired | None:
        """State `waiting-for-data` until a file matches `pattern` (polling the listing
        with backoff); what interrupted it, if anything."""
        self._account("infrastructure_recovery")
        self.status.set(state="waiting-for-data",
                        message=f"no file matches {pattern} yet; the job starts when one does")
        try:
            while True:
                deadline = time.monotonic() + backoff.next_delay()
                while (left := deadline - time.monotonic()) > 0:
                    self.wake.wait(left)
                    self.wake.clear()
                    if (interrupted := self._interrupted(desired)) is not None:
                        return interrupted
                if self._data_present(pattern):
                    self.status.note(f"data found for {pattern}; starting the job")
                    return None
        finally:
            self._account("waiting_for_data")

    def _data_present(self, pattern: str) -> bool:
        """A file matches `pattern` (gs://: a bucket listing; else the local disk). When
        the listing fails the job itself is asked again (it is the judge)."""
        if pattern.startswith("gs://"):
            try:
                return self.storage.any_match(pattern, "trainData")
            except (AgentError, TransientError) as error:
                log(f"listing for {pattern}: {error}; asking the job")
                return True
        if "://" in pattern:
            return True
        return bool(glob.glob(pattern))

    def _run_job(self, desired: Desired, package_dir: Path) -> tuple[int, Desired | None]:
        """Start the job and follow it to its exit code (and the update that stopped it)."""
        config = self.root / "jobs" / f"{desired.run_key}.json"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(desired.job_json)
        env = job_environment(os.environ, package_dir, desired.workers,
                              tpu_name=self._pod_tpu_name() if desired.workers == "0" else "",
                              runtime_version=self.attributes.get(RUNTIME_KEY, ""),
                              image_env=read_environment_file(Path("/etc/environment")))
        self.status.note(f"starting job: package {desired.package_sha256}, config {config}")
        self._account("infrastructure_recovery")
        launched = time.monotonic()
        self.job.start(config, env, cwd=package_dir)
        self.status.set(state="running", package=desired.package_sha256, message="")
        code, update = self._follow(desired)
        self.goodput.merge(settle_run(self.job.run, code, time.monotonic() - launched))
        self._since = time.monotonic()
        self.status.set(goodput=self.goodput.view())
        return code, update

    def _pod_tpu_name(self) -> str:
        """grpc:// endpoints of every worker (no TPU API on the node); the node's id
        where the VM does not list them."""
        endpoints = self.attributes.get(NETWORK_ENDPOINTS_KEY, "").strip()
        return grpc_tpu_name(endpoints) if endpoints else node_id(self.attributes, self.metadata)

    def _follow(self, desired: Desired) -> tuple[int, Desired | None]:
        while self.job.poll() is None:
            self.wake.wait(1.0)
            self.wake.clear()
            if self.terminated.is_set():
                self.status.note("SIGTERM: stopping the job so it checkpoints")
                return self.job.stop(), None
            if reason := self._notice():
                self.status.note(f"{reason}: stopping the job so it saves inside the notice")
                return self.job.stop(), None
            update = self._update(desired)
            if update is not None:
                code = self.job.stop()
                self.status.note(f"job stopped for the update (exit code {code})")
                return code, update
        return self.job.wait(), None

    def _update(self, desired: Desired) -> Desired | None:
        """A new package or job, installed while the old job still runs; None if none."""
        attributes = self._changed_attributes()
        if attributes is None:
            return None
        self.attributes = attributes
        self.status.prefix = attributes.get(STATUS_KEY) or self.status.prefix
        try:
            new = Desired.from_attributes(attributes)
            if new == desired:
                return None
            self.status.set(message=f"update: installing package {new.package_sha256}")
            self.installer.ensure(new)
        except (AgentError, TransientError) as error:
            self.status.set(message=f"update refused, still running the current job: {error}")
            return None
        self.status.note("update installed: stopping the job so it checkpoints")
        return new

    def _succeeded(self, desired: Desired) -> int:
        done = self.root / "done" / desired.run_key
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(str(self.status.fields["step"]) + "\n")
        self.status.set(state="succeeded", message="job finished")
        return EXIT_OK

    def _stopped(self, code: int, run: JobRun) -> int:
        """The job stopped on a signal (ours or the VM's): `preempted`, not `failed`."""
        why = self._notice() or ("SIGTERM" if self.terminated.is_set() else "a stop signal")
        if code == EXIT_PREEMPTED:
            saved = run.stop_save["step"] if run.stop_save else run.stopped_at or run.step
            self.status.set(state="preempted", stopSave=run.stop_save,
                            message=f"stopped ({why}) after saving step {saved}")
            return EXIT_PREEMPTED
        durable = max(run.start_step, run.saved_step or 0)
        self.status.set(state="preempted", message=f"stopped ({why}) without a stop save "
                        f"({self._job_error(code, run)}); resumes from step {durable}")
        return EXIT_STOP_SAVE_FAILED

    # -- goodput ---------------------------------------------------------------------

    def _begin_accounting(self, desired: Desired) -> None:
        """Totals for this job: carried on from an earlier agent's status, plus the time
        the node spent down in between when that agent was still working on it."""
        if self.goodput.job == desired.run_key:
            return
        self.goodput = Goodput.resume(desired.run_key, self.previous)
        fields: dict[str, object] = {"node": node_id(self.attributes, self.metadata)}
        earlier = self.previous.get("goodput")
        if isinstance(earlier, dict) and earlier.get("job") == desired.run_key:
            fields["lastSave"] = self.previous.get("lastSave")
            if self.previous.get("state") in ACTIVE_STATES:
                self.goodput.add("infrastructure_recovery",
                                 self.started_at - parse_utc(str(self.previous.get("updated"))))
        self.previous = {}
        self.status.set(goodput=self.goodput.view(), **fields)  # type: ignore[arg-type]

    def _account(self, category: str) -> None:
        now = time.monotonic()
        self.goodput.add(category, now - self._since)
        self._since = now

    def _progress(self, run: JobRun, what: str) -> None:
        """From the job's output (the reader thread): steps, goodput so far, saves."""
        if what == "save":
            self.status.set(step=run.step, lastSave=run.last_save,
                            goodput=self.goodput.view(run.reported))
        else:
            self.status.progress(step=run.step, goodput=self.goodput.view(run.reported))


def parse_utc(text: str) -> float:
    """Seconds since the epoch of an `updated` timestamp; now when unreadable."""
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return time.time()


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
    except (AgentError, TransientError) as error:
        log(str(error))
        return EXIT_FAILED
    signal.signal(signal.SIGTERM, agent.terminate)
    signal.signal(signal.SIGINT, agent.terminate)
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
