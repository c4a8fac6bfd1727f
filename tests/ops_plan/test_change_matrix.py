"""The change matrix: dev, prod and the platform stack planned before and after each
routine change, and the engine's steps the preview predicts (ops/plan/steps.py).

Only the rows that change a node's own immutable fields (runtime, accelerator type,
provisioning) replace that node. Code and job changes publish a new release object
and a new package object beside the old ones (docs/design.md, contract C1: the
nodes point at a stable release prefix and are not touched); a new region gets a
new subnet range and no existing range moves.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from components import package
from components.stack_config import file_config
from model.archive import TRAINING_DIR, Archive, build_archive
from model.pulumi_types import (
    CLOUDQUOTA_S_QUOTA_PREFERENCE,
    COMPUTE_SUBNETWORK,
    DYNAMIC_QUEUED_TPU,
    STORAGE_BUCKET,
    STORAGE_BUCKET_OBJECT,
    TPU_V2_VM,
)
from model.settings.load import load_settings
from model.settings.schema import SettingsError
from ops.plan.diff import diff_plans, render_diff, replacement_warnings
from ops.plan.offline import offline_plan
from ops.plan.report import plain
from ops.plan.steps import Step, plan_steps

Config = dict[str, str]
Nodes = list[dict[str, Any]]
STACKS = ("dev", "prod", "platform")
TPU_TYPES = (TPU_V2_VM, DYNAMIC_QUEUED_TPU)
OBJECT = STORAGE_BUCKET_OBJECT
SUBNET = COMPUTE_SUBNETWORK
BUCKET = STORAGE_BUCKET
QUOTA = CLOUDQUOTA_S_QUOTA_PREFERENCE


def _nodes_key(config: Config) -> tuple[str, list[str]]:
    """Where the stack's first team's nodes are: `tpu-stack:nodes`, or a team's."""
    if json.loads(config.get("tpu-stack:nodes", "[]")):
        return "tpu-stack:nodes", []
    teams = json.loads(config["tpu-stack:teams"])
    team = next(name for name, spec in teams.items() if spec.get("nodes"))
    return "tpu-stack:teams", [team, "nodes"]


def edit_nodes(config: Config, edit: Callable[[Nodes], None]) -> None:
    key, path = _nodes_key(config)
    data = json.loads(config[key])
    nodes = data
    for part in path:
        nodes = nodes[part]
    edit(nodes)
    config[key] = json.dumps(data)


def edit_json(config: Config, key: str, edit: Callable[[Any], None]) -> None:
    data = json.loads(config[key])
    edit(data)
    config[key] = json.dumps(data)


def queued(config: Config) -> None:
    edit_nodes(config, lambda n: n[0].update(provisioning="queued", queue={"spot": True}))


# A second node in the first node's zone, and one in a region the stack does not
# use yet (a zone its generation is offered in: model/catalog.py).
def _add(zone: str, accelerator: str, provisioning: str) -> Callable[[Config], None]:
    def add(config: Config) -> None:
        def more(nodes: Nodes) -> None:
            extra = {k: v for k, v in nodes[0].items()
                     if k not in ("generation", "topology", "acceleratorType", "zone",
                                  "provisioning", "queue", "runtimeVersion")}
            nodes.append({**extra, "name": "extra", "zone": zone or nodes[0]["zone"],
                          "acceleratorType": accelerator, "provisioning": provisioning})
        edit_nodes(config, more)
        if zone.startswith("europe-west4") and json.loads(config.get("tpu-stack:quota", "{}")):
            # A new region comes with the project's quota there (IAM & Admin > Quotas).
            edit_json(config, "tpu-stack:quota", lambda q: q.setdefault("v5e", {}).update(
                {"europe-west4": {"preemptible": 64}}))
    return add


def _first_job(config: Config) -> str:
    key, path = _nodes_key(config)
    nodes = json.loads(config[key])
    for part in path:
        nodes = nodes[part]
    return nodes[0]["job"]


def hyperparameter(config: Config) -> None:
    """One more training step for the first node's job (a team's jobs sit beside its nodes)."""
    job = _first_job(config)
    key, path = _nodes_key(config)
    data = json.loads(config[key] if path else config["tpu-stack:jobs"])
    jobs = data
    for part in path[:-1]:
        jobs = jobs[part]
    jobs = jobs["jobs"] if path else jobs
    jobs[job]["trainSteps"] += 1000
    config[key if path else "tpu-stack:jobs"] = json.dumps(data)


def add_team(config: Config) -> None:
    edit_json(config, "tpu-stack:teams", lambda teams: teams.update(
        speech={"members": ["group:ml-speech@acme.example"], "quota": {"usdPerHour": 10},
                "subnetSlot": 2, "alerts": {"email": "ml-speech@acme.example"}}))


def storage_location(location: str) -> Callable[[Config], None]:
    return lambda config: edit_json(config, "tpu-stack:storage",
                                    lambda s: s.update(location=location))


def subnet_range(config: Config) -> None:
    network = json.loads(config.get("tpu-stack:network", "{}"))
    network["subnetCidr"] = "10.128.0.0/19"  # the default /20, grown: it holds the old one
    config["tpu-stack:network"] = json.dumps(network)


def node_field(**changes: Any) -> Callable[[Config], None]:
    return lambda config: edit_nodes(config, lambda n: n[0].update(**changes))


def runtime(stack: str) -> list[Step]:
    """A newer runtime on the first node. The catalog accepts one TensorFlow image per
    slice today (tpu-vm-tf-2.18.0), so the newer one is written into the head plan."""
    head = copy.deepcopy(base_plan(stack))
    node = next(r for r in head["resources"] if r["name"] == first_node(stack))
    node["inputs"]["runtimeVersion"] = node["inputs"]["runtimeVersion"].replace("2.18.0", "2.19.0")
    return plan_steps(base_plan(stack), head).steps

# The platform's first node is nlp's spot v5e `sweep` (its reserved pod is a queued
# resource on the platform's reservation: a team's reserved V2Vm finds none, issue 34).
SAME_REGION = {"dev": ("v5litepod-4", "spot"), "prod": ("v4-8", "reserved"),
               "platform": ("v5litepod-4", "spot")}
SMALLER = {"dev": {"acceleratorType": "v5litepod-4"},  # the first node's slice, halved
           "prod": {"topology": "2x2x2"},
           "platform": {"acceleratorType": "v5litepod-4"}}


def on_demand(config: Config) -> None:
    """The first node made on-demand (with a team's on-demand quota for it)."""
    node_field(provisioning="on-demand")(config)
    if json.loads(config.get("tpu-stack:teams", "{}")):
        edit_json(config, "tpu-stack:teams",
                  lambda t: t["nlp"]["quota"]["v5e"].update(onDemand=8))

NEW_REGION = {"dev": ("europe-west4-b", "v5litepod-8", "spot"),
              "prod": ("us-central1-a", "v5litepod-8", "on-demand"),
              "platform": ("europe-west4-b", "v5litepod-8", "spot")}
# prod's us-central2 pin holds us-central1's slot range (10.128.0.0/20): a new
# us-central1 is pinned where the grid puts it, as the settings ask
# (model/settings/ _moved_range_problems).
NEW_REGION_PINS = {"prod": {"us-central1": "10.128.16.0/20"}}
# The subnets a grown grid changes: only an unpinned range at slot 0 widens in place.
GROWN = {"dev": [("update", "subnet-us-central1")], "prod": [], "platform": []}
LOCATIONS = {"dev": "US", "prod": "us-central2", "platform": "US"}


@pytest.fixture(scope="module")
def new_code(tmp_path_factory: pytest.TempPathFactory) -> Archive:
    """The package built from a copy of training/ with one line changed."""
    copy = tmp_path_factory.mktemp("training") / "training"
    shutil.copytree(TRAINING_DIR, copy, ignore=shutil.ignore_patterns("__pycache__", "tests"))
    init = copy / "tpu_training" / "__init__.py"
    init.write_text(init.read_text() + "\n# a change under training/\n")
    return build_archive(copy)


_BASES: dict[tuple[str, bool], dict[str, Any]] = {}


def plan(stack: str, edit: Callable[[Config], None] | None = None, *,
         is_queued: bool = False) -> dict[str, Any]:
    config = file_config(stack)
    if is_queued:
        queued(config)
    if edit is not None:
        edit(config)
    return plain(offline_plan(stack, config).to_json())


def base_plan(stack: str, *, is_queued: bool = False) -> dict[str, Any]:
    key = (stack, is_queued)
    if key not in _BASES:
        _BASES[key] = plan(stack, is_queued=is_queued)
    return _BASES[key]


def steps(stack: str, edit: Callable[[Config], None], *, is_queued: bool = False) -> list[Step]:
    return plan_steps(base_plan(stack, is_queued=is_queued),
                      plan(stack, edit, is_queued=is_queued)).steps


def tpu(steps_: list[Step]) -> set[tuple[str, str]]:
    """(op, node) of each step on a TPU node; a node added as `extra` is `extra`."""
    return {(s.op, "extra" if s.name.endswith("extra-vm") else s.name)
            for s in steps_ if s.type in TPU_TYPES}


def ops(steps_: list[Step], op: str, type_: str | None = None) -> list[Step]:
    return [s for s in steps_ if s.op == op and (type_ is None or s.type == type_)]


def first_node(stack: str) -> str:
    return next(r["name"] for r in base_plan(stack)["resources"] if r["type"] in TPU_TYPES)


def assert_nothing_replaced(steps_: list[Step]) -> None:
    assert [(s.name, [c.path for c in s.replaced_by]) for s in ops(steps_, "replace")] == []


@pytest.mark.parametrize("stack", STACKS)
def test_add_a_node_in_the_same_region(stack):
    result = steps(stack, _add("", *SAME_REGION[stack]))
    assert tpu(result) == {("create", "extra")}
    assert_nothing_replaced(result)
    assert ops(result, "delete") == []


@pytest.mark.parametrize("stack", STACKS)
def test_add_a_node_in_a_new_region(stack):
    zone, accelerator, provisioning = NEW_REGION[stack]

    def add(config: Config) -> None:
        _add(zone, accelerator, provisioning)(config)
        if stack in NEW_REGION_PINS:
            edit_json(config, "tpu-stack:network",
                      lambda n: n["subnets"].update(NEW_REGION_PINS[stack]))
    result = steps(stack, add)
    assert tpu(result) == {("create", "extra")}
    region = zone.rsplit("-", 1)[0]
    # The platform's subnet there, and the node's team's own; vision, whose regions
    # are its own, gets none (docs/teams.md, "Regions per team").
    teams = ["nlp"] if stack == "platform" else []
    assert sorted(s.name for s in ops(result, "create", SUBNET)) == sorted(
        [f"subnet-{region}", *(f"{team}-subnet-{region}" for team in teams)])
    # No existing range moves: the subnets of the regions in use are not touched.
    assert [s.name for s in result if s.type == SUBNET and s.op != "create"] == []
    assert_nothing_replaced(result)
    assert ops(result, "delete") == []


def test_rename_a_node_counts_its_component_as_the_engine_does():
    """A renamed node is a new TpuNode component with its VM and release: the engine's
    summary counts the component too, +3/-3 (its steps carry component resources)."""
    result = steps("dev", lambda c: edit_nodes(c, lambda n: n[0].update(name="renamed")))
    kinds = {op: sorted(s.type.rsplit(":", 1)[-1] for s in ops(result, op))
             for op in ("create", "delete")}
    assert kinds == {"create": ["BucketObject", "TpuNode", "V2Vm"],
                     "delete": ["BucketObject", "TpuNode", "V2Vm"]}


@pytest.mark.parametrize("stack", STACKS)
def test_remove_a_node(stack):
    result = steps(stack, lambda c: edit_nodes(c, lambda n: n.pop(0)))
    assert tpu(result) == {("delete", first_node(stack))}
    assert_nothing_replaced(result)
    assert ops(result, "create") == []


def object_kind(name: str) -> str:
    """`archive-<sha16>` (the package) or `<node>-release-<hash16>` (C1), else the name."""
    return "archive" if name.startswith("archive-") else \
        "release" if "-release-" in name else name


def release_node(name: str) -> str:
    return name.rsplit("-release-", 1)[0]


def assert_new_release_only(result: list[Step], *, package_changes: bool) -> None:
    """Contract C1: new objects beside the old ones, no node touched."""
    assert tpu(result) == set()
    assert_nothing_replaced(result)
    assert {(s.op, s.type) for s in result} == {("create", OBJECT), ("delete", OBJECT)}
    created = sorted(object_kind(s.name) for s in ops(result, "create"))
    deleted = sorted(object_kind(s.name) for s in ops(result, "delete"))
    assert created == deleted
    assert ("archive" in created) is package_changes
    assert "release" in created and set(created) <= {"archive", "release"}
    # One release per node: each node's new object replaces that node's old one.
    assert sorted(release_node(s.name) for s in ops(result, "create") if "-release-" in s.name) \
        == sorted(release_node(s.name) for s in ops(result, "delete") if "-release-" in s.name)
    # Created before the old ones go: nothing deletes first.
    assert not any(s.delete_first for s in result)


@pytest.mark.parametrize("stack", STACKS)
def test_change_the_training_code(stack, new_code, monkeypatch):
    base_plan(stack)  # planned with the repository's training/
    monkeypatch.setattr(package, "build_archive", lambda: new_code)
    assert_new_release_only(steps(stack, lambda c: None), package_changes=True)


def test_change_the_training_code_of_a_queued_node(new_code, monkeypatch):
    """A waiting queued request keeps its place in the queue: nothing touches it."""
    base_plan("dev", is_queued=True)  # planned with the repository's training/
    monkeypatch.setattr(package, "build_archive", lambda: new_code)
    result = steps("dev", lambda c: None, is_queued=True)
    assert any(r["type"] == TPU_TYPES[1] for r in base_plan("dev", is_queued=True)["resources"])
    assert_new_release_only(result, package_changes=True)


@pytest.mark.parametrize("stack", STACKS)
def test_change_a_job_hyperparameter(stack):
    assert_new_release_only(steps(stack, hyperparameter), package_changes=False)


@pytest.mark.parametrize("stack", STACKS)
def test_change_a_nodes_labels(stack):
    result = steps(stack, node_field(labels={"experiment": "lr-sweep"}))
    assert tpu(result) == {("update", first_node(stack))}
    assert {s.op for s in result} == {"update"}
    [node] = [s for s in result if s.type in TPU_TYPES]
    assert node.paths == ("labels.experiment",)


def test_add_a_team():
    result = steps("platform", add_team)
    assert tpu(result) == set()
    assert_nothing_replaced(result)
    assert ops(result, "delete") == []
    assert ops(result, "create") != []


@pytest.mark.parametrize(("stack", "edit", "field"), [
    *((s, None, "runtimeVersion") for s in STACKS),
    *((s, node_field(**SMALLER[s]), "accelerator") for s in STACKS),
    *((s, on_demand, "schedulingConfig") for s in STACKS),
])
def test_a_nodes_own_immutable_field_replaces_it_delete_first(stack, edit, field):
    result = steps(stack, edit) if edit else runtime(stack)
    node = first_node(stack)
    assert tpu(result) == {("replace", node)}
    [replaced] = ops(result, "replace")
    assert replaced.delete_first
    assert all(field in path for path in replaced.replaced_paths), replaced.replaced_paths
    # Anything else is a release object for the node's resolved job, or (platform)
    # the team's quota cap that `on_demand` raises with it: an in-place update of
    # the preferred value, never a replace (replacement.json: only `parent` forces
    # new), so the cap is never dropped.
    others = [s for s in result if s.type not in (*TPU_TYPES, OBJECT)]
    assert all(s.type == QUOTA and s.op == "update"
               and s.paths == ("quotaConfig.preferredValue",) for s in others), others
    assert bool(others) == (edit is on_demand and stack == "platform")


# The buckets each stack protects (components/storage.py PRECIOUS, unless storage.protect
# is false: dev), team buckets included.
PROTECTED_BUCKETS = {"dev": set(), "prod": {"checkpoints", "data"},
                     "platform": {"checkpoints", "data", "nlp-checkpoints"}}


def refused(steps_: list[Step]) -> dict[str, str]:
    return {s.name: s.refused for s in steps_ if s.refused}


@pytest.mark.parametrize("stack", STACKS)
def test_change_the_bucket_location(stack):
    """Every bucket is replaced, delete first (its name is set: pulumi-terraform-bridge
    nameRequiresDeleteBeforeReplace); the engine refuses the protected ones
    (step_generator.go continueStepsFromDiff: "unable to replace resource ... marked for
    protection"), and the preview says so as an error with the way out."""
    result = steps(stack, storage_location(LOCATIONS[stack]))
    buckets = ops(result, "replace", BUCKET)
    assert all(s.delete_first for s in buckets) and {s.name for s in buckets} >= {
        "artifacts", "checkpoints", "data", "logs"}
    assert set(refused(result)) == PROTECTED_BUCKETS[stack]
    assert all("marked for protection" in why for why in refused(result).values())
    assert {op for op, _ in tpu(result)} <= {"update"}
    diff = diff_plans(base_plan(stack), plan(stack, storage_location(LOCATIONS[stack])))
    text = render_diff(diff, "table")
    assert ("error: unable to replace resource" in text) is bool(PROTECTED_BUCKETS[stack])
    assert ("pulumi state unprotect" in text) is bool(PROTECTED_BUCKETS[stack])


def test_a_protected_pool_is_not_replaced():
    """prod's CI pool id changed: the protected pool and its provider would be replaced,
    which the engine refuses; the grants that take the pool's name are replaced with it."""
    result = steps("prod", lambda c: edit_json(c, "tpu-stack:ci", lambda ci: ci.update(
        poolId="github-actions-2")))
    assert set(refused(result)) == {"pool", "github"}
    assert {s.name for s in ops(result, "replace")} == {
        "pool", "github", "github-impersonates-deployer", "github-impersonates-preview"}


def remove_vision(config: Config) -> None:
    edit_json(config, "tpu-stack:teams", lambda teams: teams.pop("vision"))


def test_removing_a_team_refuses_its_protected_deletes():
    """step.go DeleteStep.Apply: a protected resource's delete fails, preview too; the
    team's other resources are deleted (their deletes run beside it in `up`). The
    team's project itself is the bootstrap step's, looked up, not a resource of the
    stack (docs/teams.md, "Who deploys what"): no step for it."""
    result = steps("platform", remove_vision)
    # The controller's manifest no longer names vision's (it reads no team stack of it).
    assert {(s.op, s.name) for s in result if s.op != "delete"} == {
        ("update", "controller-manifest")}
    # vision's storage custom role is the bootstrap's (issue 44): not in the plan.
    assert set(refused(result)) == {"vision-pool", "vision-github"}
    assert all("cannot be deleted\nbecause it is protected" in why
               for why in refused(result).values())
    assert len(result) - len(refused(result)) > 30


def test_removing_a_quota_preference_says_the_cap_stays():
    """The provider's Delete only drops a quota preference from the state
    (resource_cloud_quotas_quota_preference.go): the cap stays in GCP, and the preview
    says so, with how to lift it."""
    diff = diff_plans(base_plan("platform"), plan("platform", remove_vision))
    quota = ops(diff.steps.steps, "delete", QUOTA)
    assert quota and all("only drops it from the state" in s.stays_in_gcp for s in quota)
    warnings = [w for w in replacement_warnings(diff) if "quota preference" in w]
    assert len(warnings) == len(quota)
    assert all("the cap" in w and "stays" in w and "raise it first" in w for w in warnings)


def test_a_case_only_location_change_is_no_change():
    """`US` → `us`: the provider's StateFunc upper-cases `location`
    (resource_storage_bucket.go) and the bridge diffs after it: no step."""
    assert steps("prod", storage_location("us")) == []


def test_a_protect_only_change_is_a_same_step():
    """dev's buckets protected: no diff, a same step each (counted unchanged) that
    shows the lock change (step_generator.go: no diff, NewSameStep)."""
    result = steps("dev", lambda c: edit_json(c, "tpu-stack:storage",
                                              lambda s: s.update(protect=True)))
    assert [(s.op, s.name, s.paths) for s in result] == [
        ("same", "checkpoints", ("(protect)",)), ("same", "data", ("(protect)",))]
    diff = diff_plans(base_plan("dev"), plan("dev", lambda c: edit_json(
        c, "tpu-stack:storage", lambda s: s.update(protect=True))))
    assert [diff.steps.counts()[op] for op in ("create", "update", "replace", "delete")] \
        == [0, 0, 0, 0]


def test_dependents_of_a_delete_first_bucket_go_before_it_with_its_objects():
    """dev's buckets moved: each is replaced delete first, so its dependents whose inputs
    take its name (IAM members, and the package and release objects: `bucket.name`) are
    deleted before it and created in the new bucket (step_generator.go
    calculateDependentReplacements, NewDeleteReplacementStep); nothing is left behind."""
    result = steps("dev", storage_location("EU"))
    artifacts = next(s for s in result if s.name == "artifacts")
    objects = [s for s in result if s.type == OBJECT]
    assert {object_kind(s.name) for s in objects} == {"archive", "release"}
    assert all((s.op, s.delete_first, s.deleted_before) == ("replace", True, artifacts.urn)
               for s in objects)
    members = [s for s in result if s.type.endswith("bucketIAMMember:BucketIAMMember")]
    assert members and all(s.deleted_before is not None and s.delete_first for s in members)


def test_dependents_of_a_create_first_root_are_not_deleted_first():
    """A create-before-delete replacement (prod's pool: no name set, no provider rule)
    condemns nothing: its dependents are replaced after it, not deleted first."""
    result = steps("prod", lambda c: edit_json(c, "tpu-stack:ci", lambda ci: ci.update(
        poolId="github-actions-2")))
    assert [s.name for s in result if s.deleted_before] == []


@pytest.mark.parametrize("is_queued", [False, True])
def test_spot_to_queued_and_back_is_refused(is_queued):
    """A V2Vm and a queued node are two URNs with one TPU node id: the engine creates the
    new one while the old one still exists (it deletes last), and GCP refuses the
    create. The preview refuses it and says how: two reviewed changes."""
    def switch(config: Config) -> None:
        if is_queued:
            edit_nodes(config, lambda n: (n[0].pop("queue"), n[0].update(provisioning="spot")))
        else:
            queued(config)
    result = steps("dev", switch, is_queued=is_queued)
    [create] = [s for s in result if s.op == "create" and s.type in TPU_TYPES]
    [delete] = [s for s in result if s.op == "delete" and s.type in TPU_TYPES]
    assert create.refused.startswith("GCP refuses the create: TPU node dev-trainer in ")
    assert delete.name in create.refused and "two reviewed changes" in create.refused
    assert not delete.refused


def test_a_pin_that_moves_a_range_is_refused():
    """dev + europe-west4 pinned to 10.128.8.0/21 would move us-central1 (unpinned, in
    use) off 10.128.0.0/20, replacing its subnet and node `trainer`: settings refuse it,
    naming the region it moves and how to pin it."""
    def pin(config: Config) -> None:
        _add("europe-west4-b", "v5litepod-8", "spot")(config)
        edit_json(config, "tpu-stack:network", lambda n: n.update(
            subnets={"europe-west4": "10.128.8.0/21"}))
    config = file_config("dev")
    pin(config)
    with pytest.raises(SettingsError) as error:
        load_settings(config, "dev")
    assert "tpu-stack:network.subnets.europe-west4: europe-west4's pin 10.128.8.0/21 " \
        "overlaps us-central1's slot range 10.128.0.0/20, so us-central1's subnet would " \
        "move to 10.128.16.0/20" in str(error.value)
    assert "pin it where it is (tpu-stack:network.subnets.us-central1: 10.128.0.0/20)" \
        in str(error.value)


@pytest.mark.parametrize("stack", STACKS)
def test_grow_the_subnet_range(stack):
    """`subnetCidr` /20 → /19. dev's us-central1 is slot 0, so its range widens
    (10.128.0.0/20 → 10.128.0.0/19 holds the old one: IsShrinkageIpCidr is false, an
    update through expandIpCidrRange); prod's and the platform's regions are pinned,
    and a pin holds its range whatever the grid: no subnet changes."""
    result = steps(stack, subnet_range)
    assert tpu(result) == set()
    assert_nothing_replaced(result)
    assert [(s.op, s.name) for s in result if s.type == SUBNET] == GROWN[stack]


def test_grow_a_pinned_range_in_place():
    """prod's pinned us-central2 widened in its pin: updates, nothing replaced (the
    internal firewall rule names the subnets' ranges: it widens with them, in place)."""
    result = steps("prod", lambda c: edit_json(c, "tpu-stack:network", lambda n: n.update(
        subnets={"us-central2": "10.128.0.0/19"})))
    assert sorted((s.op, s.name) for s in result) == [("update", "allow-internal"),
                                                      ("update", "subnet-us-central2")]
    subnet = next(s for s in result if s.name == "subnet-us-central2")
    assert [(c.path, c.old, c.new) for c in subnet.changes] == [
        ("ipCidrRange", "10.128.0.0/20", "10.128.0.0/19")]


def test_growing_the_grid_moves_a_later_slot_and_the_preview_says_so():
    """Not a routine change: an unpinned region past slot 0 moves when the grid's block
    grows (us-central2: slot 1, 10.128.16.0/20 → 10.128.32.0/19), which replaces its
    subnet first and, through its unknown self link, the node on it. Pinning the
    regions' ranges before growing the grid keeps them (docs/design.md, "Stack config")."""
    second = _add("us-central2-b", "v4-8", "spot")

    def grown(config: Config) -> None:
        second(config)
        subnet_range(config)

    result = plan_steps(plan("dev", second), plan("dev", grown)).steps
    replaced = [(s.op, s.name, s.delete_first) for s in result if s.op == "replace"]
    assert replaced[0] == ("replace", "subnet-us-central2", True)
    assert [(c.path, c.reason) for c in ops(result, "replace", SUBNET)[0].replaced_by] == [
        ("ipCidrRange", "shrinks")]
    assert tpu(result) == {("replace", "extra")}
    assert [s.name for s in ops(result, "update", SUBNET)] == ["subnet-us-central1"]

    def pinned_first(config: Config) -> None:
        grown(config)
        edit_json(config, "tpu-stack:network", lambda n: n.update(
            subnets={"us-central1": "10.128.0.0/20", "us-central2": "10.128.16.0/20"}))

    kept = plan_steps(plan("dev", second), plan("dev", pinned_first)).steps
    assert [s for s in kept if s.type == SUBNET or s.op == "replace"] == []


def test_a_shrunk_range_is_predicted_with_its_chain():
    """Not a routine change: a range given a smaller block replaces the subnet (delete
    first) and, through its unknown self link, every node in it."""
    def shrink(config: Config) -> None:
        config["tpu-stack:network"] = json.dumps({"subnetCidr": "10.128.0.0/21"})
    result = steps("dev", shrink)
    assert [(s.op, s.type, s.delete_first) for s in result if s.op == "replace"] == [
        ("replace", SUBNET, True), ("replace", TPU_TYPES[0], True)]
    node = ops(result, "replace", TPU_TYPES[0])[0]
    assert node.replaced_paths == ("networkConfig.subnetwork",)
    assert node.replaced_by[0].unknown_from.endswith("::subnet-us-central1")


def test_the_archive_is_a_different_package(new_code):
    assert new_code.sha256 != build_archive().sha256
    assert isinstance(new_code.filename, str) and Path(new_code.filename).suffix == ".gz"
