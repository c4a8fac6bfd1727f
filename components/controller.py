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
  a custom role (list, get, update, stop, delete nodes; list, get, create, delete, reset
  queued resources; get operations) and actAs on the TPU runtime accounts (a request it
  creates runs its node as one: cloud.google.com/iam/docs/service-accounts-actas); in its
  bucket, objects under controller/ and the budget markers (read) only;
- the stack's manifest (model/manifest.py) as a BucketObject of JSON.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_gcp as gcp

from components.budget_stop import INVOKER_ROLE, REGION, RUNTIME, source_object
from model import catalog
from model.archive import REPO_ROOT
from model.fleet import target_for
from model.function_archive import zip_members
from model.manifest import OBJECT_PREFIX, BudgetTeam, TeamBudget, manifest_json, object_name
from model.naming import Naming

TYPE = "tpu-stack:index:Controller"
ENTRY_POINT = "controller"
FUNCTION_DIR = REPO_ROOT / "functions" / "controller"
# The repo modules the function imports (its closure: tests/controller/
# test_controller_function.py runs the archive with nothing else on the path).
SOURCE_FILES = (
    "cloud/*.py", "ops/controller/*.py", "model/*.py", "model/*.json", "model/settings/*.py",
    "model/settings/rules/*.py", "node_agent/__init__.py", "node_agent/contract.py",
    "ops/__init__.py", "ops/tpu/__init__.py", "ops/tpu/actions.py", "ops/tpu/api.py",
    "ops/tpu/target.py", "components/__init__.py", "components/fallback_tpu.py",
    "components/queued_tpu.py", "components/stack_config.py",
    "training/wheels.lock")  # model/catalog.py reads the TF versions it carries at import
# Cloud Scheduler (cloud.google.com/scheduler/docs/reference/rest) and what a gen2
# function needs (components/budget_stop.py APIS).
APIS = ("cloudscheduler.googleapis.com", "cloudfunctions.googleapis.com",
        "cloudbuild.googleapis.com", "artifactregistry.googleapis.com", "run.googleapis.com")
# IAM permission names: cloud.google.com/iam/docs/roles-permissions/tpu (ops/tpu/api.py
# PERMISSIONS names the method each is checked on).
TPU_PERMISSIONS = ("tpu.nodes.list", "tpu.nodes.get", "tpu.nodes.update", "tpu.nodes.stop",
                   "tpu.nodes.delete", "tpu.queuedresources.list", "tpu.queuedresources.get",
                   "tpu.queuedresources.create", "tpu.queuedresources.delete",
                   "tpu.queuedresources.reset", "tpu.operations.get")
# Its objects: read the manifests and markers, write the lease, moves and audit (an
# overwrite is a delete too: cloud.google.com/storage/docs/access-control/iam-permissions).
OBJECT_PERMISSIONS = ("storage.objects.get", "storage.objects.list", "storage.objects.create",
                      "storage.objects.delete")
ACT_AS_ROLE = "roles/iam.serviceAccountUser"
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
    runtime_accounts: Sequence[pulumi.Input[str]] = ()  # account names it acts as
    budget_topics: Sequence[pulumi.Input[str]] = ()  # projects/<p>/topics/<t>
    # Logs buckets whose agents' status objects it lists (idle stops): read only.
    status_buckets: Sequence[pulumi.Input[str]] = ()
    deployer: str | None = None
    extra: dict[str, str] = field(default_factory=dict)


class Controller(pulumi.ComponentResource):
    """The function, its schedule, its budget subscriptions and its account."""

    account: gcp.serviceaccount.Account
    function: gcp.cloudfunctionsv2.Function

    def __init__(self, name: str, args: ControllerArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.account = gcp.serviceaccount.Account(
            "controller", account_id=args.naming.account_id("controller"),
            display_name="tpu-stack placement and limits controller", project=args.project,
            opts=child)
        member = self.account.email.apply(lambda email: f"serviceAccount:{email}")
        grants = self._grants(args, member, child)
        source = self._source(args, child)
        self.function = gcp.cloudfunctionsv2.Function(
            "controller", name=args.naming.cloud_function("controller"), project=args.project,
            location=REGION, labels=args.labels,
            description="Places TPU requests on their candidates, enforces limits and budgets",
            build_config=gcp.cloudfunctionsv2.FunctionBuildConfigArgs(
                runtime=RUNTIME, entry_point=ENTRY_POINT,
                source=gcp.cloudfunctionsv2.FunctionBuildConfigSourceArgs(
                    storage_source=gcp.cloudfunctionsv2.FunctionBuildConfigSourceStorageSourceArgs(
                        bucket=source.bucket, object=source.name))),
            service_config=gcp.cloudfunctionsv2.FunctionServiceConfigArgs(
                service_account_email=self.account.email, timeout_seconds=TIMEOUT_SECONDS,
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
            description="Runs the tpu-stack controller",
            # HTTP targets allow 15 s to 30 min (cloud.google.com/scheduler/docs/reference/
            # rest/v1/projects.locations.jobs, Job.attemptDeadline; as recalled, unconfirmed).
            attempt_deadline=f"{TIMEOUT_SECONDS}s",
            http_target=gcp.cloudscheduler.JobHttpTargetArgs(
                uri=self.function.url, http_method="POST",
                oidc_token=gcp.cloudscheduler.JobHttpTargetOidcTokenArgs(
                    service_account_email=self.account.email, audience=self.function.url)),
            opts=child.merge(pulumi.ResourceOptions(depends_on=[invoker])))
        for index, topic in enumerate(args.budget_topics):
            gcp.pubsub.Subscription(
                f"controller-budget-{index}", project=args.project, topic=topic,
                name=args.naming.cloud_function(f"controller-budget-{index}"),
                # The longest ack deadline Pub/Sub allows (600 s, cloud.google.com/pubsub/
                # docs/reference/rest/v1/projects.subscriptions; as recalled, unconfirmed):
                # a push is acknowledged by the function's 200, after its run.
                labels=args.labels, ack_deadline_seconds=600,
                push_config=gcp.pubsub.SubscriptionPushConfigArgs(
                    push_endpoint=self.function.url,
                    oidc_token=gcp.pubsub.SubscriptionPushConfigOidcTokenArgs(
                        service_account_email=self.account.email,
                        audience=self.function.url)),
                opts=child.merge(pulumi.ResourceOptions(depends_on=[invoker])))
        self.register_outputs({"serviceAccount": self.account.email,
                               "url": self.function.url})

    def _grants(self, args: ControllerArgs, member: pulumi.Input[str],
                child: pulumi.ResourceOptions) -> list[pulumi.Resource]:
        grants: list[pulumi.Resource] = []
        for index, project in enumerate(sorted(set(args.managed_projects))):
            role = gcp.projects.IAMCustomRole(
                f"controller-role-{index}", role_id=args.naming.custom_role_id("controller"),
                title="tpu-stack controller",
                description="List, place, stop and delete the stack's TPU nodes and requests",
                permissions=list(TPU_PERMISSIONS), project=project, opts=child)
            grants.append(gcp.projects.IAMMember(
                f"controller-tpu-{index}", project=project, member=member, opts=child,
                role=pulumi.Output.concat("projects/", role.project, "/roles/", role.role_id)))
        for index, account in enumerate(args.runtime_accounts):
            grants.append(gcp.serviceaccount.IAMMember(
                f"controller-acts-as-{index}", service_account_id=account, role=ACT_AS_ROLE,
                member=member, opts=child))
        for index, bucket in enumerate(args.status_buckets):
            # objects.list and get of the status objects (ops/tpu/logs.py published_jobs).
            grants.append(gcp.storage.BucketIAMMember(
                f"controller-status-{index}", bucket=bucket, member=member,
                role="roles/storage.objectViewer", opts=child))
        objects = gcp.projects.IAMCustomRole(
            "controller-objects-role", role_id=args.naming.custom_role_id("controller_objects"),
            title="tpu-stack controller objects", description="The controller's own objects",
            permissions=list(OBJECT_PERMISSIONS), project=args.project, opts=child)
        prefix = pulumi.Output.concat("projects/_/buckets/", args.bucket, "/objects/")
        grants.append(gcp.storage.BucketIAMMember(
            "controller-objects", bucket=args.bucket, member=member, opts=child,
            role=pulumi.Output.concat("projects/", objects.project, "/roles/", objects.role_id),
            condition=gcp.storage.BucketIAMMemberConditionArgs(
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
    manages the stack's project and its teams' projects, acts as their runtime accounts
    (the team's as components/teams.py names it), runs on the budget topics of the teams
    whose budget stops their TPUs, and gets the stack's manifest."""
    settings = platform.settings  # type: ignore[attr-defined]
    naming = settings.naming
    bucket = platform.buckets.buckets["artifacts"].name  # type: ignore[attr-defined]
    teams = sorted({team for team, _node in settings.named_nodes if team})
    identity = platform.identity  # type: ignore[attr-defined]
    accounts: list[pulumi.Input[str]] = [identity.account.name]
    for team in teams:
        project = naming.team_project(team)
        accounts.append(f"projects/{project}/serviceAccounts/"
                        f"{naming.account_id('runtime', team)}@{project}.iam.gserviceaccount.com")
    topics = [pulumi.Output.concat("projects/", settings.gcp_project, "/topics/",
                                   naming.cloud_function("budget", team))
              for team in sorted(settings.teams)
              if settings.teams[team].budget_action == "stop" and settings.billing_account]
    controller = Controller("controller", ControllerArgs(
        naming=naming, project=settings.gcp_project, bucket=bucket,
        interval=settings.controller.interval,
        managed_projects=[settings.node_project(t) for t in (None, *teams)],
        labels=naming.labels("controller", settings.team, settings.labels),
        runtime_accounts=accounts, budget_topics=topics,
        status_buckets=[platform.buckets.buckets["logs"].name]), opts=opts)  # type: ignore[attr-defined]
    regions = set(settings.regions)
    zones = tuple(z for z in catalog.all_zones() if catalog.region_of(z) in regions)
    budget_teams = tuple(BudgetTeam(team, naming.team_project(team), zones)
                         for team in sorted(settings.teams)
                         if settings.teams[team].budget_action == "stop")
    budgets = tuple(TeamBudget(team, settings.node_project(team), spec.budget_usd_per_month,
                               spec.budget_horizon_hours)  # issue 46: spend_lines.py
                    for team, spec in sorted(settings.teams.items())
                    if spec.budget_usd_per_month is not None)
    text = manifest_json(target_for(settings), budget_teams=budget_teams, budgets=budgets)
    manifest_object(settings.stack, bucket, text, opts)
    return controller
