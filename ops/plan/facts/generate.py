"""Generate ops/plan/facts/replacement.json: which inputs replace a resource, and how.

For every resource type the program declares: the inputs whose change forces a
replacement (terraform-provider-google-beta schemas: `ForceNew`, and
`customdiff.ForceNewIfChange` with the condition's name), the same fields as
magic-modules documents them (`immutable: true`, a cross-check), and whether the
replacement deletes first (pulumi-gcp's ResourceInfo `DeleteBeforeReplace`, or an
auto-named property set explicitly: pulumi-terraform-bridge's rule). Each entry
records the file and commit it was read from.

It reads local checkouts (a work tree or a bare git directory), given on the
command line, and copies no code from them, only the facts:

    .venv/infra/bin/python -m ops.plan.facts.generate \\
        --provider PATH/terraform-provider-google-beta --magic-modules PATH/magic-modules \\
        --pulumi-gcp PATH/pulumi-gcp --bridge PATH/pulumi-terraform-bridge --pulumi PATH/pulumi \\
        --plugin-sdk PATH/terraform-plugin-sdk [--plugin-sdk-commit COMMIT]

It also records each field's value normalisation (`StateFunc`, `DiffSuppressFunc`: the
SDK's diff, which the bridge runs, compares normalised values) and where the engine
rules the preview mirrors (protect, retainOnDelete, delete-first dependents, same
steps, the display) are, in pulumi/pulumi.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from model.pulumi_types import (
    BILLING_BUDGET,
    CLOUDFUNCTIONSV2_FUNCTION,
    CLOUDQUOTA_S_QUOTA_PREFERENCE,
    CLOUDRUNV2_SERVICE_IAM_MEMBER,
    CLOUDSCHEDULER_JOB,
    COMPUTE_FIREWALL,
    COMPUTE_NETWORK,
    COMPUTE_SHARED_VPC_HOST_PROJECT,
    COMPUTE_SHARED_VPC_SERVICE_PROJECT,
    COMPUTE_SUBNETWORK,
    COMPUTE_SUBNETWORK_IAM_MEMBER,
    DYNAMIC_FALLBACK_TPU,
    DYNAMIC_QUEUED_TPU,
    IAM_WORKLOAD_IDENTITY_POOL,
    IAM_WORKLOAD_IDENTITY_POOL_PROVIDER,
    LOGGING_METRIC,
    MONITORING_ALERT_POLICY,
    MONITORING_DASHBOARD,
    MONITORING_MONITORED_PROJECT,
    MONITORING_NOTIFICATION_CHANNEL,
    ORGANIZATIONS_PROJECT,
    PROJECTS_IAM_CUSTOM_ROLE,
    PROJECTS_IAM_MEMBER,
    PROJECTS_SERVICE,
    PROJECTS_SERVICE_IDENTITY,
    PROVIDER_GCP,
    PUBSUB_SUBSCRIPTION,
    PUBSUB_TOPIC,
    PUBSUB_TOPIC_IAM_MEMBER,
    SERVICEACCOUNT_ACCOUNT,
    SERVICEACCOUNT_IAM_BINDING,
    SERVICEACCOUNT_IAM_MEMBER,
    STORAGE_BUCKET,
    STORAGE_BUCKET_IAM_BINDING,
    STORAGE_BUCKET_IAM_MEMBER,
    STORAGE_BUCKET_OBJECT,
    TPU_V2_VM,
)

OUT = Path(__file__).with_name("replacement.json")


@dataclass(frozen=True)
class TypeSource:
    terraform: str  # the provider's resource name
    files: tuple[str, ...]  # provider files holding its schema (parent schema first)
    schemas: tuple[str, ...]  # `var NAME = map[...]` schemas; empty: the resource's own
    mmv1: str | None = None  # magic-modules product YAML, for generated resources
    # The provider's Delete that only drops the resource from state (its function, as
    # text): the resource stays in GCP when Pulumi deletes it.
    delete_only_forgets: str | None = None


GO = "google-beta/services/"
IAM = "google-beta/tpgiamresource/"
# Pulumi type token → where the provider defines it (pulumi-gcp maps the tokens:
# provider/resources.go, `Tok: gcpResource(...)` and MustComputeTokens).
TYPES: dict[str, TypeSource] = {
    BILLING_BUDGET: TypeSource(
        "google_billing_budget", (GO + "billingbudgets/resource_billing_budget.go",), (),
        "mmv1/products/billingbudgets/Budget.yaml"),
    CLOUDQUOTA_S_QUOTA_PREFERENCE: TypeSource(
        "google_cloud_quotas_quota_preference",
        (GO + "cloudquotas/resource_cloud_quotas_quota_preference.go",), (),
        "mmv1/products/cloudquotas/QuotaPreference.yaml",
        "func resourceCloudQuotasQuotaPreferenceDelete"),
    CLOUDFUNCTIONSV2_FUNCTION: TypeSource(
        "google_cloudfunctions2_function",
        (GO + "cloudfunctions2/resource_cloudfunctions2_function.go",), (),
        "mmv1/products/cloudfunctions2/Function.yaml"),
    CLOUDRUNV2_SERVICE_IAM_MEMBER: TypeSource(
        "google_cloud_run_v2_service_iam_member",
        (GO + "cloudrunv2/iam_cloud_run_v2_service.go", IAM + "resource_iam_member.go"),
        ("CloudRunV2ServiceIamSchema", "IamMemberBaseSchema")),
    CLOUDSCHEDULER_JOB: TypeSource(
        "google_cloud_scheduler_job",
        (GO + "cloudscheduler/resource_cloud_scheduler_job.go",), (),
        "mmv1/products/cloudscheduler/Job.yaml"),
    COMPUTE_FIREWALL: TypeSource(
        "google_compute_firewall", (GO + "compute/resource_compute_firewall.go",), (),
        "mmv1/products/compute/Firewall.yaml"),
    COMPUTE_NETWORK: TypeSource(
        "google_compute_network", (GO + "compute/resource_compute_network.go",), (),
        "mmv1/products/compute/Network.yaml"),
    COMPUTE_SHARED_VPC_HOST_PROJECT: TypeSource(
        "google_compute_shared_vpc_host_project",
        (GO + "compute/resource_compute_shared_vpc_host_project.go",), ()),
    COMPUTE_SHARED_VPC_SERVICE_PROJECT: TypeSource(
        "google_compute_shared_vpc_service_project",
        (GO + "compute/resource_compute_shared_vpc_service_project.go",), ()),
    COMPUTE_SUBNETWORK: TypeSource(
        "google_compute_subnetwork", (GO + "compute/resource_compute_subnetwork.go",), (),
        "mmv1/products/compute/Subnetwork.yaml"),
    COMPUTE_SUBNETWORK_IAM_MEMBER: TypeSource(
        "google_compute_subnetwork_iam_member",
        (GO + "compute/iam_compute_subnetwork.go", IAM + "resource_iam_member.go"),
        ("ComputeSubnetworkIamSchema", "IamMemberBaseSchema")),
    IAM_WORKLOAD_IDENTITY_POOL: TypeSource(
        "google_iam_workload_identity_pool",
        (GO + "iambeta/resource_iam_workload_identity_pool.go",), (),
        "mmv1/products/iambeta/WorkloadIdentityPool.yaml"),
    IAM_WORKLOAD_IDENTITY_POOL_PROVIDER: TypeSource(
        "google_iam_workload_identity_pool_provider",
        (GO + "iambeta/resource_iam_workload_identity_pool_provider.go",), (),
        "mmv1/products/iambeta/WorkloadIdentityPoolProvider.yaml"),
    LOGGING_METRIC: TypeSource(
        "google_logging_metric", (GO + "logging/resource_logging_metric.go",), (),
        "mmv1/products/logging/Metric.yaml"),
    MONITORING_ALERT_POLICY: TypeSource(
        "google_monitoring_alert_policy",
        (GO + "monitoring/resource_monitoring_alert_policy.go",), (),
        "mmv1/products/monitoring/AlertPolicy.yaml"),
    # Handwritten (magic-modules mmv1/third_party/terraform/services/monitoring/): no YAML.
    MONITORING_DASHBOARD: TypeSource(
        "google_monitoring_dashboard",
        (GO + "monitoring/resource_monitoring_dashboard.go",), ()),
    MONITORING_MONITORED_PROJECT: TypeSource(
        "google_monitoring_monitored_project",
        (GO + "monitoring/resource_monitoring_monitored_project.go",), (),
        "mmv1/products/monitoring/MonitoredProject.yaml"),
    MONITORING_NOTIFICATION_CHANNEL: TypeSource(
        "google_monitoring_notification_channel",
        (GO + "monitoring/resource_monitoring_notification_channel.go",), (),
        "mmv1/products/monitoring/NotificationChannel.yaml"),
    ORGANIZATIONS_PROJECT: TypeSource(
        "google_project", (GO + "resourcemanager/resource_google_project.go",), ()),
    PROJECTS_IAM_CUSTOM_ROLE: TypeSource(
        "google_project_iam_custom_role",
        (GO + "resourcemanager/resource_google_project_iam_custom_role.go",), ()),
    PROJECTS_IAM_MEMBER: TypeSource(
        "google_project_iam_member",
        (GO + "resourcemanager/iam_project.go", IAM + "resource_iam_member.go"),
        ("IamProjectSchema", "IamMemberBaseSchema")),
    PROJECTS_SERVICE_IDENTITY: TypeSource(
        "google_project_service_identity",
        (GO + "resourcemanager/resource_project_service_identity.go",), ()),
    PROJECTS_SERVICE: TypeSource(
        "google_project_service", (GO + "resourcemanager/resource_google_project_service.go",),
        ()),
    PUBSUB_TOPIC: TypeSource(
        "google_pubsub_topic", (GO + "pubsub/resource_pubsub_topic.go",), (),
        "mmv1/products/pubsub/Topic.yaml"),
    PUBSUB_SUBSCRIPTION: TypeSource(
        "google_pubsub_subscription", (GO + "pubsub/resource_pubsub_subscription.go",), (),
        "mmv1/products/pubsub/Subscription.yaml"),
    PUBSUB_TOPIC_IAM_MEMBER: TypeSource(
        "google_pubsub_topic_iam_member",
        (GO + "pubsub/iam_pubsub_topic.go", IAM + "resource_iam_member.go"),
        ("PubsubTopicIamSchema", "IamMemberBaseSchema")),
    SERVICEACCOUNT_ACCOUNT: TypeSource(
        "google_service_account",
        (GO + "resourcemanager/resource_google_service_account.go",), ()),
    SERVICEACCOUNT_IAM_BINDING: TypeSource(
        "google_service_account_iam_binding",
        (GO + "resourcemanager/iam_service_account.go", IAM + "resource_iam_binding.go"),
        ("IamServiceAccountSchema", "iamBindingSchema")),
    SERVICEACCOUNT_IAM_MEMBER: TypeSource(
        "google_service_account_iam_member",
        (GO + "resourcemanager/iam_service_account.go", IAM + "resource_iam_member.go"),
        ("IamServiceAccountSchema", "IamMemberBaseSchema")),
    STORAGE_BUCKET: TypeSource(
        "google_storage_bucket", (GO + "storage/resource_storage_bucket.go",), ()),
    STORAGE_BUCKET_IAM_BINDING: TypeSource(
        "google_storage_bucket_iam_binding",
        (GO + "storage/iam_storage_bucket.go", IAM + "resource_iam_binding.go"),
        ("StorageBucketIamSchema", "iamBindingSchema")),
    STORAGE_BUCKET_IAM_MEMBER: TypeSource(
        "google_storage_bucket_iam_member",
        (GO + "storage/iam_storage_bucket.go", IAM + "resource_iam_member.go"),
        ("StorageBucketIamSchema", "IamMemberBaseSchema")),
    STORAGE_BUCKET_OBJECT: TypeSource(
        "google_storage_bucket_object", (GO + "storage/resource_storage_bucket_object.go",), ()),
    TPU_V2_VM: TypeSource(
        "google_tpu_v2_vm", (GO + "tpuv2/resource_tpu_v2_vm.go",), (),
        "mmv1/products/tpuv2/Vm.yaml"),
}

# Where the rules live, for the entries' citations (checked to exist at generation).
BRIDGE_RULE = ("pkg/tfbridge/schema.go", "func nameRequiresDeleteBeforeReplace")
BRIDGE_DIFF = ("pkg/tfbridge/provider.go", "nameRequiresDeleteBeforeReplace(news, olds")
BRIDGE_CONFIG = ("pkg/tfbridge/provider.go", "func (p *configDiffer) forcesProviderReplace")
BRIDGE_AUTONAMING = ("pkg/tfbridge/info/autonaming.go", "func (p *Provider) SetAutonaming")
PULUMI_GCP = ("provider/resources.go", "prov.SetAutonaming(")
ENGINE_OVERRIDE = ("pkg/resource/deploy/step_generator.go",
                   "deleteBeforeReplace = *goal.DeleteBeforeReplace")
ENGINE_DEPENDENTS = ("pkg/resource/deploy/step_generator.go",
                     "func (sg *stepGenerator) calculateDependentReplacements")
ENGINE_UNKNOWN = ("pkg/resource/deploy/step_generator.go",
                  "pv = resource.MakeComputed(resource.NewProperty(\"<unknown>\"))")
# The engine rules the preview mirrors beyond replacement (ops/plan/steps.py), each at
# the line that decides it, in pulumi/pulumi.
STEP_GENERATOR = "pkg/resource/deploy/step_generator.go"
ENGINE_RULES: dict[str, list[tuple[str, str]]] = {
    # continueStepsFromDiff: a replace of a resource protected before and after is an
    # error (preview goes on to show the diff, `up` bails before any step).
    "protectRefusesReplace": [(STEP_GENERATOR, "if new.Protect && old.Protect && "
                                               "!sg.deployment.opts.IgnoreProtect {")],
    # A protected resource a delete-first root would delete first: error and bail.
    "protectedDependentBails": [(STEP_GENERATOR, "as part of replacing %q ")],
    # DeleteStep.Apply: a protected delete (not a replacement's) fails, preview too.
    "protectRefusesDelete": [("pkg/resource/deploy/step.go",
                              "if !s.replacing && s.old.Protect && "
                              "!s.deployment.opts.IgnoreProtect {")],
    # ... and a retainOnDelete one only leaves the state.
    "retainOnDeleteKeeps": [("pkg/resource/deploy/step.go",
                             "} else if s.old.RetainOnDelete {")],
    # Deletes run in antichains, in parallel: the ones beside a refused delete still run.
    "deletesBesideARefusalRun": [
        ("pkg/resource/deploy/deployment_executor.go",
         "deleteChains := ex.stepGen.ScheduleDeletes(deleteSteps)"),
        ("pkg/resource/deploy/step_executor.go",
         "func (se *stepExecutor) ExecuteParallel(antichain antichain)")],
    # Only a delete-first replacement deletes its dependents first, before itself.
    "deleteFirstDependentsGoFirst": [
        (STEP_GENERATOR, "toReplace, err = sg.calculateDependentReplacements(old)"),
        (STEP_GENERATOR, "NewDeleteReplacementStep(sg.deployment, sg.deletes, "
                         "dependentResource, true, oldViews))")],
    # No diff (a protect-only change): a same step, counted unchanged.
    "sameStepWithoutDiff": [(STEP_GENERATOR, "updateSteps = append(updateSteps, "
                                             "NewSameStep(sg.deployment, event, old, new))")],
    # What `pulumi preview --diff` prints: prefixes, `old => new`, the summary.
    "displayPrefixes": [("pkg/resource/deploy/step.go", "func RawPrefix(op display.StepOp)")],
    "displayOldToNew": [("pkg/backend/display/object_diff.go", 'p.writeVerbatim(" => ")')],
    "displaySummary": [("pkg/backend/display/diff.go", "func renderSummaryEvent("),
                       ("pkg/backend/display/diff.go",
                        'summaryPieces = append(summaryPieces, fmt.Sprintf("%d unchanged", '
                        'sameCount))')],
}
# The bridge diffs the provider's state against the new config with the SDK's own diff,
# which applies a field's StateFunc to the new value and drops a change its
# DiffSuppressFunc suppresses (pulumi/terraform-plugin-sdk, the bridge's replacement
# of terraform-plugin-sdk/v2 in its go.mod).
BRIDGE_SDK_DIFF = ("pkg/tfbridge/provider.go",
                   "return p.tf.Diff(ctx, res.TFName, state, config, shim.DiffOptions{")
SDK_STATE_FUNC = ("helper/schema/schema.go", "n = schema.StateFunc(n)")
SDK_DIFF_SUPPRESS = ("helper/schema/schema.go",
                     "schema.DiffSuppressFunc(attrK, attrV.Old, attrV.New, rd)")


class Checkout:
    """A repository on disk: a work tree or a bare git directory, at HEAD."""

    def __init__(self, repo: str, path: Path, commit: str = "HEAD") -> None:
        self.repo, self.path = repo, path
        self.commit = self._git("rev-parse", f"{commit}^{{commit}}").strip()

    def _git(self, *args: str) -> str:
        git_dir = self.path / ".git" if (self.path / ".git").exists() else self.path
        return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True,
                              capture_output=True, text=True).stdout

    def read(self, path: str) -> str:
        return self._git("show", f"{self.commit}:{path}")

    def cite(self, path: str, needle: str | None = None) -> dict[str, Any]:
        """repo, path, commit (and the needle's line, which must be there)."""
        where: dict[str, Any] = {"repo": self.repo, "path": path, "commit": self.commit}
        if needle is not None:
            text = self.read(path)
            if needle not in text:
                raise SystemExit(f"{self.repo}:{path}: {needle!r} not found; the rule moved")
            where["line"] = text[:text.index(needle)].count("\n") + 1
        return where

    def submodule_commit(self, path: str) -> str:
        return self._git("ls-tree", self.commit, path).split()[2]


# --- Go source, read as text ------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"|`[^`]*`|//[^\n]*|/\*.*?\*/', re.S)
_KEY = re.compile(r'^[a-z0-9_]+$')


def masked(source: str) -> str:
    """The source with comments and string contents blanked (same length), so braces
    count; short identifier strings (schema keys) are kept."""
    def blank(match: re.Match[str]) -> str:
        text = match.group(0)
        if text.startswith('"') and _KEY.match(text[1:-1]):
            return text
        return re.sub(r"[^\n]", " ", text)
    return _STRING.sub(blank, source)


def closing(text: str, open_at: int) -> int:
    """Index of the brace closing the one at `open_at`."""
    depth = 0
    for index in range(open_at, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return index
    raise ValueError("unbalanced braces")


def top_level(body: str) -> str:
    """`body` without anything nested in braces."""
    out, depth = [], 0
    for char in body:
        if char == "}":
            depth -= 1
        if depth == 0:
            out.append(char)
        if char == "{":
            depth += 1
    return "".join(out)


_ENTRY = re.compile(r'"([a-z0-9_]+)"\s*:\s*\{')
_SCHEMA_MAP = re.compile(r"Schema:\s*map\[string\]\*schema\.Schema\{")


@dataclass(frozen=True)
class Field:
    path: tuple[str, ...]  # Terraform names; `x[]`: an item of list or set x
    force_new: bool
    input: bool  # Optional or Required
    string: bool
    # The schema's value normalisation, if any: ("StateFunc" | "DiffSuppressFunc",
    # the function's name (an inline one: `inline:upper` and the like), its line).
    normalise: tuple[str, str, int] | None = None


def schema_fields(text: str, open_at: int, prefix: tuple[str, ...] = ()) -> Iterator[Field]:
    """Every field of the schema map whose `{` is at `open_at`, nested ones too."""
    end = closing(text, open_at)
    index = open_at + 1
    while (match := _ENTRY.search(text, index, end)) is not None:
        body_at = match.end() - 1
        body_end = closing(text, body_at)
        body = text[body_at + 1:body_end]
        flat = top_level(body)
        path = (*prefix, match.group(1))
        one = re.search(r"MaxItems:\s*1\b", flat) is not None
        listy = re.search(r"Type:\s*schema\.Type(List|Set)\b", flat) is not None
        yield Field(path, re.search(r"ForceNew:\s*true", flat) is not None,
                    re.search(r"(Optional|Required):\s*true", flat) is not None,
                    re.search(r"Type:\s*schema\.TypeString\b", flat) is not None,
                    normalisation(text, body_at + 1, body))
        if (nested := _SCHEMA_MAP.search(body)) is not None:
            # The bridge flattens a MaxItems=1 block to an object (pulumi-terraform-bridge
            # docs: "MaxItemsOne"); other lists keep their items.
            item = path if one or not listy else (*prefix, match.group(1) + "[]")
            yield from schema_fields(text, body_at + 1 + nested.end() - 1, item)
        index = body_end + 1


_NORMALISE = re.compile(r"\b(StateFunc|DiffSuppressFunc):\s*([\w.]+)")
_INLINE_KINDS = (("strings.ToUpper(", "inline:upper"), ("strings.ToLower(", "inline:lower"))


def normalisation(text: str, body_start: int, body: str) -> tuple[str, str, int] | None:
    """The field's own StateFunc or DiffSuppressFunc (not a nested field's): kind, function
    name (`tpgresource.` dropped; an inline function is named by what it does when that is
    one call, `inline:upper`, else `inline`), and its line in the file."""
    for match in _NORMALISE.finditer(body):
        if body[:match.start()].count("{") != body[:match.start()].count("}"):
            continue  # a nested field's
        kind, name = match.group(1), match.group(2).removeprefix("tpgresource.")
        if name == "func":
            # The body's brace: after the signature, whose `interface{}` has braces too.
            opened = re.compile(r"\)\s*(string|bool)\s*\{").search(body, match.end()).end() - 1
            inner = body[opened:closing(body, opened) + 1]
            calls = [word for needle, word in _INLINE_KINDS if needle in inner]
            name = calls[0] if len(calls) == 1 and inner.count("return") == 1 else "inline"
        line = text[:body_start + match.start()].count("\n") + 1
        return kind, name, line
    return None


def resource_fields(source: str, schema_var: str | None) -> list[Field]:
    text = masked(source)
    if schema_var:
        start = re.search(rf"var {schema_var} = map\[string\]\*schema\.Schema\{{", text)
    else:
        start = _SCHEMA_MAP.search(text, text.index("*schema.Resource {"))
    if start is None:
        raise SystemExit(f"schema {schema_var or 'of the resource'} not found")
    return list(schema_fields(text, start.end() - 1))


def conditional_force_new(source: str) -> dict[str, str]:
    """`customdiff.ForceNewIfChange("field", Condition)`: field → condition's name."""
    return dict(re.findall(r'ForceNewIfChange\(\s*"([a-z0-9_]+)"\s*,\s*(\w+)', source))


def camel(name: str) -> str:
    """The bridge's default Pulumi name of a Terraform field (`x[]` stays marked)."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def pulumi_path(field: Field) -> str:
    return ".".join(camel(part) for part in field.path)


# --- magic-modules --------------------------------------------------------------------

def mmv1_immutable(source: str) -> list[str]:
    """Dotted API names of the properties documented `immutable: true`."""
    product = yaml.safe_load(source)
    whole = bool(product.get("immutable"))
    return sorted(_immutable((product.get("properties") or []) + (product.get("parameters") or []),
                             whole, ""))


def _immutable(properties: list[dict[str, Any]], whole: bool, prefix: str) -> Iterator[str]:
    for prop in properties:
        path = f"{prefix}{prop['name']}"
        if prop.get("output"):
            continue
        if prop.get("immutable") or (whole and not prop.get("update_url")):
            yield path
        nested = prop.get("properties") or (prop.get("item_type") or {}).get("properties")
        if isinstance(nested, list):
            yield from _immutable(nested, whole, f"{path}.")


# --- pulumi-gcp ---------------------------------------------------------------------

def resource_infos(source: str) -> dict[str, str]:
    """The `Resources:` map of pulumi-gcp's ProviderInfo: terraform name → entry text."""
    text = masked(source)
    start = text.index("Resources: map[string]*tfbridge.ResourceInfo{")
    open_at = text.index("{", start)
    end = closing(text, open_at)
    infos, index = {}, open_at + 1
    while (match := re.compile(r'"(google_[a-z0-9_]+)"\s*:\s*\{').search(text, index, end)):
        body_end = closing(text, match.end() - 1)
        infos[match.group(1)] = text[match.end():body_end]
        index = body_end + 1
    return infos


def auto_named(info: str, fields: list[Field], autonaming_all: bool) -> str | None:
    """The Terraform field pulumi-gcp auto-names, if any."""
    explicit = re.search(r'"([a-z0-9_]+)"\s*:\s*(tfbridge\.|info\.)AutoName', info)
    if explicit:
        return explicit.group(1)
    if "nameField(lowercaseAutoName())" in info:
        return "name"
    # SetAutonaming: every input string field literally called `name` without a Fields entry.
    named = [f for f in fields if f.path == ("name",) and f.input and f.string]
    if autonaming_all and named and not re.search(r'"name"\s*:', info):
        return "name"
    return None


# --- the facts ---------------------------------------------------------------------

def normalise_entry(field: Field, where: dict[str, Any]) -> dict[str, Any]:
    assert field.normalise is not None
    kind, function, line = field.normalise
    return {"kind": kind, "function": function, **where, "line": line}


def type_entry(token: str, source: TypeSource, provider: Checkout, mm: Checkout,
               gcp_infos: dict[str, str], autonaming_all: bool) -> dict[str, Any]:
    fields: list[Field] = []
    conditions: dict[str, str] = {}
    normalise: dict[str, dict[str, Any]] = {}
    for index, path in enumerate(source.files):
        text = provider.read(path)
        schema_var = source.schemas[index] if source.schemas else None
        found = resource_fields(text, schema_var)
        fields += found
        normalise.update({pulumi_path(f): normalise_entry(f, provider.cite(path))
                          for f in found if f.normalise is not None})
        conditions.update(conditional_force_new(text))
    info = gcp_infos.get(source.terraform, "")
    auto = auto_named(info, fields, autonaming_all)
    entry: dict[str, Any] = {
        "terraform": source.terraform,
        "forceNew": sorted(pulumi_path(f) for f in fields if f.force_new),
        "forceNewIf": {camel(k): v for k, v in sorted(conditions.items())},
        "deleteBeforeReplace": bool(re.search(r"DeleteBeforeReplace:\s*true", info)),
        "autoName": camel(auto) if auto else None,
        "normalise": dict(sorted(normalise.items())),
        "source": [provider.cite(path) for path in source.files],
    }
    if source.delete_only_forgets:
        entry["deleteOnlyForgets"] = provider.cite(source.files[0], source.delete_only_forgets)
    if source.mmv1:
        entry["mmv1"] = {**mm.cite(source.mmv1), "immutable": mmv1_immutable(mm.read(source.mmv1))}
    return entry


def queued_tpu_entry() -> dict[str, Any]:
    """The dynamic provider's own rule (components/queued_tpu.py, QueuedTpuProvider.diff):
    every input but the in-place and provider-only ones replaces, always delete first;
    an in-place change while the request still waits is held, and applied once the node
    exists: the request keeps its place in the queue (.update)."""
    from components import queued_tpu

    return {"replaceUnless": sorted(queued_tpu.IN_PLACE + queued_tpu.PROVIDER_ONLY),
            "heldWhileWaiting": sorted(queued_tpu.IN_PLACE),
            "forceNew": [], "forceNewIf": {}, "deleteBeforeReplace": True, "autoName": None,
            "source": [{"repo": "tpu-stack", "path": "components/queued_tpu.py",
                        "symbol": "QueuedTpuProvider.diff, .update, IN_PLACE, PROVIDER_ONLY"}]}


def fallback_tpu_entry() -> dict[str, Any]:
    """FallbackTpuProvider.diff: the node's own inputs as QueuedTpu's, except that the
    candidates, maxWait and the top-level view of the first candidate are updates. An edit
    of `candidates` that removes the one the node runs on replaces it: which one that is
    only the state knows, so the plan shows an edit that removes any candidate as a
    replacement (`replaceWhenRemoved`, components/fallback_tpu.py removed_candidates),
    one that only adds or reorders as an update."""
    from components import fallback_tpu, queued_tpu

    return {"replaceUnless": sorted({*queued_tpu.IN_PLACE, *fallback_tpu.STEERING,
                                     *fallback_tpu.PLACEMENT_KEYS}),
            "replaceWhenRemoved": "candidates",
            # A request `tpuctl recover` moved waits again: QueuedTpu's update holds.
            "heldWhileWaiting": sorted(queued_tpu.IN_PLACE),
            "forceNew": [], "forceNewIf": {}, "deleteBeforeReplace": True, "autoName": None,
            "source": [{"repo": "tpu-stack", "path": "components/fallback_tpu.py",
                        "symbol": "FallbackTpuProvider.diff, STEERING, PLACEMENT_KEYS, "
                                  "removed_candidates"}]}


def generate(args: argparse.Namespace) -> dict[str, Any]:
    gcp = Checkout("pulumi/pulumi-gcp", args.pulumi_gcp)
    # The provider at the commit pulumi-gcp builds (its `upstream` submodule).
    provider = Checkout("hashicorp/terraform-provider-google-beta", args.provider,
                        gcp.submodule_commit("upstream"))
    mm = Checkout("GoogleCloudPlatform/magic-modules", args.magic_modules)
    bridge = Checkout("pulumi/pulumi-terraform-bridge", args.bridge)
    engine = Checkout("pulumi/pulumi", args.pulumi)
    sdk = Checkout("pulumi/terraform-plugin-sdk", args.plugin_sdk, args.plugin_sdk_commit)
    resources_go = gcp.read(PULUMI_GCP[0])
    autonaming_all = PULUMI_GCP[1] in resources_go
    infos = resource_infos(resources_go)
    types = {token: type_entry(token, source, provider, mm, infos, autonaming_all)
             for token, source in TYPES.items()}
    types[PROVIDER_GCP] = {
        "forceNew": re.findall(r'"(\w+)":\s*\{[^}]*ForcesProviderReplace:\s*tfbridge\.True\(\)',
                               resources_go),
        "forceNewIf": {}, "deleteBeforeReplace": False, "autoName": None,
        "source": [bridge.cite(*BRIDGE_CONFIG), gcp.cite(PULUMI_GCP[0])]}
    types[DYNAMIC_QUEUED_TPU] = queued_tpu_entry()
    types[DYNAMIC_FALLBACK_TPU] = fallback_tpu_entry()
    return {
        "generatedBy": "ops/plan/facts/generate.py",
        "rules": {
            "autoNamedSetExplicitlyDeletesFirst": [bridge.cite(*BRIDGE_RULE),
                                                   bridge.cite(*BRIDGE_DIFF)],
            "autonamingOfNameFields": [bridge.cite(*BRIDGE_AUTONAMING), gcp.cite(*PULUMI_GCP)],
            "resourceOptionOverridesProvider": [engine.cite(*ENGINE_OVERRIDE)],
            "dependentsDiffWithUnknowns": [engine.cite(*ENGINE_DEPENDENTS),
                                           engine.cite(*ENGINE_UNKNOWN)],
            "normalisedBeforeDiff": [bridge.cite(*BRIDGE_SDK_DIFF), sdk.cite(*SDK_STATE_FUNC),
                                     sdk.cite(*SDK_DIFF_SUPPRESS)],
            **{rule: [engine.cite(*where) for where in places]
               for rule, places in ENGINE_RULES.items()},
        },
        "types": types,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag in ("provider", "magic-modules", "pulumi-gcp", "bridge", "pulumi", "plugin-sdk"):
        parser.add_argument(f"--{flag}", type=Path, required=True)
    # The bridge pins pulumi/terraform-plugin-sdk by a pseudo-version (its go.mod); give
    # the commit read when that one is not in the checkout.
    parser.add_argument("--plugin-sdk-commit", default="HEAD")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.write_text(json.dumps(generate(args), indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
