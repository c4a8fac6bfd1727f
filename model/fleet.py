"""What a stack expects to run: its TPU nodes (each with its fallback candidates, team,
project and limits), its teams' caps and budgets. Pure: built from the settings
(`target_for`); `tpuctl` and the controller compare it with what the TPU API lists."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from cloud import gcp_credentials
from model import catalog
from model.budget_hold import settings_digest
from model.candidates import candidate_label, candidate_props
from model.settings.schema import StackSettings


class TargetError(ValueError):
    """The stack cannot be read; the message says why."""


@dataclass(frozen=True)
class ExpectedNode:
    """One node of the stack config, resolved: its TPU node id and slice."""

    logical: str
    node_id: str
    zone: str
    tpu: catalog.Slice
    runtime_version: str
    spot: bool
    queued: bool
    project: str
    team: str = ""  # the `team` label it carries (the stack's own team for its own nodes)
    capacity: str = ""  # NodeSettings.capacity: what the team's cap counts it against
    # A node with fallback: each candidate's placement (components/fallback_tpu.py
    # candidate_props, with its region's `subnet_name`), the node's own first.
    candidates: tuple[dict[str, Any], ...] = field(default=(), compare=False, hash=False)
    max_wait_seconds: int = 0
    # Its settings hashed (components/budget_hold.py settings_digest): what the janitor's
    # deletion past maxRuntime holds it out of the stack with.
    settings_digest: str = field(default="", compare=False)
    # Its queued resource id (model/naming.py queued_resource); "" = the node id.
    queued_id: str = field(default="", compare=False)

    @property
    def region(self) -> str:
        return catalog.region_of(self.zone)

    def candidate_at(self, zone: str, accelerator_type: str = "") -> int:
        """The candidate (0-based) a request in `zone` of `accelerator_type` is on: the
        first in that zone of that type, else the first in that zone, else the first."""
        same_zone = [i for i, c in enumerate(self.candidates) if c["zone"] == zone]
        typed = [i for i in same_zone
                 if self.candidates[i].get("accelerator_type") in (None, accelerator_type)]
        return (typed or same_zone or [0])[0]

    def request_id(self, index: int) -> str:
        """Candidate `index` (0-based)'s request id (model/naming.py candidate_request)."""
        from model.naming import candidate_request

        return candidate_request(self.queued_id or self.node_id, index + 1)

    def candidate_of(self, request: Any) -> int:
        """The candidate (0-based) a request (ops/tpu/api.py QueuedStatus) is on: the one
        whose request name it has, else candidate_at by zone and type."""
        queued_id = request.name.rsplit("/", 1)[-1]
        for index in range(len(self.candidates)):
            if self.request_id(index) == queued_id and \
                    self.candidates[index]["zone"] == request.zone:
                return index
        return self.candidate_at(request.zone, request.accelerator_type)

    def candidate_label(self, index: int) -> str:
        """`2/4 us-east5-b spot` (components/fallback_tpu.py label)."""
        return candidate_label(index + 1, len(self.candidates), self.candidates[index])

    @property
    def zones(self) -> tuple[str, ...]:
        """Where the node may live: its zone, or every candidate's."""
        return tuple(dict.fromkeys(c["zone"] for c in self.candidates)) or (self.zone,)


@dataclass(frozen=True)
class StackTarget:
    project: str
    stack: str
    nodes: tuple[ExpectedNode, ...]
    # The stack file's gcp: credential keys (GCP_AUTH_KEYS), values as YAML reads them.
    gcp: Mapping[str, Any] = field(default_factory=dict)
    # team -> {(TPU family, capacity): chips the team may hold} (tpu-stack:teams.<t>.quota);
    # a team absent here has no cap in this stack.
    caps: Mapping[str, Mapping[tuple[str, str], int]] = field(default_factory=dict)
    # team -> its monthly budget in USD (tpu-stack:teams.<t>.budgetUsdPerMonth), where set.
    budgets: Mapping[str, float] = field(default_factory=dict)
    # The stack's artifacts bucket: where the janitor records its deletions past maxRuntime.
    artifacts_bucket: str = ""

    def auth(self, env: Mapping[str, str] | None = None) -> gcp_credentials.GcpAuth:
        """The credentials the stack's gcp provider would use (its config, then the
        environment), so tpuctl acts as the same identity as `pulumi up`."""
        try:
            return gcp_credentials.resolve(self.gcp, os.environ if env is None else env)
        except gcp_credentials.GcpCredentialsError as error:
            raise TargetError(f"Pulumi.{self.stack}.yaml: {error}") from None

    @property
    def zones(self) -> list[str]:
        return sorted({node.zone for node in self.nodes})

    @property
    def places(self) -> list[tuple[str, str]]:
        """(project, zone) of every node, every candidate zone of a node with fallback
        included: where the TPU API lists them."""
        return sorted({(node.project, zone) for node in self.nodes for zone in node.zones})

    @property
    def projects(self) -> list[str]:
        """The projects the nodes live in; the stack's own when it has no nodes."""
        return sorted({node.project for node in self.nodes}) or [self.project]

    @property
    def queued_node_ids(self) -> list[str]:
        return [node.node_id for node in self.nodes if node.queued]

    def expected(self, node_id: str) -> ExpectedNode | None:
        return self._by_id.get(node_id)

    @cached_property
    def _by_id(self) -> dict[str, ExpectedNode]:
        """Node id -> node: status looks every listed node up (10,000 on a platform)."""
        return {node.node_id: node for node in reversed(self.nodes)}  # the first one wins

    @property
    def teams(self) -> list[str]:
        return sorted({node.team for node in self.nodes if node.team} | set(self.caps))

    def for_team(self, team: str) -> StackTarget:
        """The stack as one team sees it: its nodes only, so only its places are read."""
        if team not in self.teams:
            known = ", ".join(self.teams) or "none"
            raise TargetError(f"--team {team}: not a team of stack {self.stack} (teams: {known})")
        return replace(self, nodes=tuple(n for n in self.nodes if n.team == team))


def target_for(settings: StackSettings, platform: StackSettings | None = None) -> StackTarget:
    """`platform`: a team stack's platform stack, where its team's cap is set."""
    nodes = tuple(
        ExpectedNode(
            logical=node.name,
            node_id=settings.naming.tpu_node(node.name, team),
            zone=node.zone,
            tpu=node.tpu,
            runtime_version=node.runtime,
            spot=node.spot,
            queued=node.provisioning == "queued" or bool(node.fallback),
            project=settings.node_project(team),
            team=team or settings.team,  # the label model/naming.py gives it
            capacity=node.capacity,
            candidates=candidate_places(settings, node),
            max_wait_seconds=node.max_wait_seconds if node.fallback else 0,
            settings_digest=settings_digest(node.model_dump_json(by_alias=True)),
            queued_id=settings.naming.queued_resource(node.name, team),  # as platform.py
        )
        for team, node in settings.named_nodes
    )
    teams = (platform or settings).teams
    caps = {team: team_cap(teams[team].quota) for team in teams
            if team in settings.teams or team == settings.team}
    budgets = {team: spec.budget_usd_per_month for team, spec in teams.items()
               if team in caps and spec.budget_usd_per_month is not None}
    return StackTarget(project=settings.gcp_project, stack=settings.stack, nodes=nodes,
                       caps=caps, budgets=budgets, artifacts_bucket=settings.naming.bucket(
                           "artifacts", settings.team if settings.is_team_stack else None))


def candidate_places(settings: StackSettings, node: Any) -> tuple[dict[str, Any], ...]:
    """A node with fallback's candidates, as tpuctl recover queues them; () without."""
    if not node.fallback:
        return ()
    naming = settings.platform_naming if settings.is_team_stack else settings.naming
    return tuple({**candidate_props(c, None),
                  "subnet_name": naming.network_resource(f"tpu-{catalog.region_of(c.zone)}")}
                 for c in node.candidates)


def team_cap(quota: Any) -> dict[tuple[str, str], int]:
    """{(family, capacity): chips} of a TeamQuota, the entries above zero."""
    return {(family, capacity): quota.chips(family).of(capacity)
            for family in catalog.GENERATIONS for capacity in ("onDemand", "spot", "reserved")
            if quota.chips(family).of(capacity)}
