"""What the node should run: the current release under the node's release prefix.

Contract C1 (docs/design.md, "The release pointer"): `tpu-stack-release` names a
prefix, `gs://<artifacts>/releases/<node-id>/`; under it one object per release,
`release-<first 16 hex of sha256(content)>.json`, whose content is compact JSON
with sorted keys: {"job": {...}, "package": "gs://.../tpu_training-<sha>.tar.gz",
"sha256": "<hex>"}. The current one is the latest `timeCreated`, ties broken by the
greatest name. A code or job change uploads a new object and never touches the
node's metadata, so a queued request keeps its place and no node is updated.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping

from node_agent.common import AgentError, parse_utc
from node_agent.contract import (
    RELEASE_KEY,
    RELEASE_OBJECT_PREFIX,
    RELEASE_OBJECT_SUFFIX,
    WORKERS_KEY,
)
from node_agent.storage import Storage, split_gs_uri

RELEASE_NAME = re.compile(
    rf"^{RELEASE_OBJECT_PREFIX}[0-9a-f]{{16}}{re.escape(RELEASE_OBJECT_SUFFIX)}$")


def release_content(job: Mapping[str, object], package_uri: str, sha256: str) -> bytes:
    """A release object's bytes: compact JSON with sorted keys (one content, one name)."""
    release = {"job": dict(job), "package": package_uri, "sha256": sha256}
    return json.dumps(release, sort_keys=True, separators=(",", ":")).encode()


def release_name(content: bytes) -> str:
    """`release-<first 16 hex of sha256(content)>.json`."""
    digest = hashlib.sha256(content).hexdigest()[:16]
    return f"{RELEASE_OBJECT_PREFIX}{digest}{RELEASE_OBJECT_SUFFIX}"


@dataclasses.dataclass(frozen=True)
class Release:
    """One release object: where it is, and the package and job it names."""

    uri: str
    package_uri: str
    package_sha256: str
    job_json: str

    @classmethod
    def parse(cls, uri: str, content: bytes) -> Release:
        try:
            value = json.loads(content)
            package, sha, job = value["package"], value["sha256"], value["job"]
        except (ValueError, TypeError, KeyError) as error:
            raise AgentError(f"{RELEASE_KEY}: {uri} is not a release object "
                             f"({{job, package, sha256}}): {error}") from None
        sha = str(sha).strip().lower()
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise AgentError(f"{RELEASE_KEY}: {uri}: sha256 {sha!r} is not a hex sha256")
        if not isinstance(job, dict) or not str(package).startswith("gs://"):
            raise AgentError(f"{RELEASE_KEY}: {uri}: job must be an object and package "
                             "a gs:// URI")
        return cls(uri, str(package), sha, json.dumps(job, sort_keys=True))


def current_release(storage: Storage, prefix: str) -> Release | None:
    """The release with the latest timeCreated (ties: the greatest name) under `prefix`,
    or None when there is none yet. One objects.list of the prefix (JSON API,
    `prefix=`, cloud.google.com/storage/docs/json_api/v1/objects/list), then one read."""
    bucket, folder = split_gs_uri(prefix, RELEASE_KEY)
    newest: tuple[float, str] | None = None
    for item in storage.list(bucket, folder, RELEASE_KEY, "name,timeCreated"):
        name = str(item.get("name", ""))
        created = parse_utc(str(item.get("timeCreated", "")))
        if created is None or not RELEASE_NAME.match(name[len(folder):]):
            continue
        newest = max(newest or (created, name), (created, name))
    if newest is None:
        return None
    uri = f"gs://{bucket}/{newest[1]}"
    content = storage.read(uri, RELEASE_KEY)
    return None if content is None else Release.parse(uri, content)


@dataclasses.dataclass(frozen=True)
class Desired:
    """What runs: a release on this node's workers; a change of either restarts the job."""

    release: Release
    workers: str

    @property
    def package_uri(self) -> str:
        return self.release.package_uri

    @property
    def package_sha256(self) -> str:
        return self.release.package_sha256

    @property
    def job_json(self) -> str:
        return self.release.job_json

    @property
    def run_key(self) -> str:
        """Names one (package, job) pair: the local memory of a finished job."""
        return hashlib.sha256(f"{self.package_sha256}\n{self.job_json}".encode()).hexdigest()[:24]


def node_settings(attributes: Mapping[str, str]) -> tuple[str, str]:
    """(release prefix, workers) from the node's metadata."""
    prefix = attributes.get(RELEASE_KEY, "").strip()
    if not prefix:
        raise AgentError(f"node metadata lacks {RELEASE_KEY} (set by the tpu-stack TpuNode "
                         "component: gs://<artifacts>/releases/<node>/)")
    split_gs_uri(prefix, RELEASE_KEY)
    workers = attributes.get(WORKERS_KEY, "all").strip()
    if workers not in ("all", "0"):
        raise AgentError(f"{WORKERS_KEY}: {workers!r} is not allowed; use 'all' "
                         "(single host) or '0' (pod slice: worker 0 runs the client)")
    return prefix.rstrip("/") + "/", workers
