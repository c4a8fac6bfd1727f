"""`tpuctl logs`: what the node agent wrote to GCS.

The node's `tpu-stack-status` metadata value is `gs://<logs bucket>/status/<node>/`;
the agent uploads `worker-<n>/job.log` and `worker-<n>/status.json` there (docs/design.md,
"What a TPU node carries in metadata"). google-cloud-storage honours
STORAGE_EMULATOR_HOST, so tests aim this at a local emulator.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from node_agent.contract import STATUS_KEY
from ops.tpu.api import NodeStatus

JOB_ENDED = {"succeeded", "failed"}


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


class AgentLogs:
    """Reads one worker's job.log and status.json under a status prefix."""

    def __init__(self, project: str, client: Any = None) -> None:
        self.project = project
        self._client = client

    @property
    def client(self) -> Any:
        if self._client is None:
            from google.cloud import storage

            self._client = storage.Client(project=self.project)
        return self._client

    def _read(self, prefix: str, worker: int, name: str) -> bytes | None:
        from google.api_core import exceptions as gexc

        bucket, path = split_gs(f"{prefix}worker-{worker}/{name}")
        try:
            return self.client.bucket(bucket).blob(path).download_as_bytes()
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
