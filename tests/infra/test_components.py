"""Each component under Pulumi's mock engine: the inputs and options that matter."""

from __future__ import annotations

import hashlib
import ipaddress
import itertools
import json
from dataclasses import dataclass

import pulumi
import pytest

import node_agent as agent
from components.identity import IdentityArgs, RuntimeIdentity
from components.network import Network, NetworkArgs, subnet_ranges
from components.package import PackageArgs, TrainingPackage
from components.project import APIS, Project, ProjectArgs
from components.storage import TrainingBuckets
from components.tpu_node import NodeLocations, TpuNode, TpuNodeArgs
from model.archive import Archive
from model.naming import Naming
from model.pulumi_types import (
    COMPONENT_PROJECT,
    COMPONENT_TPU_NODE,
    COMPUTE_FIREWALL,
    COMPUTE_NETWORK,
    COMPUTE_SUBNETWORK,
    ORGANIZATIONS_PROJECT,
    PROJECTS_IAM_MEMBER,
    PROJECTS_SERVICE,
    SERVICEACCOUNT_ACCOUNT,
    SERVICEACCOUNT_KEY,
    STORAGE_BUCKET,
    STORAGE_BUCKET_IAM_MEMBER,
    STORAGE_BUCKET_OBJECT,
    TPU_V2_VM,
)
from model.settings.load import load_settings
from model.settings.schema import ProjectSettings, StorageSettings
from ops.plan.mock_engine import ProgramRun, Registration, run_program
from tests.infra.stack_fixtures import as_cli, config, node

NAMING = Naming("acme-ml-test", "test")


def declare(build: callable) -> ProgramRun:
    return run_program({}, "test", program=build)


def only(run: ProgramRun, type_token: str) -> Registration:
    found = run.of_type(type_token)
    assert len(found) == 1, [r.name for r in found]
    return found[0]


def parent_type(run: ProgramRun, resource: Registration) -> str:
    return run.by_urn()[resource.parent].type


# ---- project ---------------------------------------------------------------

def test_adopted_project_enables_apis_that_stay_on_destroy() -> None:
    run = declare(lambda: Project("project", ProjectArgs(
        project_id="acme-ml-test", settings=ProjectSettings(), labels={})))
    services = run.of_type(PROJECTS_SERVICE)
    assert sorted(s.inputs["service"] for s in services) == sorted(APIS)
    for service in services:
        assert service.inputs["disableOnDestroy"] is False
        assert service.inputs["project"] == "acme-ml-test"
        assert parent_type(run, service) == COMPONENT_PROJECT
    assert not run.of_type(ORGANIZATIONS_PROJECT)


def test_created_project_is_protected_and_has_no_default_network() -> None:
    settings = ProjectSettings(create=True, billing_account="01AB23-45CD67-89EF01",
                               folder_id="1234567890")
    run = declare(lambda: Project("project", ProjectArgs(
        project_id="acme-ml-test", settings=settings, labels={"stack": "test"})))
    project = only(run, ORGANIZATIONS_PROJECT)
    assert project.protect
    assert project.inputs["autoCreateNetwork"] is False
    assert project.inputs["billingAccount"] == "01AB23-45CD67-89EF01"
    assert project.inputs["folderId"] == "1234567890"


# ---- network ---------------------------------------------------------------

def network_run(regions: list[str], iap: bool = True) -> ProgramRun:
    return declare(lambda: Network("network", NetworkArgs(
        project_id="acme-ml-test", naming=NAMING, regions=regions,
        subnet_cidr="10.128.0.0/20", ssh_through_iap=iap, node_tag="test-tpu-node")))


def test_network_has_private_google_access_and_no_auto_subnets() -> None:
    run = network_run(["us-central1"])
    vpc = only(run, COMPUTE_NETWORK)
    assert vpc.inputs["autoCreateSubnetworks"] is False
    subnet = only(run, COMPUTE_SUBNETWORK)
    assert subnet.inputs["privateIpGoogleAccess"] is True
    assert subnet.inputs["ipCidrRange"] == "10.128.0.0/20"
    assert subnet.inputs["region"] == "us-central1"


def test_firewall_allows_internal_traffic_and_ssh_only_from_iap() -> None:
    """Within the stack's own subnets, by address (a tag anyone can set is no boundary,
    and a TPU VM's match by service account is unconfirmed: components/network.py), and
    SSH from IAP to the node tag."""
    rules = {r.name: r.inputs for r in network_run(["us-central1", "us-central2"]).of_type(
        COMPUTE_FIREWALL)}
    ranges = ["10.128.0.0/20", "10.128.16.0/20"]
    assert rules["allow-internal"]["sourceRanges"] == ranges
    assert rules["allow-internal"]["destinationRanges"] == ranges
    for key in ("targetTags", "targetServiceAccounts", "sourceServiceAccounts", "sourceTags"):
        assert key not in rules["allow-internal"], key
    assert rules["allow-iap-ssh"]["targetTags"] == ["test-tpu-node"]
    assert rules["allow-iap-ssh"]["sourceRanges"] == ["35.235.240.0/20"]
    assert rules["allow-iap-ssh"]["allows"] == [{"protocol": "tcp", "ports": ["22"]}]
    assert "allow-iap-ssh" not in {r.name for r in network_run(["us-central1"], iap=False)
                                   .of_type(COMPUTE_FIREWALL)}


def test_each_region_has_its_own_slot_of_the_grid() -> None:
    ranges = subnet_ranges("10.128.0.0/20", ["us-central1", "us-central2", "europe-west4"])
    assert ranges == {"us-central1": "10.128.0.0/20", "us-central2": "10.128.16.0/20",
                      "europe-west4": "10.128.32.0/20"}


def test_adding_or_removing_a_region_moves_no_range() -> None:
    """The old rule split the grid between the regions present: a second region
    shrank the first one's range, which replaces its subnet and its nodes."""
    regions = ["us-central1"]
    before = subnet_ranges("10.128.0.0/20", regions)
    for added in ("europe-west4", "asia-northeast1", "us-central2"):
        regions = [*regions, added]
        after = subnet_ranges("10.128.0.0/20", regions)
        assert {r: after[r] for r in before} == before
        before = after
    assert subnet_ranges("10.128.0.0/20", regions[1:]) == {r: before[r] for r in regions[1:]}


def test_pinned_ranges_win_over_slots() -> None:
    pinned = {"us-central1": "10.128.0.0/21", "us-central2": "10.128.8.0/21"}
    ranges = subnet_ranges("10.128.0.0/20", ["us-central1", "us-central2", "europe-west4"],
                           pinned)
    assert ranges == {**pinned, "europe-west4": "10.128.32.0/20"}


def test_a_region_whose_slot_a_pin_holds_takes_the_next_free_block() -> None:
    """prod pins us-central2 to us-central1's slot: a us-central1 node gets the next
    free block, and every later region the first free one at or after its own slot."""
    ranges = subnet_ranges("10.128.0.0/20", ["us-central1", "us-central2", "europe-west4"],
                           {"us-central2": "10.128.0.0/20"})
    assert ranges == {"us-central1": "10.128.16.0/20", "us-central2": "10.128.0.0/20",
                      "europe-west4": "10.128.32.0/20"}
    pushed = subnet_ranges("10.128.0.0/20", ["us-central1", "us-central2"],
                           {"europe-west4": "10.128.16.0/20"})
    assert pushed == {"us-central1": "10.128.0.0/20", "us-central2": "10.128.32.0/20"}


def test_ranges_do_not_depend_on_the_regions_in_use() -> None:
    """Every subset of the regions, in any order, gets the same ranges as the whole
    grid: which regions a stack uses never moves a range."""
    from model.subnets import REGION_SLOTS, grid_ranges

    pinned = {"us-central2": "10.128.0.0/20", "us-east1": "10.128.64.0/21"}
    grid = grid_ranges("10.128.0.0/20", pinned)
    assert set(grid) == set(REGION_SLOTS)
    for used in (["us-central1"], ["asia-northeast1", "us-central1"], list(REGION_SLOTS[::-1])):
        assert subnet_ranges("10.128.0.0/20", used, pinned) == {r: grid[r] for r in used}
    nets = [ipaddress.IPv4Network(n) for n in grid.values()]
    assert not any(a.overlaps(b) for i, a in enumerate(nets) for b in nets[i + 1:])


def test_pinning_a_region_where_it_is_moves_nothing() -> None:
    """The upgrade path: pinning the ranges a stack has changes no range."""
    from model.subnets import grid_ranges

    before = grid_ranges("10.128.0.0/20", {"us-central2": "10.128.0.0/20"})
    after = grid_ranges("10.128.0.0/20", {"us-central2": "10.128.0.0/20",
                                          "us-central1": before["us-central1"]})
    assert after == before


def test_a_region_with_no_slot_or_no_block_is_told_to_pin() -> None:
    from model.subnets import SubnetRangeError

    with pytest.raises(SubnetRangeError, match="mars-north1 has no subnet slot; pin its range"):
        subnet_ranges("10.128.0.0/20", ["mars-north1"])
    with pytest.raises(SubnetRangeError, match="us-central2 has no free block"):
        subnet_ranges("255.255.255.0/24", ["us-central2"])


def test_every_catalog_region_has_a_slot() -> None:
    from model import catalog
    from model.subnets import REGION_SLOTS

    assert {catalog.region_of(z) for z in catalog.all_zones()} <= set(REGION_SLOTS)
    assert len(set(REGION_SLOTS)) == len(REGION_SLOTS)


# ---- storage ---------------------------------------------------------------

def buckets_run(**storage: object) -> ProgramRun:
    settings = StorageSettings(location="US", **storage)
    from components.storage import BucketsArgs
    return declare(lambda: TrainingBuckets("storage", BucketsArgs(
        project_id="acme-ml-test", naming=NAMING, settings=settings,
        labels={"stack": "test", "managed-by": "pulumi"})))


def test_buckets_are_private_uniform_and_labelled() -> None:
    buckets = {b.name: b for b in buckets_run().of_type(STORAGE_BUCKET)}
    assert set(buckets) == {"data", "artifacts", "checkpoints", "logs"}
    for purpose, bucket in buckets.items():
        assert bucket.inputs["uniformBucketLevelAccess"] is True
        assert bucket.inputs["publicAccessPrevention"] == "enforced"
        assert bucket.inputs["forceDestroy"] is False
        assert bucket.inputs["labels"] == {"stack": "test", "managed-by": "pulumi",
                                           "purpose": purpose}
        assert bucket.inputs["name"] == f"acme-ml-test-test-{purpose}"


def test_precious_buckets_are_protected_and_versioned_where_overwritten() -> None:
    buckets = {b.name: b for b in buckets_run().of_type(STORAGE_BUCKET)}
    assert {n for n, b in buckets.items() if b.protect} == {"data", "checkpoints"}
    assert {n for n, b in buckets.items() if b.inputs["versioning"]["enabled"]} == {
        "artifacts", "checkpoints"}
    logs_rule = buckets["logs"].inputs["lifecycleRules"][0]
    assert logs_rule["action"]["type"] == "Delete" and logs_rule["condition"]["age"] == 90


@dataclass
class Version:
    """One version of a GCS object: created on day `created`, noncurrent from `noncurrent`."""

    name: str
    generation: int
    created: int
    noncurrent: int | None = None


def lifecycle_deletes(rules: list[dict], versions: list[Version], today: int) -> set[int]:
    """The generations GCS Object Lifecycle Management deletes on `today`: every
    condition of a rule must hold; numNewerVersions counts newer versions of the same
    name (live one included); daysSinceNoncurrentTime and withState=ARCHIVED only
    match noncurrent versions (cloud.google.com/storage/docs/lifecycle#conditions)."""
    def holds(key: str, value: object, v: Version) -> bool:
        newer = sum(o.name == v.name and o.generation > v.generation for o in versions)
        checks = {
            "age": lambda: today - v.created >= value,
            "numNewerVersions": lambda: newer >= value,
            "daysSinceNoncurrentTime": lambda: (v.noncurrent is not None
                                                and today - v.noncurrent >= value),
            "withState": lambda: {"ANY": True, "LIVE": v.noncurrent is None,
                                  "ARCHIVED": v.noncurrent is not None}[value],
            "matchesPrefix": lambda: any(v.name.startswith(p) for p in value),
        }
        return checks[key]()

    return {v.generation for v in versions for r in rules if r["action"]["type"] == "Delete"
            and all(holds(k, val, v) for k, val in r["condition"].items())}


def test_old_packages_expire_and_the_referenced_one_never_does() -> None:
    """Ten deploys a week apart, each a new package name; Pulumi's replacement
    leaves the old object noncurrent (versioned bucket). Then 90 quiet days."""
    rules = {b.name: b for b in buckets_run().of_type(
        STORAGE_BUCKET)}["artifacts"].inputs["lifecycleRules"]
    versions = [Version(f"packages/tpu_training-{n:02d}.tar.gz", n, 7 * n, None)
                for n in range(10)]
    for old, new in itertools.pairwise(versions):
        old.noncurrent = new.created
    live = versions[-1]
    for today in (63, 63 + 30, 63 + 90):
        gone = lifecycle_deletes(rules, versions, today)
        assert live.generation not in gone
        assert gone == {v.generation for v in versions
                        if v.noncurrent is not None and today - v.noncurrent >= 30}
    assert len(lifecycle_deletes(rules, versions, 63 + 90)) == 9


def test_dev_may_opt_out_of_protection() -> None:
    buckets = buckets_run(force_destroy=True, protect=False).of_type(STORAGE_BUCKET)
    assert not any(b.protect for b in buckets)
    assert all(b.inputs["forceDestroy"] is True for b in buckets)


# ---- identity --------------------------------------------------------------

def identity_run() -> ProgramRun:
    names = {p: NAMING.bucket(p) for p in ("data", "artifacts", "checkpoints", "logs")}
    return declare(lambda: RuntimeIdentity("identity", IdentityArgs(
        project_id="acme-ml-test", naming=NAMING, buckets=names)))


def test_runtime_account_reads_inputs_and_writes_outputs_on_its_buckets() -> None:
    run = identity_run()
    account = only(run, SERVICEACCOUNT_ACCOUNT)
    assert account.inputs["accountId"] == "test-runtime"
    member = "serviceAccount:test-runtime@acme-ml-test.iam.gserviceaccount.com"
    grants = {(b.inputs["bucket"].rsplit("-", 1)[1], b.inputs["role"])
              for b in run.of_type(STORAGE_BUCKET_IAM_MEMBER)}
    assert all(b.inputs["member"] == member
               for b in run.of_type(STORAGE_BUCKET_IAM_MEMBER))
    writes = {bucket for bucket, role in grants if role == "roles/storage.objectUser"}
    reads = {bucket for bucket, role in grants if role == "roles/storage.objectViewer"}
    assert writes == {"checkpoints", "logs"}
    assert reads == {"data", "artifacts"}


def test_runtime_account_has_only_the_project_roles_a_job_needs() -> None:
    run = identity_run()
    roles = {m.inputs["role"] for m in run.of_type(PROJECTS_IAM_MEMBER)}
    assert roles == {"roles/logging.logWriter", "roles/monitoring.metricWriter",
                     "roles/tpu.viewer"}
    assert not run.of_type(SERVICEACCOUNT_KEY)
    every_role = roles | {b.inputs["role"] for b in run.of_type(
        STORAGE_BUCKET_IAM_MEMBER)}
    assert not every_role & {"roles/editor", "roles/owner", "roles/storage.admin"}


# ---- package ---------------------------------------------------------------

def test_package_object_is_named_by_its_sha256(tmp_path) -> None:
    archive = Archive(data=b"fake archive", sha256="ab" * 32)
    holder: dict[str, TrainingPackage] = {}

    def build() -> None:
        holder["package"] = TrainingPackage("package", PackageArgs(
            bucket="acme-ml-test-test-artifacts", archive=archive, staging_dir=tmp_path))

    run = declare(build)
    obj = only(run, STORAGE_BUCKET_OBJECT)
    # A new package is a new logical name: created before the old one is deleted.
    assert obj.name == f"archive-{'ab' * 8}"
    assert obj.inputs["name"] == f"packages/tpu_training-{'ab' * 32}.tar.gz"
    assert obj.inputs["bucket"] == "acme-ml-test-test-artifacts"
    assert obj.inputs["metadata"] == {"sha256": "ab" * 32}
    assert holder["package"].uri == (f"gs://acme-ml-test-test-artifacts/packages/"
                                     f"tpu_training-{'ab' * 32}.tar.gz")
    assert (tmp_path / f"tpu_training-{'ab' * 32}.tar.gz").read_bytes() == b"fake archive"


# ---- TPU node --------------------------------------------------------------

def node_run(**node_changes: object) -> tuple[ProgramRun, TpuNodeArgs]:
    settings = load_settings(as_cli(config(tpu_stack_nodes=[node(**node_changes)])), "test")
    trainer = settings.nodes[0]
    args = TpuNodeArgs(
        project_id="acme-ml-test", node_id="test-trainer", settings=trainer,
        job=settings.job(trainer.job),
        locations=NodeLocations(
            data_root="gs://d", checkpoint_dir="gs://c/ckpt/test-trainer/",
            export_dir="gs://c/export/test-trainer/", tensorboard_dir="gs://l/tb/test-trainer/",
            status_prefix="gs://l/status/test-trainer/"),
        package_uri="gs://a/packages/tpu_training-00.tar.gz", package_sha256="00",
        service_account_email="test-runtime@acme-ml-test.iam.gserviceaccount.com",
        network="projects/p/global/networks/n", subnetwork="projects/p/regions/r/subnetworks/s",
        network_tag="test-tpu-node", labels={"stack": "test", "managed-by": "pulumi"})
    return declare(lambda: TpuNode("node-trainer", args)), args


def test_node_is_replaced_delete_first_under_its_component() -> None:
    run, _ = node_run()
    vm = only(run, TPU_V2_VM)
    assert vm.delete_before_replace
    assert parent_type(run, vm) == COMPONENT_TPU_NODE
    assert vm.inputs["name"] == "test-trainer"
    assert vm.inputs["zone"] == "us-central1-a"
    assert vm.inputs["runtimeVersion"] == "tpu-vm-tf-2.18.0-pjrt"


def test_ssh_is_os_login_and_gclouds_ssh_keys_are_left_alone() -> None:
    """`gcloud compute tpus tpu-vm ssh` writes ssh-keys into the node's metadata
    (even with OS Login); V2Vm.metadata is authoritative, so the stack must ignore
    that key, or every `up --refresh` removes it."""
    vm = only(node_run()[0], TPU_V2_VM)
    assert vm.inputs["metadata"]["enable-oslogin"] == "TRUE"
    assert "ssh-keys" not in vm.inputs["metadata"]
    assert vm.ignore_changes == ['metadata["ssh-keys"]', 'metadata["tpu-stack-stop"]']


def test_node_runs_as_the_runtime_account_without_external_ips() -> None:
    vm = only(node_run()[0], TPU_V2_VM)
    assert vm.inputs["serviceAccount"] == {
        "email": "test-runtime@acme-ml-test.iam.gserviceaccount.com",
        "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}
    assert vm.inputs["networkConfig"]["enableExternalIps"] is False
    assert vm.inputs["tags"] == ["test-tpu-node"]
    assert vm.inputs["labels"]["managed-by"] == "pulumi"


def test_node_carries_every_metadata_key_of_the_contract() -> None:
    run, args = node_run()
    metadata = only(run, TPU_V2_VM).inputs["metadata"]
    assert set(metadata) == {agent.STARTUP_SCRIPT_KEY, "tpu-stack-release", agent.WORKERS_KEY,
                             agent.STATUS_KEY, agent.RUNTIME_KEY, "enable-guest-attributes",
                             "tpu-stack-node", "enable-oslogin"}
    assert metadata["enable-guest-attributes"] == "TRUE"
    assert metadata["tpu-stack-node"] == "test-trainer"  # the node id, not a worker's name
    assert metadata[agent.RUNTIME_KEY] == args.settings.runtime
    assert metadata[agent.STARTUP_SCRIPT_KEY] == agent.startup_script()
    assert metadata["tpu-stack-release"] == "gs://a/releases/test-trainer/"
    assert metadata[agent.WORKERS_KEY] == "all"


def release_of(run: ProgramRun) -> tuple[Registration, dict]:
    (release,) = [o for o in run.of_type(STORAGE_BUCKET_OBJECT)
                  if "-release-" in o.name]
    content = release.inputs["content"]
    return release, json.loads(content["value"] if isinstance(content, dict) else content)


def test_each_release_is_an_object_named_by_its_content_under_the_pointer() -> None:
    """Contract C1: releases/<node>/release-<sha16 of the content>.json in the package's
    bucket; compact JSON with sorted keys: the resolved job, the package and its sha256."""
    run, args = node_run()
    release, content = release_of(run)
    raw = json.dumps(content, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(raw.encode()).hexdigest()[:16]
    assert release.name == f"node-trainer-release-{digest}"
    assert release.inputs["name"] == f"releases/test-trainer/release-{digest}.json"
    assert release.inputs["bucket"] == "a"
    assert parent_type(run, release) == COMPONENT_TPU_NODE
    assert content["package"] == args.package_uri and content["sha256"] == "00"
    job = content["job"]
    assert job["trainData"] == "gs://d/datasets/mnist/train-*.tfrecord"
    assert job["checkpointDir"] == "gs://c/ckpt/test-trainer/"
    assert job["exportDir"] == "gs://c/export/test-trainer/"
    assert job["tensorboardDir"] == "gs://l/tb/test-trainer/"
    assert job["noticeSeconds"] == 30  # a spot node's notice (contract C3)
    assert job["peakFlopsPerSecond"] == 8 * 197e12  # a v5litepod-8 (the job's MFU)
    assert job["mtbfSeconds"] == 24 * 3600  # spot: preemptible's 24-hour cap (auto interval)
    vm = only(run, TPU_V2_VM)
    assert release.urn in vm.dependencies  # the first boot finds its release


def test_an_on_demand_node_gets_the_standard_notice() -> None:
    job = release_of(node_run(provisioning="on-demand")[0])[1]["job"]
    assert job["noticeSeconds"] == 120
    assert job["mtbfSeconds"] == 30 * 24 * 3600  # maintenance, assumed monthly (unconfirmed)


@pytest.mark.parametrize(("provisioning", "expected"), [
    ("spot", {"spot": True}), ("preemptible", {"preemptible": True}),
    ("reserved", {"reserved": True}), ("on-demand", None)])
def test_scheduling_follows_provisioning(provisioning: str, expected: dict | None) -> None:
    vm = only(node_run(provisioning=provisioning)[0], TPU_V2_VM)
    assert vm.inputs.get("schedulingConfig") == expected


def test_accelerator_type_or_config_as_the_user_wrote_it() -> None:
    by_type = only(node_run()[0], TPU_V2_VM).inputs
    assert by_type["acceleratorType"] == "v5litepod-8" and "acceleratorConfig" not in by_type
    by_shape = only(node_run(acceleratorType=None, generation="v4", topology="2x2x4",
                             zone="us-central2-b")[0], TPU_V2_VM).inputs
    assert by_shape["acceleratorConfig"] == {"type": "V4", "topology": "2x2x4"}
    assert "acceleratorType" not in by_shape
    assert by_shape["runtimeVersion"] == "tpu-vm-tf-2.18.0-pod-pjrt"
    assert by_shape["metadata"][agent.WORKERS_KEY] == "0"


@pytest.mark.parametrize("change", [
    {"package_uri": "gs://a/packages/tpu_training-11.tar.gz", "package_sha256": "11"},
    {"job": "a hyperparameter, and the node pointed at another job"}])
def test_a_code_or_job_change_is_a_new_release_and_leaves_the_node_alone(change: dict) -> None:
    """Only the release object changes (a new logical name: created, then the old one
    deleted); the node's inputs, metadata included, stay exactly as they were, so no
    node is updated and a waiting queued request keeps its place."""
    import dataclasses
    run_a, args = node_run()
    if change.get("job"):
        change = {"job": dataclasses.replace(args.job, learningRate=0.5),
                  "settings": args.settings.model_copy(update={"job": "other"})}
    run_b = declare(lambda: TpuNode("node-trainer", dataclasses.replace(args, **change)))
    a = only(run_a, TPU_V2_VM).inputs
    b = only(run_b, TPU_V2_VM).inputs
    assert a == b
    (old, _), (new, _) = release_of(run_a), release_of(run_b)
    assert old.name != new.name and old.inputs["name"] != new.inputs["name"]


def test_component_options_are_visible_to_the_recording_monitor() -> None:
    run = declare(lambda: pulumi.ComponentResource("tpu-stack:index:Probe", "probe"))
    assert run.registrations[0].type == "tpu-stack:index:Probe"
    assert not run.registrations[0].custom
