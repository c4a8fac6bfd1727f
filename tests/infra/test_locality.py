"""The preview's warning when a node reads its job's data from another region."""

from __future__ import annotations

import pulumi
import pytest

from components.stack_config import file_config, settings_for
from model.locality import holds_region, stack_warnings
from model.settings.load import load_settings
from ops.plan.mock_engine import run_program
from tests.infra.stack_fixtures import as_cli, config, job, node

PLATFORM_POD = (
    "node pod in us-central2-b reads trainData from gs://acme-ml-shared-platform-data "
    "(us-central1) and writes checkpoints to gs://acme-ml-shared-platform-nlp-checkpoints "
    "(us-central1), outside its region us-central2: GCS charges for data moved across "
    "regions, every epoch for training data, ~$20/TB moved (unconfirmed, model/catalog.py; "
    "cloud.google.com/storage/pricing, data transfer within Google Cloud); keep the "
    "buckets in the node's region, or the node in the buckets' region")


def settings_of(location: str = "us-central1", zone: str = "us-central1-a", **job_changes):
    return load_settings(as_cli(config(
        tpu_stack_storage={"location": location, "forceDestroy": True, "protect": False},
        tpu_stack_nodes=[node(zone=zone)],
        tpu_stack_jobs={"mnist": job(**job_changes)})), "test")


def test_the_platforms_us_central2_pod_reads_its_data_from_us_central1() -> None:
    assert stack_warnings(settings_for("platform")) == [PLATFORM_POD]


@pytest.mark.parametrize("stack", ["dev", "prod", "team-vision"])
def test_stacks_whose_nodes_sit_by_their_data_have_no_warning(stack: str) -> None:
    assert stack_warnings(settings_for(stack)) == []


def test_a_node_in_another_region_than_the_data_bucket_is_warned_of() -> None:
    (warning,) = stack_warnings(settings_of(zone="europe-west4-b",
                                            evalData="datasets/mnist/eval-*.tfrecord"))
    assert warning.startswith("node trainer in europe-west4-b reads trainData from "
                              "gs://acme-ml-test-test-data (us-central1) and evalData from "
                              "gs://acme-ml-test-test-data (us-central1) and writes "
                              "checkpoints to gs://acme-ml-test-test-checkpoints (us-central1), "
                              "outside its region europe-west4:")
    assert "~$80/TB moved" in warning  # between continents


def test_a_gs_uri_counts_only_in_a_bucket_the_stack_knows() -> None:
    known = settings_of(location="europe-west4",
                        trainData="gs://acme-ml-test-test-artifacts/train-*.tfrecord")
    assert stack_warnings(known)[0].startswith(
        "node trainer in us-central1-a reads trainData from gs://acme-ml-test-test-artifacts "
        "(europe-west4)")
    foreign = settings_of(location="europe-west4", trainData="gs://someone-else/train-*")
    # Only its checkpoints, in the stack's own bucket, count (issue 45).
    (warning,) = stack_warnings(foreign)
    assert "someone-else" not in warning
    assert warning.startswith("node trainer in us-central1-a writes checkpoints to "
                              "gs://acme-ml-test-test-checkpoints (europe-west4)")


@pytest.mark.parametrize(("location", "region", "held"), [
    ("us-central1", "us-central1", True), ("US-CENTRAL1", "us-central2", False),
    ("NAM4", "us-east1", True), ("nam4", "us-central2", False),
    ("US", "us-central2", True), ("US", "europe-west4", False),
    ("EU", "europe-west4", True), ("EU", "europe-west2", False),
    ("ASIA", "asia-northeast1", True), ("somewhere", "us-central1", None),
])
def test_where_a_location_keeps_its_data(location: str, region: str, held: bool | None) -> None:
    assert holds_region(location, region) is held


def test_the_preview_warns_on_the_node(monkeypatch: pytest.MonkeyPatch) -> None:
    warned = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, resource=None, **_: warned.append(
        (message, type(resource).__name__)))
    run_program(file_config("platform"), "platform")
    assert (PLATFORM_POD, "TpuNode") in warned
