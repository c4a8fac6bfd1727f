"""The permission proof (policy/permissions.py, ops/plan/proof.py): every shipped stack can
be applied by the identity it names, and each of issue 34's findings 1-3, reintroduced,
is refused naming the resource, the identity, the missing permission and the fix."""

from __future__ import annotations

import copy
import json

import pytest

from components.stack_config import file_config, settings_for
from model import bootstrap
from model.pulumi_types import (
    CLOUDFUNCTIONSV2_FUNCTION,
    CLOUDRUNV2_SERVICE_IAM_MEMBER,
    COMPUTE_SHARED_VPC_SERVICE_PROJECT,
    DNS_MANAGED_ZONE,
    DYNAMIC_FALLBACK_TPU,
    PROJECTS_IAM_MEMBER,
    PUBSUB_TOPIC,
    PUBSUB_TOPIC_IAM_MEMBER,
    TPU_V2_VM,
)
from model.settings.load import load_settings
from model.settings.schema import SettingsError
from ops.plan.mock_engine import ProgramRun, run_program
from ops.plan.proof import plan_proof
from policy.iam import IamModel
from policy.permissions import Applier, prove
from tests.repo_stacks import repo_stacks

PLATFORM_DEPLOYER = "serviceAccount:platform-deployer@acme-ml-shared.iam.gserviceaccount.com"
V2VM = TPU_V2_VM


@pytest.fixture(scope="module")
def platform_run() -> ProgramRun:
    return run_program(file_config("platform"), "platform")


def without(run: ProgramRun, name_part: str) -> ProgramRun:
    kept = [r for r in run.registrations if name_part not in r.name]
    assert len(kept) < len(run.registrations), name_part
    return ProgramRun(kept, run.outputs)


def test_every_shipped_stack_is_applied_by_the_identity_it_names() -> None:
    proved = {}
    for stack in repo_stacks():
        proof = plan_proof(settings_for(stack), run_program(file_config(stack), stack))
        assert proof.findings == [], "\n".join(proof.lines())
        assert proof.unchecked == [], proof.unchecked  # every resource type has a row
        proved[stack] = proof.identity
    assert proved["platform"] == PLATFORM_DEPLOYER
    assert proved["prod"] == "serviceAccount:prod-deployer@acme-ml-prod.iam.gserviceaccount.com"
    assert proved["team-vision"].startswith("serviceAccount:platform-vision-deployer@")
    assert proved["dev"] is None  # no deployer declared: a person applies it


def test_finding_1_a_grant_outside_the_bootstrap_s_condition_is_refused(
        platform_run, monkeypatch) -> None:
    """roles/browser for vision's preview account, left out of the folder condition."""
    monkeypatch.setattr(bootstrap, "PREVIEW_ROLES", {})
    proof = plan_proof(settings_for("platform"), platform_run)
    lines = [f.line() for f in proof.findings]
    assert lines and all("roles/browser" in line or "preview-browser" in line for line in lines)
    finding = proof.findings[0]
    assert finding.resource == "gcp:projects/iAMMember:IAMMember vision-preview-browser"
    assert finding.identity == PLATFORM_DEPLOYER
    assert finding.permission == "resourcemanager.projects.setIamPolicy"
    assert finding.on == "projects/acme-ml-shared-vision"
    assert finding.fix == ("add 'roles/browser' to the hasOnly list of the condition on "
                           "roles/resourcemanager.projectIamAdmin at folders/246813579024")


def test_finding_2_a_node_running_as_an_account_needs_act_as_on_it(platform_run) -> None:
    """The platform deployer creating nlp's nodes without actAs on nlp's runtime account
    (the folder's serviceAccountAdmin holds none)."""
    proof = plan_proof(settings_for("platform"), without(platform_run,
                                                         "platform-deployer-act-as"))
    nlp = "projects/acme-ml-shared-nlp/serviceAccounts/platform-nlp-runtime@" \
          "acme-ml-shared-nlp.iam.gserviceaccount.com"
    refused = {(f.resource.rsplit(" ", 1)[-1], f.operation) for f in proof.findings}
    assert refused == {(node, op) for node in ("node-nlp-sweep-vm", "node-nlp-pod-queued")
                       for op in ("create", "update")}
    assert {f.permission for f in proof.findings} == {"iam.serviceAccounts.actAs"}
    assert {f.on for f in proof.findings} == {nlp}
    assert {f.fix for f in proof.findings} == {
        f"grant roles/iam.serviceAccountUser on {nlp} (that account only)"}


def test_finding_3_a_reserved_node_in_a_team_project_finds_no_reservation(platform_run) -> None:
    """nlp's reserved pod as a V2Vm in nlp's project: the platform's reservation is in
    the host project, which only a queued resource's reservationName reaches."""
    [sweep] = [r for r in platform_run.of_type(V2VM) if r.name == "node-nlp-sweep-vm"]
    reserved = copy.deepcopy(sweep)
    reserved.name = "node-nlp-pod"
    reserved.inputs["schedulingConfig"] = {"reserved": True}
    run = ProgramRun([*platform_run.registrations, reserved], platform_run.outputs)
    [finding] = plan_proof(settings_for("platform"), run).findings
    assert finding.resource == f"{V2VM} node-nlp-pod"
    assert finding.permission == "a reservation"
    assert finding.on.startswith("projects/acme-ml-shared-nlp (a reserved node uses a "
                                 "reservation of its own project")
    assert finding.fix == ("provisioning: queued with queue.reservationName: projects/"
                           "acme-ml-shared/locations/us-central1-a/reservations/NAME")


def test_the_settings_refuse_a_reserved_team_node_with_the_fix() -> None:
    data = file_config("platform")
    teams = json.loads(data["tpu-stack:teams"])
    [pod] = [node for node in teams["nlp"]["nodes"] if node["name"] == "pod"]
    pod["provisioning"] = "reserved"
    pod.pop("queue")
    data["tpu-stack:teams"] = json.dumps(teams)
    with pytest.raises(SettingsError) as error:
        load_settings(data, "platform")
    assert ("tpu-stack:teams.nlp.nodes[1].provisioning: reserved capacity in a team's project "
            "finds no reservation") in str(error.value)
    assert ("queue.reservationName: projects/acme-ml-shared/locations/us-central2-b/"
            "reservations/<NAME>") in str(error.value)


def test_a_platform_declaring_team_nodes_names_its_deployer() -> None:
    data = file_config("platform")
    projects = json.loads(data["tpu-stack:teamProjects"])
    projects.pop("deployer")
    data["tpu-stack:teamProjects"] = json.dumps(projects)
    with pytest.raises(SettingsError) as error:
        load_settings(data, "platform")
    assert "tpu-stack:teamProjects.deployer: is required when the platform declares team " \
           "nodes (nlp)" in str(error.value)


def test_a_grant_changes_one_role_and_the_proof_checks_that_role() -> None:
    """Pure: a conditioned projectIamAdmin admits the listed role, refuses another."""
    condition = ("api.getAttribute('iam.googleapis.com/modifiedGrantsByRole', [])"
                 ".hasOnly(['roles/tpu.viewer'])")
    admin = {"type": PROJECTS_IAM_MEMBER,
             "inputs": {"project": "p1", "role": "roles/resourcemanager.projectIamAdmin",
                        "member": "serviceAccount:d@p1.iam.gserviceaccount.com",
                        "condition": {"expression": condition}}}
    grants = [{"type": PROJECTS_IAM_MEMBER, "name": role, "urn": role,
               "inputs": {"project": "p1", "role": role, "member": "group:g@x.example"}}
              for role in ("roles/tpu.viewer", "roles/owner")]
    model = IamModel.of([admin])
    applier = Applier("serviceAccount:d@p1.iam.gserviceaccount.com")
    findings = prove(grants, model, applier)
    assert {f.resource for f in findings} == {"gcp:projects/iAMMember:IAMMember roles/owner"}
    assert {f.operation for f in findings} == {"create", "update", "delete"}


def test_finding_4_the_shared_vpc_host_needs_xpn_admin_where_the_host_lives(
        platform_run, monkeypatch) -> None:
    """Without the bootstrap's xpnAdmin on the host project's parent (the teams' folder
    holds it, the host may sit elsewhere) enabling the host is refused."""
    from ops.plan import proof as proof_module

    grants = proof_module.deployer_grants
    monkeypatch.setattr(proof_module, "deployer_grants", lambda *a: [
        g for g in grants(*a) if g.resource != bootstrap.UNKNOWN_HOST_PARENT])
    findings = plan_proof(settings_for("platform"), platform_run).findings
    host = "gcp:compute/sharedVPCHostProject:SharedVPCHostProject shared-vpc-host"
    attach = COMPUTE_SHARED_VPC_SERVICE_PROJECT
    assert {(f.resource, f.permission) for f in findings} == {
        (host, "compute.organizations.enableXpnHost"),
        (host, "compute.organizations.disableXpnHost"),
        # Attaching a team's project is checked on the host's side too.
        (f"{attach} vision-shared-vpc", "compute.organizations.enableXpnResource"),
        (f"{attach} nlp-shared-vpc", "compute.organizations.enableXpnResource"),
        # and detaching it (disableXpnResource, issue 44)
        (f"{attach} vision-shared-vpc", "compute.organizations.disableXpnResource"),
        (f"{attach} nlp-shared-vpc", "compute.organizations.disableXpnResource")}
    assert {f.on for f in findings} == {"projects/acme-ml-shared"}
    assert all(f.fix == "grant roles/compute.xpnAdmin on projects/acme-ml-shared"
               for f in findings)


def test_finding_5_the_quota_contact_needs_quota_update_rights(platform_run,
                                                               monkeypatch) -> None:
    from ops.plan import proof as proof_module

    monkeypatch.setattr(proof_module, "quota_contact_grant", lambda *a: None)
    findings = plan_proof(settings_for("platform"), platform_run).findings
    assert findings and {f.identity for f in findings} == {
        "the quota contact ml-platform@acme.example"}
    assert {f.on for f in findings} == {"projects/acme-ml-shared-vision",
                                        "projects/acme-ml-shared-nlp"}
    assert {f.permission for f in findings} == {"cloudquotas.quotas.update"}


def test_unconfirmed_quota_ids_are_marked_in_the_catalog_the_caps_and_the_preview(
        platform_run) -> None:
    """Finding 6: ids named by analogy are marked, and the preview says so per team."""
    from model import catalog

    assert catalog.TPU_QUOTA_IDS[("v4", "onDemand")] in catalog.UNCONFIRMED_QUOTA_IDS
    assert catalog.TPU_QUOTA_IDS[("v5e", "onDemand")] not in catalog.UNCONFIRMED_QUOTA_IDS
    caps = platform_run.outputs["teams"]["nlp"]["quotaCaps"]
    marked = {cap["quotaId"] for cap in caps if cap["quotaIdUnconfirmed"]}
    assert marked == set(catalog.UNCONFIRMED_QUOTA_IDS)
    warnings = [message for level, message in platform_run.logs if level == "warning"
                and "unconfirmed by a public source" in message]
    # Once for every team (issue 45: no warning repeated per team).
    assert len(warnings) == 1 and warnings[0].startswith("teams nlp, vision: ")
    assert all("TPUV4sPodPerProjectPerRegionForTPUAPI" in w and "tpuctl preflight" in w
               for w in warnings)


def test_tpuctl_plan_fails_naming_the_refusal(capsys) -> None:
    """The plan verb (and so the pull-request check, which runs it per stack) exits 1
    and prints the resource, the identity, the permission and the fix."""
    from ops.commands.plan import print_report
    from ops.plan.offline import offline_plan

    result = offline_plan("platform")
    assert print_report(result, "markdown", None) == 0
    assert "permission proof: serviceAccount:platform-deployer@acme-ml-shared.iam." \
           "gserviceaccount.com may apply every resource" in capsys.readouterr().out
    result.run = without(result.run, "platform-deployer-act-as")
    assert print_report(result, "markdown", None) == 1
    captured = capsys.readouterr()
    assert ("gcp:tpu/v2Vm:V2Vm node-nlp-sweep-vm: serviceAccount:platform-deployer@acme-ml-"
            "shared.iam.gserviceaccount.com cannot create it: missing iam.serviceAccounts.actAs "
            "on projects/acme-ml-shared-nlp/serviceAccounts/platform-nlp-runtime@acme-ml-shared-"
            "nlp.iam.gserviceaccount.com; fix: grant roles/iam.serviceAccountUser") in captured.out
    assert "operation(s) its deployer may not do" in captured.err


def test_a_team_stack_is_proved_against_the_platform_s_grants(monkeypatch) -> None:
    """vision's deployer without networkUser on its subnets: its nodes are refused."""
    from ops.plan import proof as proof_module
    from ops.plan.mock_engine import planned_stack_run

    platform = planned_stack_run("acme/tpu-stack/platform")
    monkeypatch.setattr(proof_module, "planned_stack_run",
                        lambda _ref: without(platform, "vision-deployer-network-user"))
    proof = plan_proof(settings_for("team-vision"),
                       run_program(file_config("team-vision"), "team-vision"))
    assert {f.permission for f in proof.findings} == {"compute.subnetworks.use"}
    assert {f.on for f in proof.findings} == {
        "projects/acme-ml-shared/regions/us-central1/subnetworks/platform-tpu-vision-us-central1"}
    assert {f.resource for f in proof.findings} == {
        "gcp:tpu/v2Vm:V2Vm node-vision-trainer-vm", "gcp:tpu/v2Vm:V2Vm node-vision-eval-vm"}


def test_a_resource_type_without_a_row_is_named_as_not_proved() -> None:
    from ops.plan.proof import Proof

    applier = Applier("serviceAccount:d@p1.iam.gserviceaccount.com")
    zone = {"type": DNS_MANAGED_ZONE, "name": "t", "urn": "t",
            "inputs": {"project": "p1", "name": "t"}}
    assert prove([zone], IamModel(), applier) == []
    assert applier.unchecked == [DNS_MANAGED_ZONE]
    lines = Proof(applier.identity, [], applier.unchecked).lines()
    assert lines[-1] == ("  not proved (no row in policy/permissions.py): "
                         + DNS_MANAGED_ZONE)


# ---- the budget stop and the fallback nodes (issues 35, 36) -----------------------

BUDGET_STOP_ACCOUNT = ("projects/acme-ml-shared/serviceAccounts/platform-nlp-budget-stop@"
                       "acme-ml-shared.iam.gserviceaccount.com")
RESERVATION = "projects/acme-ml-shared/locations/us-central1-a/reservations/v5e-pool"
BUILD_ACCOUNT = ("projects/acme-ml-shared/serviceAccounts/platform-nlp-function-build@"
                 "acme-ml-shared.iam.gserviceaccount.com")


def _platform_with(change) -> dict[str, str]:
    data = file_config("platform")
    teams = json.loads(data["tpu-stack:teams"])
    change(teams)
    data["tpu-stack:teams"] = json.dumps(teams)
    return data


def _budget_stop(teams: dict) -> None:
    teams["nlp"]["budgetAction"] = "stop"


def _fallback(teams: dict) -> None:
    """nlp's `burst`: the host's reservation first (named, from nlp's project), spot next."""
    teams["nlp"]["quota"]["v5e"]["reserved"] = 8
    teams["nlp"]["nodes"].append({
        "name": "burst", "zone": "us-central1-a", "acceleratorType": "v5litepod-8",
        "provisioning": "queued", "queue": {"reservationName": RESERVATION},
        "fallback": [{"provisioning": "spot"}], "maxWait": "20m", "job": "sweep"})


@pytest.fixture(scope="module")
def budget_stop_stack() -> tuple[object, ProgramRun]:
    data = _platform_with(_budget_stop)
    return load_settings(data, "platform"), run_program(data, "platform")


@pytest.fixture(scope="module")
def fallback_stack() -> tuple[object, ProgramRun]:
    data = _platform_with(_fallback)
    # The host's v5e pool, shared with nlp's project (model/shared_reservations.py).
    shared = json.loads(data["tpu-stack:sharedReservations"])
    shared.append({"name": "v5e-pool", "owner": "acme-ml-shared",
                   "ownerProjectNumber": "123456789012", "zone": "us-central1-a",
                   "generation": "v5e", "consumers": ["acme-ml-shared-nlp"]})
    data["tpu-stack:sharedReservations"] = json.dumps(shared)
    return load_settings(data, "platform"), run_program(data, "platform")


def test_the_platform_with_a_budget_stop_is_applied_by_its_deployer(budget_stop_stack) -> None:
    settings, run = budget_stop_stack
    assert {r.type for r in run.registrations} >= {
        PUBSUB_TOPIC, PUBSUB_TOPIC_IAM_MEMBER,
        CLOUDFUNCTIONSV2_FUNCTION,
        CLOUDRUNV2_SERVICE_IAM_MEMBER}
    proof = plan_proof(settings, run)
    assert proof.findings == [], "\n".join(proof.lines())
    assert proof.unchecked == []
    assert proof.identity == PLATFORM_DEPLOYER


def test_the_platform_with_a_fallback_node_is_applied_by_its_deployer(fallback_stack) -> None:
    settings, run = fallback_stack
    [node] = run.of_type(DYNAMIC_FALLBACK_TPU)
    assert [c.get("reservation_name") for c in node.inputs["candidates"]] == [RESERVATION, None]
    proof = plan_proof(settings, run)
    assert proof.findings == [], "\n".join(proof.lines())
    assert proof.unchecked == []


def _without_host_role(role: str):
    from ops.plan import proof as proof_module

    grants = proof_module.deployer_grants
    return proof_module, "deployer_grants", lambda *a: [
        g for g in grants(*a) if not (g.resource == "projects/acme-ml-shared" and g.role == role)]


TOPIC = "gcp:pubsub/topic:Topic nlp-budget"
FUNCTION = "gcp:cloudfunctionsv2/function:Function nlp-budget-stop"


@pytest.mark.parametrize("removed, refused", [
    ("roles/pubsub.admin", {
        (TOPIC, "pubsub.topics.create", "projects/acme-ml-shared"),
        ("gcp:pubsub/topicIAMMember:TopicIAMMember nlp-budget-billing-publisher",
         "pubsub.topics.setIamPolicy", "projects/acme-ml-shared/topics/platform-nlp-budget"),
        # the controller's push subscription on that topic (issue 43)
        ("gcp:pubsub/subscription:Subscription controller-budget-nlp",
         "pubsub.subscriptions.create", "projects/acme-ml-shared")}),
    ("roles/cloudfunctions.developer", {
        (FUNCTION, "cloudfunctions.functions.create", "projects/acme-ml-shared")}),
    ("roles/run.admin", {
        ("gcp:cloudrunv2/serviceIamMember:ServiceIamMember nlp-budget-stop-invoker",
         "run.services.setIamPolicy",
         "projects/acme-ml-shared/locations/us-central1/services/platform-nlp-budget-stop")}),
    ("the budget stop's role in the folder's condition", {
        ("gcp:projects/iAMMember:IAMMember nlp-budget-stop-tpu",
         "resourcemanager.projects.setIamPolicy", "projects/acme-ml-shared-nlp")}),
    ("the bootstrap's actAs on the runtime account", {
        (FUNCTION, "iam.serviceAccounts.actAs", BUDGET_STOP_ACCOUNT)}),
    ("the bootstrap's actAs on the build account", {
        (FUNCTION, "iam.serviceAccounts.actAs", BUILD_ACCOUNT)}),
    ("the bootstrap's builder grant", {
        (FUNCTION, "cloudbuild.builds.create", "projects/acme-ml-shared"),
        (FUNCTION, "storage.objects.get", "projects/_/buckets/acme-ml-shared-platform-artifacts/"
                                          "objects/functions/budget-stop-*.zip")}),
])
def test_each_grant_the_budget_stop_needs_when_removed_is_named(
        budget_stop_stack, monkeypatch, removed, refused) -> None:
    settings, run = budget_stop_stack
    if removed.startswith("roles/"):
        monkeypatch.setattr(*_without_host_role(removed))
    elif removed.startswith("the budget stop's role"):
        listed = bootstrap.granted_in_team_projects
        monkeypatch.setattr(bootstrap, "granted_in_team_projects", lambda settings: [
            role for role in listed(settings) if not role.endswith("/platform_budget_stop")])
    else:
        monkeypatch.setattr(*_without_bootstrap_grant(removed))
    found = {(f.resource, f.permission, _glob_source(f.on))
             for f in plan_proof(settings, run).findings}
    assert refused <= found, found
    assert {f[1] for f in found} <= {p for _, p, _ in refused} | {
        # the same grant's other operations and permissions
        "pubsub.topics.update", "pubsub.topics.delete", "pubsub.topics.getIamPolicy",
        "pubsub.subscriptions.update", "pubsub.subscriptions.delete",
        "cloudfunctions.functions.update", "cloudfunctions.functions.delete",
        "run.services.getIamPolicy", "iam.roles.update", "iam.roles.delete",
        "iam.serviceAccounts.delete"}, found


def _without_bootstrap_grant(removed: str):
    """The bootstrap's grants for the functions' accounts, less the one `removed` names."""
    from ops.plan import proof as proof_module

    grants = proof_module.function_account_grants

    def dropped(grant) -> bool:
        if "builder" in removed:
            return grant.role == "roles/cloudbuild.builds.builder"
        account = BUDGET_STOP_ACCOUNT if "runtime" in removed else BUILD_ACCOUNT
        return grant.resource == account
    return proof_module, "function_account_grants", lambda *a: [
        g for g in grants(*a) if not dropped(g)]


def _glob_source(on: str) -> str:
    """The source object's name holds its content's hash."""
    head, sep, _ = on.partition("/objects/functions/budget-stop-")
    return f"{head}{sep}*.zip" if sep else on


def test_a_fallback_node_needs_act_as_each_candidate_s_subnet_and_reservation(
        fallback_stack) -> None:
    """Without actAs on nlp's runtime account, networkUser on the second candidate's
    subnet, or with a reservation of a project the stack holds none in."""
    settings, run = fallback_stack
    [node] = run.of_type(DYNAMIC_FALLBACK_TPU)
    changed = copy.deepcopy(node)
    changed.inputs["candidates"][1]["subnetwork"] = \
        "projects/other-host/regions/us-central1/subnetworks/elsewhere"
    changed.inputs["candidates"][0]["reservation_name"] = \
        "projects/elsewhere/locations/us-central1-a/reservations/r"
    kept = [r for r in without(run, "platform-deployer-act-as").registrations if r is not node]
    findings = plan_proof(settings, ProgramRun([*kept, changed], run.outputs)).findings
    mine = {(f.permission, f.on.split(" ")[0]) for f in findings
            if f.resource.endswith("node-nlp-burst-fallback") and f.identity == PLATFORM_DEPLOYER}
    assert mine == {
        ("iam.serviceAccounts.actAs", "projects/acme-ml-shared-nlp/serviceAccounts/"
         "platform-nlp-runtime@acme-ml-shared-nlp.iam.gserviceaccount.com"),
        ("compute.subnetworks.use", "projects/other-host/regions/us-central1/subnetworks/"
                                    "elsewhere"),
        ("a reservation", "projects/elsewhere"),
        # nor declared shared with nlp's project (issue 44)
        ("a shared reservation", "projects/elsewhere/locations/us-central1-a/reservations/r")}
