"""Whole program, every Pulumi.<stack>.yaml in the repo, as `pulumi up` would run it."""

from __future__ import annotations

import datetime
import json
import re

import pulumi
import pytest
import yaml

import node_agent as agent
from components.stack_config import (
    StackFileError,
    file_config,
    load_yaml,
    project_declarations,
    project_defaults,
)
from model.archive import REPO_ROOT
from model.pulumi_types import (
    COMPUTE_SUBNETWORK,
    IAM_WORKLOAD_IDENTITY_POOL,
    PROJECTS_IAM_MEMBER,
    PROJECTS_SERVICE,
    STORAGE_BUCKET,
    STORAGE_BUCKET_IAM_MEMBER,
    STORAGE_BUCKET_OBJECT,
    TPU_V2_VM,
)
from ops.plan.mock_engine import run_program
from tests.infra.stack_fixtures import as_cli, config, node
from tests.repo_stacks import repo_stacks

STACKS = repo_stacks()
LABELLED = (STORAGE_BUCKET, TPU_V2_VM)


def test_the_repo_has_dev_and_prod() -> None:
    assert {"dev", "prod"} <= set(STACKS)


@pytest.mark.parametrize("stack", STACKS)
def test_stack_plans_with_every_required_label(stack: str) -> None:
    run = run_program(file_config(stack), stack)
    for resource in run.registrations:
        if resource.type in LABELLED:
            labels = resource.inputs["labels"]
            assert {"stack", "team", "component", "managed-by"} <= labels.keys(), resource.name
            assert labels["stack"] == stack and labels["managed-by"] == "pulumi"


@pytest.mark.parametrize("stack", [s for s in STACKS if s in ("dev", "prod")])
def test_single_team_stack_outputs(stack: str) -> None:
    run = run_program(file_config(stack), stack)
    outputs = run.outputs
    assert set(outputs["buckets"]) == {"data", "artifacts", "checkpoints", "logs"}
    assert outputs["runtimeServiceAccount"].endswith(".iam.gserviceaccount.com")
    assert outputs["package"]["uri"].endswith(f"tpu_training-{outputs['package']['sha256']}"
                                              ".tar.gz")
    vms = run.of_type(TPU_V2_VM)
    assert len(vms) == len(outputs["nodes"])
    releases = {o.inputs["name"].split("/")[1]: o for o in run.of_type(
        STORAGE_BUCKET_OBJECT) if "-release-" in o.name}
    for vm in vms:
        metadata = vm.inputs["metadata"]
        node_id = vm.inputs["name"]
        assert metadata["tpu-stack-release"] == (f"{outputs['buckets']['artifacts']}/releases/"
                                                 f"{node_id}/")
        # pulumi-gcp sends a BucketObject's content as a secret; the mock engine
        # records it unwrapped and names it in `secrets`.
        assert "content" in releases[node_id].secrets
        release = json.loads(releases[node_id].inputs["content"])
        assert release["package"] == outputs["package"]["uri"]
        job = release["job"]
        assert job["trainData"].startswith(outputs["buckets"]["data"] + "/")
        assert job["checkpointDir"].startswith(outputs["buckets"]["checkpoints"] + "/")
        assert vm.inputs["serviceAccount"]["email"] == outputs["runtimeServiceAccount"]


def test_dev_is_one_single_host_spot_node_with_destroyable_buckets() -> None:
    run = run_program(file_config("dev"), "dev")
    (trainer,) = run.outputs["nodes"].values()
    assert (trainer["hosts"], trainer["provisioning"]) == (1, "spot")
    assert trainer["usdPerHour"] == pytest.approx(0.607 * trainer["chips"])
    assert run.outputs["estimatedUsdPerHour"] == pytest.approx(trainer["usdPerHour"])
    assert not any(b.protect for b in run.of_type(STORAGE_BUCKET))


def test_prod_is_a_protected_pod_slice() -> None:
    run = run_program(file_config("prod"), "prod")
    (pod,) = run.outputs["nodes"].values()
    assert (pod["acceleratorType"], pod["topology"], pod["hosts"]) == ("v4-32", "2x2x4", 4)
    assert pod["runtimeVersion"] == "tpu-vm-tf-2.18.0-pod-pjrt"
    protected = {b.name for b in run.of_type(STORAGE_BUCKET) if b.protect}
    assert protected == {"data", "checkpoints"}
    vm = run.of_type(TPU_V2_VM)[0]
    assert vm.inputs["metadata"][agent.WORKERS_KEY] == "0"
    assert vm.inputs["schedulingConfig"] == {"reserved": True}


def test_a_bad_stack_fails_with_one_message_and_no_traceback() -> None:
    bad = config(tpu_stack_nodes=[node(zone="us-central2-b"), node(name="b", job="nope")])
    with pytest.raises(pulumi.RunError) as caught:
        run_program(as_cli(bad), "test")
    text = str(caught.value)
    assert "tpu-stack:nodes[0].zone: us-central2-b does not offer TPU v5e" in text
    assert "tpu-stack:nodes[1].job: 'nope' is not a key of tpu-stack:jobs" in text
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def test_config_comes_from_pulumi_yaml_then_the_stack_file(tmp_path) -> None:
    (tmp_path / "Pulumi.yaml").write_text(yaml.safe_dump({
        "name": "tpu-stack", "runtime": "python",
        "config": {"environment": {"type": "string", "default": "prod"},
                   "team": "platform", "labels": {"default": {"b": "2", "a": "1"}},
                   "nodes": [], "gcp:project": {"value": "from-project"}}}))
    (tmp_path / "Pulumi.x.yaml").write_text(yaml.safe_dump({
        "config": {"tpu-stack:team": "vision", "gcp:project": "from-stack",
                   "tpu-stack:storage": {"location": "US", "protect": True}}}))
    # Objects reach the program as Go's encoding/json writes them: compact, keys sorted.
    assert file_config("x", tmp_path) == {
        "tpu-stack:environment": "prod", "tpu-stack:team": "vision",
        "tpu-stack:labels": '{"a":"1","b":"2"}', "tpu-stack:nodes": "[]",
        "gcp:project": "from-stack", "tpu-stack:storage": '{"location":"US","protect":true}'}


def _project(tmp_path, config: dict, stack: dict) -> None:
    (tmp_path / "Pulumi.yaml").write_text(yaml.safe_dump(
        {"name": "tpu-stack", "runtime": "python", "config": config}))
    (tmp_path / "Pulumi.s.yaml").write_text(yaml.safe_dump({"config": stack}))


@pytest.mark.parametrize(("declared", "message"), [
    ({"storage": {"description": "d"}},
     "Stack 's' is missing configuration value 'storage' (set tpu-stack:storage in "
     "Pulumi.s.yaml: d)"),
    ({"storage": {}, "nodes": {}},
     "Stack 's' is missing configuration values 'nodes' and 'storage' (set tpu-stack:nodes "
     "in Pulumi.s.yaml; set tpu-stack:storage in Pulumi.s.yaml)"),
    ({"c": {}, "a": {}, "b": {"default": None}},
     "Stack 's' is missing configuration values 'a', 'b' and 'c' (set tpu-stack:a in "
     "Pulumi.s.yaml; set tpu-stack:b in Pulumi.s.yaml; set tpu-stack:c in Pulumi.s.yaml)"),
])
def test_a_key_without_default_or_value_left_unset_fails_as_the_cli_fails(
        tmp_path, declared: dict, message: str) -> None:
    _project(tmp_path, declared, {"gcp:project": "p"})
    with pytest.raises(StackFileError) as caught:
        file_config("s", tmp_path)
    assert str(caught.value) == message


def test_a_misspelt_required_key_gets_a_did_you_mean_after_the_clis_message(tmp_path) -> None:
    _project(tmp_path, {"storage": {}}, {"tpu-stack:storag": {"location": "US"}})
    with pytest.raises(StackFileError) as caught:
        file_config("s", tmp_path)
    assert str(caught.value) == ("Stack 's' is missing configuration value 'storage' "
                                 "(tpu-stack:storag in the stack file: did you mean "
                                 "tpu-stack:storage?)")


def test_typed_keys_and_declarations_follow_the_clis_rules(tmp_path) -> None:
    _project(tmp_path, {"environment": {"type": "string"}},
             {"tpu-stack:environment": {"a": 1}})
    with pytest.raises(StackFileError) as caught:
        file_config("s", tmp_path)
    assert str(caught.value) == ("Stack 's' with configuration key 'environment' must be of "
                                 "type 'string'")
    _project(tmp_path, {"labels": {"a": "b"}}, {})  # an object is not shorthand
    with pytest.raises(StackFileError, match="additionalProperties 'a' not allowed"):
        file_config("s", tmp_path)
    _project(tmp_path, {"x": {"default": 1, "value": 2}}, {})
    with pytest.raises(StackFileError, match="cannot have both a 'default' and 'value'"):
        file_config("s", tmp_path)
    _project(tmp_path, {"n": {"type": "integer", "default": "many"}}, {})
    with pytest.raises(StackFileError, match="not of the expected type 'integer'"):
        file_config("s", tmp_path)


def test_a_stack_key_needs_a_namespace(tmp_path) -> None:
    _project(tmp_path, {}, {"storage": {"location": "US"}})
    with pytest.raises(StackFileError, match="could not parse storage as a configuration key"):
        file_config("s", tmp_path)


@pytest.mark.parametrize("stack", STACKS)
def test_every_stack_passes_the_clis_config_merge(stack: str) -> None:
    """Every key Pulumi.yaml declares reaches the program (none is silently skipped)."""
    declared = {f"tpu-stack:{k}" if ":" not in k else k for k in project_declarations()}
    assert declared <= set(file_config(stack))


def test_tpuctl_plan_of_a_stack_missing_a_required_key_fails_with_the_clis_message(
        tmp_path, monkeypatch) -> None:
    from typer.testing import CliRunner

    import ops.plan.offline
    from ops.cli import app

    (tmp_path / "Pulumi.yaml").write_text((REPO_ROOT / "Pulumi.yaml").read_text())
    dev = load_yaml((REPO_ROOT / "Pulumi.dev.yaml").read_text())
    del dev["config"]["tpu-stack:storage"]
    (tmp_path / "Pulumi.nostore.yaml").write_text(yaml.safe_dump(dev))
    monkeypatch.setattr(ops.plan.offline, "file_config", lambda stack: file_config(stack, tmp_path))
    result = CliRunner().invoke(app, ["plan", "--stack", "nostore"])
    assert result.exit_code == 2
    assert ("Stack 'nostore' is missing configuration value 'storage' (set tpu-stack:storage "
            "in Pulumi.nostore.yaml: Buckets: {location (required)") in result.output


# yaml.v3 (the CLI's YAML library) against PyYAML's YAML 1.1 on the same text.
YAML_CASES = [
    ("yes", "yes", True), ("no", "no", False), ("on", "on", True), ("off", "off", False),
    ("y", "y", "y"), ("n", "n", "n"), ("Yes", "Yes", True), ("True", True, True),
    ("FALSE", False, False), ("1:30", "1:30", 90), ("0o17", 15, "0o17"), ("017", 15, 15),
    ("0x1F", 31, 31), ("1_000", 1000, 1000), ("1e3", 1000.0, "1e3"), ("~", None, None),
    ("2024-01-02", "2024-01-02 00:00:00 +0000 UTC", datetime.date(2024, 1, 2)),
    ("2001-12-14T21:59:43.10Z", "2001-12-14 21:59:43.1 +0000 UTC",
     datetime.datetime(2001, 12, 14, 21, 59, 43, 100000, tzinfo=datetime.timezone.utc)),
]


@pytest.mark.parametrize(("text", "cli", "pyyaml"), YAML_CASES)
def test_stack_files_are_read_as_yaml_1_2_like_the_cli(text: str, cli, pyyaml) -> None:
    assert load_yaml(f"k: {text}")["k"] == cli
    assert yaml.safe_load(f"k: {text}")["k"] == pyyaml  # what the old reader saw


def test_values_reach_the_program_as_the_cli_writes_them() -> None:
    from components.stack_config import cli_value

    assert [cli_value(v) for v in ("on", True, 5000, 1.0, 0.5, None)] == [
        "on", "true", "5000", "1", "0.5", "null"]
    assert cli_value({"b": [1.0, 2.5], "a": {"z": False}}) == '{"a":{"z":false},"b":[1,2.5]}'


def test_a_yes_in_a_stack_file_reaches_the_program_as_text(tmp_path) -> None:
    _project(tmp_path, {}, {"tpu-stack:team": "on", "tpu-stack:labels": {"flag": "no"}})
    config = file_config("s", tmp_path)
    assert config["tpu-stack:team"] == "on"
    assert config["tpu-stack:labels"] == '{"flag":"no"}'


def test_pulumi_version_file_names_pulumi_yamls_minimum() -> None:
    project = load_yaml((REPO_ROOT / "Pulumi.yaml").read_text())
    minimum = (REPO_ROOT / ".pulumi-version").read_text()
    assert minimum.endswith("\n") and minimum.count("\n") == 1
    assert project["requiredPulumiVersion"] == f">={minimum.strip()}"
    assert re.fullmatch(r"[0-9]+\.[0-9]+\.[0-9]+", minimum.strip())


def test_every_top_level_key_is_declared_with_a_description() -> None:
    from model.settings.load import TOP_LEVEL_KEYS
    project = yaml.safe_load((REPO_ROOT / "Pulumi.yaml").read_text())
    declared = {f"tpu-stack:{k}": v for k, v in project["config"].items()}
    assert set(TOP_LEVEL_KEYS) <= set(declared)
    assert all(isinstance(v, dict) and v.get("description") for v in declared.values())
    assert project_defaults()["tpu-stack:environment"] == "prod"


@pytest.mark.parametrize("stack", STACKS)
def test_every_urn_is_unique(stack: str) -> None:
    urns = [r.urn for r in run_program(file_config(stack), stack).registrations]
    assert len(urns) == len(set(urns))


def test_two_nodes_have_distinct_urns_and_node_ids() -> None:
    run = run_program(as_cli(config(tpu_stack_nodes=[node(), node(name="second")])), "test")
    vms = run.of_type(TPU_V2_VM)
    assert len({vm.urn for vm in vms}) == 2
    assert {vm.inputs["name"] for vm in vms} == {"test-trainer", "test-second"}


def test_prod_declares_its_ci_identity_and_the_apis_it_needs() -> None:
    run = run_program(file_config("prod"), "prod")
    services = {s.inputs["service"] for s in run.of_type(PROJECTS_SERVICE)}
    assert {"sts.googleapis.com", "iamcredentials.googleapis.com",
            "cloudresourcemanager.googleapis.com"} <= services
    assert run.outputs["ciDeployerServiceAccount"].endswith(".iam.gserviceaccount.com")
    assert run.outputs["ciPreviewServiceAccount"].endswith(".iam.gserviceaccount.com")
    assert "/workloadIdentityPools/" in run.outputs["ciWorkloadIdentityProvider"]
    pool = run.of_type(IAM_WORKLOAD_IDENTITY_POOL)[0]
    assert pool.protect


def test_dev_without_ci_enables_no_token_exchange() -> None:
    run = run_program(file_config("dev"), "dev")
    services = {s.inputs["service"] for s in run.of_type(PROJECTS_SERVICE)}
    assert "sts.googleapis.com" not in services
    assert "ciDeployerServiceAccount" not in run.outputs


def test_a_node_itself_waits_for_the_tpu_api_its_grants_and_its_package() -> None:
    run = run_program(file_config("dev"), "dev")
    by_urn = run.by_urn()
    vm = run.of_type(TPU_V2_VM)[0]
    waits_for = {by_urn[urn].type for urn in vm.dependencies}
    assert {PROJECTS_SERVICE, STORAGE_BUCKET_IAM_MEMBER,
            PROJECTS_IAM_MEMBER,
            STORAGE_BUCKET_OBJECT} <= waits_for
    grants = [r for r in run.registrations if r.type.endswith("IAMMember:BucketIAMMember")
              or r.type.endswith("iAMMember:IAMMember")]
    assert {g.urn for g in grants} <= set(vm.dependencies)


@pytest.mark.parametrize("stack", STACKS)
def test_tpuctl_expects_exactly_the_nodes_the_plan_declares(stack: str) -> None:
    from components.stack_config import settings_for
    from model.fleet import target_for

    run = run_program(file_config(stack), stack)
    declared = {vm.inputs["name"] for vm in run.of_type(TPU_V2_VM)}
    declared |= {q.inputs["node_id"] for q in run.registrations if "QueuedTpu" in q.type}
    assert {n.node_id for n in target_for(settings_for(stack)).nodes} == declared


def test_a_cloud_stack_reference_fails_the_program_on_a_self_managed_backend() -> None:
    """`pulumi up -s team-vision` after `pulumi login gs://…`: the engine's organization
    is 'organization', so acme/tpu-stack/platform cannot resolve (pkg/backend/diy)."""
    with pytest.raises(pulumi.RunError) as caught:
        run_program(file_config("team-vision"), "team-vision", organization="organization")
    assert "tpu-stack:platformStack: 'acme/tpu-stack/platform' does not name a stack on " \
           "this stack's backend, a self-managed backend" in str(caught.value)


# ---- subnet ranges never move (issue 18) ------------------------------------

SHIPPED_RANGES = {
    "dev": {"us-central1": "10.128.0.0/20"},
    "prod": {"us-central2": "10.128.0.0/20"},
    "platform": {"us-central1": "10.128.0.0/21", "us-central2": "10.128.8.0/21"},
}


def subnet_ranges_of(config: dict, stack: str) -> dict[str, str]:
    run = run_program(config, stack)
    return {s.inputs["region"]: s.inputs["ipCidrRange"]  # the stack's own, not a team's
            for s in run.of_type(COMPUTE_SUBNETWORK)
            if s.name.startswith("subnet-")}


@pytest.mark.parametrize("stack", sorted(SHIPPED_RANGES))
def test_shipped_stacks_keep_the_ranges_they_were_deployed_with(stack: str) -> None:
    assert subnet_ranges_of(file_config(stack), stack) == SHIPPED_RANGES[stack]


def _with_node_in(stack: str, zone: str, accelerator: str) -> dict:
    config = file_config(stack)
    nodes = json.loads(config["tpu-stack:nodes"])
    job = nodes[0]["job"] if nodes else None
    if job is None:  # the platform's nodes are its teams'
        teams = json.loads(config["tpu-stack:teams"])
        team = teams["nlp"]
        team["nodes"].append({"name": "extra", "zone": zone, "acceleratorType": accelerator,
                              "job": "sweep"})
        team["quota"]["v5e"]["onDemand"] = 8
        config["tpu-stack:teams"] = json.dumps(teams)
        quota = json.loads(config["tpu-stack:quota"])
        quota.setdefault("v5e", {})[zone.rsplit("-", 1)[0]] = {"onDemand": 8}
        config["tpu-stack:quota"] = json.dumps(quota)
        return config
    nodes.append({"name": "extra", "zone": zone, "acceleratorType": accelerator, "job": job})
    config["tpu-stack:nodes"] = json.dumps(nodes)
    return config


@pytest.mark.parametrize("stack", sorted(SHIPPED_RANGES))
def test_a_node_in_a_new_region_adds_a_subnet_and_moves_none(stack: str) -> None:
    ranges = subnet_ranges_of(_with_node_in(stack, "europe-west4-b", "v5litepod-8"), stack)
    assert {r: ranges[r] for r in SHIPPED_RANGES[stack]} == SHIPPED_RANGES[stack]
    assert ranges["europe-west4"] == "10.128.32.0/20"


# ---- code and job changes never touch a node (issue 18, contract C1) ---------

def _plan_nodes_and_releases(config: dict, stack: str) -> tuple[dict, dict, dict]:
    run = run_program(config, stack)
    nodes = {r.name: r.inputs for r in run.registrations
             if r.type == TPU_V2_VM or "QueuedTpu" in r.type}
    objects = {r.name: r.inputs for r in run.of_type(STORAGE_BUCKET_OBJECT)}
    releases = {n: o for n, o in objects.items() if "-release-" in n}
    archives = {n: o for n, o in objects.items() if n.startswith("archive-")}
    return nodes, releases, archives


def _new_code(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import components.package
    from model.archive import Archive
    stage = components.package.stage
    monkeypatch.setattr(components.package, "build_archive",
                        lambda: Archive(data=b"other code", sha256="cd" * 32))
    monkeypatch.setattr(components.package, "stage", lambda archive, _: stage(archive, tmp_path))


def _queued(stack: str) -> dict:
    config = file_config(stack)
    nodes = json.loads(config["tpu-stack:nodes"])
    for entry in nodes:
        entry.update(provisioning="queued", queue={"spot": True})
    config["tpu-stack:nodes"] = json.dumps(nodes)
    return config


def _other_hyperparameter(config: dict) -> dict:
    jobs = json.loads(config["tpu-stack:jobs"])
    for job in jobs.values():
        job["learningRate"] = 0.05
    return {**config, "tpu-stack:jobs": json.dumps(jobs)}


@pytest.mark.parametrize("queued", [False, True], ids=["v2vm", "queued"])
@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_a_code_or_job_change_leaves_every_node_input_as_it_was(
        stack: str, queued: bool, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    config = _queued(stack) if queued else file_config(stack)
    nodes, releases, archives = _plan_nodes_and_releases(config, stack)
    after_job = _plan_nodes_and_releases(_other_hyperparameter(config), stack)
    _new_code(monkeypatch, tmp_path)
    after_code = _plan_nodes_and_releases(config, stack)
    for after_nodes, after_releases, _ in (after_job, after_code):
        assert after_nodes == nodes
        assert after_releases.keys().isdisjoint(releases)  # new ones; the old ones go last
        assert len(after_releases) == len(releases) == len(nodes)
    assert list(after_job[2]) == list(archives)
    assert list(after_code[2]) == [f"archive-{'cd' * 8}"] != list(archives)
