"""`tpuctl logs`: what the node agent wrote to GCS.

The node's `tpu-stack-status` metadata value is `gs://<logs bucket>/status/<node>/`;
the agent uploads `worker-<n>/job.log` and `worker-<n>/status.json` there (docs/design.md,
"What a TPU node carries in metadata"). status.json also carries the status fields as
the object's custom metadata, so one listing of the bucket gives every node's status
(`published_jobs`). google-cloud-storage honours STORAGE_EMULATOR_HOST, so tests aim
this at a local emulator.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cloud import gcp_credentials
from node_agent.contract import STATUS_KEY
from ops.tpu.api import STATUS_KEYS, NodeStatus

JOB_ENDED = {"succeeded", "failed"}
WORKER0_STATUS = "worker-0/status.json"  # worker 0 runs the job, as with guest attributes
LISTINGS_IN_FLIGHT = 16  # bucket listings at once (one per logs bucket: one per team)


class LogsError(RuntimeError):
    """The logs cannot be found; the message says where we looked."""


def status_prefix(node: NodeStatus) -> str:
    prefix = node.metadata.get(STATUS_KEY, "")
    if not prefix.startswith("gs://"):
        raise LogsError(f"node {node.node_id} has no {STATUS_KEY} metadata (gs://…/status/<node>/)")
    return prefix if prefix.endswith("/") else prefix + "/"


def split_gs(uri: str) -> tuple[str, str]:
    bucket, _, path = uri.removeprefix("gs://").partition("/")
    return bucket, path


def parent_of(path: str) -> str:
    """`status/dev-a/` -> `status/`: the folder every node's status prefix sits in."""
    return path[: path.rstrip("/").rfind("/") + 1]


class AgentLogs:
    """Reads one worker's job.log and status.json under a status prefix, with the
    stack's gcp credentials (`auth`; without it, the provider's environment variables,
    then plain ADC)."""

    def __init__(self, project: str, client: Any = None,
                 auth: gcp_credentials.GcpAuth | None = None) -> None:
        self.project = project
        self._client = client
        self._auth = auth
        self._lock = threading.Lock()

    @property
    def client(self) -> Any:
        with self._lock:  # listings of several buckets share one client: make it once
            return self._make_client()

    def _make_client(self) -> Any:
        if self._client is None:
            from google.cloud import storage

            # Against STORAGE_EMULATOR_HOST the client makes itself anonymous when given
            # no credentials (google-cloud-storage 3.x, google/cloud/storage/client.py).
            emulated = bool(os.environ.get("STORAGE_EMULATOR_HOST"))
            auth = self._auth or gcp_credentials.resolve({}, os.environ)
            credentials = None if emulated else gcp_credentials.build(auth)
            self._client = storage.Client(project=self.project, credentials=credentials)
        return self._client

    def _read(self, prefix: str, worker: int, name: str) -> bytes | None:
        from google.api_core import exceptions as gexc

        bucket, path = split_gs(f"{prefix}worker-{worker}/{name}")
        try:
            client = self.client
        except gcp_credentials.GcpCredentialsError as error:
            raise LogsError(str(error)) from None
        try:
            return client.bucket(bucket).blob(path).download_as_bytes()
        except gexc.NotFound:
            return None
        except gexc.Forbidden as error:
            raise LogsError(
                f"reading gs://{bucket}/{path} needs IAM permission storage.objects.get"
            ) from error

    def job_log(self, prefix: str, worker: int) -> bytes | None:
        return self._read(prefix, worker, "job.log")

    def status(self, prefix: str, worker: int) -> dict[str, Any] | None:
        raw = self._read(prefix, worker, "status.json")
        return None if raw is None else json.loads(raw)

    def published(self, bucket: str, parent: str,
                  strict: bool = False) -> dict[str, dict[str, str]]:
        """{`<parent><node>/`: worker 0's status fields} from the custom metadata of every
        `<parent>*/worker-0/status.json`: one objects.list (1,000 objects a page) for any
        number of nodes. {} when the bucket cannot be listed: the caller asks the nodes;
        `strict`: the error is raised (the controller reports it, ops/controller/agents.py).
        """
        from google.api_core import exceptions as gexc
        from google.auth import exceptions as auth_exceptions

        try:
            listing = self.client.list_blobs(
                bucket, prefix=parent, match_glob=f"{parent}*/{WORKER0_STATUS}",
                fields="items(name,metadata),nextPageToken")
            # Each object's JSON resource as it came (google-api-core's page iterator
            # takes `item_to_value`): no Blob per object, whose `metadata` getter
            # deep-copies (a fifth of status's CPU at 10,000 nodes, bench/status_scale.py).
            listing.item_to_value = lambda _iterator, item: item
            items = list(listing)
        except (gexc.GoogleAPICallError, auth_exceptions.GoogleAuthError,
                gcp_credentials.GcpCredentialsError):
            if strict:
                raise
            return {}
        return {
            name.removesuffix(WORKER0_STATUS): fields
            for item in items
            if isinstance(item, dict) and isinstance(name := item.get("name"), str)
            and name.endswith(f"/{WORKER0_STATUS}")
            and (fields := _status_fields(item.get("metadata")))
        }


def _status_fields(metadata: Any) -> dict[str, str]:
    """The status keys of an object's custom metadata (a JSON object of strings)."""
    if not isinstance(metadata, dict):
        return {}
    return {k: v for k, v in metadata.items() if k in STATUS_KEYS and isinstance(v, str)}


NodeKey = tuple[str, str]  # (zone, node id)


def published_jobs(logs: AgentLogs, nodes: list[NodeStatus]) -> dict[NodeKey, dict[str, str]]:
    """{(zone, node id): job status} for the nodes whose agent publishes its status as
    object metadata: one listing per logs bucket, not one request per node."""
    wanted: dict[tuple[str, str], dict[str, NodeStatus]] = {}
    for node in nodes:
        prefix = node.metadata.get(STATUS_KEY, "")
        if prefix.startswith("gs://"):
            bucket, path = split_gs(prefix if prefix.endswith("/") else prefix + "/")
            wanted.setdefault((bucket, parent_of(path)), {})[path] = node
    # A team's nodes publish to its own bucket: the listings go side by side. One storage
    # client serves the threads ("it is safe to share instances across threads",
    # google-cloud-python storage docs/index.rst, PR 5763).
    with ThreadPoolExecutor(max_workers=max(1, min(LISTINGS_IN_FLIGHT, len(wanted)))) as pool:
        listings = pool.map(lambda place: logs.published(*place), wanted)
    found = {}
    for by_path, listed in zip(wanted.values(), listings, strict=True):
        for path, fields in listed.items():
            if path in by_path:
                found[(by_path[path].zone, by_path[path].node_id)] = fields
    return found


def follow(
    logs: AgentLogs,
    prefix: str,
    worker: int,
    emit: Callable[[str], None],
    poll: float = 5.0,
    sleep: Callable[[float], None] = time.sleep,
    max_polls: int | None = None,
) -> str:
    """Print new log text as the agent uploads it; return the job's final state.

    The agent re-uploads the whole job.log, so each poll prints what lies past
    the last offset. Ends when status.json says the job succeeded or failed.
    """
    offset, polls = 0, 0
    while True:
        state = (logs.status(prefix, worker) or {}).get("state", "")
        offset = _emit_new(logs.job_log(prefix, worker) or b"", offset, emit)
        polls += 1
        if state in JOB_ENDED:
            # The agent uploads status.json before job.log: take the log's last upload too.
            sleep(poll)
            _emit_new(logs.job_log(prefix, worker) or b"", offset, emit)
            return state
        if max_polls is not None and polls >= max_polls:
            return state
        sleep(poll)


def _emit_new(text: bytes, offset: int, emit: Callable[[str], None]) -> int:
    if len(text) < offset:
        offset = 0  # a new run started a fresh log
    if len(text) > offset:
        emit(text[offset:].decode(errors="replace"))
    return len(text)
