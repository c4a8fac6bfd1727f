"""CiIdentity under Pulumi's mock engine: inputs, and the options Mocks cannot see."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pulumi
import pytest
from pulumi.runtime import mocks
from pulumi.runtime.stack import wait_for_rpcs

from components.ci import DEPLOYER_ROLES, GITHUB_ISSUER, CiArgs, CiIdentity
from components.naming import Naming
from components.settings import CiSettings
from policy.evaluate import evaluate, load_config

REPO = "acme/tpu-platform"
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
        if args.typ == "gcp:iam/workloadIdentityPool:WorkloadIdentityPool":
            outputs["name"] = POOL_NAME
        if args.typ == "gcp:serviceaccount/account:Account":
            outputs["email"] = f"{args.inputs['accountId']}@acme-ml-prod.iam.gserviceaccount.com"
            outputs["name"] = f"projects/acme-ml-prod/serviceAccounts/{outputs['email']}"
        if args.typ == "gcp:projects/iAMCustomRole:IAMCustomRole":
            outputs["name"] = f"projects/acme-ml-prod/roles/{args.inputs['roleId']}"
        return f"{args.name}-id", outputs

    def call(self, args: mocks.MockCallArgs) -> dict[str, Any]:
        return {}


@pytest.fixture
def registered() -> Iterator[dict[str, Registered]]:
    """The resources a CiIdentity registers, on its own event loop."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    monitor = RecordingMonitor(GcpMocks())
    mocks.set_mocks(GcpMocks(), project="tpu-stack", stack="prod", monitor=monitor)
    try:
        args = CiArgs(CiSettings(github_repository=REPO), "acme-ml-prod",
                      Naming("acme-ml-prod", "prod"))
        CiIdentity("ci", args)
        loop.run_until_complete(wait_for_rpcs())
        yield monitor.registered
    finally:
        loop.close()
        asyncio.set_event_loop(None)


def test_pool_and_provider_trust_only_the_repository(registered):
    pool = registered["pool"]
    assert pool.inputs["workloadIdentityPoolId"] == "prod-github"
    provider = registered["github"]
    assert provider.inputs["oidc"]["issuerUri"] == GITHUB_ISSUER
    assert provider.inputs["attributeMapping"]["attribute.repository"] == "assertion.repository"
    assert provider.inputs["attributeCondition"] == f'assertion.repository == "{REPO}"'
    assert provider.inputs["workloadIdentityPoolProviderId"] == "github"


def test_only_that_repository_may_impersonate_the_deployer(registered):
    binding = registered["github-impersonates-deployer"]
    assert binding.inputs["role"] == "roles/iam.workloadIdentityUser"
    assert binding.inputs["member"] == (
        f"principalSet://iam.googleapis.com/{POOL_NAME}/attribute.repository/{REPO}")
    deployer = "prod-deployer@acme-ml-prod.iam.gserviceaccount.com"
    assert binding.inputs["serviceAccountId"].endswith(deployer)


def test_deployer_gets_exactly_its_roles(registered):
    grants = [r for r in registered.values() if r.type == "gcp:projects/iAMMember:IAMMember"]
    roles = sorted(r.inputs["role"] for r in grants)
    assert roles == sorted([*DEPLOYER_ROLES, "projects/acme-ml-prod/roles/tpuStackStorageDeployer"])
    assert {r.inputs["member"] for r in grants} == {
        "serviceAccount:prod-deployer@acme-ml-prod.iam.gserviceaccount.com"}
    assert not {"roles/editor", "roles/owner", "roles/storage.admin"} & set(roles)
    assert "storage.buckets.create" in registered["storage-deployer"].inputs["permissions"]


def test_soft_deleted_resources_are_protected_and_all_are_children(registered):
    protected = sorted(name for name, r in registered.items() if r.protect)
    assert protected == ["github", "pool", "storage-deployer"]
    component = registered.pop("ci")
    assert component.type == "tpu-stack:index:CiIdentity"
    assert {r.parent for r in registered.values()} == {
        "urn:pulumi:prod::tpu-stack::pulumi:pulumi:Stack$tpu-stack:index:CiIdentity::ci"}


def test_the_ci_identity_passes_the_policy_pack(registered):
    plan = {"resources": [
        {"urn": f"urn:pulumi:prod::tpu-stack::{r.type}::{name}", "type": r.type, "name": name,
         "custom": not r.type.startswith("tpu-stack:"), "inputs": r.inputs, "protect": r.protect}
        for name, r in registered.items()]}
    assert evaluate(plan, load_config()) == []
