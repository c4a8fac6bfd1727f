"""Shared TPU capacity (docs/teams.md): team settings and quota, isolation on the
declared IAM, budgets and labels, platform and team stacks under the mock engine."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pulumi
import pytest

from components.stack_config import file_config
from components.team_stack import PlatformStackError
from model.pulumi_types import (
    BILLING_BUDGET,
    COMPUTE_FIREWALL,
    COMPUTE_NETWORK,
    COMPUTE_SUBNETWORK,
    DYNAMIC_QUEUED_TPU,
    ORGANIZATIONS_PROJECT,
    PROJECTS_IAM_MEMBER,
    PROJECTS_SERVICE,
    PROVIDER_GCP,
    SERVICEACCOUNT_ACCOUNT,
    SERVICEACCOUNT_IAM_BINDING,
    SERVICEACCOUNT_IAM_MEMBER,
    STORAGE_BUCKET,
    STORAGE_BUCKET_IAM_BINDING,
    STORAGE_BUCKET_IAM_MEMBER,
    STORAGE_BUCKET_OBJECT,
    STORAGE_GET_BUCKET_OBJECT_CONTENT,
    TPU_V2_VM,
)
from model.settings.load import load_settings
from model.settings.schema import NodeSettings, SettingsError
from ops.plan.mock_engine import GcpMocks, ProgramRun, planned_stack_outputs, run_program
from tests.infra.stack_fixtures import as_cli, config, job, node

PLATFORM_REF = "acme/tpu-stack/platform"
BUCKET = STORAGE_BUCKET
V2VM = TPU_V2_VM
BUDGET = BILLING_BUDGET
BUCKET_GRANTS = (STORAGE_BUCKET_IAM_MEMBER,
                 STORAGE_BUCKET_IAM_BINDING)
ACCOUNT_GRANTS = (SERVICEACCOUNT_IAM_MEMBER,
                  SERVICEACCOUNT_IAM_BINDING)
PROJECT_GRANT = PROJECTS_IAM_MEMBER
READ_ROLES = {"roles/storage.objectViewer", "roles/storage.legacyBucketReader"}
QUOTA = {"v5e": {"us-central1": {"onDemand": 16, "preemptible": 32}},
         "v4": {"us-central2": {"onDemand": 32}}}
TEAM_PROJECTS = {"folderId": "1234567890", "billingAccount": "01AB23-45CD67-89EF01",
                 "quotaContact": "platform@acme.example",
                 "deployer": "platform-deployer@acme-ml-test.iam.gserviceaccount.com"}
# The platform's reservation, in the host project: a team's node names it (issue 34).
RESERVATION = "projects/acme-ml-test/locations/us-central2-b/reservations/v4-pods"


def team(name: str, *nodes: dict, **changes: Any) -> dict:
    data = {"members": [f"group:ml-{name}@acme.example"],
            "labels": {"cost-centre": f"cc-{name}"},
            "quota": {"v5e": {"spot": 16, "onDemand": 8}, "v4": {"reserved": 16},
                      "usdPerHour": 100},
            "jobs": {"mnist": job()}, "nodes": list(nodes),
            "alerts": {"email": f"ml-{name}@acme.example"}}
    data.update(changes)
    return data


def platform(**teams: dict) -> dict:
    """A platform stack (dev, so buckets stay unprotected) serving `teams`, each given a
    subnet slot of its own in order unless it names one."""
    for slot, spec in enumerate(teams.values()):
        spec.setdefault("subnetSlot", slot)
    return config(tpu_stack_labels={"cost-centre": "cc-platform"}, tpu_stack_quota=QUOTA,
                  tpu_stack_nodes=[], tpu_stack_teams=teams, tpu_stack_teamProjects=TEAM_PROJECTS)


def spot(name: str = "trainer", **changes: Any) -> dict:
    return node(name=name, **changes)


def pod(name: str = "pod") -> dict:
    """A v4 pod slice on the platform's reservation, through a queued resource."""
    return node(name=name, zone="us-central2-b", acceleratorType=None, generation="v4",
                topology="2x2x4", provisioning="queued", queue={"reservationName": RESERVATION},
                job="mnist")


def problems_of(data: dict, stack: str = "test") -> list[tuple[str, str]]:
    with pytest.raises(SettingsError) as caught:
        load_settings(as_cli(data), stack)
    return caught.value.problems


# ---- settings: capacity, quota and bad team config --------------------------

@pytest.mark.parametrize(("provisioning", "queue", "capacity", "quota_type"), [
    ("on-demand", None, "onDemand", "onDemand"),
    ("spot", None, "spot", "preemptible"),
    ("preemptible", None, "spot", "preemptible"),
    ("reserved", None, "reserved", "onDemand"),
    ("queued", {"spot": True}, "spot", "preemptible"),
    ("queued", {"reservationName": "r1"}, "reserved", "onDemand"),
    ("queued", {"guaranteed": True}, "onDemand", "onDemand"),
])
def test_each_provisioning_model_counts_against_its_quota(provisioning, queue, capacity,
                                                          quota_type) -> None:
    settings = NodeSettings.model_validate(node(provisioning=provisioning, queue=queue))
    assert (settings.capacity, settings.quota_type) == (capacity, quota_type)


def test_a_platform_with_teams_loads() -> None:
    settings = load_settings(as_cli(platform(vision=team("vision", spot()),
                                             nlp=team("nlp", pod()))), "test")
    assert [(t, n.name) for t, n in settings.all_nodes] == [("vision", "trainer"),
                                                            ("nlp", "pod")]
    assert settings.regions == ["us-central1", "us-central2"]
    assert settings.team_labels("nlp") == {"cost-centre": "cc-nlp"}


def test_teams_together_must_fit_the_project_quota() -> None:
    # Each team fits its own quota (16 spot v5e); together 48 > the project's 32.
    teams = {name: team(name, spot("a"), spot("b", provisioning="preemptible"))
             for name in ("vision", "nlp", "speech")}
    assert problems_of(platform(**teams)) == [(
        "tpu-stack:quota.v5e.us-central1.preemptible",
        "the teams need 48 v5e preemptible (spot and preemptible) chips in us-central1 "
        "(nlp 16, speech 16, vision 16); the project's quota is 32")]


def test_a_region_without_declared_quota_is_refused() -> None:
    data = platform(vision=team("vision", spot(zone="europe-west4-b")))
    assert problems_of(data) == [(
        "tpu-stack:quota.v5e.europe-west4.preemptible",
        "the teams need 8 v5e preemptible (spot and preemptible) chips in europe-west4 "
        "(vision 8); no v5e quota is declared in europe-west4")]


def test_a_team_must_fit_its_own_quota_and_ceiling() -> None:
    vision = team("vision", spot("a"), spot("b"), spot("c"),
                  quota={"v5e": {"spot": 16}, "usdPerHour": 10})
    assert problems_of(platform(vision=vision)) == [
        ("tpu-stack:teams.vision.quota.v5e.spot",
         "team vision needs 24 v5e spot chips (nodes: a 8, b 8, c 8); its quota is 16"),
        ("tpu-stack:teams.vision.quota.usdPerHour",
         "team vision's nodes cost $14.57/h at list prices; its ceiling is $10.00/h"),
    ]


def test_reserved_chips_need_reserved_quota() -> None:
    nlp = team("nlp", pod(), quota={"v4": {"onDemand": 64}})
    assert problems_of(platform(nlp=nlp)) == [
        ("tpu-stack:teams.nlp.quota.v4.reserved",
         "team nlp needs 16 v4 reserved chips (nodes: pod 16); its quota is 0")]


T = "tpu-stack:teams.vision"

# (case, config, key path the message names, words it contains)
BAD_TEAM_CONFIGS: list[tuple[str, dict, str, str]] = [
    ("negative quota", platform(vision=team("vision", quota={"v5e": {"spot": -8}})),
     f"{T}.quota.v5e.spot", "greater than or equal to 0"),
    ("unknown family", platform(vision=team("vision", quota={"v7x": {"spot": 8}})),
     f"{T}.quota.v7x", "allowed: usdPerHour, v2, v3, v4, v5e, v5p, v6e"),
    ("unknown capacity", platform(vision=team("vision", quota={"v5e": {"flex": 8}})),
     f"{T}.quota.v5e.flex", "allowed: onDemand, spot, reserved"),
    ("unknown team key", platform(vision=team("vision", owner="ana")),
     f"{T}.owner", "allowed: members, nodes, jobs, quota, labels"),
    ("bad member", platform(vision=team("vision", members=["ana@acme.example"])),
     f"{T}.members[0]", "group:name@domain or user:name@domain"),
    ("service account member",
     platform(vision=team("vision", members=["serviceAccount:x@p.iam.gserviceaccount.com"])),
     f"{T}.members[0]", "not a Google group or user"),
    ("no members", platform(vision=team("vision", members=[])), f"{T}.members",
     "at least one member"),
    ("bad team name", platform(Vision=team("vision")), "tpu-stack:teams.Vision",
     "lowercase letters"),
    ("team named as the stack's team", platform(research=team("research")),
     "tpu-stack:teams.research", "this stack's own team"),
    ("bad label", platform(vision=team("vision", labels={"cost-centre": "CC 1"})),
     f"{T}.labels.cost-centre", "not a label value"),
    ("no cost centre anywhere", {**platform(vision=team("vision", labels={})),
                                 "tpu-stack:labels": {}},
     "tpu-stack:labels.cost-centre", "required with tpu-stack:teams"),
    ("team node in a wrong zone", platform(vision=team("vision", spot(zone="us-central2-b"))),
     f"{T}.nodes[0].zone", "does not offer TPU v5e"),
    ("team node naming a missing job", platform(vision=team("vision", spot(job="bert"))),
     f"{T}.nodes[0].job", "is not a key of tpu-stack:teams.vision.jobs (mnist)"),
    ("team job batch", platform(vision=team("vision", spot(), jobs={"mnist": job(
        globalBatchSize=1001)})), f"{T}.jobs.mnist.globalBatchSize", "not divisible by the 8"),
    ("quota family unknown", {**platform(), "tpu-stack:quota": {"v9": {}}},
     "tpu-stack:quota.v9", "not a TPU generation"),
    ("quota region without the family", {**platform(), "tpu-stack:quota": {
        "v4": {"us-central1": {"onDemand": 8}}}},
     "tpu-stack:quota.v4.us-central1", "v4 is not offered in us-central1 (regions: us-central2)"),
    ("bad billing account", {**platform(), "tpu-stack:billing": {"account": "123"}},
     "tpu-stack:billing.account", "XXXXXX-XXXXXX-XXXXXX"),
    ("teams without team projects", {**platform(vision=team("vision")),
                                     "tpu-stack:teamProjects": {}},
     "tpu-stack:teamProjects.folderId", "is required with tpu-stack:teams: the number of the "
                                        "folder"),
    ("folder id not a number", {**platform(vision=team("vision")),
                                "tpu-stack:teamProjects": {"folderId": "folders/12"}},
     "tpu-stack:teamProjects.folderId", "'folders/12' is not a folder id"),
    ("team projects without a billing account", {**platform(vision=team("vision")),
                                                 "tpu-stack:teamProjects": {"folderId": "12"}},
     "tpu-stack:teamProjects.billingAccount",
     "is required with tpu-stack:teams and without tpu-stack:billing"),
    ("team projects without a quota contact", {**platform(vision=team("vision")),
                                               "tpu-stack:teamProjects": {"folderId": "12"}},
     "tpu-stack:teamProjects.quotaContact",
     "is required with tpu-stack:teams: an email Google may contact"),
    ("state bucket as a URL", {**platform(vision=team("vision")), "tpu-stack:teamProjects": {
        **TEAM_PROJECTS, "stateBucket": "gs://acme-state"}},
     "tpu-stack:teamProjects.stateBucket", "is not a bucket name: the name alone"),
    ("team ci by repository name only", platform(vision=team("vision", ci={
        "githubRepository": "acme/vision", "githubRepositoryId": "acme",
        "githubRepositoryOwnerId": "1"})),
     f"{T}.ci.githubRepositoryId", "is not a number"),
    ("zero threshold", {**platform(), "tpu-stack:billing": {
        "account": "01AB23-45CD67-89EF01", "alertThresholds": [0, 1.0]}},
     "tpu-stack:billing.alertThresholds[0]", "must be above 0"),
]


@pytest.mark.parametrize(("data", "key", "words"),
                         [case[1:] for case in BAD_TEAM_CONFIGS],
                         ids=[case[0] for case in BAD_TEAM_CONFIGS])
def test_bad_team_config_names_its_key(data: dict, key: str, words: str) -> None:
    problems = problems_of(data)
    assert key in dict(problems), problems
    assert words in dict(problems)[key]


def team_stack(**changes: Any) -> dict:
    data = config(tpu_stack_platformStack=PLATFORM_REF, tpu_stack_team="vision",
                  tpu_stack_labels={"cost-centre": "cc-vision-2210"})
    data.update(changes)
    return data


@pytest.mark.parametrize(("changes", "key", "words"), [
    ({"tpu-stack:platformStack": "platform"}, "tpu-stack:platformStack",
     "organization/tpu-stack/<stack> on a self-managed backend"),
    ({"tpu-stack:team": "platform"}, "tpu-stack:team", "a team stack names its team"),
    ({"tpu-stack:teams": {"x": team("x")}}, "tpu-stack:teams", "belongs to the platform stack"),
    ({"tpu-stack:quota": QUOTA}, "tpu-stack:quota", "belongs to the platform stack"),
    ({"tpu-stack:teamProjects": TEAM_PROJECTS}, "tpu-stack:teamProjects",
     "belongs to the platform stack"),
    ({"tpu-stack:labels": {}}, "tpu-stack:labels.cost-centre", "required in a team stack"),
    ({"tpu-stack:network": {"subnetCidr": "10.8.0.0/20"}}, "tpu-stack:network",
     "the platform stack (acme/tpu-stack/platform) owns the network"),
    ({"tpu-stack:platformStack": "acme/tpu-stack/test"}, "tpu-stack:platformStack",
     "is this stack itself"),
])
def test_bad_team_stack_config_names_its_key(changes: dict, key: str, words: str) -> None:
    problems = dict(problems_of(team_stack(**changes)))
    assert words in problems[key]


def test_a_quota_overflow_stops_the_program_before_any_resource() -> None:
    data = platform(vision=team("vision", spot("a"), spot("b"), spot("c")))
    with pytest.raises(pulumi.RunError) as caught:
        run_program(as_cli(data), "test")
    assert "tpu-stack:teams.vision.quota.v5e.spot: team vision needs 24" in str(caught.value)


# ---- isolation on the declared IAM ------------------------------------------

def members_of(inputs: dict[str, Any]) -> list[str]:
    return [inputs["member"]] if "member" in inputs else list(inputs["members"])


def grants(run: ProgramRun) -> Iterator[tuple[str, str, str]]:
    """(principal, role, target) for every IAM grant: `bucket:<name>`,
    `account:<account name>` or `project`."""
    for r in run.registrations:
        if r.type in BUCKET_GRANTS:
            target = f"bucket:{r.inputs['bucket']}"
        elif r.type in ACCOUNT_GRANTS:
            target = f"account:{r.inputs['serviceAccountId']}"
        elif r.type == PROJECT_GRANT:
            target = "project"
        else:
            continue
        for member in members_of(r.inputs):
            yield member, r.inputs["role"], target


def bucket_owners(run: ProgramRun) -> dict[str, tuple[str, str]]:
    """`bucket:<name>` → (team label, purpose label)."""
    labels = {b.inputs["name"]: b.inputs["labels"] for b in run.of_type(BUCKET)}
    return {f"bucket:{name}": (lab["team"], lab["purpose"]) for name, lab in labels.items()}


def account_names(run: ProgramRun) -> dict[str, str]:
    """`serviceAccount:<email>` → `account:<account name>`."""
    return {f"serviceAccount:{a.outputs['email']}": f"account:{a.outputs['name']}"
            for a in run.of_type(SERVICEACCOUNT_ACCOUNT)}


@pytest.fixture(scope="module")
def three_teams() -> ProgramRun:
    """Mode A: the platform stack declares three teams' nodes."""
    teams = {name: team(name, spot(), pod()) for name in ("vision", "nlp", "speech")}
    data = platform(**teams)
    data["tpu-stack:quota"] = {"v5e": {"us-central1": {"preemptible": 64}},
                               "v4": {"us-central2": {"onDemand": 64}}}
    return run_program(as_cli(data), "shared")


@pytest.fixture(scope="module")
def repo_stacks() -> dict[str, ProgramRun]:
    """Mode B: this repo's platform stack and the vision team's own stack."""
    return {stack: run_program(file_config(stack), stack)
            for stack in ("platform", "team-vision")}


def team_principals(run: ProgramRun) -> dict[str, set[str]]:
    """Each team's identities: its runtime account and its members."""
    outputs = run.outputs
    if "team" in outputs:  # a team stack
        entry = planned_stack_outputs(outputs["platformStack"])["teams"][outputs["team"]]
        return {outputs["team"]: {f"serviceAccount:{outputs['runtimeServiceAccount']}",
                                  *entry["members"]}}
    return {name: {f"serviceAccount:{t['serviceAccount']}", *t["members"]}
            for name, t in outputs["teams"].items() if "serviceAccount" in t}


def assert_fenced(runs: list[ProgramRun], shared_data: str) -> None:
    """No team's identity or members hold anything on another team's buckets or
    account; on the platform's buckets they only read the shared data and code."""
    principals: dict[str, set[str]] = {}
    owners: dict[str, tuple[str, str]] = {}
    accounts: dict[str, str] = {}
    for run in runs:
        principals.update(team_principals(run))
        owners.update(bucket_owners(run))
        accounts.update(account_names(run))
    team_account = {t: accounts[next(p for p in ps if p.startswith("serviceAccount:"))]
                    for t, ps in principals.items()}
    all_grants = [g for run in runs for g in grants(run)]
    assert len(principals) >= 2
    for a, b in itertools.permutations(principals, 2):
        for principal, role, target in all_grants:
            if principal not in principals[a]:
                continue
            assert owners.get(target, ("", ""))[0] != b, (a, principal, role, target)
            assert target != team_account[b], (a, principal, role, target)
    for name, identities in principals.items():
        held = [(p, r, t) for p, r, t in all_grants if p in identities and t.startswith("bucket:")]
        for principal, role, target in held:
            team_label, purpose = owners[target]
            if team_label != name:
                assert target == f"bucket:{shared_data}" or purpose == "artifacts", target
                assert role in READ_ROLES, (principal, role, target)
        own = {(owners[t][1], r) for p, r, t in held if p.startswith("serviceAccount:")}
        assert {("checkpoints", "roles/storage.objectUser"),
                ("logs", "roles/storage.objectUser"),
                ("data", "roles/storage.objectViewer")} <= own, name
        members = identities - {p for p in identities if p.startswith("serviceAccount:")}
        acts_as = {(p, t) for p, r, t in all_grants if r == "roles/iam.serviceAccountUser"
                   and p in members}
        assert acts_as == {(m, team_account[name]) for m in members}


def test_three_platform_managed_teams_are_fenced_in(three_teams: ProgramRun) -> None:
    data_bucket = three_teams.outputs["sharedData"].removeprefix("gs://")
    assert_fenced([three_teams], data_bucket)


def test_a_team_stack_and_a_platform_team_are_fenced_in(repo_stacks) -> None:
    runs = list(repo_stacks.values())
    assert_fenced(runs, repo_stacks["platform"].outputs["sharedData"].removeprefix("gs://"))
    assert set().union(*(team_principals(r) for r in runs)) == {"nlp", "vision"}


def test_members_and_team_accounts_get_only_the_listed_project_roles(three_teams) -> None:
    project_roles: dict[str, set[str]] = {}
    for principal, role, target in grants(three_teams):
        if target == "project":
            project_roles.setdefault(principal, set()).add(role)
    for name, t in three_teams.outputs["teams"].items():
        assert project_roles[t["members"][0]] == {"roles/tpu.viewer"}, name
        assert project_roles[f"serviceAccount:{t['serviceAccount']}"] == {
            "roles/logging.logWriter", "roles/monitoring.metricWriter", "roles/tpu.viewer"}


def test_team_nodes_run_as_their_team_and_write_to_its_buckets(three_teams) -> None:
    teams = three_teams.outputs["teams"]
    vms = three_teams.of_type(V2VM)
    # Each team's pod slice is a queued resource naming the platform's reservation.
    queued = three_teams.of_type(DYNAMIC_QUEUED_TPU)
    assert len(vms) == 3 and len(queued) == 3
    for q in queued:
        assert q.inputs["service_account_email"] == teams[q.inputs["labels"]["team"]][
            "serviceAccount"]
        assert q.inputs["reservation_name"] == RESERVATION
    # The job is in the node's release (C1), a secret input: the mock engine records
    # it unwrapped and names it in `secrets`.
    objects = [o for o in three_teams.of_type(STORAGE_BUCKET_OBJECT)
               if "-release-" in o.name]
    assert all("content" in o.secrets for o in objects)
    releases = {o.inputs["name"].split("/")[1]: o.inputs["content"] for o in objects}
    for vm in vms:
        name = vm.inputs["labels"]["team"]
        assert vm.inputs["serviceAccount"]["email"] == teams[name]["serviceAccount"]
        job_config = releases[vm.inputs["name"]]
        assert teams[name]["buckets"]["checkpoints"] + "/ckpt/" in job_config
        assert three_teams.outputs["sharedData"] + "/datasets/" in job_config
        assert vm.inputs["name"].startswith(f"shared-{name}-")


# ---- cost attribution ---------------------------------------------------------

def test_every_billable_resource_carries_team_and_cost_centre(repo_stacks) -> None:
    for stack, run in repo_stacks.items():
        for resource in run.of_type(BUCKET) + run.of_type(V2VM):
            labels = resource.inputs["labels"]
            expected = {"platform": "cc-ml-platform", "nlp": "cc-nlp-3120",
                        "vision": "cc-vision-2210"}[labels["team"]]
            assert labels["cost-centre"] == expected, (stack, resource.name)


def test_a_budget_per_team_on_its_whole_project(repo_stacks) -> None:
    """The project filter alone: a label filter would drop unlabelled spend in the
    team's project (filters are ANDed, Budget API `Filter`)."""
    budgets = {b.inputs["displayName"].rsplit(" ", 1)[-1]: b.inputs
               for b in repo_stacks["platform"].of_type(BUDGET)}
    assert set(budgets) == {"vision", "nlp"}
    for budget in budgets.values():
        assert budget["billingAccount"] == "01AB23-45CD67-89EF01"
        assert budget["budgetFilter"]["projects"] == ["projects/123456789012"]
        assert "labels" not in budget["budgetFilter"]
        assert [r["thresholdPercent"] for r in budget["thresholdRules"]] == [0.5, 0.9, 1.0]
    assert budgets["nlp"]["amount"]["specifiedAmount"]["units"] == "60000"
    assert budgets["vision"]["amount"]["specifiedAmount"]["units"] == str(60 * 730)
    assert not repo_stacks["team-vision"].of_type(BUDGET)


def test_the_teams_billing_account_holds_their_budgets(three_teams) -> None:
    """No tpu-stack:billing, teamProjects.billingAccount set: the budgets are declared on
    the account the teams' projects bill to, never dropped (issue 44)."""
    budgets = three_teams.of_type(BUDGET)
    assert len(budgets) == 3
    assert {b.inputs["billingAccount"] for b in budgets} == {TEAM_PROJECTS["billingAccount"]}


def test_cost_per_team_in_the_outputs(repo_stacks, three_teams) -> None:
    platform_outputs = repo_stacks["platform"].outputs
    assert platform_outputs["costByTeam"] == {"nlp": pytest.approx(51.52 + 8 * 0.607)}
    assert platform_outputs["teams"]["nlp"]["usdPerHour"] == pytest.approx(51.52 + 4.856)
    assert repo_stacks["team-vision"].outputs["estimatedUsdPerHour"] == pytest.approx(
        8 * 0.607 + 4 * 1.20)
    by_team = three_teams.outputs["costByTeam"]
    assert set(by_team) == {"vision", "nlp", "speech"}
    assert three_teams.outputs["estimatedUsdPerHour"] == pytest.approx(sum(by_team.values()))


# ---- platform and team stacks ---------------------------------------------------

def test_the_platform_exports_what_team_stacks_consume(repo_stacks) -> None:
    outputs = repo_stacks["platform"].outputs
    assert outputs["projectId"] == "acme-ml-shared"
    assert set(outputs["network"]["subnets"]) == {"us-central1", "us-central2"}
    assert outputs["teams"]["vision"]["quota"] == {"usdPerHour": 60.0,
                                                   "v5e": {"spot": 64, "onDemand": 16}}
    vision = outputs["teams"]["vision"]
    assert "nodes" not in vision and "buckets" not in vision  # vision deploys its own
    # Its project, runtime account and deployer are the platform's (TeamProject).
    assert vision["projectId"] == "acme-ml-shared-vision"
    assert vision["serviceAccount"] == (
        "platform-vision-runtime@acme-ml-shared-vision.iam.gserviceaccount.com")
    assert vision["deployer"]["serviceAccount"].endswith(
        "@acme-ml-shared-vision.iam.gserviceaccount.com")
    assert "deployer" not in outputs["teams"]["nlp"]  # nlp declares no CI of its own


def test_a_team_stack_declares_only_its_own_parts(repo_stacks) -> None:
    run = repo_stacks["team-vision"]
    platform_outputs = repo_stacks["platform"].outputs
    types = {r.type for r in run.registrations}
    assert not types & {PROJECTS_SERVICE, COMPUTE_NETWORK,
                        COMPUTE_SUBNETWORK, COMPUTE_FIREWALL}
    assert {b.inputs["labels"]["purpose"] for b in run.of_type(BUCKET)} == {
        "artifacts", "checkpoints", "logs"}
    for vm in run.of_type(V2VM):
        assert vm.inputs["networkConfig"]["network"] == platform_outputs["network"]["id"]
        assert vm.inputs["networkConfig"]["subnetwork"] == (
            platform_outputs["teams"]["vision"]["subnets"]["us-central1"])
        assert vm.inputs["tags"] == [platform_outputs["network"]["nodeTag"]]
        assert vm.inputs["serviceAccount"]["email"] == run.outputs["runtimeServiceAccount"]
    assert run.outputs["quota"] == {"v5e": {"spot": 8, "onDemand": 4}}


def run_team_vision(change) -> ProgramRun:
    outputs = copy.deepcopy(planned_stack_outputs(PLATFORM_REF))
    change(outputs)
    return run_program(file_config("team-vision"), "team-vision",
                       mock=GcpMocks(stack_outputs={PLATFORM_REF: outputs}))


@pytest.mark.parametrize(("change", "words"), [
    (lambda o: o["teams"]["vision"].update(quota={"v5e": {"spot": 4, "onDemand": 4}}),
     "tpu-stack:teams.vision.quota.v5e.spot: team vision needs 8 v5e spot chips "
     "(nodes: trainer 8); its quota is 4"),
    (lambda o: o["teams"]["vision"]["quota"].update(usdPerHour=5),
     "tpu-stack:teams.vision.quota.usdPerHour: team vision's nodes cost $9.66/h"),
    # No object for a team the platform does not serve (its outputs objects, issue 34).
    (lambda o: o["teams"].pop("vision"),
     "tpu-stack:team: 'vision': no outputs object gs://acme-pulumi-state/tpu-stack/"
     "platform-outputs/platform/vision.json"),
    (lambda o: o["teams"]["vision"]["labels"].update({"cost-centre": "cc-other"}),
     "tpu-stack:labels.cost-centre: 'cc-vision-2210' is not team vision's cost centre"),
    (lambda o: o["teams"]["vision"]["subnets"].pop("us-central1"),
     "tpu-stack:nodes[0].zone: acme/tpu-stack/platform has no subnet of team vision in "
     "us-central1"),
    (lambda o: o["teams"]["vision"].pop("subnets"),
     "tpu-stack:teams.vision: acme/tpu-stack/platform has no output teams.vision.subnets"),
    (lambda o: o.update(projectId="acme-ml-other"),
     "gcp:project: acme-ml-shared is not the platform's project (acme-ml-other)"),
    (lambda o: o.pop("teams"), "is 'vision' one of them, spelt as there"),
])
def test_a_team_stack_the_platform_does_not_allow_fails_at_preview(change, words) -> None:
    with pytest.raises(PlatformStackError) as caught:
        run_team_vision(change)
    message = str(caught.value)
    assert message.startswith("the platform stack acme/tpu-stack/platform does not serve")
    assert words in message


class CreationLog(GcpMocks):
    """GcpMocks that notes the type of every custom resource the engine would create,
    the provider each is created with, and every function call (invoke)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.created: list[str] = []
        self.providers: dict[str, str] = {}  # resource name → provider reference
        self.calls: list[str] = []
        self.looked_up: list[str | None] = []  # getProject's projectId per call

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict]:
        if args.custom is not False:  # components are no cloud resource
            self.created.append(args.typ)
            self.providers[args.name] = args.provider or ""
        return super().new_resource(args)

    def call(self, args: pulumi.runtime.MockCallArgs) -> dict:
        self.calls.append(args.token)
        self.looked_up.append(args.args.get("projectId"))
        return super().call(args)


def test_budgets_use_a_provider_billing_the_project_with_the_budgets_api_on() -> None:
    """pulumi-gcp billing.Budget: billing_project + user_project_override, or 403."""
    log = CreationLog(stack_outputs={})
    run = run_program(file_config("platform"), "platform", mock=log)
    (provider,) = run.of_type(PROVIDER_GCP)
    assert provider.inputs["billingProject"] == "acme-ml-shared"
    assert provider.inputs["project"] == "acme-ml-shared"
    # Provider resources get their config as strings (Pulumi encodes non-strings).
    assert provider.inputs["userProjectOverride"] == "true"
    services = {s.inputs["service"]: s for s in run.of_type(PROJECTS_SERVICE)}
    assert "billingbudgets.googleapis.com" in services
    for budget in run.of_type(BUDGET):
        assert log.providers[budget.name].startswith(provider.urn)
        assert services["billingbudgets.googleapis.com"].urn in budget.dependencies


def test_budgets_on_the_teams_billing_account_have_their_api_and_provider(three_teams) -> None:
    assert [p.name for p in three_teams.of_type(PROVIDER_GCP)] == ["budgets"]
    assert "billingbudgets.googleapis.com" in {
        s.inputs["service"] for s in three_teams.of_type(PROJECTS_SERVICE)}


def test_a_failed_contract_check_stops_everything_of_the_team_stack() -> None:
    """Not only the nodes: the team's buckets, account, grants and package wait too."""
    outputs = copy.deepcopy(planned_stack_outputs(PLATFORM_REF))
    outputs["teams"]["vision"]["quota"].update(usdPerHour=5)
    log = CreationLog(stack_outputs={PLATFORM_REF: outputs})
    with pytest.raises(PlatformStackError):
        run_program(file_config("team-vision"), "team-vision", mock=log)
    # Nothing at all: it reads its outputs object (an invoke), and creates nothing.
    assert log.created == []
    assert STORAGE_GET_BUCKET_OBJECT_CONTENT in log.calls
    passing = CreationLog(stack_outputs={PLATFORM_REF: planned_stack_outputs(PLATFORM_REF)})
    run_program(file_config("team-vision"), "team-vision", mock=passing)
    assert {BUCKET, V2VM, STORAGE_BUCKET_OBJECT} <= set(passing.created)


def test_the_fence_check_catches_a_cross_team_grant(three_teams: ProgramRun) -> None:
    teams = three_teams.outputs["teams"]
    leak = copy.deepcopy(next(r for r in three_teams.registrations
                              if r.type == BUCKET_GRANTS[0]))
    leak.inputs.update(bucket=teams["nlp"]["buckets"]["checkpoints"].removeprefix("gs://"),
                       member=f"serviceAccount:{teams['vision']['serviceAccount']}",
                       role="roles/storage.objectViewer")
    leaky = ProgramRun([*three_teams.registrations, leak], three_teams.outputs)
    with pytest.raises(AssertionError):
        assert_fenced([leaky], three_teams.outputs["sharedData"].removeprefix("gs://"))


def test_the_offline_plan_prices_every_team() -> None:
    from ops.plan.offline import offline_plan
    from ops.plan.report import cost_summary, node_rows

    plan = offline_plan("platform")
    cost = plan.to_json()["cost"]
    assert cost["byTeam"] == {"nlp": {"usdPerHour": pytest.approx(56.376),
                                      "usdPerMonth": pytest.approx(56.376 * 730)}}
    assert "- team nlp: $56.38/hour, $41,154.48/month" in cost_summary(plan.to_json()).splitlines()
    # name, GCP name, accelerator, runtime, provisioning, USD/hour, USD/month, spot saving
    rows = {row[0]: row[5] for row in node_rows(plan.to_json())}
    assert rows == {"nlp-pod": "~$51.52 (unconfirmed) via reservation", "nlp-sweep": "$4.86"}
    assert "byTeam" not in offline_plan("dev").to_json()["cost"]


def test_every_resource_has_its_own_urn(three_teams, repo_stacks) -> None:
    for run in (three_teams, *repo_stacks.values()):
        urns = [r.urn for r in run.registrations]
        assert len(urns) == len(set(urns))


def test_team_projects_are_the_bootstrap_s_not_the_stack_s(repo_stacks) -> None:
    """No project is created or owned by the platform's deployer (Resource Manager
    makes a project's creator its owner): the bootstrap step makes them."""
    projects = [r.inputs["projectId"] for run in repo_stacks.values()
                for r in run.of_type(ORGANIZATIONS_PROJECT)]
    assert projects == []
    services = {r.inputs["project"] for r in repo_stacks["platform"].of_type(
        PROJECTS_SERVICE)}
    assert {"acme-ml-shared-vision", "acme-ml-shared-nlp"} <= services


def test_the_bootstrap_makes_the_projects_and_grants_no_project_creation() -> None:
    import importlib.util

    from components.stack_config import settings_for
    from model.bootstrap import (
        BUDGETS_ROLE,
        HOST_STORAGE_ROLE,
        XPN_ADMIN,
        function_host_roles,
    )
    from model.roles import DEPLOYER_ROLES, METRICS_SCOPE_ROLE, PLATFORM_FOLDER_ROLES

    spec = importlib.util.spec_from_file_location(
        "bootstrap", Path(__file__).resolve().parents[1] / "scripts" / "bootstrap_team_projects.py")
    bootstrap = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bootstrap)
    settings = settings_for("platform")
    commands = bootstrap.commands(settings, "d@acme-ml-shared.iam.gserviceaccount.com",
                                  "C0abc123", {"folders": "cond.json", "projects": "host.json"},
                                  "organizations/42")
    created = [c[3] for c in commands if c[:3] == ["gcloud", "projects", "create"]]
    assert created == ["acme-ml-shared-nlp", "acme-ml-shared-vision"]
    assert all("--folder=246813579024" in c for c in commands if c[:3] == ["gcloud", "projects",
                                                                           "create"])
    grants = [(c[c.index("add-iam-policy-binding") + 1],
               next(a.removeprefix("--role=") for a in c if a.startswith("--role=")))
              for c in commands if "add-iam-policy-binding" in c]
    assert grants == [*(("246813579024", role) for role in PLATFORM_FOLDER_ROLES),
                      *(("acme-ml-shared", role) for role in (*DEPLOYER_ROLES, HOST_STORAGE_ROLE)),
                      # nlp's budget stops its TPUs: its topic, function and invoker grant
                      *(("acme-ml-shared", role) for role in function_host_roles(settings)),
                      # the fleet dashboard's metrics scope links the teams' projects
                      ("acme-ml-shared", METRICS_SCOPE_ROLE),
                      ("42", XPN_ADMIN), ("gs://acme-pulumi-state", HOST_STORAGE_ROLE),
                      ("01AB23-45CD67-89EF01", BUDGETS_ROLE),
                      # nlp's budget-stop accounts, the bootstrap's (issue 44)
                      ("platform-nlp-budget-stop@acme-ml-shared.iam.gserviceaccount.com",
                       "roles/iam.serviceAccountUser"),
                      ("platform-nlp-function-build@acme-ml-shared.iam.gserviceaccount.com",
                       "roles/iam.serviceAccountUser"),
                      ("acme-ml-shared", "roles/cloudbuild.builds.builder"),
                      # the controller's accounts, the bootstrap's too (issue 43)
                      ("platform-controller@acme-ml-shared.iam.gserviceaccount.com",
                       "roles/iam.serviceAccountUser"),
                      ("platform-controller-build@acme-ml-shared.iam.gserviceaccount.com",
                       "roles/iam.serviceAccountUser"),
                      ("acme-ml-shared", "roles/cloudbuild.builds.builder"),
                      ("246813579024", "roles/cloudquotas.admin")]  # the quota contact's
    assert "--member=group:ml-platform@acme.example" in commands[-1]
    roles = {role for _, role in grants}
    assert not {"roles/resourcemanager.projectCreator", "roles/billing.user",
                "roles/owner"} & roles
    # The Shared VPC host is enabled where the host project lives (issue 34, finding 4).
    assert ["gcloud", "organizations", "add-iam-policy-binding", "42"] in [c[:4] for c in commands]
    conditions = [a for c in commands for a in c if a.startswith("--condition-from-file=")]
    assert conditions == ["--condition-from-file=cond.json", "--condition-from-file=host.json"]
    policies = {c[4] for c in commands if c[3] in ("enable-enforce", "allow")}
    assert policies == {"storage.publicAccessPrevention", "compute.skipDefaultNetworkCreation",
                        "iam.allowedPolicyMemberDomains",
                        "iam.automaticIamGrantsForDefaultServiceAccounts",
                        # the shared v4 reservation's owner (model/shared_reservations.py)
                        "compute.sharedReservationsOwnerProjects"}
    condition = bootstrap.grants_condition(settings)["expression"]
    assert "roles/owner" not in condition and "'roles/tpu.admin'" in condition
    assert "'roles/browser'" in condition  # the team preview accounts' role (finding 1)


def test_a_created_project_s_billing_account_budgets_every_team() -> None:
    data = platform(vision=team("vision", quota={}), nlp=team("nlp"))
    data["tpu-stack:project"] = {"create": True, "billingAccount": "01AB23-45CD67-89EF01"}
    log = CreationLog(stack_outputs={}, project_number="987654321098")
    run = run_program(as_cli(data), "shared", mock=log)
    # The number of the project the stack creates, not a lookup of a project
    # that does not exist yet at the first preview; the teams' projects, made by
    # the bootstrap step before, are looked up.
    assert sorted(log.looked_up) == ["acme-ml-test-nlp", "acme-ml-test-vision"]
    for budget in run.of_type(BUDGET):
        assert budget.inputs["budgetFilter"]["projects"] == ["projects/987654321098"]
    budgets = {b.inputs["displayName"].rsplit(" ", 1)[-1]: b.inputs for b in run.of_type(BUDGET)}
    assert budgets["vision"]["amount"] == {"lastPeriodAmount": True}  # no ceiling, no figure
    assert budgets["nlp"]["amount"]["specifiedAmount"] == {"currencyCode": "USD",
                                                           "units": str(100 * 730)}
    assert [r["thresholdPercent"] for r in budgets["nlp"]["thresholdRules"]] == [0.5, 0.9, 1.0]


# ---- state on a shared gs:// backend ------------------------------------------------

def test_state_conditions_fit_iam_s_limit_and_name_stack_files_exactly() -> None:
    from model import team_state

    condition = team_state.write_condition("b", "team-vision")
    assert condition.count("||") <= team_state.MAX_OPERATORS
    assert ("resource.name == 'projects/_/buckets/b/objects/.pulumi/stacks/tpu-stack/"
            "team-vision.pulumi-tags'") in condition
    assert "startsWith('projects/_/buckets/b/objects/.pulumi/stacks/" not in condition


@pytest.mark.parametrize(("meta", "has_stacks", "refused"), [
    ("version: 1\n", True, False),
    (None, False, False),  # an empty bucket starts in the project layout
    ("version: 0\n", True, True),
    (None, True, True),  # stacks without meta.yaml: the legacy layout
])
def test_a_legacy_layout_bucket_is_refused_with_the_upgrade_step(meta, has_stacks,
                                                                 refused) -> None:
    from model.team_state import legacy_problem

    problem = legacy_problem("acme-pulumi-state", meta, has_stacks)
    assert (problem is not None) == refused
    if refused:
        assert "pulumi login gs://acme-pulumi-state && pulumi state upgrade" in problem


# ---- each team's own subnets ----------------------------------------------------------

def test_each_team_gets_a_subnet_per_region_from_its_own_slot() -> None:
    run = run_program(as_cli(platform(vision=team("vision", spot()),
                                      nlp=team("nlp", subnetSlot=5))), "shared")
    subnets = {r.name: (r.inputs["region"], r.inputs["ipCidrRange"])
               for r in run.of_type(COMPUTE_SUBNETWORK)}
    # vision: slot 0 (given in order), nlp: slot 5; a /22 per region slot in a /18.
    assert subnets["vision-subnet-us-central1"] == ("us-central1", "10.160.0.0/22")
    # vision's one node is in us-central1: no subnet of its own elsewhere (issue 45).
    assert "vision-subnet-us-central2" not in subnets
    assert subnets["nlp-subnet-us-central1"] == ("us-central1", "10.161.64.0/22")
    rules = {r.name: r.inputs for r in run.of_type(COMPUTE_FIREWALL)}
    assert rules["nlp-peers"]["sourceRanges"] == ["10.161.64.0/22", "10.161.68.0/22"]
    assert rules["nlp-peers"]["destinationRanges"] == rules["nlp-peers"]["sourceRanges"]
    [vm] = run.of_type(V2VM)
    assert vm.inputs["networkConfig"]["subnetwork"].endswith("/subnetworks/shared-tpu-vision-"
                                                             "us-central1")


@pytest.mark.parametrize(("change", "key", "words"), [
    (lambda d: d["tpu-stack:teams"]["nlp"].update(subnetSlot=0),
     "tpu-stack:teams.vision.subnetSlot", "0 is team nlp's"),
    (lambda d: d["tpu-stack:teams"]["nlp"].update(subnetSlot=64),
     "tpu-stack:teams.nlp.subnetSlot", "10.160.0.0/12 holds slots 0 to 63"),
    (lambda d: d["tpu-stack:network"].update(teamSubnetCidr="10.128.0.0/12"),
     "tpu-stack:network.teamSubnetCidr", "overlaps the platform's own ranges (us-central1 "
     "10.128.0.0/20, "),
    (lambda d: d["tpu-stack:network"].update(teamSubnetCidr="10.160.0.0/20"),
     "tpu-stack:network.teamSubnetCidr", "narrower than one team's block (/18)"),
])
def test_team_subnet_settings_are_refused_naming_the_key(change, key, words) -> None:
    data = platform(vision=team("vision"), nlp=team("nlp"))
    data.setdefault("tpu-stack:network", {})
    change(data)
    problems = dict(problems_of(data))
    assert key in problems and words in problems[key], problems
