"""`tpuctl preflight`: can every node of the stack be created where the stack says?

Three sources, each reported on its own: the catalog (model/catalog.py, the
only place tpuctl takes TPU facts from), the live TPU API of each zone (the
accelerator types and runtime versions it offers), and the TPU quota of each
project the nodes live in (a team's nodes: the team's project, docs/teams.md).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from model import catalog
from model.fleet import ExpectedNode, StackTarget
from ops.tpu.api import NoCredentialsError, TpuApi, Unread

Outcome = Literal["ok", "fail", "not checked"]
# (project, region, generation, spot) -> chips the quota allows, or None if unknown.
QuotaLookup = Callable[[str, str, catalog.Generation, bool], int | None]


@dataclass(frozen=True)
class Check:
    subject: str  # a node id, or "<generation> in <region>" for quota
    what: str
    outcome: Outcome
    detail: str = ""


@dataclass(frozen=True)
class PreflightReport:
    checks: tuple[Check, ...]
    live: bool  # False: the TPU API was not asked (offline or no credentials)
    note: str = ""
    credentials_error: str = ""  # why the TPU API could not be asked (exit 2)
    unread: tuple[Unread, ...] = ()  # (project, zone) pairs whose offers could not be read

    @property
    def ok(self) -> bool:
        return all(check.outcome != "fail" for check in self.checks)


def catalog_checks(node: ExpectedNode) -> list[Check]:
    gen = node.tpu.generation
    zone_ok = node.zone in gen.zones
    zone_detail = "" if zone_ok else f"the catalog lists {gen.name} only in {', '.join(gen.zones)}"
    problem = catalog.runtime_problem(node.tpu, node.runtime_version)
    return [
        Check(
            node.node_id,
            f"catalog: {gen.name} in {node.zone}",
            "ok" if zone_ok else "fail",
            zone_detail,
        ),
        Check(
            node.node_id,
            f"catalog: runtime {node.runtime_version}",
            "fail" if problem else "ok",
            problem or catalog.runtime_note(node.tpu, node.runtime_version) or "",
        ),
    ]


def candidate_catalog_checks(node: ExpectedNode) -> list[Check]:
    """The catalog's word on each further fallback candidate's zone."""
    checks = []
    for subject, zone, wanted, _ in placements(node)[1:]:
        gen = catalog.parse_accelerator_type(wanted).generation
        ok = zone in gen.zones
        checks.append(Check(subject, f"catalog: {gen.name} in {zone}", "ok" if ok else "fail",
                            "" if ok else f"the catalog lists {gen.name} only in "
                                          f"{', '.join(gen.zones)}"))
    return checks


def live_checks(api: TpuApi, target: StackTarget) -> tuple[list[Check], list[Unread]]:
    """One list of accelerator types and one of runtime versions per (project, zone),
    the pairs concurrently: what a zone offers depends on the project asking. A pair
    that cannot be read is one row: "fail" for a zone the API does not serve the
    project (no node can be made there), else "not checked"."""
    offered, unread = api.each_place(
        target.places, lambda project, zone: (api.accelerator_types(project, zone),
                                              api.runtime_versions(project, zone)))
    checks = [Check(f"{u.zone} ({u.project})", "zone's offers",
                    "fail" if u.kind == "no-zone" else "not checked", u.error) for u in unread]
    for node in target.nodes:
        for subject, zone, wanted, runtime in placements(node):
            if (node.project, zone) not in offered:
                continue
            types, runtimes = offered[(node.project, zone)]
            checks.append(_offered(subject, zone, f"zone offers {wanted}", wanted in types,
                                   sorted(types)))
            checks.append(_offered(subject, zone, f"zone offers {runtime}", runtime in runtimes,
                                   sorted(runtimes)))
    return checks, unread


def placements(node: ExpectedNode) -> list[tuple[str, str, str, str]]:
    """(subject, zone, accelerator type, runtime) of the node's own placement and of each
    further fallback candidate (issue 45: preflight checks every candidate's zone)."""
    own = [(node.node_id, node.zone, node.tpu.accelerator_type, node.runtime_version)]
    count = len(node.candidates)
    for position, candidate in enumerate(node.candidates[1:], start=2):
        wanted = candidate.get("accelerator_type") or catalog.slice_for(
            candidate["generation"], candidate["accelerator_topology"]).accelerator_type
        own.append((f"{node.node_id} candidate {position}/{count}", candidate["zone"], wanted,
                    candidate["runtime_version"]))
    return own


def _offered(subject: str, zone: str, what: str, ok: bool, choices: list[str]) -> Check:
    detail = "" if ok else f"{zone} offers: {', '.join(choices) or 'nothing'}"
    return Check(subject, what, "ok" if ok else "fail", detail)


def quota_checks(target: StackTarget, lookup: QuotaLookup | None) -> list[Check]:
    """Chips the stack needs per (project, generation, region, spot), against the quota
    if known.

    Quota is per project, TPU family and region, separately for on-demand and
    preemptible (docs/tpu-facts.md).
    """
    needed: dict[tuple[str, catalog.Generation, str, bool], int] = defaultdict(int)
    for node in target.nodes:
        needed[(node.project, node.tpu.generation, node.region, node.spot)] += node.tpu.chips
    several = len({project for project, *_ in needed}) > 1
    checks = []
    for (project, gen, region, spot), chips in sorted(
        needed.items(), key=lambda item: (item[0][0], item[0][1].name, item[0][2:])
    ):
        subject = f"{gen.name} {'spot' if spot else 'on-demand'} in {region}"
        subject += f" ({project})" if several else ""
        allowed = lookup(project, region, gen, spot) if lookup else None
        if allowed is None:
            checks.append(Check(subject, f"quota for {chips} chips", "not checked", _QUOTA_UNKNOWN))
        else:
            outcome: Outcome = "ok" if allowed >= chips else "fail"
            checks.append(
                Check(subject, f"quota for {chips} chips", outcome, f"quota allows {allowed}")
            )
    return checks


_QUOTA_UNKNOWN = (
    "quota not read (offline, no credentials, or Cloud Quotas did not answer); "
    "check IAM & Admin > Quotas for the TPU family and region"
)


def preflight(
    target: StackTarget, api: TpuApi | None, quota: QuotaLookup | None = None
) -> PreflightReport:
    """Catalog and quota checks always; live checks when `api` is given and credentials
    work. Without a quota lookup the quota rows say "not checked" with the chips needed."""
    checks = [check for node in target.nodes for check in
              (*catalog_checks(node), *candidate_catalog_checks(node))]
    if api is None:
        return PreflightReport(
            (*checks, *quota_checks(target, None)), live=False,
            note="offline: checked against the catalog only",
        )
    try:
        live, unread = live_checks(api, target)
    except NoCredentialsError as error:
        return PreflightReport(
            (*checks, *quota_checks(target, None)), live=False,
            note="checked against the catalog only", credentials_error=str(error),
        )
    checks += live + quota_checks(target, quota)
    return PreflightReport(tuple(checks), live=True, unread=tuple(unread))
