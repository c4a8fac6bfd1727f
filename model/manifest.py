"""The desired state a stack hands the controller: one JSON object per stack in GCS.

Written by the stack's program (components/controller.py, a gcp.storage.BucketObject)
at `controller/manifests/<stack>.json` of the controller's bucket, and by
`tpuctl reconcile` from the stack file. Pure: JSON in, StackTarget out (ops/tpu/target.py,
the same model `tpuctl` plans with). Format (docs/design.md, "The controller"):

    {"version": 1, "stack": "dev", "project": "acme-ml-dev",
     "artifactsBucket": "...", "idleStopMinutes": 60 | null,
     "budgetTeams": [{"team": "vision", "project": "acme-ml-vision", "zones": [...]}],
     "statusBuckets": ["<logs bucket>", ...],
     "teamManifests": [{"team": "vision", "stack": "team-vision",
                        "project": "acme-ml-vision", "bucket": "...",
                        "object": "controller/manifests/team-vision.json"}],
     "budgets": [{"team": "vision", "project": "acme-ml-vision", "usdPerMonth": 5000,
                  "horizonHours": 24}],
     "nodes": [{"logical": "trainer", "nodeId": "dev-trainer", "queuedId": "dev-trainer-qr",
                "project": "acme-ml-dev", "zone": "us-east5-a", "acceleratorType": "v6e-8",
                "runtimeVersion": "...", "spot": true, "queued": true, "team": "platform",
                "capacity": "spot", "maxWaitSeconds": 1800, "settingsDigest": "...",
                "candidates": [{"zone": ..., "accelerator_type": ..., ...}]}]}

A node's maxRuntime and idleStop travel in its own metadata (node_agent/contract.py),
which the TPU API's node list returns: the manifest need not repeat them.
`statusBuckets`: the logs buckets where the agents of its nodes with an idleStop publish
their status (`status/<node>/worker-0/status.json`): the controller lists those, and
only for a stack that has any. `teamManifests` (a platform's only): where each team
stack writes its own manifest, in the team stack's own artifacts bucket (a team stack
cannot write the platform's bucket); the controller reads them beside the platform's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from model import catalog, team_state
from model.fleet import ExpectedNode, StackTarget
from model.naming import Naming
from model.settings.schema import StackSettings

VERSION = 1
PREFIX = "controller/manifests/"


class ManifestError(ValueError):
    """A manifest the controller cannot read: it names the stack and the field."""


@dataclass(frozen=True)
class BudgetTeam:
    """A team whose budget stops its TPUs, wherever they are declared (its team stack's
    nodes too): the controller lists its project's zones and acts on its labelled nodes."""

    team: str
    project: str
    zones: tuple[str, ...]


@dataclass(frozen=True)
class TeamManifestRef:
    """Where a team stack's manifest lives (its own artifacts bucket), and what it may
    name: only nodes of `team` in `project`, as `stack`."""

    team: str
    stack: str
    project: str
    bucket: str
    object: str

    @property
    def uri(self) -> str:
        return f"gs://{self.bucket}/{self.object}"


@dataclass(frozen=True)
class TeamBudget:
    """A team with a monthly budget (whatever its budgetAction): the controller logs its
    spend and runout each run (ops/controller/spend_lines.py, issue 46)."""

    team: str
    project: str  # where its nodes run
    usd_per_month: float
    horizon_hours: float


@dataclass(frozen=True)
class Manifest:
    target: StackTarget
    idle_stop_minutes: float | None = None
    budget_teams: tuple[BudgetTeam, ...] = ()
    status_buckets: tuple[str, ...] = ()
    team_manifests: tuple[TeamManifestRef, ...] = ()
    budgets: tuple[TeamBudget, ...] = ()


def object_name(stack: str) -> str:
    return f"{PREFIX}{stack}.json"


def manifest_json(target: StackTarget, idle_stop_minutes: float | None = None,
                  budget_teams: tuple[BudgetTeam, ...] = (),
                  status_buckets: tuple[str, ...] = (),
                  team_manifests: tuple[TeamManifestRef, ...] = (),
                  budgets: tuple[TeamBudget, ...] = ()) -> str:
    """The manifest of `target` (ops/tpu/target.py target_for), stable bytes."""
    body = {"version": VERSION, "stack": target.stack, "project": target.project,
            "artifactsBucket": target.artifacts_bucket, "idleStopMinutes": idle_stop_minutes,
            "nodes": [_node_json(node) for node in target.nodes],
            "budgetTeams": [{"team": t.team, "project": t.project, "zones": list(t.zones)}
                            for t in budget_teams],
            "statusBuckets": list(status_buckets),
            "teamManifests": [{"team": r.team, "stack": r.stack, "project": r.project,
                               "bucket": r.bucket, "object": r.object}
                              for r in team_manifests],
            "budgets": [{"team": b.team, "project": b.project, "usdPerMonth": b.usd_per_month,
                         "horizonHours": b.horizon_hours} for b in budgets]}
    return json.dumps(body, sort_keys=True, indent=1)


def status_buckets(settings: StackSettings) -> tuple[str, ...]:
    """The logs buckets of the stack's nodes with an idleStop (components/platform.py
    puts a node's status under its team's logs bucket, a stack's own under its own)."""
    teams = {team for team, node in settings.named_nodes if node.idle_stop}
    return tuple(sorted({settings.naming.bucket("logs", team) for team in teams}))


def team_manifest_ref(naming: Naming, team: str) -> TeamManifestRef:
    """Where team `team`'s own stack (team_state.team_stack: `team-<team>`, the only
    stack its deployer may write state for) writes its manifest: the artifacts bucket
    that stack makes (components/teams.py TeamSpace, the team stack's naming)."""
    stack = team_state.team_stack(team)
    own = Naming(naming.project, stack)
    return TeamManifestRef(team, stack, naming.team_project(team),
                           own.bucket("artifacts", team), object_name(stack))


def team_manifest_refs(settings: StackSettings) -> tuple[TeamManifestRef, ...]:
    """Where each team that deploys a team stack writes its manifest: a team with `ci`
    (the keyless deployer its own repository deploys its team stack as, docs/teams.md);
    a team without one has no team stack to read, and no "no manifest" line each run."""
    return tuple(team_manifest_ref(settings.naming, team) for team in sorted(settings.teams)
                 if settings.teams[team].ci is not None)


def _node_json(node: ExpectedNode) -> dict[str, Any]:
    return {"logical": node.logical, "nodeId": node.node_id, "queuedId": node.queued_id,
            "project": node.project, "zone": node.zone,
            "acceleratorType": node.tpu.accelerator_type, "runtimeVersion": node.runtime_version,
            "spot": node.spot, "queued": node.queued, "team": node.team,
            "capacity": node.capacity, "maxWaitSeconds": node.max_wait_seconds,
            "settingsDigest": node.settings_digest,
            "candidates": [dict(c) for c in node.candidates]}


def parse(text: str, where: str = "manifest") -> Manifest:
    """A manifest from its JSON, or one ManifestError naming what is wrong."""
    try:
        body = json.loads(text)
        if body.get("version") != VERSION:
            raise ManifestError(f"{where}: version must be {VERSION}, not {body.get('version')!r}")
        nodes = tuple(_node(n) for n in body["nodes"])
        target = StackTarget(project=body["project"], stack=body["stack"], nodes=nodes,
                             artifacts_bucket=body.get("artifactsBucket") or "")
        idle = body.get("idleStopMinutes")
        teams = tuple(BudgetTeam(t["team"], t["project"], tuple(t["zones"]))
                      for t in body.get("budgetTeams") or ())
        buckets = tuple(str(b) for b in body.get("statusBuckets") or ())
        refs = tuple(TeamManifestRef(r["team"], r["stack"], r["project"], r["bucket"],
                                     r["object"]) for r in body.get("teamManifests") or ())
        budgets = tuple(TeamBudget(b["team"], b["project"], float(b["usdPerMonth"]),
                                   float(b["horizonHours"])) for b in body.get("budgets") or ())
        return Manifest(target, float(idle) if idle is not None else None, teams,
                        status_buckets=buckets, team_manifests=refs, budgets=budgets)
    except ManifestError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, catalog.CatalogError) as error:
        raise ManifestError(f"{where}: not a controller manifest ({error!r})") from None


def _node(body: Mapping[str, Any]) -> ExpectedNode:
    return ExpectedNode(
        logical=body["logical"], node_id=body["nodeId"], zone=body["zone"],
        tpu=catalog.parse_accelerator_type(body["acceleratorType"]),
        runtime_version=body["runtimeVersion"], spot=bool(body["spot"]),
        queued=bool(body["queued"]), project=body["project"], team=body.get("team") or "",
        capacity=body.get("capacity") or "", candidates=tuple(body.get("candidates") or ()),
        max_wait_seconds=int(body.get("maxWaitSeconds") or 0),
        settings_digest=body.get("settingsDigest") or "", queued_id=body.get("queuedId") or "")


OBJECT_PREFIX = "controller/"  # everything the controller writes (its grant's condition)
