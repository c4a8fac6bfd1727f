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

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pulumi
import pulumi_gcp as gcp

from components.budget_hold import read_janitor_markers, read_markers, team_stack_hold
from components.budget_stop import APIS as BUDGET_STOP_APIS
from components.budget_stop import BudgetStop, BudgetStopArgs
from components.ci import CI_APIS, CiArgs, CiIdentity, DeployerScope
from components.controller import APIS as CONTROLLER_APIS
from components.controller import declare_for as declare_controller
from components.identity import IdentityArgs, RuntimeIdentity
from components.monitoring import MonitoringArgs, StackMonitoring
from components.network import Network, NetworkArgs
from components.package import PackageArgs, TrainingPackage
from components.project import APIS, BUDGETS_API, Project, ProjectArgs
from components.storage import BucketsArgs, TrainingBuckets
from components.team_manifest import declare_team_manifest
from components.team_stack import PlatformReference
from components.teams import (
    OWN_PURPOSES,
    TEAM_STACK_PURPOSES,
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
from model import catalog, cost, function_accounts, meter, subnets, team_state
from model.bootstrap import granted_in_host_project
from model.budget_hold import BudgetHold, budget_hold, janitor_held, settings_digest
from model.naming import label_value
from model.pulumi_types import COMPONENT_TPU_PLATFORM
from model.roles import DEPLOYER_ACCOUNT_ROLE, DEPLOYER_ACCOUNT_ROLES
from model.settings.schema import BillingSettings, NodeSettings, StackSettings
from model.team_regions import regions_warning, team_regions
from model.warnings import stack_warnings
from tpu_training.config import JobConfig

TYPE = COMPONENT_TPU_PLATFORM


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
    subnets: Any = None  # a team's own subnets (region → id, or a lookup); None: the stack's


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
        self.warnings = stack_warnings(settings)  # each logged on its resource below
        self.teams, self.team_nodes, self.access = {}, {}, {}
        self.held: dict[str, BudgetHold] = {}  # teams held after a budget stop
        # The nodes declared, by team (None: the stack's own): those the janitor deleted
        # past maxRuntime with the same settings are not (components/budget_hold.py).
        self.declared: dict[str | None, list[NodeSettings]] = {}
        self._janitor_markers: dict[str, list[str]] = {}
        if settings.is_team_stack:
            self._declare_team_stack()
        else:
            self._declare_platform()
        self.cost = cost.stack_cost(settings.nodes)
        self.team_costs = cost.team_costs(settings.all_nodes)
        if settings.teams and settings.team_projects and settings.team_projects.state_bucket:
            self._write_team_outputs(settings.team_projects.state_bucket)
        self.register_outputs({})

    # ---- single-team and platform stacks ----------------------------------

    def _declare_platform(self) -> None:
        settings = self.settings
        naming = settings.naming
        # Each API once: the functions need several of the same (a second Service of one
        # name would be a duplicate URN).
        apis = tuple(dict.fromkeys((
            *APIS, *(CI_APIS if settings.ci else ()),
            *((BUDGETS_API,) if self._has_budgets else ()),
            *(BUDGET_STOP_APIS if self._budget_stops else ()),
            *(CONTROLLER_APIS if function_accounts.controller_enabled(settings) else ()))))
        self.project = Project("project", ProjectArgs(
            project_id=settings.gcp_project, settings=settings.project,
            labels=self._labels("project"), apis=apis), opts=self._child())
        after_apis = self._child(depends_on=self.project.services)
        project_id = self.project.project_id
        for warning in self.warnings:  # at preview and up: the stack's own on its project
            if warning.node is None and warning.team is None:
                pulumi.log.warn(warning.text, resource=self.project)
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
            node_tag=self.node_tag), opts=after_apis)
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
        self.nodes = [self._node(node, settings.job(node.job), own)
                      for node in self._declared(settings.nodes, None, self.buckets.names[
                          "artifacts"])]
        if settings.teams:
            # The platform's project shares its network with the teams' projects
            # (Shared VPC; docs/teams.md).
            self.host = HostNetwork(project_id, gcp.compute.SharedVPCHostProject(
                "shared-vpc-host", project=project_id, opts=after_apis), self.network.subnets,
                self.network.network.id)
        if settings.teams and settings.team_projects and settings.team_projects.deployer:
            self._deployer_on_own_account(settings.team_projects.deployer)
        if settings.ci:
            self.ci = CiIdentity("ci", CiArgs(settings.ci, project_id, naming, scope=DeployerScope(
                granted_roles=self._granted_project_roles(),
                accounts=[self.identity.email])), opts=after_apis)
        self.budgets = BudgetsAccess(
            budgets_provider(project_id, self._child()),
            self.project.by_api[BUDGETS_API]) if self._has_budgets else None
        for team in settings.teams:
            self._declare_team(team, after_apis)
        # Dashboards and alerts (issue 46): the stack's, the fleet's, each team's.
        self.monitoring = StackMonitoring("monitoring", MonitoringArgs(
            settings, project_id, list(self.project.services),
            {t: (a.project_id, a.services) for t, a in self.access.items()}), opts=self._child())
        if function_accounts.controller_enabled(settings):  # issue 43
            self.controller = declare_controller(self, after_apis)

    def _write_team_outputs(self, bucket: str) -> None:
        """Each team's view of this stack's outputs, one object per team in the state
        bucket: a team stack reads its own (team_stack.py), so no team needs the
        platform's stack file, which holds every team's (team_state.py)."""
        outputs = self._platform_outputs()
        for team in sorted(self.settings.teams):
            view = pulumi.Output.from_input(team_state.team_view(outputs, team))
            gcp.storage.BucketObject(
                f"{team}-platform-outputs", bucket=bucket,
                name=team_state.outputs_object(self.settings.stack, team),
                content=view.apply(lambda v: json.dumps(v, sort_keys=True)),
                content_type="application/json", opts=self._child())

    def _deployer_on_own_account(self, deployer: str) -> None:
        """The platform deployer administers and acts as the stack's own runtime account,
        on that account alone (as a CI deployer does, components/ci.py); an admin's first
        `up` applies these, as no principal grants itself."""
        for role in DEPLOYER_ACCOUNT_ROLES:
            logical = "acts-as" if role == DEPLOYER_ACCOUNT_ROLE else "administers"
            gcp.serviceaccount.IAMMember(
                f"platform-deployer-{logical}", service_account_id=self.identity.account.name,
                role=role, member=f"serviceAccount:{deployer}", opts=self._child())

    def _granted_project_roles(self) -> list[str]:
        """Roles the stack grants on its own project, the deployer's own excepted:
        what its deployer's projectIamAdmin is limited to (components/ci.py)."""
        return granted_in_host_project(self.settings)

    def _declare_team(self, team: str, after_apis: pulumi.ResourceOptions) -> None:
        """The platform's part for every team: its project; a team whose nodes
        the platform declares also gets its buckets and nodes there."""
        settings = self.settings
        spec = settings.teams[team]
        assert (settings.team_projects and settings.team_projects.folder_id
                and settings.team_billing_account), "settings check"
        stopper = self._budget_stop(team, after_apis)
        if warning := regions_warning(settings, team):
            pulumi.log.warn(warning, resource=self)
        access = self.access[team] = TeamProject(f"team-project-{team}", TeamProjectArgs(
            team=team, stack=settings.stack, naming=settings.naming,
            quota_contact=settings.team_projects.quota_contact,
            state_bucket=settings.team_projects.state_bucket, members=spec.members,
            quota=spec.quota, regions={f: sorted(r) for f, r in settings.quota.items()},
            network=self.host, data_bucket=self.buckets.names["data"], ci=spec.ci,
            subnet_ranges=subnets.team_ranges(settings.network.team_subnet_cidr,
                                              spec.subnet_slot or 0,
                                              team_regions(settings, team)),
            budget=self._budget(team, stopper), budgets=self.budgets,
            platform_deployer=settings.team_projects.deployer if spec.nodes else None,
            controller=(function_accounts.controller_account(settings)
                        if function_accounts.controller_enabled(settings) else None)),
            opts=after_apis)
        for warning in self.warnings:  # at preview and up
            if warning.team == team:
                pulumi.log.warn(warning.text, resource=access)
        # Held or not, whoever declares its nodes (issue 43: a team stack reads it from
        # its outputs object, components/budget_hold.py team_stack_hold).
        held = self._held(team) if stopper else None
        if held is not None:
            self.held[team] = held
        if not spec.nodes:
            return
        shared = {"artifacts": self.buckets.buckets["artifacts"].name}
        space = self._team_space(team, shared, spec.members, after_apis, access)
        placement = self._team_placement(
            team, space, self.buckets.uri("data"),
            [access.tpu_api, *access.grants, *space.identity.grants, self.package.object],
            access.project_id, {region: s.id for region, s in access.subnets.items()})
        if held is not None:  # the buckets stay; the nodes a budget stop deleted stay out
            self.held[team] = held
            pulumi.log.warn(held.warning(n.name for n in spec.nodes), resource=access)
        self.team_nodes[team] = [] if held else [
            self._node(node, spec.job(node.job), placement)
            for node in self._declared(spec.nodes, team, self.buckets.names["artifacts"])]

    def _declared(self, nodes: list[NodeSettings], team: str | None,
                  bucket: str) -> list[NodeSettings]:
        """`nodes` but those the janitor deleted past maxRuntime with these settings."""
        self.declared[team] = []
        if not nodes:  # no listing to make
            return []
        if bucket not in self._janitor_markers:
            self._janitor_markers[bucket] = self._read(read_janitor_markers, bucket)
        markers = self._janitor_markers[bucket]
        declared = []
        for node in nodes:
            node_id = self.settings.naming.tpu_node(node.name, team)
            if janitor_held(node_id, settings_digest(node.model_dump_json(by_alias=True)),
                            markers):
                pulumi.log.warn(f"node {node.name} ({node_id}) is left out: tpuctl janitor "
                                f"deleted it past its maxRuntime; change its settings (e.g. "
                                f"maxRuntime) to declare it again", resource=self)
                continue
            declared.append(node)
        self.declared[team] = declared
        return declared

    def _read(self, read: Any, *args: str) -> list[str]:
        """A marker listing; [] with a warning when it fails (the first up: the bucket
        is created in this run, so nothing was stopped or deleted yet. Unconfirmed: that
        objects.list on a missing bucket fails rather than lists nothing)."""
        try:
            return read(*args)
        except Exception as error:  # a failed invoke: a bare Exception (pulumi/runtime/invoke.py)
            pulumi.log.warn(f"markers in gs://{args[0]} unread ({error}); every node is "
                            f"declared", resource=self)
            return []

    def _held(self, team: str) -> BudgetHold | None:
        """The hold a budget stop put on `team`, read from the function's markers."""
        markers = self._read(read_markers, self.buckets.names["artifacts"], team)
        return budget_hold(team, markers, datetime.now(timezone.utc),
                           self.settings.teams[team].lift_budget_hold)

    def _node_dependencies(self, identity: RuntimeIdentity) -> list[pulumi.Resource]:
        """What a node waits for: the TPU API, the grants its job needs at boot
        and its package (the other APIs come first through what those use)."""
        return [self.project.tpu_api, *identity.grants, self.package.object]

    @property
    def _has_budgets(self) -> bool:
        """Budgets exist where teams are served: on the account their projects bill to
        (teamProjects.billingAccount, else billing.account), never dropped (issue 44)."""
        return bool(self.settings.teams and self.settings.team_billing_account)

    @property
    def _budget_stops(self) -> list[str]:
        """Teams whose budget stops their TPUs (`budgetAction: stop`)."""
        return [t for t, spec in self.settings.teams.items() if spec.budget_action == "stop"]

    def _budget_stop(self, team: str, after_apis: pulumi.ResourceOptions) -> BudgetStop | None:
        """The topic, function and account that stop the team's TPUs at its budget
        (components/budget_stop.py), in the platform's project. The function lists the
        zones of every region of the team (model/team_regions.py): its nodes, a team
        stack's too, are nowhere else."""
        settings = self.settings
        if team not in self._budget_stops:
            return None
        regions = set(team_regions(settings, team))
        zones = [zone for zone in catalog.all_zones() if catalog.region_of(zone) in regions]
        return BudgetStop(f"budget-stop-{team}", BudgetStopArgs(
            team=team, team_label=label_value(team), naming=settings.naming,
            platform_project=self.project.project_id,
            team_project=settings.naming.team_project(team), zones=zones,
            artifacts_bucket=self.buckets.buckets["artifacts"].name,
            horizon_hours=settings.teams[team].budget_horizon_hours,
            labels=self._labels("budget-stop"),
            runtime_account=function_accounts.runtime_account(settings, team),
            build_account=function_accounts.build_account(settings, team)),
            opts=after_apis)

    def _budget(self, team: str, stopper: BudgetStop | None = None) -> TeamBudget | None:
        """The team's monthly budget: its own figure, else its hourly ceiling
        for a month, else (neither given) last month's spend; notifying the budget-stop
        function's topic when the team's budget stops its TPUs."""
        settings = self.settings
        account = settings.team_billing_account
        if not account:
            return None
        billing = settings.billing or BillingSettings(account=account)
        usd_per_month = meter.team_budget_usd(settings.teams[team])
        return TeamBudget(account, usd_per_month, billing.alert_thresholds,
                          pubsub_topic=stopper.topic_path if stopper else None)

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
                                         [*space.identity.grants, self.package.object],
                                         subnets=platform.team_subnet)
        declared = self._declared(settings.nodes, team, space.buckets.names["artifacts"])
        held = team_stack_hold(settings, datetime.now(timezone.utc))  # issue 43
        if held is not None:
            self.held[team] = held
            pulumi.log.warn(held.warning(n.name for n in settings.nodes), resource=self)
            declared = self.declared[team] = []
        self.nodes = [self._node(node, settings.job(node.job), placement) for node in declared]
        declare_team_manifest(settings, space, self._child())  # issue 43: its controller

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
                        project_id: pulumi.Input[str] | None = None,
                        subnets: Any = None) -> Placement:
        uri = space.buckets.uri
        return Placement(
            team=team, data_uri=data_uri, checkpoints_uri=uri("checkpoints"),
            logs_uri=uri("logs"), service_account_email=space.identity.email,
            labels=self._team_labels("tpu-node", team), depends_on=depends_on,
            project_id=project_id, subnets=subnets)

    def _node(self, node: NodeSettings, job: JobConfig, placement: Placement) -> TpuNode:
        prefix = f"node-{placement.team}-" if placement.team else "node-"
        tpu_node = TpuNode(f"{prefix}{node.name}", self._node_args(node, job, placement),
                           opts=self._child())
        for warning in self.warnings:  # at preview and up
            if warning.about(node):
                pulumi.log.warn(warning.text, resource=tpu_node)
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
            subnetwork=_subnet(placement.subnets or net.subnets, node.zone.rsplit("-", 1)[0]),
            candidate_subnetworks={region: _subnet(placement.subnets or net.subnets, region)
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
            "nodes": _node_outputs(self.declared[None], self.nodes, self.cost),
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
            # Who a team stack grants read on its manifest (components/team_manifest.py).
            **({"controller": {"serviceAccount": function_accounts.controller_account(
                settings)}} if function_accounts.controller_enabled(settings) else {}),
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
            # The team's own subnets by region: its nodes' only addresses (teams.py).
            "subnets": {region: s.id for region, s in access.subnets.items()},
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
            result["nodes"] = {} if team in self.held else _node_outputs(
                self.declared[team], self.team_nodes[team], self.team_costs[team])
        if team in self.held:
            hold = self.held[team]
            result["budgetHold"] = {"interval": hold.interval, "marker": hold.marker,
                                    "until": f"{hold.until:%Y-%m-%dT%H:%M:%SZ}",
                                    "nodes": sorted(n.name for n in spec.nodes)}
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
            "nodes": _node_outputs(self.declared[settings.team], self.nodes, self.cost),
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

