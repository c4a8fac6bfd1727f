"""Issue 44: the proof checks what IAM itself refuses and every identity that acts, not
only the deployer's table rows (policy/acting.py). Each test reintroduces one of the
issue's findings in the shipped platform plan and reads the refusal: resource,
identity, permission, where, fix."""

from __future__ import annotations

import copy

import pytest

from components import budget_stop
from components.stack_config import file_config, settings_for
from ops.plan.mock_engine import ProgramRun, Registration, run_program
from ops.plan.proof import plan_proof
from policy.acting import known_permissions, prove_acting
from policy.iam import IamModel
from policy.permissions import Applier

DEPLOYER = "serviceAccount:platform-deployer@acme-ml-shared.iam.gserviceaccount.com"
RUNTIME = "platform-nlp-budget-stop@acme-ml-shared.iam.gserviceaccount.com"
RUNTIME_NAME = f"projects/acme-ml-shared/serviceAccounts/{RUNTIME}"
FUNCTION = "gcp:cloudfunctionsv2/function:Function nlp-budget-stop"


@pytest.fixture(scope="module")
def platform_run() -> ProgramRun:
    return run_program(file_config("platform"), "platform")


def changed(run: ProgramRun, name: str) -> tuple[ProgramRun, Registration]:
    """`run` with a deep copy of its registration `name`, to change."""
    [original] = [r for r in run.registrations if r.name == name]
    copied = copy.deepcopy(original)
    return ProgramRun([copied if r is original else r for r in run.registrations],
                      run.outputs), copied


def findings(run: ProgramRun):
    return plan_proof(settings_for("platform"), run).findings


def test_item_1_a_custom_role_permission_iam_does_not_know_is_refused(
        platform_run, monkeypatch) -> None:
    """The budget stop's role (the bootstrap's) listing the old queuedresources names."""
    from model import bootstrap

    monkeypatch.setattr(bootstrap, "BUDGET_STOP_PERMISSIONS", (
        *bootstrap.BUDGET_STOP_PERMISSIONS, "tpu.queuedresources.list", "not.a.permission"))
    found = {f.permission: f for f in findings(platform_run)}
    assert set(found) == {"tpu.queuedresources.list", "not.a.permission"}
    queued = found["tpu.queuedresources.list"]
    role = "projects/acme-ml-shared-nlp/roles/platform_budget_stop"
    assert queued.resource == f"the bootstrap's custom role {role}"
    assert queued.identity == "the bootstrap (an admin)"
    assert queued.on == role
    assert queued.fix.startswith("list tpu.nodes.list instead (iann0036/iam-dataset "
                                 "gcp/map.json")
    assert found["not.a.permission"].fix.startswith("remove not.a.permission")


def test_item_1_a_plan_s_custom_role_is_checked_too() -> None:
    role = {"type": "gcp:projects/iAMCustomRole:IAMCustomRole", "name": "storage-deployer",
            "inputs": {"project": "p", "roleId": "r",
                       "permissions": ["storage.buckets.create", "storage.bucket.delete"]}}
    [refused] = prove_acting([role], IamModel(), Applier(DEPLOYER), {})
    assert (refused.resource, refused.identity, refused.permission, refused.on) == (
        "gcp:projects/iAMCustomRole:IAMCustomRole storage-deployer", DEPLOYER,
        "storage.bucket.delete", "projects/p/roles/r")
    assert refused.fix == "remove storage.bucket.delete (did you mean storage.buckets.delete?)"


def test_item_1_every_custom_role_lists_permissions_iam_knows() -> None:
    from model.bootstrap import custom_roles

    known, _ = known_permissions()
    assert set(budget_stop.PERMISSIONS) <= known
    roles = custom_roles(settings_for("platform"))
    # vision's storage role; nlp's TPU and markers roles; the controller's TPU role in the
    # host, nlp's and vision's projects and its objects role in the host
    assert len(roles) == 7
    for role in roles:
        assert set(role.permissions) <= known, role
    assert "tpu.queuedresources.list" not in known and "tpu.nodes.list" in known


def test_item_7_a_deployer_that_may_edit_a_role_it_grants_is_refused(
        platform_run, monkeypatch) -> None:
    """roleAdmin back on the teams' folder: the deployer could widen nlp's TPU role (or
    vision's storage role) and grant it, to itself included."""
    from model import bootstrap

    monkeypatch.setattr(bootstrap, "PLATFORM_FOLDER_ROLES", {
        **bootstrap.PLATFORM_FOLDER_ROLES, "roles/iam.roleAdmin": "custom roles"})
    refused = [f for f in findings(platform_run) if f.permission == "iam.roles.update"]
    assert {(f.resource, f.on) for f in refused} == {
        ("the custom role projects/acme-ml-shared-nlp/roles/platform_budget_stop",
         "projects/acme-ml-shared-nlp"),
        ("the custom role projects/acme-ml-shared-vision/roles/platform_tpuStackStorageDeployer",
         "projects/acme-ml-shared-vision"),
        *((f"the custom role projects/{p}/roles/platform_controller", f"projects/{p}")
          for p in ("acme-ml-shared-nlp", "acme-ml-shared-vision"))}
    assert {f.identity for f in refused} == {DEPLOYER}
    assert all("remove roles/iam.roleAdmin" in f.fix for f in refused)


def test_item_7_the_deployer_holds_no_role_admin() -> None:
    from model.bootstrap import deployer_grants

    settings = settings_for("platform")
    roles = {g.role for g in deployer_grants(settings, DEPLOYER.split(":", 1)[1])}
    assert "roles/iam.roleAdmin" not in roles
    assert not [r for r in run_program(file_config("platform"), "platform").registrations
                if r.type == "gcp:projects/iAMCustomRole:IAMCustomRole"]


def test_item_2_a_grant_to_the_deployer_itself_is_checked(platform_run) -> None:
    """The old plan's self-grant: actAs on the budget stop's account, in the host project,
    where the deployer holds iam.serviceAccountCreator only."""
    run, grant = changed(platform_run, "nlp-budget-stop-tpu")
    grant.type = "gcp:serviceaccount/iAMMember:IAMMember"
    grant.name = "nlp-budget-stop-deployer-serviceAccountUser"
    grant.inputs = {"serviceAccountId": RUNTIME_NAME, "role": "roles/iam.serviceAccountUser",
                    "member": DEPLOYER}
    refused = [f for f in findings(run) if f.resource.endswith("deployer-serviceAccountUser")]
    assert {(f.identity, f.permission, f.on) for f in refused} == {
        (DEPLOYER, permission, RUNTIME_NAME)
        for permission in ("iam.serviceAccounts.getIamPolicy", "iam.serviceAccounts.setIamPolicy")}
    assert refused[0].fix == f"grant roles/iam.serviceAccountAdmin on {RUNTIME_NAME}"


def test_item_4_the_tpu_agent_needs_network_user_and_xpn_agent(platform_run) -> None:
    kept = [r for r in platform_run.registrations if "tpu-agent" not in r.name]
    found = findings(ProgramRun(kept, platform_run.outputs))
    agent = "the TPU service agent of projects/acme-ml-shared-nlp"
    mine = {(f.resource.rsplit(" ", 1)[-1], f.permission, f.on) for f in found
            if f.identity == agent}
    subnet = "projects/acme-ml-shared/regions/us-central1/subnetworks/platform-tpu-nlp-us-central1"
    assert ("node-nlp-sweep-vm", "compute.subnetworks.use", subnet) in mine
    assert ("node-nlp-sweep-vm", "compute.addresses.createInternal", "projects/acme-ml-shared") \
        in mine
    [xpn] = [f for f in found if f.identity == agent and f.resource.endswith("sweep-vm")
             and f.on == "projects/acme-ml-shared"]
    assert xpn.fix == ("grant roles/tpu.xpnAgent on projects/acme-ml-shared to serviceAccount:"
                       "service-PROJECT_NUMBER@gcp-sa-tpu.iam.gserviceaccount.com")
    assert findings(platform_run) == []


def test_item_5_a_budget_s_topic_and_billing_project_are_checked() -> None:
    budget = {"type": "gcp:billing/budget:Budget", "name": "nlp-budget",
              "inputs": {"billingAccount": "B", "allUpdatesRule": {
                  "pubsubTopic": "projects/host/topics/t"}}}
    provider = {"type": "pulumi:providers:gcp", "name": "budgets",
                "inputs": {"billingProject": "host", "userProjectOverride": "true"}}
    found = prove_acting([budget, provider], IamModel(), Applier(DEPLOYER), {})
    assert {(f.resource, f.permission, f.on) for f in found} == {
        ("gcp:billing/budget:Budget nlp-budget", "pubsub.topics.setIamPolicy",
         "projects/host/topics/t"),
        ("gcp:billing/budget:Budget nlp-budget", "serviceusage.services.use", "projects/host")}
    assert {f.identity for f in found} == {DEPLOYER}
    assert all(f.fix.startswith("grant roles/") for f in found)


def test_item_6_a_function_without_a_build_account_is_refused(platform_run) -> None:
    run, function = changed(platform_run, "nlp-budget-stop")
    del function.inputs["buildConfig"]["serviceAccount"]
    [refused] = findings(run)
    assert refused.resource == FUNCTION
    assert refused.identity == "the Compute Engine default account"
    assert refused.permission == "cloudbuild.builds.create"
    assert "set buildConfig.serviceAccount" in refused.fix


def test_item_6_the_trigger_account_must_invoke_the_function(platform_run) -> None:
    kept = [r for r in platform_run.registrations if r.name != "nlp-budget-stop-invoker"]
    [refused] = [f for f in findings(ProgramRun(kept, platform_run.outputs))
                 if f.permission == "run.routes.invoke"]
    assert refused.identity == f"serviceAccount:{RUNTIME}"
    assert refused.on.endswith("/services/platform-nlp-budget-stop")
    assert refused.fix.startswith("grant roles/run.invoker on ")


# ---- a newcomer's findings: budgets never dropped ------------------------------------

def _team_billing_only() -> dict[str, str]:
    """teamProjects.billingAccount set, no tpu-stack:billing."""
    import json

    data = file_config("platform")
    billing = json.loads(data.pop("tpu-stack:billing"))
    projects = json.loads(data["tpu-stack:teamProjects"])
    projects["billingAccount"] = billing["account"]
    data["tpu-stack:teamProjects"] = json.dumps(projects)
    return data


def test_newcomer_budgets_are_declared_on_the_teams_billing_account() -> None:
    from model.bootstrap import BUDGETS_ROLE, deployer_grants
    from model.meter import team_previews
    from model.settings.load import load_settings

    data = _team_billing_only()
    settings = load_settings(data, "platform")
    run = run_program(data, "platform")
    budgets = run.of_type("gcp:billing/budget:Budget")
    assert sorted(b.name for b in budgets) == ["nlp-budget", "vision-budget"]
    assert {b.inputs["billingAccount"] for b in budgets} == {"01AB23-45CD67-89EF01"}
    assert ("billingAccounts/01AB23-45CD67-89EF01", BUDGETS_ROLE) in {
        (g.resource, g.role) for g in deployer_grants(settings, DEPLOYER.split(":", 1)[1])}
    assert plan_proof(settings, run).findings == []
    previews = {p.team: p.budget_usd_per_month for p in team_previews(settings)}
    assert previews["nlp"] == 60000


def test_newcomer_the_preview_prints_no_budget_the_plan_does_not_declare() -> None:
    from model.meter import team_previews
    from model.settings.schema import StackSettings

    settings = settings_for("platform")
    no_billing = StackSettings.model_construct(**{**dict(settings), "billing": None,
                                                  "team_projects": None})
    assert no_billing.team_billing_account is None
    assert {p.budget_usd_per_month for p in team_previews(no_billing)} == {None}


# ---- a newcomer's findings: the bootstrap as docs/teams.md writes it ------------------

def _bootstrap_script():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "bootstrap_team_projects.py"
    spec = importlib.util.spec_from_file_location("bootstrap_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_newcomer_the_bootstrap_for_one_team_makes_that_team_only(tmp_path, capsys) -> None:
    script = _bootstrap_script()
    assert script.main(["--stack", "platform", "--deployer", DEPLOYER.split(":", 1)[1],
                        "--customer-id", "C0abc123", "--host-parent", "organizations/42",
                        "--organization", "42", "--team", "nlp",
                        "--out-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    created = [line.split()[3] for line in lines if line.startswith("gcloud projects create")]
    assert created == ["acme-ml-shared-nlp"]
    assert [line.split()[4] for line in lines if line.startswith("gcloud iam roles create")] \
        == ["platform_budget_stop", "platform_budget_stop_markers_nlp", "platform_controller"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "platform-host-grants.json", "platform-team-grants.json"]
    assert not any("vision" in line for line in lines if "create" in line)


def test_newcomer_the_bootstrap_writes_under_cache_by_default() -> None:
    script = _bootstrap_script()
    assert script.OUT_DIR.relative_to(script.REPO_ROOT).as_posix() == ".cache/bootstrap"


def test_newcomer_an_unknown_team_is_one_clear_message(capsys) -> None:
    script = _bootstrap_script()
    with pytest.raises(SystemExit):
        script.main(["--deployer", "d@x.iam.gserviceaccount.com", "--customer-id", "C0",
                     "--host-parent", "organizations/1", "--organization", "1",
                     "--team", "speech"])
    assert "--team speech: not in tpu-stack:teams of platform (nlp, vision)" in \
        capsys.readouterr().err


def test_newcomer_docs_name_every_role_the_admin_needs() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "teams.md").read_text()
    assert ".venv/infra/bin/python scripts/bootstrap_team_projects.py" in text
    for role in ("roles/orgpolicy.policyAdmin", "roles/resourcemanager.projectCreator",
                 "roles/billing.user", "roles/iam.roleAdmin", "roles/iam.serviceAccountAdmin",
                 "roles/resourcemanager.folderIamAdmin", "roles/billing.admin"):
        assert role in text, role


# ---- item 3: another project's reservation, shared ------------------------------------

POD = "pulumi-python:dynamic/tpu:QueuedTpu node-nlp-pod-queued"
V4_PODS = "projects/acme-ml-shared/locations/us-central2-b/reservations/v4-pods"


def _sharing(**change):
    """The shipped platform's settings with its one shared reservation changed (None:
    none declared)."""
    settings = settings_for("platform")
    [shared] = settings.shared_reservations
    declared = [] if change.get("drop") else [shared.model_copy(update=change)]
    return settings.model_copy(update={"shared_reservations": declared})


@pytest.mark.parametrize("change, what, fix", [
    ({"drop": True}, "a reservation of another project not declared shared with it",
     "declare it, as requested from Google (share type fixed then): "
     "tpu-stack:sharedReservations: {name: v4-pods, owner: acme-ml-shared, "
     "ownerProjectNumber: <N>, zone: us-central2-b, generation: <v4 or later>, "
     "shareType: SPECIFIC_PROJECTS, consumers: [acme-ml-shared-nlp]}"),
    ({"generation": "v3"}, "a shared reservation of v3 (sharing is v4 and later)",
     "use a reservation of the node's own project, or a v4+ one"),
    ({"share_type": "LOCAL"}, "share type LOCAL (shared with no other project)",
     "a reservation requested with share type SPECIFIC_PROJECTS naming acme-ml-shared-nlp"),
    ({"consumers": ["acme-ml-shared-vision"]}, "acme-ml-shared-nlp is not among its consumers",
     "add acme-ml-shared-nlp to its consumers (at Google, then in "
     "tpu-stack:sharedReservations)"),
])
def test_item_3_another_project_s_reservation_needs_sharing(platform_run, change, what,
                                                            fix) -> None:
    [refused] = plan_proof(_sharing(**change), platform_run).findings
    assert (refused.resource, refused.identity, refused.permission) == (
        POD, DEPLOYER, "a shared reservation")
    assert refused.on == f"{V4_PODS} ({what})"
    assert refused.fix == fix


def test_item_3_the_owner_must_be_allowed_by_the_org_policy(platform_run,
                                                            monkeypatch) -> None:
    from ops.plan import proof as proof_module

    monkeypatch.setattr(proof_module, "owners_allowed", lambda settings: [])
    [refused] = plan_proof(settings_for("platform"), platform_run).findings
    assert refused.on == (f"{V4_PODS} (owner acme-ml-shared not allowed by "
                          f"compute.sharedReservationsOwnerProjects)")
    assert refused.fix == ("the bootstrap's `org-policies allow compute.sharedReservationsOwner"
                           "Projects projects/123456789012`")


def test_item_3_the_bootstrap_allows_each_owner() -> None:
    script = _bootstrap_script()
    commands = script.commands(settings_for("platform"), "d@x.iam.gserviceaccount.com",
                               "C0", {"folders": "f", "projects": "p"}, "organizations/1",
                               organization="42")
    assert ["gcloud", "resource-manager", "org-policies", "allow",
            "compute.sharedReservationsOwnerProjects", "projects/123456789012",
            "--organization=42"] in commands


# ---- item 8: the table's rows -----------------------------------------------------------

def _row_needs(kind: str, operation: str) -> tuple[str, ...]:
    from policy.permissions import TABLE

    return TABLE[kind].needs(operation)


def test_item_8_detaching_a_service_project_is_disable_xpn_resource() -> None:
    kind = "gcp:compute/sharedVPCServiceProject:SharedVPCServiceProject"
    assert _row_needs(kind, "delete") == ("compute.organizations.disableXpnResource",)


def test_item_8_overwriting_an_object_needs_delete(platform_run) -> None:
    """The deployer with object create only on the artifacts bucket: a changed object
    (an update) is refused for storage.objects.delete."""
    from policy.permissions import prove

    obj = {"type": "gcp:storage/bucketObject:BucketObject", "name": "o",
           "inputs": {"bucket": "b", "name": "x"}}
    creator = {"type": "gcp:projects/iAMCustomRole:IAMCustomRole",
               "inputs": {"project": "p", "roleId": "creator",
                          "permissions": ["storage.objects.create"]}}
    grant = {"type": "gcp:storage/bucketIAMMember:BucketIAMMember",
             "inputs": {"bucket": "b", "role": "projects/p/roles/creator", "member": DEPLOYER}}
    found = prove([obj], IamModel.of([creator, grant]), Applier(DEPLOYER))
    assert {(f.operation, f.permission) for f in found} == {
        ("update", "storage.objects.delete"), ("delete", "storage.objects.delete")}
    assert {f.on for f in found} == {"projects/_/buckets/b"}


def test_item_8_private_google_access_is_its_own_permission() -> None:
    kind = "gcp:compute/subnetwork:Subnetwork"
    assert "compute.subnetworks.setPrivateIpGoogleAccess" in _row_needs(kind, "update")


def test_item_8_a_grant_on_a_bucket_counts_for_that_bucket() -> None:
    from policy.permissions import prove

    grant = {"type": "gcp:storage/bucketIAMMember:BucketIAMMember",
             "inputs": {"bucket": "b", "role": "roles/storage.admin", "member": DEPLOYER}}
    obj = {"type": "gcp:storage/bucketObject:BucketObject", "name": "o",
           "inputs": {"bucket": "b", "name": "x"}}
    assert prove([obj], IamModel.of([grant]), Applier(DEPLOYER)) == []


@pytest.mark.parametrize("role, member, what", [
    ("roles/editor", "user:a@acme.example", "roles/editor"),
    ("roles/storage.objectViewer", "allUsers", "allUsers")])
def test_item_8_iam_takes_no_condition_on_basic_roles_or_public_members(role, member,
                                                                          what) -> None:
    grant = {"type": "gcp:storage/bucketIAMMember:BucketIAMMember", "name": "g",
             "inputs": {"bucket": "b", "role": role, "member": member,
                        "condition": {"title": "t", "expression": "true"}}}
    [refused] = prove_acting([grant], IamModel(), Applier(DEPLOYER), {})
    assert (refused.resource, refused.permission, refused.on) == (
        "gcp:storage/bucketIAMMember:BucketIAMMember g", "a conditional grant",
        f"{what} (IAM takes no condition here)")


def test_item_8_a_group_quota_contact_is_marked_unconfirmed(platform_run,
                                                             monkeypatch) -> None:
    from model import bootstrap
    from ops.plan import proof as proof_module

    monkeypatch.setattr(proof_module, "quota_contact_grant", lambda settings: None)
    refused = [f for f in findings(platform_run) if f.identity.startswith("the quota")]
    assert refused and {f.fix.rsplit(" to ", 1)[1] for f in refused} == {
        "user:ml-platform@acme.example (a group: unconfirmed)"}
    assert bootstrap.quota_contact_grant(settings_for("platform"), "user").member == \
        "user:ml-platform@acme.example"


# ---- a fresh team that stops at its budget ----------------------------------------------

def test_a_fresh_team_with_a_budget_stop_proves_clean_with_the_bootstrap_s_grants() -> None:
    """`teams.speech` with `budgetAction: stop` added to the shipped platform: the bootstrap
    (`--team speech`) makes its roles and accounts and grants the deployer actAs on them;
    the plan then proves clean with no other edit."""
    import json

    from model.bootstrap import custom_roles, function_account_grants
    from model.settings.load import load_settings

    data = file_config("platform")
    teams = json.loads(data["tpu-stack:teams"])
    teams["speech"] = {"subnetSlot": 2, "members": ["group:ml-speech@acme.example"],
                       "quota": {"v5e": {"spot": 8}}, "budgetUsdPerMonth": 5000,
                       "budgetAction": "stop",
                       "alerts": {"email": "ml-speech@acme.example"}}
    data["tpu-stack:teams"] = json.dumps(teams)
    settings = load_settings(data, "platform")
    proof = plan_proof(settings, run_program(data, "platform"))
    assert proof.findings == [], "\n".join(proof.lines())
    assert {r.name for r in custom_roles(settings, ["speech"])} == {
        "projects/acme-ml-shared-speech/roles/platform_budget_stop",
        "projects/acme-ml-shared/roles/platform_budget_stop_markers_speech",
        # The shipped platform runs the controller: it manages the new team's project too.
        "projects/acme-ml-shared-speech/roles/platform_controller"}
    assert {g.resource.rsplit("/", 1)[-1] for g in function_account_grants(
        settings, DEPLOYER.split(":", 1)[1], ["speech"]) if "serviceAccounts" in g.resource} \
        == {"platform-speech-budget-stop@acme-ml-shared.iam.gserviceaccount.com",
            "platform-speech-function-build@acme-ml-shared.iam.gserviceaccount.com"}


@pytest.mark.parametrize("removed, permission", [
    ("nlp-budget-stop-tpu", "tpu.nodes.delete"),
    ("nlp-budget-stop-markers", "storage.objects.create")])
def test_item_6_the_runtime_account_holds_what_the_function_calls(platform_run, removed,
                                                                  permission) -> None:
    kept = [r for r in platform_run.registrations if r.name != removed]
    refused = [f for f in findings(ProgramRun(kept, platform_run.outputs))
               if f.identity == f"serviceAccount:{RUNTIME}"]
    assert permission in {f.permission for f in refused}
    assert all(f.resource == FUNCTION for f in refused)


# ---- the controller (issue 43): its identities, the bootstrap's ------------------------

CONTROLLER = "platform-controller@acme-ml-shared.iam.gserviceaccount.com"
CONTROLLER_NAME = f"projects/acme-ml-shared/serviceAccounts/{CONTROLLER}"


def test_the_shipped_platform_runs_the_controller_and_proves_clean(platform_run) -> None:
    settings = settings_for("platform")
    assert settings.controller is not None and settings.controller.enabled
    assert [r.name for r in platform_run.of_type("gcp:cloudscheduler/job:Job")] == ["controller"]
    proof = plan_proof(settings, platform_run)
    assert proof.findings == [], "\n".join(proof.lines())


def test_the_controller_s_roles_are_the_bootstrap_s_with_permissions_iam_knows() -> None:
    from model.bootstrap import custom_roles

    made = {r.name: r.permissions for r in custom_roles(settings_for("platform"))}
    tpu_roles = [name for name in made if name.endswith("/roles/platform_controller")]
    assert sorted(tpu_roles) == sorted(f"projects/{p}/roles/platform_controller" for p in (
        "acme-ml-shared", "acme-ml-shared-nlp", "acme-ml-shared-vision"))
    assert "tpu.nodes.create" in made[tpu_roles[0]]
    assert not [p for p in made[tpu_roles[0]] if p.startswith("tpu.queuedresources")]
    known, _services = known_permissions()
    for name, permissions in made.items():
        assert set(permissions) <= known, (name, set(permissions) - known)


@pytest.mark.parametrize("kind, name", [
    ("gcp:cloudscheduler/job:Job", "controller"),
    ("gcp:pubsub/subscription:Subscription", "controller-budget-nlp"),
    ("gcp:cloudfunctionsv2/function:Function", "controller")])
def test_without_the_bootstrap_s_act_as_the_controller_s_oidc_and_runtime_uses_are_refused(
        platform_run, monkeypatch, kind, name) -> None:
    """The Scheduler job's and the push subscription's OIDC token account, and the
    function's runtime account, each need the deployer's actAs on that account."""
    from ops.plan import proof as proof_module

    granted = proof_module.function_account_grants

    def without_controller(*args, **kwargs):
        return [g for g in granted(*args, **kwargs) if g.resource != CONTROLLER_NAME]

    monkeypatch.setattr(proof_module, "function_account_grants", without_controller)
    refused = [f for f in findings(platform_run) if f.resource == f"{kind} {name}"]
    assert {(f.permission, f.on) for f in refused} == {
        ("iam.serviceAccounts.actAs", CONTROLLER_NAME)}
    assert {f.identity for f in refused} == {DEPLOYER}
