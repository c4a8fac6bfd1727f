"""Live quota headroom of each fallback candidate, for `tpuctl plan --live`.

The limit is what Cloud Quotas reports (ops/tpu/quota.py, QuotaInfo per project and
quota id). Cloud Quotas' QuotaInfo carries limits only, no usage (QuotaDetails holds
`value` and rollout info; cloud.google.com/docs/quotas/reference/rest/v1/
QuotaInfo), so the usage is counted from the TPU API: the chips of the project's
nodes in the candidate's region that this stack does not own, per family and quota
type as GCP counts them (docs/tpu-facts.md: quota is per family and region,
on-demand and preemptible apart; a spot or preemptible node draws on preemptible,
the rest on on-demand). The stack's own nodes are left out there because the plan
counts them itself (model/candidates.py live_headroom). A region's zones are
the ones the catalog lists for the candidate's family; a node in a zone the catalog
does not list is not seen (unconfirmed that none exists).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.cloud import tpu_v2, tpu_v2alpha1

from cloud.tpu import ENDPOINT_ENV
from model import candidates, catalog
from model.fleet import StackTarget
from model.settings.schema import NodeSettings, StackSettings
from ops.tpu.api import (
    NoCredentialsError,
    TpuApi,
    TpuApiError,
    Unread,
    _chips,
    _type_of,
    belongs_to,
)
from ops.tpu.quota import Get, QuotaReader, QuotaReadError, lazy_get, limit_in, plain_get

TPU_API = "https://tpu.googleapis.com"

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


def reservation_places(settings: StackSettings) -> list[tuple[str, str]]:
    """(project, zone) of every candidate that names a reservation."""
    return sorted({(candidates.node_project(settings, node), c.zone)
                   for _, node in settings.all_nodes if node.fallback
                   for c in node.candidates if c.queue and c.queue.reservation_name})


def reservation_left(reservation: Any, cores_per_chip: int) -> str:
    """What is left of a reservation: size less usage, in chips (a reservation counted
    in cores: divided by the family's cores per chip, catalog); its state if not ACTIVE."""
    state = tpu_v2alpha1.Reservation.State(reservation.state).name
    if state != "ACTIVE":
        return state
    standard = reservation.standard
    left = standard.size - standard.usage.total
    units = tpu_v2alpha1.Reservation.Standard.CapacityUnits(standard.capacity_units).name
    if units == "CORES":
        return str(left // cores_per_chip)
    return str(left) if units == "CHIPS" else f"{left} ({units})"


class ReservationReader:
    """`GET {base}/v2alpha1/projects/<p>/locations/<zone>/reservations`, every page
    (cloud.google.com/tpu/docs/reference/rest/v2alpha1/projects.locations.reservations/
    list: needs tpu.nodes.get; v2 has no such call). Over REST because google-cloud-tpu
    1.27's tpu_v2alpha1 client has gRPC transports only; the answer is read with its
    proto-plus classes. `get`: url → (HTTP status, body), ops/tpu/quota.py's Get."""

    def __init__(self, get: Get, base: str = TPU_API) -> None:
        self._get, self._base = get, base.rstrip("/")

    def __call__(self, project: str, zone: str) -> list[Any]:
        reservations, token = [], ""
        while True:
            url = f"{self._base}/v2alpha1/projects/{project}/locations/{zone}/reservations"
            try:
                status, body = self._get(url + (f"?pageToken={token}" if token else ""))
            except OSError as error:
                raise TpuApiError(f"list_reservations on {zone}: {error}") from None
            if status != 200:
                why = " (needs tpu.nodes.get)" if status == 403 else ""
                raise TpuApiError(f"list_reservations on {zone} in project {project} "
                                  f"answered {status}{why}")
            try:
                page = tpu_v2alpha1.ListReservationsResponse.from_json(
                    body, ignore_unknown_fields=True)
            except ValueError:
                raise TpuApiError(f"list_reservations on {zone}: the answer could not be "
                                  "read") from None
            reservations += page.reservations
            token = page.next_page_token
            if not token:
                return reservations


def stack_reservations(target: StackTarget, env: Mapping[str, str]) -> ReservationReader:
    """A reader with the stack's credentials (built on first use), or anonymous against
    $TPU_STACK_TPU_ENDPOINT, the stand-in tpuctl's TPU calls go to."""
    if env.get(ENDPOINT_ENV):
        return ReservationReader(plain_get, env[ENDPOINT_ENV])
    return ReservationReader(lazy_get(target, env))


def live_reservations(settings: StackSettings, api: TpuApi, read: ReservationReader,
                      notes: list[str]) -> dict[tuple[str, str], str]:
    """reservation_key → what is left, for each reservation a candidate names; one the
    zone does not list is `not found`."""
    places = reservation_places(settings)
    found, unread = api.each_place(places, read)
    notes += [f"reservations in {u.zone} ({u.project}) not read: {u.error}" for u in unread]
    left: dict[tuple[str, str], str] = {}
    for _, node in settings.all_nodes:
        for c in node.candidates if node.fallback else ():
            name = c.queue.reservation_name if c.queue else None
            listed = found.get((candidates.node_project(settings, node), c.zone))
            if not name or listed is None:
                continue
            key = candidates.reservation_key(c.zone, name)
            match = next((r for r in listed
                          if candidates.reservation_key(c.zone, r.name) == key), None)
            left[key] = ("not found" if match is None else
                         reservation_left(match, c.tpu.generation.cores_per_chip))
    return left


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


def live_candidates(settings: StackSettings, api: TpuApi, reader: QuotaReader,
                    reservations: ReservationReader) -> LiveHeadroom:
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

    try:
        left = live_reservations(settings, api, reservations, notes)
    except NoCredentialsError as error:
        left = {}
        notes.append(f"reservations not read: {error}")
    return LiveHeadroom(candidates.stack_candidates(settings, headroom, left), tuple(notes))
