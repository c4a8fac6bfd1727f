"""The agents' last status, which idle stops need: read per stack from the logs buckets
its manifest names (`statusBuckets`), only for a stack with idle stops.

An agent publishes its status as the custom metadata of
`status/<node id>/worker-0/status.json` in its stack's logs bucket (ops/tpu/logs.py), so
one objects.list per bucket answers for every node there: no per-node read. A bucket's
listing speaks only for the nodes of the stacks that name it. A bucket that cannot be
listed (no grant, gone) is one problem line: its stack's nodes get no idle stop this run,
the other stacks' do.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from model.manifest import Manifest
from node_agent.contract import STATUS_KEY
from ops.tpu.api import NodeStatus
from ops.tpu.logs import LISTINGS_IN_FLIGHT, AgentLogs, split_gs

STATUS_PARENT = "status/"  # components/platform.py: <logs bucket>/status/<node id>/


def needs_status(manifest: Manifest) -> bool:
    return bool(manifest.status_buckets) or manifest.idle_stop_minutes is not None


def read_agents(client: Any, manifests: Sequence[Manifest], nodes: Sequence[NodeStatus],
                problems: list[str]) -> dict[str, dict[str, str]]:
    """{node id: its agent's last status} for the stacks with idle stops."""
    speaks_for: dict[str, set[str]] = {}  # bucket -> node ids it may report on
    for manifest in manifests:
        if not needs_status(manifest):
            continue
        ids = {n.node_id for n in manifest.target.nodes}
        for bucket in manifest.status_buckets or _named_by_nodes(nodes, ids):
            speaks_for.setdefault(bucket, set()).update(ids)
    if not speaks_for:
        return {}
    logs = AgentLogs("", client=client)
    with ThreadPoolExecutor(max_workers=min(LISTINGS_IN_FLIGHT, len(speaks_for))) as pool:
        listings = list(pool.map(lambda bucket: _listed(logs, bucket), speaks_for))
    found: dict[str, dict[str, str]] = {}
    for (bucket, ids), listed in zip(speaks_for.items(), listings, strict=True):
        if isinstance(listed, str):
            problems.append(f"gs://{bucket}: the agents' status was not read ({listed}): "
                            f"no idle stop there this run")
            continue
        found.update({node_id: job for node_id, job in listed.items() if node_id in ids})
    return found


def _named_by_nodes(nodes: Sequence[NodeStatus], ids: set[str]) -> list[str]:
    """A manifest without statusBuckets (written before them): the logs buckets its
    listed nodes' status metadata names."""
    return sorted({split_gs(n.metadata[STATUS_KEY])[0] for n in nodes
                   if n.node_id in ids and n.metadata.get(STATUS_KEY, "").startswith("gs://")})


def _listed(logs: AgentLogs, bucket: str) -> dict[str, dict[str, str]] | str:
    """{node id: fields} of one bucket, or what went wrong."""
    try:
        published = logs.published(bucket, STATUS_PARENT, strict=True)
    except Exception as error:  # one bucket's failure is one problem line
        return f"{type(error).__name__}: {error}"
    return {path.removeprefix(STATUS_PARENT).rstrip("/"): fields
            for path, fields in published.items()}
