"""CiIdentity under Pulumi's mock engine: inputs, the options Mocks cannot see, and
GitHub tokens run through the declared provider and bindings (policy/cel.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pulumi
import pytest
import yaml
from pulumi.runtime import mocks
from pulumi.runtime.stack import wait_for_rpcs

from components.ci import GITHUB_ISSUER, CiArgs, CiIdentity, DeployerScope
from components.stack_config import file_config
from model.archive import REPO_ROOT
from model.naming import Naming
from model.pulumi_types import (
    COMPONENT_CI_IDENTITY,
    IAM_WORKLOAD_IDENTITY_POOL,
    IAM_WORKLOAD_IDENTITY_POOL_PROVIDER,
    PROJECTS_IAM_CUSTOM_ROLE,
    PROJECTS_IAM_MEMBER,
    SERVICEACCOUNT_ACCOUNT,
    SERVICEACCOUNT_IAM_MEMBER,
)
from model.roles import DEPLOYER_ROLES, PREVIEW_ROLES, TEAM_DEPLOYER_ROLES
from model.settings.schema import CiSettings
from ops.plan.mock_engine import run_program
from policy.cel import CelError
from policy.cel import evaluate as cel
from policy.evaluate import evaluate, load_config

REPO = "acme/tpu-platform"
REPO_ID, OWNER_ID = "260064828", "1342004"
DEPLOYER = "prod-deployer@acme-ml-prod.iam.gserviceaccount.com"
PREVIEW = "prod-preview@acme-ml-prod.iam.gserviceaccount.com"
POOL_NAME = "projects/123456/locations/global/workloadIdentityPools/prod-github"


@dataclass
class Registered:
    type: str
    name: str
    inputs: dict[str, Any]
    protect: bool
    parent: str


class RecordingMonitor(mocks.MockMonitor):
    """Keeps every RegisterResource request: protect and parent travel there, not in Mocks."""

    def __init__(self, engine_mocks: mocks.Mocks) -> None:
        super().__init__(engine_mocks)
        self.registered: dict[str, Registered] = {}

    def RegisterResource(self, request):  # noqa: N802 (the gRPC method name)
        response = super().RegisterResource(request)
        inputs = pulumi.runtime.rpc.deserialize_properties(request.object)
        self.registered[request.name] = Registered(request.type, request.name, inputs,
                                                   request.protect, request.parent)
        return response


class GcpMocks(mocks.Mocks):
    def new_resource(self, args: mocks.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        outputs = dict(args.inputs)
        if args.typ == IAM_WORKLOAD_IDENTITY_POOL:
            outputs["name"] = POOL_NAME
        if args.typ == SERVICEACCOUNT_ACCOUNT:
            outputs["email"] = f"{args.inputs['accountId']}@acme-ml-prod.iam.gserviceaccount.com"
            outputs["name"] = f"projects/acme-ml-prod/serviceAccounts/{outputs['email']}"
        if args.typ == PROJECTS_IAM_CUSTOM_ROLE:
            outputs["name"] = f"projects/acme-ml-prod/roles/{args.inputs['roleId']}"
        return f"{args.name}-id", outputs

    def call(self, args: mocks.MockCallArgs) -> dict[str, Any]:
        return {}


RUNTIME = "prod-runtime@acme-ml-prod.iam.gserviceaccount.com"
SCOPE = DeployerScope(granted_roles=["roles/logging.logWriter", "roles/tpu.viewer"],
                      accounts=[RUNTIME])


def register(scope: DeployerScope | None, team: str | None = None) -> dict[str, Registered]:
    """The resources a CiIdentity registers, on its own event loop."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    monitor = RecordingMonitor(GcpMocks())
    mocks.set_mocks(GcpMocks(), project="tpu-stack", stack="prod", monitor=monitor)
    try:
        settings = CiSettings(github_repository=REPO, github_repository_id=REPO_ID,
                              github_repository_owner_id=OWNER_ID)
        args = CiArgs(settings, "acme-ml-prod", Naming("acme-ml-prod", "prod"), scope, team)
        CiIdentity("ci", args)
        loop.run_until_complete(wait_for_rpcs())
        return monitor.registered
    finally:
        loop.close()
        asyncio.set_event_loop(None)


@pytest.fixture
def registered() -> Iterator[dict[str, Registered]]:
    yield register(SCOPE)


# ---- GitHub tokens against the declared trust -------------------------------


def token(**changes: str | None) -> dict[str, str]:
    """Claims of a GitHub Actions OIDC token (docs.github.com, "OpenID Connect
    reference"): by default a push to main of the repository, no environment."""
    claims = {
        "iss": GITHUB_ISSUER, "aud": "https://github.com/acme", "actor": "mallory",
        "repository": REPO, "repository_id": REPO_ID,
        "repository_owner": "acme", "repository_owner_id": OWNER_ID,
        "ref": "refs/heads/main", "event_name": "push", "sub": f"repo:{REPO}:ref:refs/heads/main",
    }
    claims.update(changes)
    return {key: value for key, value in claims.items() if value is not None}


PULL_REQUEST = dict(ref="refs/pull/7/merge", event_name="pull_request", base_ref="main",
                    head_ref="feature", sub=f"repo:{REPO}:pull_request")
IN_PROD = dict(environment="prod", sub=f"repo:{REPO}:environment:prod")


def exchange(provider: dict[str, Any], claims: dict[str, str]) -> dict[str, str] | None:
    """The attributes STS maps from the token (provider inputs), or None when the
    provider refuses it (a false condition; a condition or mapping that errors refuses too)."""
    variables = {"assertion": claims}
    try:
        if cel(provider["attributeCondition"], variables) is not True:
            return None
        return {key: cel(expression, variables)
                for key, expression in provider["attributeMapping"].items()}
    except CelError:
        return None


def trusted_accounts(provider: dict[str, Any], bindings: list[dict[str, Any]], pool_name: str,
                     claims: dict[str, str]) -> set[str]:
    """Service accounts whose workloadIdentityUser binding names this token's principal."""
    attributes = exchange(provider, claims)
    if attributes is None:
        return set()
    principals = {f"principalSet://iam.googleapis.com/{pool_name}/{key}/{value}"
                  for key, value in attributes.items() if key.startswith("attribute.")}
    principals.add(f"principal://iam.googleapis.com/{pool_name}/subject/"
                   f"{attributes['google.subject']}")
    return {binding["serviceAccountId"].rsplit("/", 1)[-1] for binding in bindings
            if binding["role"] == "roles/iam.workloadIdentityUser"
            and binding["member"] in principals}


def impersonable(registered: dict[str, Registered], claims: dict[str, str]) -> set[str]:
    bindings = [binding.inputs for binding in _impersonation_bindings(registered)]
    return trusted_accounts(registered["github"].inputs, bindings, POOL_NAME, claims)


def _impersonation_bindings(registered: dict[str, Registered]) -> list[Registered]:
    return [r for r in registered.values()
            if r.type == SERVICEACCOUNT_IAM_MEMBER
            and r.inputs["role"] == "roles/iam.workloadIdentityUser"]


def test_every_binding_names_a_mapped_attribute_of_this_pool(registered):
    mapped = set(registered["github"].inputs["attributeMapping"])
    bindings = _impersonation_bindings(registered)
    assert len(bindings) == 2
    for binding in bindings:
        prefix = f"principalSet://iam.googleapis.com/{POOL_NAME}/"
        assert binding.inputs["member"].startswith(prefix)
        attribute = binding.inputs["member"][len(prefix):].split("/", 1)[0]
        assert attribute in mapped  # else the binding could never match anything


def test_the_pool_trusts_the_repository_by_its_immutable_ids(registered):
    provider = registered["github"].inputs
    assert provider["oidc"]["issuerUri"] == GITHUB_ISSUER
    assert provider["workloadIdentityPoolProviderId"] == "github"
    condition = provider["attributeCondition"]
    assert "assertion.repository ==" not in condition and "repository_owner ==" not in condition
    assert exchange(provider, token()) is not None
    # The name re-registered by someone else after a rename or delete: other ids.
    assert exchange(provider, token(repository_id="999")) is None
    assert exchange(provider, token(repository_owner_id="999")) is None
    assert exchange(provider, token(repository_id=None)) is None


@pytest.mark.parametrize(("case", "claims"), [
    ("pull request", PULL_REQUEST),
    ("pull request job naming the prod environment", {**PULL_REQUEST, **IN_PROD}),
    ("pull request from a branch called main", {**PULL_REQUEST, "head_ref": "main"}),
    ("push to another branch in prod", {**IN_PROD, "ref": "refs/heads/feature"}),
    ("dispatch on another branch in prod", {**IN_PROD, "ref": "refs/heads/feature",
                                            "event_name": "workflow_dispatch"}),
    ("tag in prod", {**IN_PROD, "ref": "refs/tags/v1"}),
    ("main without an environment", {}),
    ("main in the dev environment", {"environment": "dev",
                                     "sub": f"repo:{REPO}:environment:dev"}),
])
def test_only_the_preview_account_for_anything_but_main_in_prod(registered, case, claims):
    assert impersonable(registered, token(**claims)) == {PREVIEW}, case


def test_the_deployer_is_main_in_the_stacks_environment(registered):
    for event in ("push", "schedule", "workflow_dispatch"):
        assert impersonable(registered, token(event_name=event, **IN_PROD)) == {
            DEPLOYER, PREVIEW}
    assert impersonable(registered, token(repository_id="1", **IN_PROD)) == set()


def test_the_prod_stack_plan_keeps_pull_requests_from_its_deployer():
    """The same check on the whole program of Pulumi.prod.yaml under the offline engine."""
    run = run_program(file_config("prod"), "prod")
    provider = run.of_type(
        IAM_WORKLOAD_IDENTITY_POOL_PROVIDER)[0].inputs
    pool_name = run.of_type(IAM_WORKLOAD_IDENTITY_POOL)[0].outputs["name"]
    bindings = [r.inputs for r in run.of_type(SERVICEACCOUNT_IAM_MEMBER)]
    ci = yaml.safe_load((REPO_ROOT / "Pulumi.prod.yaml").read_text())["config"]["tpu-stack:ci"]
    ids = {"repository": ci["githubRepository"], "repository_id": ci["githubRepositoryId"],
           "repository_owner_id": ci["githubRepositoryOwnerId"]}
    deployer, preview = (run.outputs["ciDeployerServiceAccount"],
                         run.outputs["ciPreviewServiceAccount"])
    assert trusted_accounts(provider, bindings, pool_name, token(**ids, **PULL_REQUEST)) == {
        preview}
    assert trusted_accounts(provider, bindings, pool_name,
                            token(**ids, **{**PULL_REQUEST, **IN_PROD})) == {preview}
    assert trusted_accounts(provider, bindings, pool_name, token(**ids, **IN_PROD)) == {
        deployer, preview}


def test_the_preview_account_only_reads(registered):
    grants = [r for r in registered.values() if r.type == PROJECTS_IAM_MEMBER
              and r.inputs["member"] == f"serviceAccount:{PREVIEW}"]
    roles = {r.inputs["role"] for r in grants}
    assert roles == set(PREVIEW_ROLES) == {"roles/browser"}
    assert not roles & set(DEPLOYER_ROLES)


def test_deployer_gets_exactly_its_roles(registered):
    grants = [r for r in registered.values() if r.type == PROJECTS_IAM_MEMBER
              and r.inputs["member"] == f"serviceAccount:{DEPLOYER}"]
    roles = sorted(r.inputs["role"] for r in grants)
    storage_role = "projects/acme-ml-prod/roles/prod_tpuStackStorageDeployer"
    assert roles == sorted([*DEPLOYER_ROLES, storage_role])
    assert not {"roles/editor", "roles/owner", "roles/storage.admin", "roles/iam.roleAdmin",
                "roles/iam.workloadIdentityPoolAdmin"} & set(roles)
    assert "storage.buckets.create" in registered["storage-deployer"].inputs["permissions"]


def test_the_deployer_s_iam_administration_is_conditioned(registered):
    conditions = {r.inputs["role"]: r.inputs.get("condition", {}).get("expression")
                  for r in registered.values() if r.type == PROJECTS_IAM_MEMBER
                  and r.inputs["member"] == f"serviceAccount:{DEPLOYER}"}
    assert conditions["roles/resourcemanager.projectIamAdmin"] == (
        "api.getAttribute('iam.googleapis.com/modifiedGrantsByRole', [])"
        ".hasOnly(['roles/logging.logWriter', 'roles/tpu.viewer'])")
    # No resource.name condition on a service-account role: IAM never evaluates one
    # for iam.googleapis.com (conditions-resource-attributes), so the grant is dead.
    assert all("resource." not in (e or "") for e in conditions.values())
    assert "roles/iam.serviceAccountAdmin" not in conditions  # on the account, below
    assert "roles/iam.serviceAccountUser" not in conditions
    on_account = sorted((r.inputs["role"], r.inputs["serviceAccountId"], r.inputs["member"])
                        for r in registered.values()
                        if r.type == SERVICEACCOUNT_IAM_MEMBER
                        and r.inputs["member"] == f"serviceAccount:{DEPLOYER}")
    runtime = f"projects/acme-ml-prod/serviceAccounts/{RUNTIME}"
    assert on_account == [("roles/iam.serviceAccountAdmin", runtime, f"serviceAccount:{DEPLOYER}"),
                          ("roles/iam.serviceAccountUser", runtime, f"serviceAccount:{DEPLOYER}")]
    unconditioned = {role for role, expression in conditions.items() if expression is None}
    assert unconditioned == {"roles/serviceusage.serviceUsageAdmin", "roles/compute.networkAdmin",
                             "roles/compute.securityAdmin", "roles/tpu.admin",
                             "roles/iam.serviceAccountCreator",
                             "projects/acme-ml-prod/roles/prod_tpuStackStorageDeployer",
                             # dashboards, alerts and log metrics (issue 46)
                             "roles/monitoring.dashboardEditor",
                             "roles/monitoring.alertPolicyEditor",
                             "roles/monitoring.notificationChannelEditor",
                             "roles/logging.configWriter"}


def test_a_team_deployer_holds_tpu_and_its_storage_role_only():
    team = register(None, team="vision")
    grants = {r.inputs["role"] for r in team.values()
              if r.type == PROJECTS_IAM_MEMBER
              and r.inputs["member"].startswith("serviceAccount:prod-vision-deployer@")}
    assert grants == {*TEAM_DEPLOYER_ROLES,
                      "projects/acme-ml-prod/roles/prod_tpuStackStorageDeployer"}
    assert {r.name for r in team.values()} >= {"vision-pool", "vision-github", "vision-deployer"}


def test_soft_deleted_resources_are_protected_and_all_are_children(registered):
    protected = sorted(name for name, r in registered.items() if r.protect)
    assert protected == ["github", "pool", "storage-deployer"]
    component = registered.pop("ci")
    assert component.type == COMPONENT_CI_IDENTITY
    assert {r.parent for r in registered.values()} == {
        "urn:pulumi:prod::tpu-stack::pulumi:pulumi:Stack$tpu-stack:index:CiIdentity::ci"}


def test_the_ci_identity_passes_the_policy_pack(registered):
    plan = {"resources": [
        {"urn": f"urn:pulumi:prod::tpu-stack::{r.type}::{name}", "type": r.type, "name": name,
         "custom": not r.type.startswith("tpu-stack:"), "inputs": r.inputs, "protect": r.protect}
        for name, r in registered.items()]}
    assert evaluate(plan, load_config()) == []
