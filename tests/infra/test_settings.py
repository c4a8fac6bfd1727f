"""Stack config validation: every bad value is one clear problem naming its key."""

from __future__ import annotations

import json
import re

import pytest

from components.stack_config import StackFileError, file_config
from model import catalog
from model.archive import REPO_ROOT
from model.settings.load import load_settings
from model.settings.schema import SettingsError
from tests.infra.stack_fixtures import as_cli, config, job, node


def load(data: dict) -> object:
    return load_settings(as_cli(data), "test")


def problems_of(data: dict) -> list[tuple[str, str]]:
    with pytest.raises(SettingsError) as caught:
        load(data)
    return caught.value.problems


def nodes(*items: dict) -> dict:
    return {"tpu_stack_nodes": list(items)}


def jobs(**items: dict) -> dict:
    return {"tpu_stack_jobs": items}


N0 = "tpu-stack:nodes[0]"
J = "tpu-stack:jobs.mnist"

# (case id, config changes, key path the message must name, words it must contain)
CI = {"githubRepository": "acme/x", "githubRepositoryId": 260064828,
      "githubRepositoryOwnerId": "1342004"}

BAD_CONFIGS: list[tuple[str, dict, str, str]] = [
    ("unknown top-level key", {"tpu_stack_nodez": []}, "tpu-stack:nodez", "unknown key"),
    ("missing gcp project", {"gcp_project": None}, "gcp:project", "required"),
    ("bad project id", {"gcp_project": "Acme_ML"}, "gcp:project", "not a project id"),
    ("short project id", {"gcp_project": "ab"}, "gcp:project", "6-30"),
    ("missing storage", {"tpu_stack_storage": None}, "tpu-stack:storage",
     "is required, with at least location"),
    ("missing storage location", {"tpu_stack_storage": {"forceDestroy": True}},
     "tpu-stack:storage.location", "required"),
    ("bad storage location", {"tpu_stack_storage": {"location": "us central"}},
     "tpu-stack:storage.location", "not a Cloud Storage location"),
    ("unknown storage key", {"tpu_stack_storage": {"location": "US", "versioned": True}},
     "tpu-stack:storage.versioned", "allowed: location"),
    ("force destroy in prod", {"tpu_stack_environment": "prod"},
     "tpu-stack:storage.forceDestroy", "only with tpu-stack:environment dev"),
    ("unprotected prod data", {"tpu_stack_environment": "prod",
                               "tpu_stack_storage": {"location": "US", "protect": False}},
     "tpu-stack:storage.protect", "only with tpu-stack:environment dev"),
    ("unknown environment", {"tpu_stack_environment": "staging"},
     "tpu-stack:environment", "'dev' or 'prod'"),
    ("retention not positive", {"tpu_stack_storage": {"location": "US", "logRetentionDays": 0}},
     "tpu-stack:storage.logRetentionDays", "greater than or equal to 1"),
    ("create without billing", {"tpu_stack_project": {"create": True}},
     "tpu-stack:project.billingAccount", "required when create is true"),
    ("bad billing account", {"tpu_stack_project": {"create": True, "billingAccount": "123"}},
     "tpu-stack:project.billingAccount", "XXXXXX-XXXXXX-XXXXXX"),
    ("folder id not digits", {"tpu_stack_project": {"create": True,
                                                    "billingAccount": "01AB23-45CD67-89EF01",
                                                    "folderId": "folders/12"}},
     "tpu-stack:project.folderId", "digits only"),
    ("billing without create", {"tpu_stack_project": {"billingAccount": "01AB23-45CD67-89EF01"}},
     "tpu-stack:project.create", "only with create: true"),
    ("bad label key", {"tpu_stack_labels": {"Cost-Centre": "x"}},
     "tpu-stack:labels.Cost-Centre", "not a label key"),
    ("bad label value", {"tpu_stack_labels": {"cost-centre": "CC 12"}},
     "tpu-stack:labels.cost-centre", "not a label value"),
    ("bad subnet cidr", {"tpu_stack_network": {"subnetCidr": "10.0.0.0/33"}},
     "tpu-stack:network.subnetCidr", "not an IPv4 CIDR"),
    ("public subnet", {"tpu_stack_network": {"subnetCidr": "8.8.0.0/20"}},
     "tpu-stack:network.subnetCidr", "private range"),
    ("pinned range not a CIDR", {"tpu_stack_network": {"subnets": {"us-central1": "10.1/33"}}},
     "tpu-stack:network.subnets.us-central1", "'10.1/33' is not an IPv4 CIDR range"),
    ("pinned range outside RFC 1918",
     {"tpu_stack_network": {"subnets": {"us-central1": "100.64.0.0/20"}}},
     "tpu-stack:network.subnets.us-central1", "must be a private range (RFC 1918"),
    ("pinned range too small", {"tpu_stack_network": {"subnets": {"us-central1": "10.0.0.0/30"}}},
     "tpu-stack:network.subnets.us-central1", "of /29 or larger"),
    ("pinned unknown region", {"tpu_stack_network": {"subnets": {"us-cenral1": "10.0.0.0/20"}}},
     "tpu-stack:network.subnets.us-cenral1", "'us-cenral1' is not a region with TPUs"),
    ("pins overlap", {"tpu_stack_network": {"subnets": {"us-central1": "10.0.0.0/16",
                                                        "us-central2": "10.0.8.0/21"}}},
     "tpu-stack:network.subnets.us-central2",
     "us-central2's range 10.0.8.0/21 overlaps us-central1's 10.0.0.0/16"),
    ("slot leaves private space",
     {"tpu_stack_network": {"subnetCidr": "192.168.240.0/20"},
      "tpu_stack_nodes": [node(), node(name="b", zone="us-central2-b", acceleratorType="v4-8")]},
     "tpu-stack:network.subnetCidr", "us-central2's slot range 192.169.0.0/20"),
    ("nodes not a list", {"tpu_stack_nodes": {"name": "x"}}, "tpu-stack:nodes",
     "valid list"),
    ("node name missing", nodes(node(name=None)), f"{N0}.name", "required"),
    ("node name uppercase", nodes(node(name="Trainer")), f"{N0}.name", "lowercase"),
    ("duplicate node names", nodes(node(), node()), "tpu-stack:nodes[1].name",
     "already the name of nodes[0]"),
    ("unknown node key", nodes(node(spot=True)), f"{N0}.spot", "allowed: name, zone"),
    ("unknown provisioning", nodes(node(provisioning="cheap")), f"{N0}.provisioning",
     "'on-demand', 'spot'"),
    ("no accelerator", nodes(node(acceleratorType=None)), f"{N0}.acceleratorType",
     "give acceleratorType"),
    ("type and topology", nodes(node(generation="v5e", topology="2x4")),
     f"{N0}.acceleratorType", "not both"),
    ("unknown type prefix", nodes(node(acceleratorType="v9-8")), f"{N0}.acceleratorType",
     "not an accelerator type"),
    ("type size not offered", nodes(node(acceleratorType="v5litepod-12")),
     f"{N0}.acceleratorType", "is not offered"),
    ("odd TensorCore count", nodes(node(acceleratorType="v4-9", zone="us-central2-b")),
     f"{N0}.acceleratorType", "TensorCores, 2 per chip"),
    ("unknown generation", nodes(node(acceleratorType=None, generation="v7", topology="2x2")),
     f"{N0}.generation", "not a TPU generation"),
    ("topology without generation", nodes(node(acceleratorType=None, topology="2x4")),
     f"{N0}.generation", "required with topology"),
    ("v5e topology 3x3", nodes(node(acceleratorType=None, generation="v5e", topology="3x3")),
     f"{N0}.topology", "3x3 is not a v5e topology (1x1, 2x2, 2x4"),
    ("3D topology on v5e", nodes(node(acceleratorType=None, generation="v5e",
                                      topology="2x2x1")),
     f"{N0}.topology", "2D"),
    ("v4 side of 3", nodes(node(acceleratorType=None, generation="v4", topology="2x2x3",
                                zone="us-central2-b")),
     f"{N0}.topology", "not a v4 topology"),
    ("v4 unordered sides", nodes(node(acceleratorType=None, generation="v4", topology="4x2x2",
                                      zone="us-central2-b")),
     f"{N0}.topology", "A<=B<=C"),
    ("zone without the generation", nodes(node(zone="us-central2-b")), f"{N0}.zone",
     "does not offer TPU v5e"),
    ("malformed zone", nodes(node(zone="uscentral1")), f"{N0}.zone", "not a zone name"),
    ("undocumented TF image", nodes(node(runtimeVersion="tpu-vm-tf-2.19.0-pjrt")),
     f"{N0}.runtimeVersion", "no Google source names such an image"),
    ("pod slice on single-host image",
     nodes(node(acceleratorType="v4-32", zone="us-central2-b",
                runtimeVersion="tpu-vm-tf-2.18.0-pjrt")),
     f"{N0}.runtimeVersion", "use a -pod image"),
    ("single host on pod image", nodes(node(runtimeVersion="tpu-vm-tf-2.18.0-pod-pjrt")),
     f"{N0}.runtimeVersion", "is one host"),
    ("stream executor image on v5e", nodes(node(runtimeVersion="tpu-vm-tf-2.18.0-se")),
     f"{N0}.runtimeVersion", "v5e runs TensorFlow on -pjrt images only"),
    ("unsupported TF", nodes(node(runtimeVersion="tpu-vm-tf-2.14.1")),
     f"{N0}.runtimeVersion", "the training package carries tf-keras for TensorFlow 2.15 to"),
    ("v6e pod with TensorFlow", nodes(node(acceleratorType="v6e-16", zone="us-east1-d")),
     f"{N0}.runtimeVersion", "tensorflow/python/tools/grpc_tpu_worker.py"),
    ("framework-free image", nodes(node(runtimeVersion="v2-alpha-tpuv5-lite")),
     f"{N0}.runtimeVersion", "not a TensorFlow TPU VM image"),
    ("unknown job", nodes(node(job="bert")), f"{N0}.job", "not a key of tpu-stack:jobs"),
    ("queue without queued", nodes(node(queue={"spot": True})), f"{N0}.queue",
     "only with provisioning: queued"),
    ("queue spot and guaranteed", nodes(node(provisioning="queued",
                                             queue={"spot": True, "guaranteed": True})),
     f"{N0}.queue.spot", "not both"),
    ("queue bad duration", nodes(node(provisioning="queued",
                                      queue={"validUntilDuration": "6 hours"})),
     f"{N0}.queue.validUntilDuration", "not a duration"),
    ("bad node label", nodes(node(labels={"owner": "Alice"})), f"{N0}.labels.owner",
     "not a label value"),
    ("external ips not bool", nodes(node(externalIps="maybe")), f"{N0}.externalIps",
     "valid boolean"),
    ("batch not divisible", jobs(mnist=job(globalBatchSize=1020)), f"{J}.globalBatchSize",
     "not divisible by the 8 replicas"),
    ("unknown model", jobs(mnist=job(model="gpt")), f"{J}.model", "not a known model"),
    ("job missing trainData", jobs(mnist={k: v for k, v in job().items() if k != "trainData"}),
     f"{J}.trainData", "required"),
    ("job batch not a number", jobs(mnist=job(globalBatchSize="big")), f"{J}.globalBatchSize",
     "whole number"),
    ("job zero steps", jobs(mnist=job(trainSteps=0)), f"{J}.trainSteps", "at least 1"),
    ("imagenet records for mnist_cnn", jobs(mnist=job(recordFormat="imagenet")),
     f"{J}.recordFormat", "mnist_cnn reads raw records only"),
    ("unknown record format", jobs(mnist=job(recordFormat="jpeg")), f"{J}.recordFormat",
     "allowed: raw, imagenet"),
    ("job unknown key", jobs(mnist=job(epochs=3)), f"{J}.epochs", "unknown key"),
    ("job sets a location", jobs(mnist=job(checkpointDir="gs://x/ckpt")),
     f"{J}.checkpointDir", "unknown key"),
    ("checkpoint not whole executions", jobs(mnist=job(checkpointEverySteps=250)),
     f"{J}.checkpointEverySteps", "not a multiple of stepsPerExecution"),
    ("job name uppercase", {"tpu_stack_jobs": {"MNIST": job()},
                            "tpu_stack_nodes": [node(job="MNIST")]},
     "tpu-stack:jobs.MNIST", "job names are"),
    ("ci bad repository", {"tpu_stack_ci": {**CI, "githubRepository": "acme"}},
     "tpu-stack:ci.githubRepository", "not owner/name"),
    ("ci reserved pool id", {"tpu_stack_ci": {**CI, "poolId": "gcp-x"}},
     "tpu-stack:ci.poolId", "not starting with gcp-"),
    ("ci without the repository's id", {"tpu_stack_ci": {"githubRepository": "acme/x",
                                                          "githubRepositoryOwnerId": 7}},
     "tpu-stack:ci.githubRepositoryId", "required"),
    ("ci id not a number", {"tpu_stack_ci": {**CI, "githubRepositoryOwnerId": "acme"}},
     "tpu-stack:ci.githubRepositoryOwnerId", "not a number"),
    ("ci branch with a quote", {"tpu_stack_ci": {**CI, "deployBranch": "main' || true"}},
     "tpu-stack:ci.deployBranch", "not a branch name"),
]


@pytest.mark.parametrize(("changes", "key", "words"),
                         [case[1:] for case in BAD_CONFIGS], ids=[c[0] for c in BAD_CONFIGS])
def test_bad_config_names_the_key(changes: dict, key: str, words: str) -> None:
    problems = problems_of(config(**changes))
    matching = [message for path, message in problems if path == key]
    assert matching, f"no problem for {key}: {problems}"
    assert any(words in message for message in matching), matching


def test_there_are_at_least_forty_bad_configs() -> None:
    assert len(BAD_CONFIGS) >= 40


def test_every_problem_is_reported_at_once() -> None:
    bad = config(tpu_stack_environment="prod",
                 tpu_stack_nodes=[node(zone="us-central2-b"), node(name="b", job="nope")])
    keys = {key for key, _ in problems_of(bad)}
    assert keys == {"tpu-stack:storage.forceDestroy", "tpu-stack:storage.protect",
                    f"{N0}.zone", "tpu-stack:nodes[1].job"}


def test_message_is_one_block_listing_each_problem() -> None:
    with pytest.raises(SettingsError) as caught:
        load(config(tpu_stack_nodes=[node(acceleratorType=None, generation="v5e",
                                          topology="3x3")]))
    text = str(caught.value)
    assert text.splitlines()[0] == "the stack config has 1 problem:"
    assert "tpu-stack:nodes[0].topology: 3x3 is not a v5e topology (1x1, 2x2, 2x4, 4x4" in text


def test_valid_config_resolves_the_slice_and_runtime() -> None:
    settings = load(config())
    trainer = settings.nodes[0]
    assert (trainer.tpu.accelerator_type, trainer.tpu.chips, trainer.tpu.hosts) == (
        "v5litepod-8", 8, 1)
    assert trainer.runtime == "tpu-vm-tf-2.18.0-pjrt"
    assert trainer.workers == "all"
    assert trainer.spot


def test_generation_and_topology_resolve_a_pod_slice() -> None:
    pod = node(acceleratorType=None, generation="v4", topology="2x2x4", zone="us-central2-b",
               provisioning="reserved")
    settings = load(config(tpu_stack_nodes=[pod], tpu_stack_jobs={"mnist": job()}))
    tpu = settings.nodes[0].tpu
    assert (tpu.accelerator_type, tpu.chips, tpu.hosts, tpu.replicas) == ("v4-32", 16, 4, 16)
    assert settings.nodes[0].runtime == "tpu-vm-tf-2.18.0-pod-pjrt"
    assert settings.nodes[0].workers == "0"
    assert not settings.nodes[0].spot


def test_empty_optional_blocks_mean_absent() -> None:
    settings = load(config(tpu_stack_ci={}, tpu_stack_project={}))
    assert settings.ci is None
    assert settings.project.create is False


def test_queue_duration_in_seconds() -> None:
    queued = node(provisioning="queued", queue={"spot": True, "validUntilDuration": "6h"})
    settings = load(config(tpu_stack_nodes=[queued]))
    assert settings.nodes[0].queue.valid_until_seconds == 6 * 3600
    assert settings.nodes[0].spot


@pytest.mark.parametrize("location", ["s3://bucket/train-*.tfrecord", "http://host/train-*",
                                      "https://host/train-*", "file:///data/train-*",
                                      "hdfs://nn/train-*", "ram://train-*"])
@pytest.mark.parametrize("key", ["trainData", "evalData"])
def test_a_location_with_another_scheme_than_gs_is_refused_naming_its_key(
        key: str, location: str) -> None:
    problems = dict(problems_of(config(tpu_stack_jobs={"mnist": job(**{key: location})})))
    scheme = location.split(":", 1)[0]
    assert f"the {scheme}: scheme is not supported" in problems[f"{J}.{key}"]
    assert "allowed: gs://" in problems[f"{J}.{key}"]


def test_gs_and_data_bucket_paths_are_locations() -> None:
    settings = load(config(tpu_stack_jobs={"mnist": job(
        trainData="gs://other-bucket/mnist/train-*.tfrecord",
        evalData="datasets/mnist/test-*.tfrecord")}))
    assert settings.job("mnist").trainData.startswith("gs://other-bucket/")


def test_a_team_job_location_is_checked_the_same_way() -> None:
    from components.stack_config import file_config
    from model.settings.schema import SettingsError as Error

    raw = file_config("platform")
    teams = json.loads(raw["tpu-stack:teams"])
    teams["nlp"]["jobs"]["sweep"]["trainData"] = "s3://acme/mnist/train-*"
    with pytest.raises(Error) as caught:
        load_settings({**raw, "tpu-stack:teams": json.dumps(teams)}, "platform")
    assert "tpu-stack:teams.nlp.jobs.sweep.trainData" in dict(caught.value.problems)


@pytest.mark.parametrize(("changes", "key", "meant"), [
    ({"tpu_stack_storage": None, "tpu_stack_storag": {"location": "US"}},
     "tpu-stack:storag", "tpu-stack:storage"),
    ({"tpu_stack_storage": {"locaton": "US"}}, "tpu-stack:storage.locaton", "location"),
    ({"tpu_stack_jobs": {"mnist": job(trainDta="x/*", trainData=None)}},
     f"{J}.trainDta", "trainData"),
])
def test_a_misspelt_key_is_one_line_with_did_you_mean(changes: dict, key: str,
                                                      meant: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load(config(**changes))
    assert caught.value.problems == [(key, caught.value.problems[0][1])]
    assert caught.value.problems[0][1].startswith(f"unknown key; did you mean {meant}? allowed: ")
    assert str(caught.value).splitlines()[0] == "the stack config has 1 problem:"


def _team_stack(ref: str) -> dict:
    from components.stack_config import file_config

    return {**file_config("team-vision"), "tpu-stack:platformStack": ref}


@pytest.mark.parametrize(("ref", "organization"), [
    ("acme/tpu-stack/platform", "acme"),                 # Pulumi Cloud
    ("organization/tpu-stack/platform", "organization"),  # self-managed (DIY)
    ("acme/tpu-stack/platform", None),                   # offline: backend unknown
    ("organization/tpu-stack/platform", None),
])
def test_both_backends_stack_reference_forms_are_accepted(ref: str, organization) -> None:
    settings = load_settings(_team_stack(ref), "team-vision", organization)
    assert settings.platform_stack == ref and settings.platform_naming.stack == "platform"


@pytest.mark.parametrize(("ref", "organization", "words"), [
    ("acme/tpu-stack/platform", "organization",
     "a self-managed backend, whose organization is always 'organization'"),
    ("organization/tpu-stack/platform", "acme", "Pulumi Cloud (organization 'acme')"),
    ("acme/platform", None, "is not a stack reference"),
    ("acme/other-project/platform", None, "is not a stack reference"),
    ("acme/tpu-stack/plat form", None, "is not a stack reference"),
])
def test_a_stack_reference_of_the_wrong_form_says_which_form_goes_with_which_backend(
        ref: str, organization, words: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(_team_stack(ref), "team-vision", organization)
    message = dict(caught.value.problems)["tpu-stack:platformStack"]
    assert words in message
    assert ("<your-org>/tpu-stack/<stack> on Pulumi Cloud" in message
            and "organization/tpu-stack/<stack> on a self-managed backend" in message)


def test_checkpoint_every_minutes_is_checked_by_the_job_schema():
    assert problems_of(config(**jobs(mnist=job(checkpointEveryMinutes=0)))) == [
        (f"{J}.checkpointEveryMinutes", "must be a number of minutes more than 0, got 0")]
    settings = load(config(**jobs(mnist=job(checkpointEveryMinutes=5))))
    assert settings.job("mnist").checkpointEveryMinutes == 5


def test_a_region_for_a_zone_gets_the_zones_that_offer_the_generation() -> None:
    v5e = problems_of(config(**nodes(node(zone="us-central1"))))
    v6e = problems_of(config(**nodes(node(acceleratorType="v6e-8", zone="us-east1"))))
    nowhere = problems_of(config(**nodes(node(zone="asia-east1"))))

    assert v5e == [(f"{N0}.zone", "'us-central1' is not a zone name: us-central1 is a region; "
                                  "TPU v5e is in its zone us-central1-a")]
    assert v6e == [(f"{N0}.zone", "'us-east1' is not a zone name: us-east1 is a region; "
                                  "TPU v6e is in its zone us-east1-d")]
    assert nowhere == [(f"{N0}.zone", "'asia-east1' is not a zone name: TPU v5e is in "
                                      "us-central1-a, us-south1-a, us-west1-c, us-west4-a, "
                                      "europe-west4-b")]


def test_the_v4_rule_text_names_the_one_host_shape_it_accepts() -> None:
    [(key, message)] = problems_of(config(**nodes(node(
        acceleratorType=None, generation="v4", topology="2x2x3", zone="us-central2-b"))))
    accepted = load(config(**nodes(node(acceleratorType=None, generation="v4",
                                        topology="2x2x1", zone="us-central2-b"))))

    assert key == f"{N0}.topology"
    assert message.startswith("2x2x3 is not a v4 topology: one host is 2x2x1; a larger slice "
                              "is AxBxC with A<=B<=C, every side 2 or 4 or every side a "
                              "multiple of 4, whole 4-chip hosts")
    assert accepted.nodes[0].tpu.topology == "2x2x1"


def test_a_missing_storage_block_names_its_full_key_and_location(tmp_path) -> None:
    (tmp_path / "Pulumi.yaml").write_text((REPO_ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.mine.yaml").write_text("config:\n  gcp:project: acme-ml-mine\n")

    with pytest.raises(StackFileError) as caught:
        file_config("mine", tmp_path)

    assert str(caught.value).startswith(
        "Stack 'mine' is missing configuration value 'storage' (set tpu-stack:storage in "
        "Pulumi.mine.yaml: Buckets: {location (required),")


def test_a_yaml_error_names_the_file_line_and_column(tmp_path) -> None:
    (tmp_path / "Pulumi.yaml").write_text((REPO_ROOT / "Pulumi.yaml").read_text())
    (tmp_path / "Pulumi.mine.yaml").write_text("config:\n  tpu-stack:nodes: [a, b\n")

    with pytest.raises(StackFileError) as caught:
        file_config("mine", tmp_path)

    first, *snippet = str(caught.value).splitlines()
    assert first == ("Pulumi.mine.yaml, line 3, column 1: not valid YAML: while parsing a flow "
                     "sequence; expected ',' or ']', but got '<stream end>'")
    assert snippet[-1].strip() == "^"
    assert "<unicode string>" not in str(caught.value)


# ---- every problem of a file in one pass (issue 29) ---------------------------------


@pytest.mark.parametrize(("location", "meant"), [
    ("us-cental1", "us-central1"), ("europe-west44", "europe-west4"), ("USA", "US"),
    ("nam5", "NAM4"), ("mars-north1", None),
])
def test_a_location_cloud_storage_does_not_publish_is_refused_with_the_closest(
        location: str, meant: str | None) -> None:
    [(key, message)] = problems_of(config(tpu_stack_storage={"location": location}))
    assert key == "tpu-stack:storage.location"
    assert message.startswith(f"{location!r} is not a Cloud Storage location")
    if meant and location != "mars-north1":
        assert f"(did you mean {meant}?)" in message
    assert "model/gcs_locations.json" in message


@pytest.mark.parametrize("location", ["us-central1", "US-CENTRAL1", "US", "eu", "nam4", "EUR4",
                                      "asia1", "us-central2", "africa-south1"])
def test_every_published_location_is_accepted_in_either_case(location: str) -> None:
    settings = load(config(tpu_stack_storage={"location": location, "forceDestroy": True,
                                              "protect": False}))
    assert settings.storage.location == location


def test_the_locations_file_names_its_source_and_date_and_holds_the_three_kinds() -> None:
    data = json.loads((REPO_ROOT / "model" / "gcs_locations.json").read_text())
    assert data["source"].startswith("https://cloud.google.com/storage/docs/locations")
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", data["read"])
    assert {"us-central1", "europe-west4", "us-south1"} <= set(data["regions"])
    assert set(data["dual_regions"]["nam4"]) == {"us-central1", "us-east1"}
    assert set(data["multi_regions"]) == {"us", "eu", "asia"}
    # every TPU zone's region can hold the stack's buckets
    assert {catalog.region_of(zone) for zone in catalog.all_zones()} <= set(data["regions"])


def test_shape_values_and_rules_are_all_named_in_one_pass() -> None:
    """An unknown key inside a node, a top-level typo, a bad zone and a job's negative batch:
    one message, whatever pydantic refused first."""
    problems = problems_of(config(
        tpu_stack_nodez=[],
        tpu_stack_storage={"location": "us-cental1", "forceDestroy": True, "protect": "maybe"},
        **nodes(node(acceleratorTyp="v5litepod-8", acceleratorType=None),
                node(name="second", zone="us-central1-b")),
        **jobs(mnist=job(globalBatchSize=-64))))
    keys = [key for key, _ in problems]
    assert keys == ["tpu-stack:nodez", "tpu-stack:storage.protect",
                    f"{N0}.acceleratorTyp", "tpu-stack:storage.location",
                    f"{J}.globalBatchSize", "tpu-stack:nodes[1].zone"]
    assert dict(problems)[f"{N0}.acceleratorTyp"].startswith(
        "unknown key; did you mean acceleratorType?")


def test_a_dropped_list_entry_keeps_the_other_entries_indices() -> None:
    problems = problems_of(config(**nodes("trainer", node(name="second",
                                                          zone="us-central1-b"))))
    assert [key for key, _ in problems] == ["tpu-stack:nodes[0]", "tpu-stack:nodes[1].zone"]


@pytest.mark.parametrize(("changes", "expected"), [
    # a required value of the wrong type: the rest of its block is still checked
    ({"tpu_stack_ci": {"githubRepository": "acme x", "githubRepositoryId": 1.5,
                       "githubRepositoryOwnerId": "1"}},
     ["tpu-stack:ci.githubRepositoryId", "tpu-stack:ci.githubRepository"]),
    # a refused value is not checked again against the rules it breaks
    ({"tpu_stack_environment": "staging"}, ["tpu-stack:environment"]),
    ({"gcp_project": None, "tpu_stack_labels": {"Team": "x"}},
     ["gcp:project", "tpu-stack:labels.Team"]),
])
def test_a_refused_part_is_named_once_and_the_rest_still_checked(changes: dict,
                                                                  expected: list[str]) -> None:
    assert [key for key, _ in problems_of(config(**changes))] == expected


def test_a_rule_added_as_a_generator_runs_despite_shape_problems(monkeypatch) -> None:
    """Other checks join `rule_problems` as generators of (key, message): they run on the
    repaired copy too, without knowing about it."""
    import model.settings.load as settings_module

    def no_trainer(s):
        if any(n.name == "trainer" for n in s.nodes):
            yield ("tpu-stack:nodes", "no node may be called trainer")

    rules = settings_module.rule_problems
    monkeypatch.setattr(settings_module, "rule_problems",
                        lambda s: (*rules(s), *no_trainer(s)))
    problems = problems_of(config(tpu_stack_nodez=[], tpu_stack_storage={"location": "US",
                                                                         "protect": 3}))
    assert problems[-1] == ("tpu-stack:nodes", "no node may be called trainer")


def test_the_new_team_recipe_names_everything_it_still_needs_at_once() -> None:
    """README's "A new team" on a copy of the dev stack: a team under tpu-stack:teams, and
    the first error lists every key the recipe still needs, not one per run."""
    team = {"members": ["group:ml-vision@acme.example"], "quota": {"v5e": {"spot": 8}}}
    for team_projects in (None, {}, {"folderId": "246813579024"}):
        problems = problems_of(config(tpu_stack_teams={"vision": team},
                                      tpu_stack_teamProjects=team_projects))
        needed = {"tpu-stack:teamProjects.quotaContact", "tpu-stack:teamProjects.billingAccount",
                  "tpu-stack:labels.cost-centre", "tpu-stack:teams.vision.subnetSlot",
                  "tpu-stack:teams.vision.alerts.email"}
        if team_projects != {"folderId": "246813579024"}:
            needed.add("tpu-stack:teamProjects.folderId")
        assert {key for key, message in problems if "is required" in message} == needed
