"""The placement and limits controller in the cloud (issue 43; docs/design.md, "The
controller"): declared by a platform stack, or a standalone stack, with
`tpu-stack:controller: {enabled: true, interval: 5m}`.

- a Cloud Run function (gen2, `gcp.cloudfunctionsv2.Function`, HTTP) built from its
  source archive (`controller_source`: functions/controller/main.py at the root, the
  repo modules it imports beside it), a gcp.storage.BucketObject as budget_stop.py does;
- a Cloud Scheduler job (`gcp.cloudscheduler.Job`) calling it every interval with an
  OIDC token of the controller's account (cloud.google.com/scheduler/docs/reference/rest/
  v1/projects.locations.jobs#OidcToken: "The service account must be within the same
  project as the job"; its creator needs iam.serviceAccounts.actAs on it);
- a push subscription on each team budget topic (`gcp.pubsub.Subscription`, push with
  an OIDC token: cloud.google.com/pubsub/docs/push, "Authentication"), so a budget
  notification runs it at once;
- its own service account holding only what its steps need: in each project it manages
  its TPU custom role (model/roles.py CONTROLLER_PERMISSIONS) and actAs on the TPU
  runtime accounts (a request it creates runs its node as one: cloud.google.com/iam/docs/
  service-accounts-actas); in its bucket, objects under controller/ and the budget markers
  (read) only. The account, its build account and its custom roles are the bootstrap's
  (model/function_accounts.py, model/bootstrap.py custom_roles), as the budget stop's
  are: the deployer holds iam.roleAdmin nowhere and may not administer an account it
  made (issue 44);
- the stack's manifest (model/manifest.py) as a BucketObject of JSON.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_gcp as gcp

from components.budget_stop import INVOKER_ROLE, REGION, build_config, source_object
from model import catalog, function_accounts
from model.archive import REPO_ROOT
from model.bootstrap import controller_host_roles
from model.fleet import target_for
from model.function_archive import zip_members
from model.manifest import (
    OBJECT_PREFIX,
    BudgetTeam,
    TeamBudget,
    manifest_json,
    object_name,
    status_buckets,
    team_manifest_refs,
)
from model.meter import team_budgets
from model.naming import Naming
from model.roles import ACT_AS_ROLE, CONTROLLER_OBJECTS_ROLE, CONTROLLER_READ_ROLE, CONTROLLER_ROLE
from model.settings.schema import StackSettings

TYPE = "tpu-stack:index:Controller"
ENTRY_POINT = "controller"
FUNCTION_DIR = REPO_ROOT / "functions" / "controller"
# The repo modules the function imports (its closure: tests/controller/
# test_controller_function.py runs the archive with nothing else on the path).
SOURCE_FILES = (
    "cloud/*.py", "ops/controller/*.py", "model/*.py", "model/*.json", "model/settings/*.py",
    "model/settings/rules/*.py", "node_agent/__init__.py", "node_agent/contract.py",
    "ops/__init__.py", "ops/tpu/__init__.py", "ops/tpu/actions.py", "ops/tpu/api.py",
    "ops/tpu/logs.py",  # ops/controller/agents.py lists the agents' status with it
    "ops/tpu/target.py", "components/__init__.py", "components/fallback_tpu.py",
    "components/queued_tpu.py", "components/stack_config.py",
    "training/wheels.lock")  # model/catalog.py reads the TF versions it carries at import
# Cloud Scheduler (cloud.google.com/scheduler/docs/reference/rest) and what a gen2
# function needs (components/budget_stop.py APIS).
APIS = ("cloudscheduler.googleapis.com", "cloudfunctions.googleapis.com",
        "cloudbuild.googleapis.com", "artifactregistry.googleapis.com", "run.googleapis.com")
# A run takes seconds; an HTTP function may run up to 3600 s (cloud.google.com/functions/
# docs/configuring/timeout): the lease's slot bounds a run anyway.
TIMEOUT_SECONDS = 540
SCHEDULES = {"1m": "* * * * *", "2m": "*/2 * * * *", "5m": "*/5 * * * *",
             "10m": "*/10 * * * *", "15m": "*/15 * * * *", "30m": "*/30 * * * *",
             "1h": "0 * * * *"}
INTERVAL_SECONDS = {"1m": 60, "2m": 120, "5m": 300, "10m": 600, "15m": 900, "30m": 1800,
                    "1h": 3600}


def controller_source() -> bytes:
    """The function's source archive (zip): main.py and requirements.txt at the root, the
    repo modules it imports at their paths; the same bytes for the same content."""
    members = {name: (FUNCTION_DIR / name).read_bytes()
               for name in ("main.py", "requirements.txt")}
    for pattern in SOURCE_FILES:
        for path in sorted(REPO_ROOT.glob(pattern)):
            members[path.relative_to(REPO_ROOT).as_posix()] = path.read_bytes()
    return zip_members(members)


@dataclass(frozen=True)
class ControllerArgs:
    naming: Naming
    project: pulumi.Input[str]  # where it runs
    bucket: pulumi.Input[str]  # its bucket: the stack's artifacts bucket
    interval: str  # ControllerSettings.interval
    managed_projects: Sequence[str]  # where its nodes are
    labels: dict[str, str]
    # The accounts the bootstrap made (model/function_accounts.py): emails.
    account: str
    build_account: str
    # Keyed by a stable name (the team, `stack`): a resource's name never shifts when a
    # team is added (an index would replace every grant after it).
    runtime_accounts: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)  # names
    budget_topics: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)  # by team
    # Logs buckets whose agents' status objects it lists (idle stops): read only.
    status_buckets: Mapping[str, pulumi.Input[str]] = field(default_factory=dict)  # by name
    deployer: str | None = None
    extra: dict[str, str] = field(default_factory=dict)


class Controller(pulumi.ComponentResource):
    """The function, its schedule, its budget subscriptions and its account."""

    function: gcp.cloudfunctionsv2.Function

    def __init__(self, name: str, args: ControllerArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        member = f"serviceAccount:{args.account}"
        grants = self._grants(args, member, child)
        source = self._source(args, child)
        self.function = gcp.cloudfunctionsv2.Function(
            "controller", name=args.naming.cloud_function("controller"), project=args.project,
            location=REGION, labels=args.labels,
            description="Places TPU requests on their candidates, enforces limits and budgets",
            build_config=build_config(ENTRY_POINT, args.project, args.build_account, source),
            service_config=gcp.cloudfunctionsv2.FunctionServiceConfigArgs(
                service_account_email=args.account, timeout_seconds=TIMEOUT_SECONDS,
                # One instance: the lease makes a second useless anyway.
                max_instance_count=1, available_memory="512M",
                environment_variables={
                    "TPU_STACK_CONTROLLER_BUCKET": args.bucket,
                    "TPU_STACK_CONTROLLER_INTERVAL_SECONDS": str(INTERVAL_SECONDS[args.interval]),
                }),
            opts=child.merge(pulumi.ResourceOptions(depends_on=grants)))
        invoker = gcp.cloudrunv2.ServiceIamMember(
            "controller-invoker", project=args.project, location=REGION,
            name=self.function.name, role=INVOKER_ROLE, member=member, opts=child)
        gcp.cloudscheduler.Job(
            "controller", name=args.naming.cloud_function("controller"), project=args.project,
            region=REGION, schedule=SCHEDULES[args.interval], time_zone="Etc/UTC",
            # No attemptDeadline: its default (180 s, the provider's EmptyOrDefaultStringSuppress
            # ("180s"), resource_cloud_scheduler_job.go) is far above a run's seconds, and a
            # run past it is only marked failed by Scheduler: the lease bounds a run.
            description="Runs the tpu-stack controller",
            http_target=gcp.cloudscheduler.JobHttpTargetArgs(
                uri=self.function.url, http_method="POST",
                oidc_token=gcp.cloudscheduler.JobHttpTargetOidcTokenArgs(
                    service_account_email=args.account, audience=self.function.url)),
            opts=child.merge(pulumi.ResourceOptions(depends_on=[invoker])))
        for team, topic in sorted(args.budget_topics.items()):
            gcp.pubsub.Subscription(
                f"controller-budget-{team}", project=args.project, topic=topic,
                name=args.naming.cloud_function("controller-budget", team),
                # The longest ack deadline Pub/Sub allows (600 s, cloud.google.com/pubsub/
                # docs/reference/rest/v1/projects.subscriptions; as recalled, unconfirmed):
                # a push is acknowledged by the function's 200, after its run.
                labels=args.labels, ack_deadline_seconds=600,
                push_config=gcp.pubsub.SubscriptionPushConfigArgs(
                    push_endpoint=self.function.url,
                    oidc_token=gcp.pubsub.SubscriptionPushConfigOidcTokenArgs(
                        service_account_email=args.account,
                        audience=self.function.url)),
                opts=child.merge(pulumi.ResourceOptions(depends_on=[invoker])))
        self.register_outputs({"serviceAccount": args.account,
                               "url": self.function.url})

    def _grants(self, args: ControllerArgs, member: pulumi.Input[str],
                child: pulumi.ResourceOptions) -> list[pulumi.Resource]:
        # Both roles are the bootstrap's (model/bootstrap.py custom_roles), by name.
        grants: list[pulumi.Resource] = [
            gcp.projects.IAMMember(
                f"controller-tpu-{project}", project=project, member=member, opts=child,
                role=f"projects/{project}/roles/{args.naming.custom_role_id(CONTROLLER_ROLE)}")
            for project in sorted(set(args.managed_projects))]
        for key, account in sorted(args.runtime_accounts.items()):
            grants.append(gcp.serviceaccount.IAMMember(
                f"controller-acts-as-{key}", service_account_id=account, role=ACT_AS_ROLE,
                member=member, opts=child))
        for name, bucket in sorted(args.status_buckets.items()):
            # objects.list and get of the status objects (ops/tpu/logs.py published_jobs).
            grants.append(gcp.storage.BucketIAMMember(
                f"controller-status-{name}", bucket=bucket, member=member,
                role=CONTROLLER_READ_ROLE, opts=child))
        objects_role = pulumi.Output.concat("projects/", args.project, "/roles/",
                                            args.naming.custom_role_id(CONTROLLER_OBJECTS_ROLE))
        prefix = pulumi.Output.concat("projects/_/buckets/", args.bucket, "/objects/")
        grants.append(gcp.storage.BucketIAMMember(
            "controller-objects", bucket=args.bucket, member=member, opts=child,
            role=objects_role, condition=gcp.storage.BucketIAMMemberConditionArgs(
                title="controller objects and budget markers",
                # objects.list is checked on the bucket itself (its resource type).
                expression=prefix.apply(lambda p: (
                    f'resource.type == "storage.googleapis.com/Bucket" || '
                    f'resource.name.startsWith("{p}{OBJECT_PREFIX}") || '
                    f'resource.name.startsWith("{p}budget-stop/")')))))
        return grants

    def _source(self, args: ControllerArgs,
                child: pulumi.ResourceOptions) -> gcp.storage.BucketObject:
        return source_object("controller", "controller", controller_source(), args.bucket,
                             child)


def manifest_object(stack: str, bucket: pulumi.Input[str], text: str,
                    opts: pulumi.ResourceOptions) -> gcp.storage.BucketObject:
    """The stack's manifest in the controller's bucket: rewritten at every `up`."""
    return gcp.storage.BucketObject(
        "controller-manifest", bucket=bucket, name=object_name(stack), content=text,
        content_type="application/json", opts=opts)



def declare_for(platform: pulumi.ComponentResource, opts: pulumi.ResourceOptions) -> Controller:
    """The controller of a platform (or standalone) stack (components/platform.py): it
    manages the stack's project and every team's project (the nodes of the platform's
    and of the team stacks: the bootstrap made its TPU role in each), acts as their
    runtime accounts
    (the team's as components/teams.py names it), runs on the budget topics of the teams
    whose budget stops their TPUs, and gets the stack's manifest."""
    settings = platform.settings  # type: ignore[attr-defined]
    naming = settings.naming
    bucket = platform.buckets.buckets["artifacts"].name  # type: ignore[attr-defined]
    # Every team's project and runtime account: a team stack's nodes are its own.
    teams = sorted(settings.teams)
    identity = platform.identity  # type: ignore[attr-defined]
    accounts: dict[str, pulumi.Input[str]] = {"stack": identity.account.name}
    for team in teams:
        project = naming.team_project(team)
        accounts[team] = (f"projects/{project}/serviceAccounts/"
                          f"{naming.account_id('runtime', team)}@{project}.iam.gserviceaccount.com")
    topics = {team: pulumi.Output.concat("projects/", settings.gcp_project, "/topics/",
                                         naming.cloud_function("budget", team))
              for team in sorted(settings.teams)
              if settings.teams[team].budget_action == "stop" and settings.billing_account}
    if function_accounts.bootstrap_made(settings):
        controller_opts = opts
    else:  # a standalone stack: its plan makes what a platform's bootstrap makes
        controller_opts = opts.merge(pulumi.ResourceOptions(
            depends_on=standalone_identity(settings, opts)))
    controller = Controller("controller", ControllerArgs(
        naming=naming, project=settings.gcp_project, bucket=bucket,
        interval=settings.controller.interval,
        account=function_accounts.controller_account(settings),
        build_account=function_accounts.controller_build_account(settings),
        managed_projects=[settings.node_project(t) for t in (None, *teams)],
        labels=naming.labels("controller", settings.team, settings.labels),
        runtime_accounts=accounts, budget_topics=topics,
        status_buckets=_status_buckets(platform)), opts=controller_opts)
    regions = set(settings.regions)
    zones = tuple(z for z in catalog.all_zones() if catalog.region_of(z) in regions)
    budget_teams = tuple(BudgetTeam(team, naming.team_project(team), zones)
                         for team in sorted(settings.teams)
                         if settings.teams[team].budget_action == "stop")
    budgets = tuple(TeamBudget(team, settings.node_project(team), amount,
                               settings.teams[team].budget_horizon_hours)  # spend_lines.py
                    for team, amount in sorted(team_budgets(settings).items()))
    text = manifest_json(target_for(settings), budget_teams=budget_teams,
                         status_buckets=status_buckets(settings),
                         team_manifests=team_manifest_refs(settings), budgets=budgets)
    manifest_object(settings.stack, bucket, text, opts)
    return controller


def standalone_identity(settings: StackSettings,
                        opts: pulumi.ResourceOptions) -> list[pulumi.Resource]:
    """A standalone stack's controller accounts, custom roles and build grant: what
    model/bootstrap.py has a platform's admin make (custom_roles, function_account_grants),
    by the same names and permission lists."""
    made: list[pulumi.Resource] = []
    for logical, display in function_accounts.CONTROLLER_ACCOUNTS:
        made.append(gcp.serviceaccount.Account(
            logical, account_id=settings.naming.account_id(logical), display_name=display,
            project=settings.gcp_project, opts=opts))
    for role in controller_host_roles(settings):
        made.append(gcp.projects.IAMCustomRole(
            f"{role.role_id}-role", role_id=role.role_id, title=role.title,
            permissions=list(role.permissions), project=role.project, opts=opts))
    build = function_accounts.controller_build_account(settings)
    made.append(gcp.projects.IAMMember(
        "controller-build-builder", project=settings.gcp_project,
        role=function_accounts.BUILDER_ROLE, member=f"serviceAccount:{build}",
        opts=opts.merge(pulumi.ResourceOptions(depends_on=made[:2]))))
    return made


def _status_buckets(platform: pulumi.ComponentResource) -> dict[str, pulumi.Input[str]]:
    """The logs buckets the manifest names for idle stops (the stack's own, its teams'),
    as their buckets' outputs where the stack makes them, so each grant follows its bucket."""
    made = [platform.buckets, *(s.buckets for s in platform.teams.values())]  # type: ignore[attr-defined]
    by_name = {b.names["logs"]: b.buckets["logs"].name for b in made if "logs" in b.names}
    return {name: by_name.get(name, name)
            for name in status_buckets(platform.settings)}  # type: ignore[attr-defined]
