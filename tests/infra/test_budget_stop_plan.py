"""A team's budget that stops its TPUs, in the platform plan (issue 36): the topic, the
budget's notifications to it, the function and its trigger are wired; the function's
account may delete TPUs in its own team's project and nowhere else (policy/iam.py)."""

from __future__ import annotations

from typing import Any

import pytest

from components.budget_stop import ENTRY_POINT, PUBSUB_EVENT, RUNTIME
from model.bootstrap import custom_roles
from model.pulumi_types import (
    BILLING_BUDGET,
    CLOUDFUNCTIONSV2_FUNCTION,
    CLOUDRUNV2_SERVICE_IAM_MEMBER,
    PUBSUB_TOPIC,
    PUBSUB_TOPIC_IAM_MEMBER,
    SERVICEACCOUNT_ACCOUNT,
    STORAGE_BUCKET,
    STORAGE_BUCKET_OBJECT,
    TPU_V2_VM,
)
from model.settings.load import load_settings
from ops.plan.mock_engine import ProgramRun, Registration, run_program
from policy.iam import IamModel
from tests.infra.stack_fixtures import as_cli
from tests.test_teams import platform, problems_of, spot, team

BILLING = {"account": "01AB23-45CD67-89EF01"}
TOPIC = PUBSUB_TOPIC
FUNCTION = CLOUDFUNCTIONSV2_FUNCTION
BUDGET = BILLING_BUDGET
ACCOUNT = SERVICEACCOUNT_ACCOUNT


def stack(**vision: Any) -> dict:
    data = platform(vision=team("vision", spot("trainer"), budgetUsdPerMonth=5000, **vision),
                    nlp=team("nlp", spot("sweep"), budgetUsdPerMonth=8000))
    data["tpu-stack:billing"] = BILLING
    return data


@pytest.fixture(scope="module")
def run() -> ProgramRun:
    return run_program(as_cli(stack(budgetAction="stop", budgetHorizonHours=12)), "test")


def one(run: ProgramRun, kind: str, name_part: str) -> Registration:
    found = [r for r in run.of_type(kind) if name_part in r.name]
    assert len(found) == 1, [r.name for r in run.of_type(kind)]
    return found[0]


def test_the_topic_budget_rule_and_trigger_are_wired(run: ProgramRun) -> None:
    topic = one(run, TOPIC, "vision")
    path = f"projects/{topic.inputs['project']}/topics/{topic.inputs['name']}"
    budget = one(run, BUDGET, "vision")
    assert budget.inputs["allUpdatesRule"] == {"pubsubTopic": path, "schemaVersion": "1.0"}
    assert "allUpdatesRule" not in one(run, BUDGET, "nlp").inputs, "nlp's budget alerts only"
    function = one(run, FUNCTION, "vision")
    trigger = function.inputs["eventTrigger"]
    assert trigger["pubsubTopic"] == path and trigger["eventType"] == PUBSUB_EVENT
    # The bootstrap makes the function's accounts (model/function_accounts.py): the plan
    # declares none, and builds as an account of its own, never the default one.
    account = "test-vision-budget-stop@acme-ml-test.iam.gserviceaccount.com"
    assert not [r for r in run.of_type(ACCOUNT) if "budget-stop" in r.name]
    assert trigger["serviceAccountEmail"] == account
    assert function.inputs["serviceConfig"]["serviceAccountEmail"] == account
    build = function.inputs["buildConfig"]
    assert build["serviceAccount"] == ("projects/acme-ml-test/serviceAccounts/"
                                       "test-vision-function-build@acme-ml-test.iam.gserviceaccount.com")
    assert (build["runtime"], build["entryPoint"]) == (RUNTIME, ENTRY_POINT)
    source = [r for r in run.of_type(STORAGE_BUCKET_OBJECT)
              if r.inputs.get("name") == build["source"]["storageSource"]["object"]]
    assert len(source) == 1 and source[0].inputs["bucket"] == build["source"]["storageSource"][
        "bucket"]
    env = function.inputs["serviceConfig"]["environmentVariables"]
    assert env["TPU_STACK_PROJECT"] == "acme-ml-test-vision"
    assert env["TPU_STACK_TEAM"] == "vision" and env["TPU_STACK_BUDGET_HORIZON_HOURS"] == "12"
    assert "us-central1-a" in env["TPU_STACK_ZONES"].split(",")
    assert not [r for r in run.of_type(FUNCTION) if "nlp" in r.name]


def test_the_functions_account_deletes_tpus_in_its_teams_project_and_nowhere_else(
        run: ProgramRun) -> None:
    model = IamModel.of(run.registrations)
    settings = load_settings(as_cli(stack(budgetAction="stop", budgetHorizonHours=12)), "test")
    model.custom_roles.update({r.name: frozenset(r.permissions) for r in custom_roles(settings)})
    assert not model.unresolved
    account = "serviceAccount:test-vision-budget-stop@acme-ml-test.iam.gserviceaccount.com"
    nodes = {r.inputs["project"]: f"projects/{r.inputs['project']}/locations/"
                                  f"{r.inputs['zone']}/nodes/{r.inputs['name']}"
             for r in run.of_type(TPU_V2_VM)}
    vision, nlp = nodes["acme-ml-test-vision"], nodes["acme-ml-test-nlp"]
    assert model.project_of(vision) == "projects/acme-ml-test-vision"
    # Queued resources are checked with tpu.nodes.* (iann0036/iam-dataset gcp/map.json).
    for permission in ("tpu.nodes.delete", "tpu.nodes.update", "tpu.nodes.list"):
        assert model.can(account, permission, vision), permission
    for resource in (nlp, "projects/acme-ml-test"):  # another team's node; the platform's
        for permission in ("tpu.nodes.delete", "tpu.nodes.update", "tpu.nodes.list"):
            assert not model.can(account, permission, resource), (resource, permission)
    assert not model.can(account, "tpu.nodes.create", vision)
    # Its markers only: created under its prefix, never read, replaced or deleted; no
    # other bucket (checkpoints, data) is touched.
    artifacts = next(r.inputs["name"] for r in run.of_type(STORAGE_BUCKET)
                     if r.inputs["name"].endswith("artifacts"))
    marker = f"projects/_/buckets/{artifacts}/objects/budget-stop/vision/b/x.json"
    assert model.can(account, "storage.objects.create", marker)
    assert not model.can(account, "storage.objects.create",
                         f"projects/_/buckets/{artifacts}/objects/budget-stop/nlp/b/x.json")
    for permission in ("storage.objects.delete", "storage.objects.get"):
        assert not model.can(account, permission, marker)
    for bucket in model.kinds("buckets"):
        assert not model.can(account, "storage.objects.delete", f"{bucket}/objects/x")


def test_budget_action_stop_needs_a_budget_in_usd_and_a_billing_account() -> None:
    data = stack(budgetAction="stop")
    del data["tpu-stack:teams"]["vision"]["budgetUsdPerMonth"]
    del data["tpu-stack:billing"]
    # The budget lives on the teams' billing account (teamProjects.billingAccount here,
    # issue 44): no tpu-stack:billing is needed for it.
    assert problems_of(data) == [
        ("tpu-stack:teams.vision.budgetUsdPerMonth", "is required with budgetAction: stop (the "
         "budget the team's nodes are stopped at, in USD a month)")]
    keys = [key for key, _ in problems_of(stack(budgetAction="never"))]
    assert keys == ["tpu-stack:teams.vision.budgetAction"]


def test_the_shipped_platform_stack_stops_nlp_at_its_budget_with_replacement_facts() -> None:
    from ops.plan.facts import type_facts
    from ops.plan.offline import offline_plan

    run = offline_plan("platform").run
    function = one(run, FUNCTION, "nlp")
    assert function.inputs["serviceConfig"]["environmentVariables"]["TPU_STACK_TEAM"] == "nlp"
    assert one(run, BUDGET, "nlp").inputs["allUpdatesRule"]["pubsubTopic"].endswith(
        one(run, TOPIC, "nlp").inputs["name"])
    budget_stop = [r for r in run.registrations
                   if r.custom and r.parent and "budget-stop-nlp" in r.parent]
    assert {r.type for r in budget_stop} >= {TOPIC, FUNCTION,
                                            CLOUDRUNV2_SERVICE_IAM_MEMBER,
                                            PUBSUB_TOPIC_IAM_MEMBER}
    for r in budget_stop:
        assert type_facts(r.type) is not None, r.type
