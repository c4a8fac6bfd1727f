"""The controller in the platform plan (issue 43): its function runs its archive's entry
point, Cloud Scheduler calls it every interval as its own account, each budget-stop
team's topic pushes to it, the stack's manifest is written, and its account may act on
TPUs in the projects it manages and on its own objects only (policy/iam.py)."""

from __future__ import annotations

import pytest

from components.controller import ENTRY_POINT
from model import function_accounts
from model.bootstrap import custom_roles
from model.manifest import parse
from model.settings.load import load_settings
from model.settings.schema import StackSettings
from ops.plan.mock_engine import ProgramRun, run_program
from policy.iam import IamModel
from tests.infra.stack_fixtures import as_cli
from tests.infra.test_budget_stop_plan import FUNCTION, one, stack

JOB = "gcp:cloudscheduler/job:Job"
SUBSCRIPTION = "gcp:pubsub/subscription:Subscription"
OBJECT = "gcp:storage/bucketObject:BucketObject"


def _config() -> dict[str, str]:
    data = stack(budgetAction="stop")
    data["tpu-stack:controller"] = {"enabled": True, "interval": "5m"}
    return as_cli(data)


@pytest.fixture(scope="module")
def run() -> ProgramRun:
    return run_program(_config(), "test")


@pytest.fixture(scope="module")
def settings() -> StackSettings:
    return load_settings(_config(), "test")


def test_scheduler_calls_the_function_every_interval_as_the_controllers_account(
        run: ProgramRun, settings: StackSettings) -> None:
    function = one(run, FUNCTION, "controller")
    account = function_accounts.controller_account(settings)
    assert account == "test-controller@acme-ml-test.iam.gserviceaccount.com"
    # Built as its own build account, the bootstrap's (model/function_accounts.py).
    assert function.inputs["buildConfig"]["serviceAccount"] == (
        "projects/acme-ml-test/serviceAccounts/"
        "test-controller-build@acme-ml-test.iam.gserviceaccount.com")
    assert "controller" not in {r.name for r in run.of_type("gcp:serviceaccount/account:Account")}
    assert not run.of_type("gcp:projects/iAMCustomRole:IAMCustomRole")
    [job] = run.of_type(JOB)

    assert function.inputs["buildConfig"]["entryPoint"] == ENTRY_POINT
    assert function.inputs["serviceConfig"]["serviceAccountEmail"] == account
    assert function.inputs["serviceConfig"]["environmentVariables"][
        "TPU_STACK_CONTROLLER_INTERVAL_SECONDS"] == "300"
    assert job.inputs["schedule"] == "*/5 * * * *"
    assert job.inputs["httpTarget"]["oidcToken"]["serviceAccountEmail"] == account
    [subscription] = run.of_type(SUBSCRIPTION)
    assert subscription.inputs["topic"].endswith("-budget") and "vision" in subscription.inputs[
        "topic"]
    assert subscription.inputs["pushConfig"]["oidcToken"]["serviceAccountEmail"] == account


def test_the_stack_writes_its_manifest_with_every_node(run: ProgramRun) -> None:
    [manifest] = [r for r in run.of_type(OBJECT)
                  if r.inputs.get("name") == "controller/manifests/test.json"]
    target = parse(manifest.inputs["content"]).target

    assert {n.team for n in target.nodes} == {"vision", "nlp"}
    assert {n.project for n in target.nodes} == {"acme-ml-test-vision", "acme-ml-test-nlp"}


def test_the_controllers_account_acts_on_tpus_it_manages_and_its_own_objects_only(
        run: ProgramRun, settings: StackSettings) -> None:
    model = IamModel.of(run.registrations)
    # Its roles are the bootstrap's, with their fixed lists (model/bootstrap.py).
    model.custom_roles.update({r.name: frozenset(r.permissions) for r in custom_roles(settings)})
    assert not model.unresolved
    account = "serviceAccount:" + function_accounts.controller_account(settings)
    nodes = [f"projects/{r.inputs['project']}/locations/{r.inputs['zone']}/nodes/"
             f"{r.inputs['name']}" for r in run.of_type("gcp:tpu/v2Vm:V2Vm")]
    buckets = {r.inputs["name"].rsplit("-", 1)[-1]: r.inputs["name"]
               for r in run.of_type("gcp:storage/bucket:Bucket")}

    for node in nodes:
        for permission in ("tpu.nodes.delete", "tpu.nodes.update", "tpu.nodes.list"):
            assert model.can(account, permission, node), (node, permission)
    artifacts = f"projects/_/buckets/{buckets['artifacts']}/objects"
    assert model.can(account, "storage.objects.create", f"{artifacts}/controller/moves.json")
    assert not model.can(account, "storage.objects.create", f"{artifacts}/packages/x.tar.gz")
    checkpoints = f"projects/_/buckets/{buckets['checkpoints']}/objects/ckpt/x"
    assert not model.can(account, "storage.objects.delete", checkpoints)


def test_the_controllers_account_uses_each_teams_subnets_and_no_other(
        run: ProgramRun, settings: StackSettings) -> None:
    """A candidate it creates takes an address in its team's subnet of the host's Shared
    VPC: compute.subnetworks.use there, as the deployer needs at `up`."""
    model = IamModel.of(run.registrations)
    model.custom_roles.update({r.name: frozenset(r.permissions) for r in custom_roles(settings)})
    account = "serviceAccount:" + function_accounts.controller_account(settings)
    subnets = {r.inputs["name"]: f"projects/{r.inputs['project']}/regions/"
                                 f"{r.inputs['region']}/subnetworks/{r.inputs['name']}"
               for r in run.of_type("gcp:compute/subnetwork:Subnetwork")}
    teams = {name: path for name, path in subnets.items()
             if any(f"-{team}-" in name for team in ("vision", "nlp"))}
    assert teams and set(teams) != set(subnets)
    for name, subnet in subnets.items():
        assert model.can(account, "compute.subnetworks.use", subnet) == (name in teams), name
