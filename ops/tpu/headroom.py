"""Live quota headroom of each fallback candidate, for `tpuctl plan --live`.

The limit is what Cloud Quotas reports (ops/tpu/quota.py, QuotaInfo per project and
quota id). Cloud Quotas' QuotaInfo carries limits only, no usage (QuotaDetails holds
`value` and rollout info; cloud.google.com/docs/quotas/reference/rest/v1/
QuotaInfo), so the usage is counted from the TPU API: the chips of the project's
nodes in the candidate's region that this stack does not own, per family and quota
type as GCP counts them (docs/tpu-facts.md: quota is per family and region,
on-demand and preemptible apart; a spot or preemptible node draws on preemptible,
the rest on on-demand). The stack's own nodes are left out there because the plan
counts them itself (components/candidates.py live_headroom). A region's zones are
the ones the catalog lists for the candidate's family; a node in a zone the catalog
does not list is not seen (unconfirmed that none exists).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.cloud import tpu_v2

from components import candidates, catalog
from components.settings import NodeSettings, StackSettings
from ops.tpu.api import NoCredentialsError, TpuApi, Unread, _chips, _type_of, belongs_to
from ops.tpu.quota import QuotaReader, QuotaReadError, limit_in

Usage = dict[tuple[str, str, str], int]  # (project, quota id, region) -> chips


@dataclass(frozen=True)
class LiveHeadroom:
    """What `tpuctl plan --live` overlays on the plan's `candidates`."""

    candidates: dict[str, list[dict[str, object]]]
    notes: tuple[str, ...]  # why a figure stayed unknown (one line each)


def node_quota(node: tpu_v2.Node) -> tuple[str, str] | None:
    """(quota id, region) a listed node draws on; None for a type the catalog lacks."""
    pb = tpu_v2.Node.pb(node)
    generation = _generation_of(_type_of(node))
    if generation is None:
        return None
    scheduling = pb.scheduling_config
    quota_type = "preemptible" if scheduling.spot or scheduling.preemptible else "onDemand"
    quota = catalog.TPU_QUOTA_IDS.get((generation.name, quota_type))
    zone = pb.name.split("/")[3] if pb.name.count("/") >= 5 else ""
    return (quota, catalog.region_of(zone)) if quota and zone else None


def _generation_of(accelerator: str) -> catalog.Generation | None:
    """`v5litepod-8`, or `v5p 2x2x4` (an AcceleratorConfig, api.py _type_of)."""
    name, _, topology = accelerator.partition(" ")
    if topology:
        return next((g for g in catalog.GENERATIONS.values() if g.api_type.lower() == name),
                    None)
    try:
        return catalog.parse_accelerator_type(accelerator).generation
    except catalog.CatalogError:
        return None


def usage_places(settings: StackSettings) -> list[tuple[str, str]]:
    """(project, zone) to list: every zone the catalog lists for each candidate's family
    in each candidate's region, in the node's project."""
    places = set()
    for _, node in settings.all_nodes:
        if not node.fallback:
            continue
        project = candidates.node_project(settings, node)
        for candidate in node.candidates:
            region = catalog.region_of(candidate.zone)
            places |= {(project, zone) for zone in candidate.tpu.generation.zones
                       if catalog.region_of(zone) == region}
    return sorted(places)


def outside_usage(api: TpuApi, places: list[tuple[str, str]], stack: str
                  ) -> tuple[Usage, list[Unread]]:
    """Chips the nodes at `places` that `stack` does not own hold, per quota and region."""
    found, unread = api.each_place(places, api.list_nodes)
    used: Counter[tuple[str, str, str]] = Counter()
    for (project, _zone), nodes in found.items():
        for node in nodes:
            key = node_quota(node)
            if key and not belongs_to(dict(tpu_v2.Node.pb(node).labels), stack):
                used[(project, *key)] += _chips(node)
    return dict(used), unread


def limit_reader(reader: QuotaReader, notes: list[str]) -> candidates.LimitOf:
    def limit_of(project: str, quota_id: str, region: str) -> int | None:
        try:
            return limit_in(reader.limits(project, quota_id), region)
        except QuotaReadError as error:
            note = f"quota {quota_id} in {project}: {error}"
            if note not in notes:
                notes.append(note)
            return None
    return limit_of


def live_candidates(settings: StackSettings, api: TpuApi, reader: QuotaReader
                    ) -> LiveHeadroom:
    """The plan's candidates with quota headroom read live; where a read fails, the
    figure stays unknown and a note says why. A zone not read means the usage there is
    unknown: the quotas of its region stay unknown too (never a figure too high)."""
    notes: list[str] = []
    try:
        used, unread = outside_usage(api, usage_places(settings), settings.stack)
    except NoCredentialsError as error:
        return LiveHeadroom(candidates.stack_candidates(settings),
                            (f"not read live: {error}",))
    blind = {(u.project, catalog.region_of(u.zone)) for u in unread}
    notes += [f"nodes in {u.zone} ({u.project}) not read: {u.error}" for u in unread]
    limit_of = limit_reader(reader, notes)

    def seen_limit(project: str, quota_id: str, region: str) -> int | None:
        return None if (project, region) in blind else limit_of(project, quota_id, region)

    def headroom(stack: StackSettings, node: NodeSettings) -> Mapping[Any, object]:
        return candidates.live_headroom(stack, node, seen_limit, used)

    return LiveHeadroom(candidates.stack_candidates(settings, headroom), tuple(notes))
