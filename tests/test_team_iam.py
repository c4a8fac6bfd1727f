"""Trust boundaries GCP enforces, shown by the IAM evaluator (policy/iam.py) on the
plans of the repo's stacks: teams cannot touch each other's nodes, data, accounts
or quota, and no deployer can make itself owner (issue 19, docs/teams.md)."""

from __future__ import annotations

import copy
import ipaddress
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from components.network import IAP_SOURCE_RANGE
from components.stack_config import file_config
from model import catalog
from model.pulumi_types import (
    CLOUDQUOTA_S_QUOTA_PREFERENCE,
    COMPUTE_SUBNETWORK,
    DYNAMIC_QUEUED_TPU,
    FOLDER_IAM_MEMBER,
    PROJECTS_IAM_MEMBER,
    PULUMI_STACK_REFERENCE,
    STORAGE_BUCKET,
    STORAGE_BUCKET_IAM_MEMBER,
    STORAGE_BUCKET_OBJECT,
    TPU_V2_VM,
)
from model.roles import DEPLOYER_ROLES
from ops.plan.mock_engine import ProgramRun, Registration, run_program
from policy.firewall import Endpoint, Rule, admits, rules_of
from policy.iam import IamModel, predefined_roles
from tests.infra.stack_fixtures import as_cli
from tests.test_teams import platform, pod, spot, team

V2VM = TPU_V2_VM
QUEUED_TPU = DYNAMIC_QUEUED_TPU
BUCKET = STORAGE_BUCKET
QUOTA_PREFERENCE = CLOUDQUOTA_S_QUOTA_PREFERENCE
NODE_PERMISSIONS = ("tpu.nodes.update", "tpu.nodes.delete")
BUCKET_PERMISSIONS = ("storage.objects.get", "storage.objects.create")
QUOTA_PERMISSIONS = ("cloudquotas.quotas.update", "serviceusage.quotas.update")
# Roles no deployer may hand out, and a sample of powerful ones besides.
ESCALATION_ROLES = ("roles/owner", "roles/editor", "roles/iam.serviceAccountAdmin",
                    "roles/resourcemanager.projectIamAdmin", "roles/storage.admin",
                    "roles/iam.serviceAccountTokenCreator", "roles/cloudquotas.admin")
CI = {"githubRepository": "acme/models", "githubRepositoryId": "1", "githubRepositoryOwnerId": "2"}
STATE = "acme-pulumi-state"  # a shared gs:// backend


@dataclass
class Team:
    """A team's principals and the resources that are its own, from the plans."""

    name: str
    principals: dict[str, str] = field(default_factory=dict)  # what → principal
    resources: set[str] = field(default_factory=set)
    project: str | None = None


def node_name(r: Registration) -> str:
    node_id = r.inputs.get("name") or r.inputs["node_id"]  # a V2Vm, or a queued node
    return f"projects/{r.inputs['project']}/locations/{r.inputs['zone']}/nodes/{node_id}"


def account_name(email: str) -> str:
    return f"projects/{email.split('@')[1].split('.')[0]}/serviceAccounts/{email}"


def teams_of(runs: list[ProgramRun]) -> dict[str, Team]:
    """Every team of the platform run (the first): members, runtime account and
    deployer, with the nodes and buckets labelled with its name, its accounts and
    its project."""
    platform_outputs = runs[0].outputs
    team_stacks = {run.outputs["team"]: run.outputs for run in runs[1:]}
    teams: dict[str, Team] = {}
    for name, entry in platform_outputs["teams"].items():
        t = teams[name] = Team(name)
        for index, member in enumerate(entry["members"]):
            t.principals[f"member {index}"] = member
        runtime = entry.get("serviceAccount") or team_stacks[name]["runtimeServiceAccount"]
        t.principals["runtime"] = f"serviceAccount:{runtime}"
        t.resources.add(account_name(runtime))
        assert "deployer" in entry or "nodes" in entry, (
            f"team {name} deploys from its own stack without a deployer the platform declares")
        if "deployer" in entry:
            deployer = entry["deployer"]["serviceAccount"]
            t.principals["deployer"] = f"serviceAccount:{deployer}"
            t.resources.add(account_name(deployer))
        t.project = f"projects/{entry['projectId']}" if "projectId" in entry else None
    for run in runs:
        for r in run.of_type(V2VM) + run.of_type(QUEUED_TPU):
            teams[r.inputs["labels"]["team"]].resources.add(node_name(r))
        for r in run.of_type(BUCKET):
            if r.inputs["labels"]["team"] in teams:
                teams[r.inputs["labels"]["team"]].resources.add(f"projects/_/buckets/"
                                                                f"{r.inputs['name']}")
    return teams


def crossings(model: IamModel, teams: dict[str, Team]) -> list[tuple[str, str, str, str]]:
    """(team, principal, permission, resource of another team) that IAM would allow."""
    found = []
    for a, b in itertools.permutations(teams.values(), 2):
        targets = set(b.resources)
        if b.project and b.project != a.project:
            targets.add(b.project)
        for what, principal in a.principals.items():
            for resource in sorted(targets):
                for permission in _permissions(resource):
                    if model.can(principal, permission, resource):
                        found.append((a.name, what, permission, resource))
                if any(model.can_grant(principal, role, resource) for role in ESCALATION_ROLES):
                    found.append((a.name, what, "setIamPolicy", resource))
    return found


def _permissions(resource: str) -> tuple[str, ...]:
    if "/nodes/" in resource:
        return NODE_PERMISSIONS
    if "/buckets/" in resource:
        return BUCKET_PERMISSIONS
    if "/serviceAccounts/" in resource:
        return ("iam.serviceAccounts.actAs", "iam.serviceAccounts.getAccessToken")
    return NODE_PERMISSIONS + BUCKET_PERMISSIONS + QUOTA_PERMISSIONS


@pytest.fixture(scope="module")
def repo_runs() -> list[ProgramRun]:
    """This repo's platform stack (nlp's nodes) and vision's own team stack."""
    return [run_program(file_config(stack), stack) for stack in ("platform", "team-vision")]


def three_teams_config() -> dict[str, str]:
    """A platform that declares three teams' nodes, each team with a deployer."""
    teams = {name: team(name, spot(), pod(), ci=CI) for name in ("vision", "nlp", "speech")}
    teams["vision"]["nodes"].append(spot("queue", provisioning="queued", queue={"spot": True}))
    data = platform(**teams)
    data["tpu-stack:quota"] = {"v5e": {"us-central1": {"preemptible": 64}},
                               "v4": {"us-central2": {"onDemand": 64}}}
    data["tpu-stack:teamProjects"] = {**data["tpu-stack:teamProjects"], "stateBucket": STATE}
    return as_cli(data)


@pytest.fixture(scope="module")
def three_teams() -> ProgramRun:
    return run_program(three_teams_config(), "shared")


def of_resources(resources: Any) -> IamModel:
    """The model of plan resources and the custom roles the bootstrap makes outside every
    plan (model/bootstrap.py custom_roles: the platform's and three_teams')."""
    from components.stack_config import settings_for
    from model.bootstrap import custom_roles
    from model.settings.load import load_settings

    model = IamModel.of(resources)
    for settings in (settings_for("platform"), load_settings(three_teams_config(), "shared")):
        model.custom_roles.update({r.name: frozenset(r.permissions)
                                   for r in custom_roles(settings)})
    return model


def model_of(runs: list[ProgramRun]) -> IamModel:
    return of_resources(r for run in runs for r in run.registrations)


# ---- teams cannot touch each other ------------------------------------------------

def test_no_principal_of_a_team_reaches_another_team_in_the_repo_stacks(repo_runs) -> None:
    teams = teams_of(repo_runs)
    assert set(teams) == {"vision", "nlp"}
    assert crossings(model_of(repo_runs), teams) == []


def test_no_principal_of_a_team_reaches_another_of_three(three_teams) -> None:
    teams = teams_of([three_teams])
    assert all("deployer" in t.principals for t in teams.values())
    # A queued node is in its team's project like the others.
    assert "projects/acme-ml-test-vision/locations/us-central1-a/nodes/shared-vision-queue" in (
        teams["vision"].resources)
    assert crossings(model_of([three_teams]), teams) == []


def test_each_team_has_a_project_of_its_own(repo_runs) -> None:
    """Made by the bootstrap step in the folder (not in the plan: test_teams.py)."""
    teams = teams_of(repo_runs)
    model = model_of(repo_runs)
    projects = {t.project for t in teams.values()}
    assert len(projects) == len(teams) and None not in projects
    assert "projects/acme-ml-shared" not in projects
    for t in teams.values():
        for resource in t.resources:
            assert model.project_of(resource) == t.project, resource


def test_the_isolation_check_catches_a_leaked_grant(three_teams) -> None:
    """The check can fail: nlp's deployer given TPU Admin on vision's project."""
    teams = teams_of([three_teams])
    leak = copy.deepcopy(three_teams.of_type(PROJECTS_IAM_MEMBER)[0])
    leak.inputs.update(project=teams["vision"].project.removeprefix("projects/"),
                       role="roles/tpu.admin", member=teams["nlp"].principals["deployer"])
    leak.inputs.pop("condition", None)
    leaky = of_resources([*three_teams.registrations, leak])
    found = crossings(leaky, teams)
    assert ("nlp", "deployer", "tpu.nodes.update") in {f[:3] for f in found}
    assert {f[3] for f in found} >= {r for r in teams["vision"].resources if "/nodes/" in r}


# ---- networks teams cannot cross ---------------------------------------------------

# What a node listens on: TF's gRPC worker and coordinator ports, SSH, everything.
PROBES = [("tcp", 22), ("tcp", 8470), ("tcp", 8476), ("tcp", 2222), ("tcp", 65535),
          ("udp", 8472), ("icmp", 0)]


def subnet_ranges(runs: list[ProgramRun]) -> dict[str, str]:
    """Subnetwork id (projects/<p>/regions/<r>/subnetworks/<name>) → its range."""
    return {f"projects/{r.inputs['project']}/regions/{r.inputs['region']}/subnetworks/"
            f"{r.inputs['name']}": r.inputs["ipCidrRange"]
            for run in runs for r in run.of_type(COMPUTE_SUBNETWORK)}


def node_endpoints(runs: list[ProgramRun]) -> dict[str, tuple[str, Endpoint]]:
    """node id → (team, where it sits on the network), from V2Vms and queued nodes;
    a node's address range is the subnet it names (a team's own)."""
    subnets = subnet_ranges(runs)
    nodes = {}
    for run in runs:
        for r in run.of_type(V2VM) + run.of_type(QUEUED_TPU):
            queued = r.type == QUEUED_TPU
            network = r.inputs["network"] if queued else r.inputs["networkConfig"]["network"]
            subnet = (r.inputs["subnetwork"] if queued
                      else r.inputs["networkConfig"]["subnetwork"])
            account = (r.inputs["service_account_email"] if queued
                       else r.inputs["serviceAccount"]["email"])
            node_id = r.inputs["node_id"] if queued else r.inputs["name"]
            nodes[node_id] = (r.inputs["labels"]["team"], Endpoint(
                node_id, network, subnets[subnet], account,
                frozenset(r.inputs.get("tags") or ())))
    return nodes


def test_each_team_s_nodes_sit_on_its_own_subnets_only(repo_runs, three_teams) -> None:
    for runs in (repo_runs, [three_teams]):
        nodes = node_endpoints(runs)
        by_team: dict[str, set[str]] = {}
        for owner, node in nodes.values():
            by_team.setdefault(owner, set()).add(node.cidr)
        for a, b in itertools.permutations(by_team, 2):
            assert not any(ipaddress.ip_network(x).overlaps(ipaddress.ip_network(y))
                           for x in by_team[a] for y in by_team[b]), (a, b)


def network_crossings(runs: list[ProgramRun]) -> list[tuple[str, str, str, int]]:
    """(from node, to node, protocol, port) the firewall admits between teams."""
    rules = rules_of(r for run in runs for r in run.registrations)
    nodes = node_endpoints(runs)
    return [(a.name, b.name, protocol, port)
            for (team_a, a), (team_b, b) in itertools.permutations(nodes.values(), 2)
            if team_a != team_b for protocol, port in PROBES if admits(rules, a, b, protocol, port)]


def test_no_node_of_a_team_reaches_a_node_of_another(repo_runs, three_teams) -> None:
    for runs in (repo_runs, [three_teams]):
        nodes = node_endpoints(runs)
        assert len({owner for owner, _ in nodes.values()}) >= 2
        assert network_crossings(runs) == []


def test_a_team_s_nodes_reach_each_other_and_iap_reaches_ssh_only(three_teams) -> None:
    rules = rules_of(three_teams.registrations)
    nodes = node_endpoints([three_teams])
    vision = [e for owner, e in nodes.values() if owner == "vision"]
    assert len(vision) == 3  # a spot node, a v4 pod and a queued node
    for a, b in itertools.permutations(vision, 2):
        assert all(admits(rules, a, b, protocol, port) for protocol, port in PROBES), (a, b)
    iap = Endpoint("iap", None, IAP_SOURCE_RANGE)
    for _, node in nodes.values():
        assert admits(rules, iap, node, "tcp", 22)
        assert not admits(rules, iap, node, "tcp", 8470)


def test_a_forged_tag_opens_nothing(repo_runs, three_teams) -> None:
    """A team deployer sets any tag on its own node (tpu.nodes.update): every node of
    every team carrying every tag there is still reaches no other team's node."""
    for runs in (repo_runs, [three_teams]):
        rules = rules_of(r for run in runs for r in run.registrations)
        nodes = node_endpoints(runs)
        every_tag = frozenset(tag for _, e in nodes.values() for tag in e.tags) | {"anything"}
        forged = [(owner, node.forging(every_tag)) for owner, node in nodes.values()]
        assert all(node.tags >= every_tag for _, node in forged)
        for (team_a, a), (team_b, b) in itertools.permutations(forged, 2):
            if team_a != team_b:
                assert not any(admits(rules, a, b, p, n) for p, n in PROBES), (a.name, b.name)


def test_a_pod_slice_s_workers_reach_each_other_on_every_port(three_teams) -> None:
    """A multi-host node's workers share its subnet: TF's gRPC server (8470), the
    coordination service and every other port the job opens are admitted between them."""
    rules = rules_of(three_teams.registrations)
    nodes = node_endpoints([three_teams])
    for _, node in nodes.values():
        workers = [Endpoint(f"{node.name}-w{i}", node.network, node.cidr, node.account,
                            node.tags) for i in range(4)]
        for a, b in itertools.permutations(workers, 2):
            assert all(admits(rules, a, b, protocol, port) for protocol, port in PROBES)
            assert admits(rules, a, b, "tcp", 1024) and admits(rules, a, b, "tcp", 49152)


def test_the_network_check_catches_a_rule_open_to_every_subnet(three_teams) -> None:
    """The check can fail: the shape main had, a subnet-range source to the node tag."""
    nodes = node_endpoints([three_teams])
    tag = next(iter(next(iter(nodes.values()))[1].tags))
    network = next(iter(nodes.values()))[1].network
    wide = Rule.of("wide", {"network": network, "sourceRanges": ["10.0.0.0/8"],
                            "targetTags": [tag], "allows": [{"protocol": "tcp"}]})
    rules = [*rules_of(three_teams.registrations), wide]
    crossings = [(a.name, b.name) for (ta, a), (tb, b) in itertools.permutations(nodes.values(), 2)
                 if ta != tb and admits(rules, a, b, "tcp", 8470)]
    pairs = [1 for (ta, _), (tb, _) in itertools.permutations(nodes.values(), 2) if ta != tb]
    assert len(crossings) == len(pairs) == 32  # every pair of nodes of different teams


# ---- state no other team can touch ----------------------------------------------------

def state_files(stack: str) -> list[str]:
    """Objects the DIY backend writes for a stack (pulumi/pulumi pkg/backend/diy): the
    checkpoint (plain, gzip, zstd) and its .bak, the tags file (stack_tags.go), history,
    backups, journal and locks."""
    base = f"projects/_/buckets/{STATE}/objects/.pulumi"
    stacks = f"{base}/stacks/tpu-stack/{stack}"
    return [f"{stacks}.json", f"{stacks}.json.bak", f"{stacks}.json.gz", f"{stacks}.json.gz.bak",
            f"{stacks}.json.zst", f"{stacks}.pulumi-tags",
            f"{base}/history/tpu-stack/{stack}/{stack}-1.history.json",
            f"{base}/history/tpu-stack/{stack}/{stack}-1.checkpoint.json",
            f"{base}/backups/tpu-stack/{stack}/{stack}.1.json",
            f"{base}/journal/tpu-stack/{stack}/000001.json",
            f"{base}/locks/organization/tpu-stack/{stack}/abc.json"]


WRITES = ("storage.objects.create", "storage.objects.delete", "storage.objects.update")


def test_a_team_writes_its_own_state_only_and_reads_its_outputs_object(three_teams) -> None:
    model = model_of([three_teams])
    teams = teams_of([three_teams])
    platform_file = f"projects/_/buckets/{STATE}/objects/.pulumi/stacks/tpu-stack/shared.json"
    for a, b in itertools.permutations(teams.values(), 2):
        deployer, preview = a.principals["deployer"], f"serviceAccount:shared-{a.name}-preview@"
        for obj in state_files(f"team-{a.name}"):
            assert all(model.can(deployer, w, obj) for w in WRITES), obj
            assert model.can(deployer, "storage.objects.get", obj)
        for obj in [*state_files(f"team-{b.name}"), *state_files("shared")]:
            assert not any(model.can(deployer, w, obj) for w in WRITES), (a.name, obj)
        for obj in state_files(f"team-{b.name}"):
            assert not model.can(deployer, "storage.objects.get", obj), (a.name, obj)
        # Not the platform's stack file: the outputs object the platform writes for it.
        assert not model.can(deployer, "storage.objects.get", platform_file)
        assert model.can(deployer, "storage.objects.get", f"projects/_/buckets/{STATE}/objects/"
                         f"tpu-stack/platform-outputs/shared/{a.name}.json")
        assert model.can(deployer, "storage.objects.list", f"projects/_/buckets/{STATE}")
        # A stack named like the team's as a prefix is another stack.
        assert not model.can(deployer, "storage.objects.create",
                             platform_file.replace("shared.json", f"team-{a.name}x.json"))
        previews = [p for p in {m for bs in model.bindings.values() for bd in bs
                                for m in bd.members} if p.startswith(preview)]
        assert len(previews) == 1
        for obj in state_files(f"team-{a.name}"):
            assert not any(model.can(previews[0], w, obj) for w in WRITES)


def test_a_team_s_state_grants_reach_nothing_of_another_stack(three_teams) -> None:
    """Not a stack whose name starts like the team's (stack names may hold dots), not the
    legacy layout's path, not the platform's tags, history or locks, not meta.yaml."""
    model = model_of([three_teams])
    deployer = teams_of([three_teams])["vision"].principals["deployer"]
    base = f"projects/_/buckets/{STATE}/objects/.pulumi"
    others = [*state_files("team-vision.json.x"), *state_files("team-vision-2"),
              *state_files("shared"), f"{base}/stacks/team-vision.json",  # legacy layout
              f"{base}/stacks/other-project/team-vision.json", f"{base}/meta.yaml",
              f"{base}/history/tpu-stack/team-vision-2/x.json"]
    for obj in others:
        assert not any(model.can(deployer, w, obj) for w in WRITES), obj
    for obj in state_files("team-vision"):
        assert all(model.can(deployer, w, obj) for w in WRITES), obj


def test_the_state_check_catches_a_bucket_wide_grant(three_teams) -> None:
    """The check can fail: the shape main had, objectUser on the whole state bucket."""
    teams = teams_of([three_teams])
    leak = {"type": STORAGE_BUCKET_IAM_MEMBER,
            "inputs": {"bucket": STATE, "role": "roles/storage.objectUser",
                       "member": teams["nlp"].principals["deployer"]}}
    model = of_resources([*three_teams.registrations, leak])
    assert model.can(teams["nlp"].principals["deployer"], "storage.objects.create",
                     state_files("team-vision")[0])


# ---- quota in the team's own project ---------------------------------------------

def test_a_team_s_tpu_quota_is_capped_in_its_project(repo_runs) -> None:
    preferences = {(p.inputs["parent"], p.inputs["quotaId"], p.inputs["dimensions"]["region"]):
                   p.inputs["quotaConfig"]["preferredValue"]
                   for p in repo_runs[0].of_type(QUOTA_PREFERENCE)}
    vision, nlp = "projects/acme-ml-shared-vision", "projects/acme-ml-shared-nlp"
    v5e_spot = "TPUV5sPreemptibleLitepodPerProjectPerRegionForTPUAPI"
    v5e_on_demand = "TPUV5sLitepodPerProjectPerRegionForTPUAPI"
    assert preferences[(vision, v5e_spot, "us-central1")] == "64"
    assert preferences[(vision, v5e_on_demand, "us-central1")] == "16"
    # A family the team has no quota in is capped at zero, not left at GCP's default.
    assert preferences[(vision, "TPUV4sPodPerProjectPerRegionForTPUAPI", "us-central1")] == "0"
    # Only in the team's regions (teams.vision.regions: [us-central1]; issue 45).
    assert {region for parent, _, region in preferences if parent == vision} == {"us-central1"}
    # Reserved nodes draw on on-demand quota (docs/teams.md, "Quota").
    assert preferences[(nlp, "TPUV4sPodPerProjectPerRegionForTPUAPI", "us-central2")] == "32"
    assert preferences[(nlp, v5e_spot, "us-central1")] == "16"
    assert {parent for parent, _, _ in preferences} == {vision, nlp}
    # An increase is a request Google answers: it needs a contact.
    assert {p.inputs["contactEmail"] for p in repo_runs[0].of_type(QUOTA_PREFERENCE)} == {
        "ml-platform@acme.example"}


def test_every_family_in_every_region_of_a_team_is_capped(repo_runs, three_teams) -> None:
    """Families and regions outside tpu-stack:quota get a cap of 0, not GCP's default:
    a team deployer holds tpu.admin in its project and networkUser on its own subnet in
    every region of the team (model/team_regions.py), where its caps are."""
    for run in (repo_runs[0], three_teams):
        for name, entry in run.outputs["teams"].items():
            regions = set(entry["subnets"])
            parent = f"projects/{entry['projectId']}"
            capped = {(p.inputs["quotaId"], p.inputs["dimensions"]["region"])
                      for p in run.of_type(QUOTA_PREFERENCE) if p.inputs["parent"] == parent}
            expected = {(quota_id, region) for quota_id in catalog.TPU_QUOTA_IDS.values()
                        for region in regions}
            assert capped == expected, name
            families = {family for family, _ in catalog.TPU_QUOTA_IDS}
            assert families == set(catalog.GENERATIONS)
    preferences = {(p.inputs["parent"], p.inputs["quotaId"], p.inputs["dimensions"]["region"]):
                   p.inputs["quotaConfig"]["preferredValue"]
                   for p in repo_runs[0].of_type(QUOTA_PREFERENCE)}
    # v6e, granted nowhere by the platform, is 0 in both of nlp's regions.
    for region in ("us-central1", "us-central2"):
        assert preferences[("projects/acme-ml-shared-nlp",
                            "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI", region)] == "0"
    # v5e is granted in us-central1 only: 0 in us-central2.
    assert preferences[("projects/acme-ml-shared-nlp",
                        "TPUV5sPreemptibleLitepodPerProjectPerRegionForTPUAPI",
                        "us-central2")] == "0"


def test_every_cap_skips_the_decrease_percentage_check_and_says_why(repo_runs) -> None:
    """Cloud Quotas refuses a decrease of more than 10% unless
    QUOTA_DECREASE_PERCENTAGE_TOO_HIGH is skipped (QuotaSafetyCheck)."""
    preferences = repo_runs[0].of_type(QUOTA_PREFERENCE)
    assert preferences
    for p in preferences:
        assert p.inputs["ignoreSafetyChecks"] == "QUOTA_DECREASE_PERCENTAGE_TOO_HIGH", p.name
    caps = repo_runs[0].outputs["teams"]["vision"]["quotaCaps"]
    assert len(caps) == len([p for p in preferences
                             if p.inputs["parent"] == "projects/acme-ml-shared-vision"])
    assert all("more than 10%" in cap["why"] for cap in caps)


def test_no_team_principal_can_raise_quota_or_grant_outside_its_team(repo_runs) -> None:
    model = model_of(repo_runs)
    teams = teams_of(repo_runs)
    everything = {name for names in (model.parents, model.bindings) for name in names}
    everything |= {p for name in list(everything) for p in model.ancestry(name)}
    for t in teams.values():
        for what, principal in t.principals.items():
            for permission in QUOTA_PERMISSIONS:
                assert not model.can(principal, permission, t.project), (t.name, what)
            for resource in sorted(everything - t.resources - {t.project}):
                for role in (*ESCALATION_ROLES, *predefined_roles()):
                    assert not model.can_grant(principal, role, resource), (
                        t.name, what, role, resource)
            # Nor in its own project: IAM there is the platform's.
            assert not model.can_grant(principal, "roles/owner", t.project)


def test_a_team_deployer_deploys_its_team_only(repo_runs) -> None:
    """What the team stack needs: nodes and buckets in its project, the platform's
    subnets, acting as its runtime account."""
    model = model_of(repo_runs)
    vision = teams_of(repo_runs)["vision"]
    deployer = vision.principals["deployer"]
    nodes = [r for r in vision.resources if "/nodes/" in r]
    assert nodes and all(model.can(deployer, "tpu.nodes.update", n) for n in nodes)
    assert model.can(deployer, "storage.buckets.create", vision.project)
    runtime = account_name(vision.principals["runtime"].removeprefix("serviceAccount:"))
    assert model.can(deployer, "iam.serviceAccounts.actAs", runtime)
    own = [s for s in model.kinds("subnetworks") if "-tpu-vision-" in s]
    others = [s for s in model.kinds("subnetworks") if s not in own]
    # vision's 1 region (teams.vision.regions), the platform's 2, nlp's 2.
    assert len(own) == 1 and len(others) == 4
    assert all(model.can(deployer, "compute.subnetworks.use", s) for s in own)
    # Subnets are what no team can forge: nobody of vision may use another's.
    for principal in vision.principals.values():
        assert not any(model.can(principal, "compute.subnetworks.use", s) for s in others)
    assert not model.can(deployer, "compute.subnetworks.use", "projects/acme-ml-shared")


# ---- the platform deployer, bounded by the bootstrap ----------------------------------

PLATFORM_DEPLOYER = "serviceAccount:platform-deployer@acme-ml-shared.iam.gserviceaccount.com"


def bootstrap_grants(stack: str = "platform") -> list[dict[str, Any]]:
    """The bootstrap's folder grants to the platform deployer, as plan resources
    (model/bootstrap.py: outside every plan, so added here)."""
    from components.stack_config import settings_for
    from model.bootstrap import deployer_grants

    settings = settings_for(stack)
    email = PLATFORM_DEPLOYER.removeprefix("serviceAccount:")
    return [{"type": FOLDER_IAM_MEMBER,
             "inputs": {"folder": grant.resource, "role": grant.role, "member": grant.member,
                        **({"condition": {"expression": grant.condition}}
                           if grant.condition else {})}}
            for grant in deployer_grants(settings, email) if grant.resource.startswith("folders/")]


def test_the_platform_deployer_makes_no_project_and_grants_only_team_roles(repo_runs) -> None:
    model = of_resources([*(r for run in repo_runs for r in run.registrations),
                          *bootstrap_grants()])
    teams = teams_of(repo_runs)
    folder = "folders/246813579024"
    for t in teams.values():
        model.parents[t.project] = folder  # the bootstrap made it there
    assert not model.can(PLATFORM_DEPLOYER, "resourcemanager.projects.create", folder)
    for t in teams.values():
        assert model.can(PLATFORM_DEPLOYER, "cloudquotas.quotas.update", t.project)
        assert model.can_grant(PLATFORM_DEPLOYER, "roles/tpu.viewer", t.project)
        for role in ("roles/owner", "roles/editor", "roles/resourcemanager.projectIamAdmin",
                     "roles/iam.serviceAccountTokenCreator", "roles/cloudquotas.admin"):
            assert not model.can_grant(PLATFORM_DEPLOYER, role, t.project), (t.name, role)
    # Its folder grants give no team principal anything of another team.
    assert crossings(model, teams) == []


# ---- a deployer that is not owner -----------------------------------------------------

@pytest.fixture(scope="module")
def prod() -> tuple[IamModel, dict[str, Any]]:
    run = run_program(file_config("prod"), "prod")
    return model_of([run]), run.outputs


def test_the_ci_deployer_cannot_grant_owner_editor_or_any_unlisted_role(prod) -> None:
    model, outputs = prod
    deployer = f"serviceAccount:{outputs['ciDeployerServiceAccount']}"
    project = "projects/acme-ml-prod"
    for role in ("roles/owner", "roles/editor", *DEPLOYER_ROLES, "roles/iam.roleAdmin",
                 "roles/iam.workloadIdentityPoolAdmin", "roles/storage.admin"):
        assert not model.can_grant(deployer, role, project), role
    # Exactly the roles the stack grants (the runtime account's and the preview's).
    allowed = [r for r in predefined_roles() if model.can_grant(deployer, r, project)]
    assert sorted(allowed) == ["roles/browser", "roles/logging.logWriter",
                               "roles/monitoring.metricWriter", "roles/tpu.viewer"]
    assert not model.can(deployer, "resourcemanager.projects.setIamPolicy", project,
                         ["roles/tpu.viewer", "roles/owner"])  # one bad role spoils a request


def test_the_ci_deployer_administers_and_acts_as_the_runtime_account_only(prod) -> None:
    model, outputs = prod
    deployer = f"serviceAccount:{outputs['ciDeployerServiceAccount']}"
    runtime = account_name(outputs["runtimeServiceAccount"])
    assert model.can(deployer, "iam.serviceAccounts.actAs", runtime)
    assert model.can(deployer, "iam.serviceAccounts.setIamPolicy", runtime)
    others = [account_name(outputs["ciDeployerServiceAccount"]),
              account_name(outputs["ciPreviewServiceAccount"]),
              # The Compute Engine default account (Editor in many projects).
              "projects/acme-ml-prod/serviceAccounts/"
              "123456789012-compute@developer.gserviceaccount.com"]
    for account in others:
        for permission in ("iam.serviceAccounts.actAs", "iam.serviceAccounts.setIamPolicy"):
            assert not model.can(deployer, permission, account), (permission, account)
    assert not model.can(deployer, "iam.roles.update", "projects/acme-ml-prod")
    assert not model.can(deployer, "iam.workloadIdentityPoolProviders.update",
                         "projects/acme-ml-prod")


def test_every_role_the_stacks_grant_is_named_and_in_the_table(repo_runs, prod) -> None:
    table = set(predefined_roles())
    for model in (model_of([*repo_runs, run_program(file_config("dev"), "dev")]), prod[0]):
        assert not model.unresolved, model.unresolved  # a grant whose role is unknown
        assert model.roles() - set(model.custom_roles) <= table


def test_settings_name_the_project_each_planned_node_is_in(repo_runs) -> None:
    """What tpuctl needs to find nodes: settings.node_project agrees with the plan."""
    from model.settings.load import load_settings

    for stack, run in zip(("platform", "team-vision"), repo_runs, strict=True):
        settings = load_settings(file_config(stack), stack)
        expected = {(settings.naming.tpu_node(node.name, team), settings.node_project(team))
                    for team, node in settings.named_nodes}
        planned = {(r.inputs.get("name") or r.inputs["node_id"], r.inputs["project"])
                   for r in run.of_type(V2VM) + run.of_type(QUEUED_TPU)}
        assert planned == expected and planned, stack


def test_a_team_reads_its_own_outputs_object_never_the_platform_s_stack_file(
        repo_runs) -> None:
    """Finding 10: the platform writes one object per team into the state bucket; the
    team stack reads its own there (no StackReference), and no team principal may read
    the platform's stack file (every team's members, deployers and nodes) or another
    team's object."""
    platform, vision_stack = repo_runs
    assert not vision_stack.of_type(PULUMI_STACK_REFERENCE)
    objects = {r.inputs["name"]: json.loads(r.inputs["content"])
               for r in platform.of_type(STORAGE_BUCKET_OBJECT)
               if r.inputs["bucket"] == "acme-pulumi-state"}
    assert set(objects) == {"tpu-stack/platform-outputs/platform/vision.json",
                            "tpu-stack/platform-outputs/platform/nlp.json"}
    assert set(objects["tpu-stack/platform-outputs/platform/vision.json"]["teams"]) == {"vision"}
    model = model_of(repo_runs)
    teams = teams_of(repo_runs)
    base = "projects/_/buckets/acme-pulumi-state/objects/"
    for name, t in teams.items():
        other = next(o for o in teams if o != name)
        for principal in t.principals.values():
            for suffix in ("json", "json.gz", "json.bak", "pulumi-tags"):
                assert not model.can(principal, "storage.objects.get",
                                     f"{base}.pulumi/stacks/tpu-stack/platform.{suffix}")
            assert not model.can(principal, "storage.objects.get",
                                 f"{base}tpu-stack/platform-outputs/platform/{other}.json")
        if "deployer" in t.principals:
            assert model.can(t.principals["deployer"], "storage.objects.get",
                             f"{base}tpu-stack/platform-outputs/platform/{name}.json")
