"""TpuPlatform: the whole stack, from project to TPU nodes, from one StackSettings.

Three shapes, one program (docs/teams.md):
- a single-team stack (dev, prod): project, network, buckets, one runtime
  account, the package and the nodes;
- a platform stack (`tpu-stack:teams`): the same shared parts as a Shared VPC
  host, plus for every team a project of its own (TeamProject: account, quota,
  members, deployer, budget), and, for a team whose nodes the platform declares,
  the team's buckets and nodes there;
- a team stack (`tpu-stack:platformStack`): only the team's buckets, package and
  nodes, in the team's project on the platform's network (a StackReference).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_gcp as gcp

from components import catalog, cost
from components.candidates import one_quota_warning
from components.ci import CI_APIS, PREVIEW_ROLES, CiArgs, CiIdentity, DeployerScope
from components.identity import PROJECT_ROLES, IdentityArgs, RuntimeIdentity
from components.locality import cross_region_warning
from components.network import Network, NetworkArgs
from components.package import PackageArgs, TrainingPackage
from components.progress_deadline import progress_deadline_warning
from components.project import APIS, BUDGETS_API, Project, ProjectArgs
from components.project import stack_warnings as project_stack_warnings
from components.settings import BillingSettings, NodeSettings, StackSettings
from components.stop_save import stop_save_warning
from components.storage import BucketsArgs, TrainingBuckets
from components.team_stack import PlatformReference
from components.teams import (
    OWN_PURPOSES,
    TEAM_STACK_PURPOSES,
    TPU_XPN_AGENT_ROLE,
    BudgetsAccess,
    HostNetwork,
    TeamBudget,
    TeamProject,
    TeamProjectArgs,
    TeamSpace,
    TeamSpaceArgs,
    budgets_provider,
)
from components.tpu_node import NodeLocations, TpuNode, TpuNodeArgs
from tpu_training.config import JobConfig

TYPE = "tpu-stack:index:TpuPlatform"


@dataclass(frozen=True)
class Placement:
    """Where a node's job reads and writes, who it runs as, what it waits for."""

    team: str | None  # None: the stack's own nodes (names without a team)
    data_uri: str
    checkpoints_uri: str
    logs_uri: str
    service_account_email: pulumi.Input[str]
    labels: dict[str, str]
    depends_on: list[pulumi.Resource] = field(default_factory=list)
    project_id: pulumi.Input[str] | None = None  # a team's project; None: the stack's


@dataclass(frozen=True)
class NodeNetwork:
    project_id: pulumi.Input[str]
    network: pulumi.Input[str]
    subnets: Any  # region → subnetwork id: a dict, or a lookup on a platform output
    tag: str
    package: TrainingPackage


class TpuPlatform(pulumi.ComponentResource):
    """Declares everything a team (or a platform's teams) needs to train on Cloud TPU."""

    nodes: list[TpuNode]
    teams: dict[str, TeamSpace]
    team_nodes: dict[str, list[TpuNode]]

    def __init__(self, name: str, settings: StackSettings,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        self.settings = settings
        self.teams, self.team_nodes, self.access = {}, {}, {}
        if settings.is_team_stack:
            self._declare_team_stack()
        else:
            self._declare_platform()
        self.cost = cost.stack_cost(settings.nodes)
        self.team_costs = cost.team_costs(settings.all_nodes)
        self.register_outputs({})

    # ---- single-team and platform stacks ----------------------------------

    def _declare_platform(self) -> None:
        settings = self.settings
        naming = settings.naming
        apis = (*APIS, *(CI_APIS if settings.ci else ()),
                *((BUDGETS_API,) if self._has_budgets else ()))
        self.project = Project("project", ProjectArgs(
            project_id=settings.gcp_project, settings=settings.project,
            labels=self._labels("project"), apis=apis), opts=self._child())
        after_apis = self._child(depends_on=self.project.services)
        project_id = self.project.project_id
        for warning in project_stack_warnings(settings):  # at preview and up
            pulumi.log.warn(warning, resource=self.project)
        self.buckets = TrainingBuckets("storage", BucketsArgs(
            project_id=project_id, naming=naming, settings=settings.storage,
            labels=self._labels("storage")), opts=after_apis)
        self.identity = RuntimeIdentity("identity", IdentityArgs(
            project_id=project_id, naming=naming,
            buckets={p: b.name for p, b in self.buckets.buckets.items()}), opts=after_apis)
        self.node_tag = naming.network_resource("tpu-node")
        self.network = Network("network", NetworkArgs(
            project_id=project_id, naming=naming, regions=settings.regions,
            subnet_cidr=settings.network.subnet_cidr, pinned=settings.network.subnets,
            ssh_through_iap=settings.network.ssh_through_iap,
            node_tag=self.node_tag, node_account=self.identity.email), opts=after_apis)
        self.package = TrainingPackage("package", PackageArgs(
            bucket=self.buckets.names["artifacts"],
            bucket_name=self.buckets.buckets["artifacts"].name),
            opts=self._child(depends_on=[self.buckets.buckets["artifacts"]]))
        self.placement_network = NodeNetwork(
            project_id=project_id, network=self.network.network.id,
            subnets={region: s.id for region, s in self.network.subnets.items()},
            tag=self.node_tag, package=self.package)
        uri = self.buckets.uri
        own = Placement(
            team=None, data_uri=uri("data"), checkpoints_uri=uri("checkpoints"),
            logs_uri=uri("logs"), service_account_email=self.identity.email,
            labels=self._labels("tpu-node"),
            depends_on=self._node_dependencies(self.identity))
        self.nodes = [self._node(node, settings.job(node.job), own) for node in settings.nodes]
        if settings.teams:
            # The platform's project shares its network with the teams' projects
            # (Shared VPC; docs/teams.md).
            self.host = HostNetwork(project_id, gcp.compute.SharedVPCHostProject(
                "shared-vpc-host", project=project_id, opts=after_apis), self.network.subnets,
                self.network.network.id)
        if settings.ci:
            self.ci = CiIdentity("ci", CiArgs(settings.ci, project_id, naming, scope=DeployerScope(
                granted_roles=self._granted_project_roles(),
                accounts=[self.identity.email])), opts=after_apis)
        self.budgets = BudgetsAccess(
            budgets_provider(project_id, self._child()),
            self.project.by_api[BUDGETS_API]) if self._has_budgets else None
        for team in settings.teams:
            self._declare_team(team, after_apis)

    def _granted_project_roles(self) -> list[str]:
        """Roles the stack grants on its own project, the deployer's own excepted:
        what its deployer's projectIamAdmin is limited to (components/ci.py)."""
        roles = {*PROJECT_ROLES, *PREVIEW_ROLES}
        return sorted(roles | ({TPU_XPN_AGENT_ROLE} if self.settings.teams else set()))

    def _declare_team(self, team: str, after_apis: pulumi.ResourceOptions) -> None:
        """The platform's part for every team: its project; a team whose nodes
        the platform declares also gets its buckets and nodes there."""
        settings = self.settings
        spec = settings.teams[team]
        assert (settings.team_projects and settings.team_projects.folder_id
                and settings.team_billing_account), "settings check"
        access = self.access[team] = TeamProject(f"team-project-{team}", TeamProjectArgs(
            team=team, stack=settings.stack, naming=settings.naming,
            quota_contact=settings.team_projects.quota_contact,
            state_bucket=settings.team_projects.state_bucket, members=spec.members,
            quota=spec.quota, regions={f: sorted(r) for f, r in settings.quota.items()},
            network=self.host, data_bucket=self.buckets.names["data"], ci=spec.ci,
            budget=self._budget(team), budgets=self.budgets), opts=after_apis)
        if not spec.nodes:
            return
        shared = {"artifacts": self.buckets.buckets["artifacts"].name}
        space = self._team_space(team, shared, spec.members, after_apis, access)
        placement = self._team_placement(
            team, space, self.buckets.uri("data"),
            [access.tpu_api, *access.grants, *space.identity.grants, self.package.object],
            access.project_id)
        self.team_nodes[team] = [self._node(node, spec.job(node.job), placement)
                                 for node in spec.nodes]

    def _node_dependencies(self, identity: RuntimeIdentity) -> list[pulumi.Resource]:
        """What a node waits for: the TPU API, the grants its job needs at boot
        and its package (the other APIs come first through what those use)."""
        return [self.project.tpu_api, *identity.grants, self.package.object]

    @property
    def _has_budgets(self) -> bool:
        """Budgets exist where billing is configured and teams are served."""
        return bool(self.settings.teams and self.settings.billing_account)

    def _budget(self, team: str) -> TeamBudget | None:
        """The team's monthly budget: its own figure, else its hourly ceiling
        for a month, else (neither given) last month's spend."""
        settings = self.settings
        if not settings.billing_account:
            return None
        billing = settings.billing or BillingSettings(account=settings.billing_account)
        spec = settings.teams[team]
        usd_per_month = spec.budget_usd_per_month
        if usd_per_month is None and spec.quota.usd_per_hour is not None:
            usd_per_month = spec.quota.usd_per_hour * catalog.HOURS_PER_MONTH
        return TeamBudget(billing.account, usd_per_month, billing.alert_thresholds)

    # ---- a team stack -----------------------------------------------------

    def _declare_team_stack(self) -> None:
        settings = self.settings
        team = settings.team
        # Everything of a team stack takes its project id from the platform
        # contract check, so a failed check stops all of it (buckets, account,
        # grants, package, nodes), not only the nodes: Pulumi registers a resource
        # only once its inputs resolve, and a failed apply fails its dependants.
        platform = self.platform = PlatformReference(settings, opts=self._child())
        # The platform declared the team's project and runtime account and lets it
        # read the shared data (TeamProject); the team's own buckets are here.
        space = self._team_space(team, {}, platform.members, self._child(),
                                 purposes=TEAM_STACK_PURPOSES)
        self.package = TrainingPackage("package", PackageArgs(
            bucket=space.buckets.names["artifacts"],
            bucket_name=space.buckets.buckets["artifacts"].name),
            opts=self._child(depends_on=[space.buckets.buckets["artifacts"]]))
        self.placement_network = NodeNetwork(
            project_id=platform.team_project_id, network=platform.network_id,
            subnets=platform.subnet, tag=settings.platform_naming.network_resource("tpu-node"),
            package=self.package)
        self.data_uri = f"gs://{settings.platform_naming.bucket('data')}"
        placement = self._team_placement(team, space, self.data_uri,
                                         [*space.identity.grants, self.package.object])
        self.nodes = [self._node(node, settings.job(node.job), placement)
                      for node in settings.nodes]

    # ---- shared by every shape ---------------------------------------------

    def _team_space(self, team: str, shared: dict[str, pulumi.Input[str]],
                    members: pulumi.Input[list[str]], opts: pulumi.ResourceOptions,
                    access: TeamProject | None = None,
                    purposes: tuple[str, ...] = OWN_PURPOSES) -> TeamSpace:
        """The team's buckets in its project: the platform's TeamProject (`access`)
        or, in a team stack, the platform's outputs name the project and account."""
        settings = self.settings
        if access is not None:
            project_id, email = access.project_id, access.account.email
        else:
            project_id, email = self.platform.team_project_id, self.platform.account_email
        space = TeamSpace(f"team-{team}", TeamSpaceArgs(
            team=team, project_id=project_id, naming=settings.naming,
            storage=settings.storage, labels=self._team_labels("storage", team),
            members=members, shared_buckets=shared, account_email=email,
            own_purposes=purposes), opts=opts)
        self.teams[team] = space
        return space

    def _team_labels(self, component: str, team: str) -> dict[str, str]:
        settings = self.settings
        extra = settings.team_labels(team) if team in settings.teams else settings.labels
        return settings.naming.labels(component, team, extra)

    def _team_placement(self, team: str, space: TeamSpace, data_uri: str,
                        depends_on: list[pulumi.Resource],
                        project_id: pulumi.Input[str] | None = None) -> Placement:
        uri = space.buckets.uri
        return Placement(
            team=team, data_uri=data_uri, checkpoints_uri=uri("checkpoints"),
            logs_uri=uri("logs"), service_account_email=space.identity.email,
            labels=self._team_labels("tpu-node", team), depends_on=depends_on,
            project_id=project_id)

    def _node(self, node: NodeSettings, job: JobConfig, placement: Placement) -> TpuNode:
        prefix = f"node-{placement.team}-" if placement.team else "node-"
        tpu_node = TpuNode(f"{prefix}{node.name}", self._node_args(node, job, placement),
                           opts=self._child())
        for warning in (stop_save_warning(node, job),  # at preview and up
                        cross_region_warning(self.settings, node, job),
                        progress_deadline_warning(node, job),
                        one_quota_warning(node)):
            if warning:
                pulumi.log.warn(warning, resource=tpu_node)
        return tpu_node

    def _child(self, **kwargs: object) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, **kwargs)  # type: ignore[arg-type]

    def _labels(self, component: str) -> dict[str, str]:
        return self.settings.naming.labels(component, self.settings.team, self.settings.labels)

    def _node_args(self, node: NodeSettings, job: JobConfig,
                   placement: Placement) -> TpuNodeArgs:
        net = self.placement_network
        node_id = self.settings.naming.tpu_node(node.name, placement.team)
        return TpuNodeArgs(
            project_id=placement.project_id or net.project_id,
            node_id=node_id,
            queued_resource_id=self.settings.naming.queued_resource(node.name, placement.team),
            settings=node,
            job=job,
            locations=NodeLocations(
                data_root=placement.data_uri,
                checkpoint_dir=f"{placement.checkpoints_uri}/ckpt/{node_id}/",
                export_dir=f"{placement.checkpoints_uri}/export/{node_id}/",
                tensorboard_dir=f"{placement.logs_uri}/tb/{node_id}/",
                status_prefix=f"{placement.logs_uri}/status/{node_id}/",
            ),
            package_uri=net.package.uri,
            package_sha256=net.package.sha256,
            artifacts_bucket_name=net.package.bucket_name,
            service_account_email=placement.service_account_email,
            network=net.network,
            subnetwork=_subnet(net.subnets, node.zone.rsplit("-", 1)[0]),
            candidate_subnetworks={region: _subnet(net.subnets, region)
                                   for region in sorted({c.zone.rsplit("-", 1)[0]
                                                         for c in node.candidates[1:]})},
            network_tag=net.tag,
            labels={**placement.labels, **node.labels, "node": node.name},
            depends_on=placement.depends_on,
        )

    # ---- stack outputs ------------------------------------------------------

    def outputs(self) -> dict[str, object]:
        """The stack outputs (issue: buckets, runtime account, package, nodes, cost);
        a platform stack adds what team stacks consume, a team stack its team."""
        settings = self.settings
        if settings.is_team_stack:
            return self._team_stack_outputs()
        result: dict[str, object] = {
            "buckets": {p: self.buckets.uri(p) for p in self.buckets.names},
            "runtimeServiceAccount": self.identity.email,
            "package": {"uri": self.package.uri, "sha256": self.package.sha256},
            "nodes": _node_outputs(settings.nodes, self.nodes, self.cost),
            "estimatedUsdPerHour": self.cost.usd_per_hour,
            "estimatedUsdPerMonth": self.cost.usd_per_month,
        }
        if settings.ci:
            result["ciWorkloadIdentityProvider"] = self.ci.provider_name
            result["ciDeployerServiceAccount"] = self.ci.deployer_email
            result["ciPreviewServiceAccount"] = self.ci.preview_email
        if settings.teams or settings.quota:
            result.update(self._platform_outputs())
        return result

    def _platform_outputs(self) -> dict[str, object]:
        """What team stacks read through their StackReference (team_stack.py)."""
        settings = self.settings
        total = cost.StackCost([n for c in self.team_costs.values() for n in c.nodes])
        return {
            "projectId": self.project.project_id,
            "network": {
                "id": self.network.network.id,
                "subnets": {r: s.id for r, s in self.network.subnets.items()},
                "nodeTag": self.node_tag,
            },
            "sharedData": self.buckets.uri("data"),
            "quota": {family: {region: chips.model_dump(by_alias=True)
                               for region, chips in by_region.items()}
                      for family, by_region in settings.quota.items()},
            "teams": {team: self._team_outputs(team) for team in settings.teams},
            "costByTeam": {team: c.usd_per_hour for team, c in self.team_costs.items()},
            "estimatedUsdPerHour": total.usd_per_hour,
            "estimatedUsdPerMonth": total.usd_per_month,
        }

    def _team_outputs(self, team: str) -> dict[str, object]:
        spec = self.settings.teams[team]
        access = self.access[team]
        result: dict[str, object] = {
            "members": spec.members,
            "quota": spec.quota.model_dump(by_alias=True, exclude_defaults=True),
            "labels": self.settings.team_labels(team),
            "usdPerHour": self.team_costs[team].usd_per_hour if team in self.team_costs else 0,
            "projectId": access.project_id,
            "serviceAccount": access.account.email,
            # Each cap of the team's project and why it skips a safety check (teams.py).
            "quotaCaps": [cap.to_json() for cap in access.quota_caps],
        }
        if access.ci is not None:
            result["deployer"] = {"serviceAccount": access.ci.deployer_email,
                                  "previewServiceAccount": access.ci.preview_email,
                                  "workloadIdentityProvider": access.ci.provider_name}
        space = self.teams.get(team)
        if space is not None:
            result["buckets"] = space.bucket_uris()
            result["nodes"] = _node_outputs(spec.nodes, self.team_nodes[team],
                                            self.team_costs[team])
        return result

    def _team_stack_outputs(self) -> dict[str, object]:
        settings = self.settings
        space = self.teams[settings.team]
        return {
            "team": settings.team,
            "platformStack": settings.platform_stack,
            "projectId": self.platform.team_project_id,
            "buckets": {**space.bucket_uris(), "data": self.data_uri},
            "runtimeServiceAccount": space.identity.email,
            "package": {"uri": self.package.uri, "sha256": self.package.sha256},
            "nodes": _node_outputs(settings.nodes, self.nodes, self.cost),
            "quota": self.platform.checked_usage,
            "estimatedUsdPerHour": self.cost.usd_per_hour,
            "estimatedUsdPerMonth": self.cost.usd_per_month,
        }


def _subnet(subnets: Any, region: str) -> pulumi.Input[str]:
    return subnets[region] if isinstance(subnets, dict) else subnets(region)


def _node_outputs(nodes: list[NodeSettings], tpu_nodes: list[TpuNode],
                  costs: cost.StackCost) -> dict[str, object]:
    by_name = {c.name: c for c in costs.nodes}
    return {
        node.name: {
            "nodeId": tpu_node.node_id,
            "zone": node.zone,
            "acceleratorType": node.tpu.accelerator_type,
            "topology": node.tpu.topology,
            "chips": node.tpu.chips,
            "hosts": node.tpu.hosts,
            "runtimeVersion": node.runtime,
            "provisioning": node.provisioning,
            "usdPerHour": by_name[node.name].usd_per_hour,
        }
        for node, tpu_node in zip(nodes, tpu_nodes, strict=True)
    }

