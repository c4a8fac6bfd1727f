"""What the node should run: the package and job its metadata names."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping

from node_agent.common import AgentError
from node_agent.contract import JOB_KEY, PACKAGE_KEY, PACKAGE_SHA256_KEY, WORKERS_KEY


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
