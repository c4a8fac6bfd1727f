"""A team's budget that stops its TPUs (docs/design.md, "Budgets that stop TPUs").

For a team with `budgetAction: stop`, the platform stack declares in its own project a
Pub/Sub topic the team's budget notifies (every update, `all_updates_rule`), the
budget-stop function (functions/budget_stop, a Cloud Run function built from its source
archive) triggered by that topic, and a service account of the function's own holding,
in the team's project only, the TPU permissions it needs (a custom role), plus
creating its marker objects under `budget-stop/<team>/` of the artifacts bucket. The
function's runtime account and the build account it is built as are made by the
bootstrap, which grants the deployer actAs on them (model/function_accounts.py).

`price_table` and `function_source` are pure: the function's prices come from
model/catalog.py, so the meter it acts on is the stack's own.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_gcp as gcp

from model import catalog
from model.archive import REPO_ROOT
from model.budget_hold import marker_prefix
from model.function_archive import zip_members
from model.meter import price_table
from model.naming import Naming
from model.pulumi_types import COMPONENT_BUDGET_STOP
from model.roles import (
    BUDGET_STOP_PERMISSIONS,
    BUDGET_STOP_ROLE,
    marker_role,
)

FUNCTION_DIR = Path(__file__).resolve().parents[1] / "functions" / "budget_stop"
FUNCTION_FILES = ("main.py", "requirements.txt")
# Shared with the rest of tpu-stack, at these paths in the archive: the meter's arithmetic
# (model/spend.py, the stack's own meter's too: model/meter.py), at the root where main.py
# imports it as `spend`, and the one TPU client (cloud/).
SHARED_FILES = {"spend.py": REPO_ROOT / "model" / "spend.py",
                **{f"cloud/{name}": REPO_ROOT / "cloud" / name
                   for name in ("__init__.py", "gcp_credentials.py", "tpu.py")}}
PRICES_NAME = "prices.json"
ENTRY_POINT = "budget_stop"
STAGING = REPO_ROOT / ".cache" / "functions"  # where Pulumi's FileAsset reads the archive


def function_source() -> bytes:
    """The function's source archive (zip): its files and the catalog's prices, the same
    bytes on every machine for the same content."""
    members = {name: (FUNCTION_DIR / name).read_bytes() for name in FUNCTION_FILES}
    members.update({name: path.read_bytes() for name, path in SHARED_FILES.items()})
    members[PRICES_NAME] = json.dumps(price_table(), sort_keys=True, indent=1).encode()
    return zip_members(members)


# ---- the Pulumi side ---------------------------------------------------------------

TYPE = COMPONENT_BUDGET_STOP
# APIs the function needs in the platform's project: Cloud Run functions build with
# Cloud Build into Artifact Registry, run on Cloud Run, and an Eventarc trigger feeds
# them from Pub/Sub (cloud.google.com/functions/docs/deploy: "Cloud Functions, Cloud
# Build, Artifact Registry, Cloud Run, Eventarc ... and Pub/Sub" APIs enabled).
APIS = ("cloudfunctions.googleapis.com", "cloudbuild.googleapis.com",
        "artifactregistry.googleapis.com", "run.googleapis.com", "eventarc.googleapis.com",
        "pubsub.googleapis.com")
# The newest Python among Cloud Run functions' runtimes as listed at
# cloud.google.com/functions/docs/runtime-support ("python312", "Python 3.12"; 3.13 is
# listed too in later updates: unconfirmed here, so 3.12).
RUNTIME = "python312"
# A Cloud Run functions region near the platform (us-central1 is a Tier 1 region for
# Cloud Run functions, cloud.google.com/functions/docs/locations).
REGION = "us-central1"
PUBSUB_EVENT = "google.cloud.pubsub.topic.v1.messagePublished"
# Cloud Billing publishes budget notifications as this account once a topic is connected
# (cloud.google.com/billing/docs/how-to/budgets-programmatic-notifications: the budget
# grants it pubsub.publisher on the topic; as recalled, unconfirmed here): granted
# explicitly so the deployer needs no setIamPolicy right at connect time.
BILLING_PUBLISHER = "serviceAccount:billing-budget-alert@system.gserviceaccount.com"
# The function's save grace: the longest stop notice the agent honours (120 s,
# catalog.STANDARD_NOTICE_SECONDS) plus 30 s for the job's teardown. Event-driven Cloud
# Run functions may run up to 540 s (cloud.google.com/functions/docs/configuring/timeout).
SAVE_GRACE_SECONDS = catalog.STANDARD_NOTICE_SECONDS + 30
TIMEOUT_SECONDS = 540
# The function's TPU and marker permissions: custom roles the bootstrap creates with a
# fixed list (model/bootstrap.py), so the deployer holds no iam.roleAdmin (issue 44).
PERMISSIONS = BUDGET_STOP_PERMISSIONS
INVOKER_ROLE = "roles/run.invoker"


@dataclass(frozen=True)
class BudgetStopArgs:
    team: str
    team_label: str  # the `team` label value its nodes carry (naming.labels)
    naming: Naming
    platform_project: pulumi.Input[str]
    team_project: pulumi.Input[str]
    zones: list[str]  # where the team's nodes may be (its quota's, and its nodes')
    artifacts_bucket: pulumi.Input[str]  # the source archive and the markers live here
    horizon_hours: float
    labels: dict[str, str]
    # The accounts the bootstrap made (model/function_accounts.py): emails.
    runtime_account: str
    build_account: str


class BudgetStop(pulumi.ComponentResource):
    """The topic a team's budget notifies, the function it triggers, and its grants."""

    topic_path: pulumi.Output[str]  # projects/<p>/topics/<id>: what the budget takes
    function: gcp.cloudfunctionsv2.Function

    def __init__(self, name: str, args: BudgetStopArgs,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__(TYPE, name, None, opts)
        child, t = pulumi.ResourceOptions(parent=self), f"{args.team}-"
        topic = gcp.pubsub.Topic(f"{t}budget", name=args.naming.cloud_function("budget", args.team),
                                 project=args.platform_project, labels=args.labels, opts=child)
        self.topic_path = pulumi.Output.concat("projects/", topic.project, "/topics/", topic.name)
        gcp.pubsub.TopicIAMMember(f"{t}budget-billing-publisher", project=topic.project,
                                  topic=topic.name, role="roles/pubsub.publisher",
                                  member=BILLING_PUBLISHER, opts=child)
        member = f"serviceAccount:{args.runtime_account}"
        grants = self._grants(args, member, child)
        source = self._source(args, child)
        self.function = gcp.cloudfunctionsv2.Function(
            f"{t}budget-stop", name=args.naming.cloud_function("budget-stop", args.team),
            project=args.platform_project, location=REGION, labels=args.labels,
            description=f"Stops and deletes team {args.team}'s TPUs at its budget",
            build_config=build_config(ENTRY_POINT, args.platform_project, args.build_account,
                                      source),
            service_config=gcp.cloudfunctionsv2.FunctionServiceConfigArgs(
                service_account_email=args.runtime_account, timeout_seconds=TIMEOUT_SECONDS,
                max_instance_count=1, available_memory="256M",
                environment_variables=self._environment(args)),
            event_trigger=gcp.cloudfunctionsv2.FunctionEventTriggerArgs(
                trigger_region=REGION, event_type=PUBSUB_EVENT, pubsub_topic=self.topic_path,
                service_account_email=args.runtime_account,
                # A budget notification comes again within hours: no retry storm.
                retry_policy="RETRY_POLICY_DO_NOT_RETRY"),
            opts=child.merge(pulumi.ResourceOptions(depends_on=grants)))
        # The trigger's account invokes the function's Cloud Run service, which has the
        # function's name (cloud.google.com/functions/docs/calling/eventarc: the trigger
        # needs roles/run.invoker on it).
        gcp.cloudrunv2.ServiceIamMember(f"{t}budget-stop-invoker", project=args.platform_project,
                                        location=REGION, name=self.function.name,
                                        role=INVOKER_ROLE, member=member, opts=child)
        self.register_outputs({"topic": self.topic_path, "serviceAccount": args.runtime_account})

    def _grants(self, args: BudgetStopArgs, member: pulumi.Input[str],
                child: pulumi.ResourceOptions) -> list[pulumi.Resource]:
        """The TPU permissions in the team's project; creating markers under its prefix."""
        t = f"{args.team}-"
        # Both roles are the bootstrap's (model/bootstrap.py custom_roles), by name.
        role_name = pulumi.Output.concat("projects/", args.team_project, "/roles/",
                                         args.naming.custom_role_id(BUDGET_STOP_ROLE))
        tpu = gcp.projects.IAMMember(f"{t}budget-stop-tpu", project=args.team_project,
                                     role=role_name, member=member, opts=child)
        marker_role_name = pulumi.Output.concat(
            "projects/", args.platform_project, "/roles/",
            args.naming.custom_role_id(marker_role(args.team)))
        prefix = pulumi.Output.concat("projects/_/buckets/", args.artifacts_bucket,
                                      f"/objects/{marker_prefix(args.team)}")
        markers = gcp.storage.BucketIAMMember(
            f"{t}budget-stop-markers", bucket=args.artifacts_bucket, role=marker_role_name,
            member=member, condition=gcp.storage.BucketIAMMemberConditionArgs(
                title=f"budget-stop markers of team {args.team}"[:100],
                expression=prefix.apply(lambda p: f'resource.name.startsWith("{p}")')),
            opts=child)
        return [tpu, markers]

    def _source(self, args: BudgetStopArgs,
                child: pulumi.ResourceOptions) -> gcp.storage.BucketObject:
        return source_object(f"{args.team}-budget-stop", "budget-stop", function_source(),
                             args.artifacts_bucket, child)

    @staticmethod
    def _environment(args: BudgetStopArgs) -> dict[str, pulumi.Input[str]]:
        return {"TPU_STACK_TEAM": args.team, "TPU_STACK_TEAM_LABEL": args.team_label,
                "TPU_STACK_PROJECT": args.team_project,
                "TPU_STACK_ZONES": ",".join(sorted(args.zones)),
                "TPU_STACK_MARKER_BUCKET": args.artifacts_bucket,
                "TPU_STACK_SAVE_GRACE_SECONDS": str(SAVE_GRACE_SECONDS),
                "TPU_STACK_BUDGET_HORIZON_HOURS": f"{args.horizon_hours:g}",
                "TPU_STACK_STOP_AT": "1"}


def build_config(entry_point: str, project: pulumi.Input[str], build_account: str,
                 source: gcp.storage.BucketObject
                 ) -> gcp.cloudfunctionsv2.FunctionBuildConfigArgs:
    """A function's build from its source object, built as its own build account (the
    bootstrap's, model/function_accounts.py), never the Compute Engine default one."""
    return gcp.cloudfunctionsv2.FunctionBuildConfigArgs(
        runtime=RUNTIME, entry_point=entry_point,
        service_account=pulumi.Output.concat("projects/", project, "/serviceAccounts/",
                                             build_account),
        source=gcp.cloudfunctionsv2.FunctionBuildConfigSourceArgs(
            storage_source=gcp.cloudfunctionsv2.FunctionBuildConfigSourceStorageSourceArgs(
                bucket=source.bucket, object=source.name)))


def source_object(resource_name: str, kind: str, data: bytes, bucket: pulumi.Input[str],
                  opts: pulumi.ResourceOptions) -> gcp.storage.BucketObject:
    """A function's source archive as `functions/<kind>-<digest>.zip`, staged where
    Pulumi's FileAsset reads it. A code change is a new object (a new name), which
    redeploys the function."""
    digest = hashlib.sha256(data).hexdigest()[:16]
    path = STAGING / f"{kind}-{digest}.zip"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return gcp.storage.BucketObject(
        f"{resource_name}-source-{digest}", bucket=bucket,
        name=f"functions/{kind}-{digest}.zip", source=pulumi.FileAsset(str(path)),
        content_type="application/zip", opts=opts)
