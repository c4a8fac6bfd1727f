"""Stack policies: labels and the chip budget."""

from __future__ import annotations

from model.pulumi_types import (
    SERVICEACCOUNT_ACCOUNT,
    SERVICEACCOUNT_IAM_BINDING,
    SERVICEACCOUNT_IAM_MEMBER,
)
from model.pulumi_types import STORAGE_BUCKET as BUCKET
from model.pulumi_types import TPU_V2_VM as V2VM

LABELS = {"stack": "prod", "managed-by": "pulumi"}


def test_required_labels_compliant_and_missing(check_stack):
    assert check_stack("required-labels", [(BUCKET, "logs", {"labels": LABELS})]) == []
    missing = check_stack("required-labels", [(BUCKET, "logs", {"labels": {"stack": "prod"}}),
                                              (V2VM, "trainer", {})])
    assert missing[0].startswith("logs is missing labels managed-by")
    assert missing[1].startswith("trainer is missing labels stack, managed-by")
    unlabelled_type = [(SERVICEACCOUNT_ACCOUNT, "sa", {})]
    assert check_stack("required-labels", unlabelled_type) == []


def test_team_label_required_once_teams_exist(check_stack):
    with_team = {**LABELS, "team": "vision"}
    messages = check_stack("required-labels", [(V2VM, "a", {"labels": with_team}),
                                               (V2VM, "b", {"labels": LABELS})])
    assert messages == ["b is missing labels team (required: stack, managed-by, team)"]


def test_required_labels_config_override(check_stack):
    config = {"requiredLabels": ["cost-center"], "teamLabel": ""}
    messages = check_stack("required-labels", [(BUCKET, "logs", {"labels": LABELS})],
                           config=config)
    assert messages == ["logs is missing labels cost-center (required: cost-center)"]


def test_max_chips(check_stack):
    v5e_8 = {"acceleratorType": "v5litepod-8"}
    v4_32 = {"acceleratorConfig": {"type": "V4", "topology": "2x2x4"}}
    assert check_stack("tpu-max-chips", [(V2VM, "a", v5e_8), (V2VM, "b", v5e_8)],
                       stack="dev", environment="dev") == []
    too_many = check_stack("tpu-max-chips", [(V2VM, "a", v5e_8), (V2VM, "b", v4_32)],
                           stack="dev", environment="dev", config={"maxChips": {"dev": 16}})
    assert too_many == [("stack 'dev' asks for 24 TPU chips; the limit is 16 "
                        "(policy config tpu-max-chips.maxChips)")]
    assert check_stack("tpu-max-chips", [(V2VM, "a", {})], config={"maxChips": {"*": 4}}) == [], \
        "no type: the provider's v2-8, 4 chips"
    assert check_stack("tpu-max-chips", [(V2VM, "a", {})], config={"maxChips": {"*": 3}})
    assert check_stack("tpu-max-chips", [(BUCKET, "logs", {})]) == []
    patterns = {"maxChips": {"team-*": 8, "team-nlp": 16, "*": 4}}
    assert check_stack("tpu-max-chips", [(V2VM, "a", v5e_8)], stack="team-vision",
                       config=patterns) == []
    assert check_stack("tpu-max-chips", [(V2VM, "a", v5e_8)], stack="other", config=patterns)


def test_max_chips_by_environment_unless_the_stack_has_its_own_limit(check_stack):
    v4_32 = {"acceleratorConfig": {"type": "V4", "topology": "2x2x4"}}
    limits = {"maxChips": {"dev": 8, "prod": 64, "big": 16}}
    assert check_stack("tpu-max-chips", [(V2VM, "a", v4_32)], stack="t12", environment="dev",
                       config=limits) == [("stack 't12' asks for 16 TPU chips; the limit is 8 "
                                           "(policy config tpu-max-chips.maxChips)")]
    assert check_stack("tpu-max-chips", [(V2VM, "a", v4_32)], stack="dev", config=limits) == []
    assert check_stack("tpu-max-chips", [(V2VM, "a", v4_32)], stack="big", environment="dev",
                       config=limits) == []


SA_BINDING = SERVICEACCOUNT_IAM_BINDING
SA_MEMBER = SERVICEACCOUNT_IAM_MEMBER
ACCOUNT = "projects/p/serviceAccounts/runtime@p.iam.gserviceaccount.com"


def test_no_binding_beside_a_member_of_the_same_role_and_resource(check_stack):
    binding = (SA_BINDING, "members-act-as", {"serviceAccountId": ACCOUNT,
                                               "role": "roles/iam.serviceAccountUser",
                                               "members": ["group:ml@acme.example"]})
    member = (SA_MEMBER, "deployer-act-as", {"serviceAccountId": ACCOUNT,
                                              "role": "roles/iam.serviceAccountUser",
                                              "member": "serviceAccount:d@p.iam"})
    assert check_stack("no-binding-beside-member", [binding, member]) == [
        f"roles/iam.serviceAccountUser on {ACCOUNT} is granted by an IAMBinding and an "
        "IAMMember: the binding is authoritative and removes the member's grant; use "
        "IAMMember for every grant of that role"]
    other_role = (member[0], member[1], {**member[2], "role": "roles/iam.serviceAccountAdmin"})
    assert check_stack("no-binding-beside-member", [binding, other_role]) == []
    other_account = (member[0], member[1], {**member[2], "serviceAccountId": ACCOUNT + "x"})
    assert check_stack("no-binding-beside-member", [binding, other_account]) == []


def test_the_shipped_stacks_never_bind_beside_a_member(check_stack):
    """Every IAM grant of the repo's stacks and a three-team platform, through the rule."""
    from components.stack_config import file_config
    from ops.plan.mock_engine import run_program
    from tests.infra.stack_fixtures import as_cli
    from tests.test_teams import platform, spot, team

    runs = [run_program(file_config(stack), stack)
            for stack in ("dev", "prod", "platform", "team-vision")]
    teams = {name: team(name, spot(), ci={"githubRepository": "acme/m", "githubRepositoryId": "1",
                                          "githubRepositoryOwnerId": "2"})
             for name in ("vision", "nlp", "speech")}
    runs.append(run_program(as_cli(platform(**teams)), "shared"))
    for run in runs:
        resources = [(r.type, r.name, r.inputs) for r in run.registrations]
        assert any("iammember" in t.lower() for t, _, _ in resources)
        assert check_stack("no-binding-beside-member", resources) == []
