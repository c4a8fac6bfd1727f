"""A node with fallback, placed by FallbackTpuProvider against the fake TPU API over loopback."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from google.api_core import exceptions as gexc

from cloud.tpu import ENDPOINT_ENV, tpu_client
from components.fallback_tpu import FallbackTpuProvider
from components.queued_tpu import QueuedTpuError
from model import capacity
from tests.fakes.tpu_api import FakeTpuApi, running

PROJECT = "acme-ml-dev"
WAITS, QUOTA, TAKES = "us-east5-a", "us-east5-b", "us-central1-b"
V6E_SPOT_QUOTA = "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI"
MAX_WAIT = 1.0
# Polls, two force deletes confirmed gone, a create: seconds at most on a busy machine.
GRACE = 8.0


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeTpuApi]:
    api = FakeTpuApi(project=PROJECT, accelerator_types={
        z: ["v6e-8"] for z in (WAITS, QUOTA, TAKES, "us-east1-d")})
    with running(api):
        monkeypatch.setenv(ENDPOINT_ENV, api.endpoint)
        yield api


def candidate(zone: str) -> dict[str, object]:
    return {"zone": zone, "provisioning": "spot", "accelerator_type": "v6e-8",
            "runtime_version": "tpu-vm-tf-2.18.0-pjrt", "spot": True,
            "subnetwork": f"projects/{PROJECT}/regions/{zone[:-2]}/subnetworks/tpu",
            "generation": "v6e", "chips": 8, "quota_type": "preemptible"}


def props(*zones: str, **overrides: object) -> dict[str, object]:
    base: dict[str, object] = {
        "project": PROJECT, "node_id": "dev-trainer",
        "candidates": [candidate(z) for z in zones],
        "max_wait_seconds": MAX_WAIT, "network": f"projects/{PROJECT}/global/networks/tpu",
        "service_account_email": "tpu-runtime@acme-ml-dev.iam.gserviceaccount.com",
        "metadata": {"startup-script": "#!/bin/bash\necho hi", "tpu-stack-node": "dev-trainer"},
        "labels": {"stack": "dev"}, "poll_seconds": 0.05, "create_timeout_seconds": 30,
        "delete_timeout_seconds": 5, "round_backoff_seconds": 0.1,
    }
    return {**base, **overrides}


def left_behind(fake: FakeTpuApi, *zones: str) -> list[str]:
    return [z for z in zones
            if fake.queued_resource(z, "dev-trainer") or fake.node(z, "dev-trainer")]


def test_the_third_candidate_takes_within_max_wait_and_nothing_of_the_first_two_is_left(
        fake: FakeTpuApi) -> None:
    fake.script_queued("dev-trainer", "WAITING_FOR_RESOURCES", zone=WAITS)  # forever
    fake.refuse_for_quota(QUOTA, V6E_SPOT_QUOTA)
    fake.script_queued("dev-trainer", "WAITING_FOR_RESOURCES", "ACTIVE", zone=TAKES)

    started = time.monotonic()
    result = FallbackTpuProvider().create(props(WAITS, QUOTA, TAKES))
    took = time.monotonic() - started

    assert result.id == f"projects/{PROJECT}/locations/{TAKES}/queuedResources/dev-trainer"
    assert (result.outs["zone"], result.outs["candidate"]) == (TAKES, 3)
    assert result.outs["candidate_label"] == f"3/3 {TAKES} spot"
    assert [a["outcome"] for a in result.outs["attempts"]] == ["timeout", "quota", "took"]
    assert V6E_SPOT_QUOTA in result.outs["attempts"][1]["detail"]
    assert MAX_WAIT <= took <= MAX_WAIT + GRACE
    assert left_behind(fake, WAITS, QUOTA) == []
    assert fake.node(TAKES, "dev-trainer").metadata["tpu-stack-node"] == "dev-trainer"
    # At most one attempt alive at a time: each create came after the last delete.
    mutations = [(c.action, c.zone) for c in fake.mutating_calls()
                 if c.collection == "queuedResources"]
    # (A refused create is deleted too, and confirmed gone: the API may have queued it.)
    assert mutations == [("create", WAITS), ("delete", WAITS), ("create", QUOTA),
                         ("delete", QUOTA), ("create", TAKES)]


def test_a_permission_error_on_the_first_candidate_stops_and_no_second_is_tried(
        fake: FakeTpuApi) -> None:
    fake.fail(403, times=99, action="create", collection="queuedResources", zone=WAITS,
              message="Permission 'tpu.queuedResources.create' denied on resource")

    with pytest.raises(QueuedTpuError) as raised:
        FallbackTpuProvider().create(props(WAITS, QUOTA, TAKES))

    message = str(raised.value)
    assert "candidate 1 stopped the placement with a permanent error" in message
    assert "Permission 'tpu.queuedResources.create' denied" in message
    assert {c.zone for c in fake.calls if c.action == "create"} == {WAITS}
    assert left_behind(fake, WAITS, QUOTA, TAKES) == []


def test_a_quota_error_skips_the_same_family_in_that_region_for_the_round(
        fake: FakeTpuApi) -> None:
    fake.refuse_for_quota(QUOTA, V6E_SPOT_QUOTA)

    result = FallbackTpuProvider().create(props(QUOTA, WAITS, "us-east1-d"))

    assert [a["outcome"] for a in result.outs["attempts"]] == ["quota", "skipped", "took"]
    assert "ran out this round" in result.outs["attempts"][1]["detail"]
    assert not [c for c in fake.calls if c.action == "create" and c.zone == WAITS]


def test_a_request_failing_for_capacity_or_reservation_moves_on_with_its_class(
        fake: FakeTpuApi) -> None:
    fake.script_queued("dev-trainer", "CREATING", "FAILED", zone=WAITS,
                       error=(8, f'There is no more capacity in the zone "{WAITS}"'))
    fake.script_queued("dev-trainer", "FAILED", zone=QUOTA,
                       error=(9, "Insufficient reserved capacity."))

    result = FallbackTpuProvider().create(props(WAITS, QUOTA, TAKES))

    assert [a["outcome"] for a in result.outs["attempts"]] == ["capacity", "reservation", "took"]
    assert left_behind(fake, WAITS, QUOTA) == []


def test_no_candidate_takes_rounds_back_off_then_stop_with_every_reason(
        fake: FakeTpuApi) -> None:
    fake.refuse_for_quota(QUOTA, V6E_SPOT_QUOTA)
    fake.refuse_for_quota(TAKES, "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI")

    with pytest.raises(QueuedTpuError, match=r"no candidate took in \d+ round") as raised:
        FallbackTpuProvider().create(props(QUOTA, TAKES, create_timeout_seconds=1))

    assert raised.value.args[0].count("candidate 1: quota") >= 1


def test_refresh_finds_the_node_in_whichever_candidate_zone_it_lives(fake: FakeTpuApi) -> None:
    provider = FallbackTpuProvider()
    fake.refuse_for_quota(QUOTA, V6E_SPOT_QUOTA)
    created = provider.create(props(QUOTA, TAKES))

    read = provider.read(created.id, created.outs)
    gone = provider.read(f"projects/{PROJECT}/locations/{QUOTA}/queuedResources/dev-trainer",
                         {**created.outs, "placement": candidate(QUOTA)})

    assert (read.id, read.outs["candidate"]) == (created.id, 2)
    assert (gone.id, gone.outs["zone"]) == (created.id, TAKES)


def test_editing_the_list_moves_nothing_unless_the_running_candidate_goes(
        fake: FakeTpuApi) -> None:
    provider = FallbackTpuProvider()
    fake.refuse_for_quota(QUOTA, V6E_SPOT_QUOTA)
    created = provider.create(props(QUOTA, TAKES))
    olds = created.outs

    reordered = provider.diff(created.id, olds, props(TAKES, "us-east1-d"))
    removed = provider.diff(created.id, olds, props(QUOTA, "us-east1-d"))
    updated = provider.update(created.id, olds, props(TAKES, "us-east1-d"))

    assert reordered.changes and not reordered.replaces
    assert removed.replaces == ["candidates"]
    assert (updated.outs["candidate"], updated.outs["candidate_label"]) == (
        1, f"1/2 {TAKES} spot")
    assert fake.queued_resource(TAKES, "dev-trainer") is not None


def test_the_fake_fails_a_node_create_operation_as_the_real_api_does(fake: FakeTpuApi) -> None:
    from google.cloud import tpu_v2

    fake.fail_node_creates(WAITS)
    operation = tpu_client().create_node(parent=f"projects/{PROJECT}/locations/{WAITS}",
                                         node_id="n1", node=tpu_v2.Node(accelerator_type="v6e-8"))
    with pytest.raises(gexc.GoogleAPICallError) as raised:
        operation.result(timeout=5)

    failure = capacity.classify(capacity.from_exception(raised.value), WAITS)
    assert failure.kind == "capacity"
    assert f'no more capacity in the zone "{WAITS}"' in failure.detail


def test_the_provider_survives_dill_serialisation_in_a_fresh_process() -> None:
    import base64
    import json
    import subprocess
    import sys

    from pulumi.dynamic.dynamic import serialize_provider

    blob = serialize_provider(FallbackTpuProvider())
    olds = {"placement": candidate(TAKES), "labels": {"a": "1"}}
    code = ("import base64, json, sys, dill; p = dill.loads(base64.b64decode(sys.argv[1])); "
            "olds, news = json.loads(sys.argv[2]), json.loads(sys.argv[3]); "
            "print(type(p).__name__, p.diff('x', olds, news).replaces)")

    news = {"candidates": [candidate(TAKES)], "labels": {"a": "2"}}
    out = subprocess.run([sys.executable, "-c", code, blob, json.dumps(olds), json.dumps(news)],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "FallbackTpuProvider []"
    assert base64.b64decode(blob)


def leave(fake: FakeTpuApi, zone: str) -> None:
    """A request of this node an interrupted run left in `zone` (scripted by the caller)."""
    from google.cloud import tpu_v2

    tpu_client().create_queued_resource(
        parent=f"projects/{PROJECT}/locations/{zone}", queued_resource_id="dev-trainer",
        queued_resource=tpu_v2.QueuedResource()).result(timeout=5)
    assert fake.queued_resource(zone, "dev-trainer") is not None


def test_a_request_an_interrupted_run_left_elsewhere_is_deleted_before_the_first_attempt(
        fake: FakeTpuApi) -> None:
    fake.script_queued("dev-trainer", "WAITING_FOR_RESOURCES", zone=QUOTA)
    leave(fake, QUOTA)

    result = FallbackTpuProvider().create(props(TAKES, QUOTA))

    assert [a["outcome"] for a in result.outs["attempts"]] == ["leftover", "took"]
    assert fake.queued_resource(QUOTA, "dev-trainer") is None
    assert result.outs["zone"] == TAKES


def test_an_active_request_an_interrupted_run_left_is_adopted(fake: FakeTpuApi) -> None:
    fake.script_queued("dev-trainer", "ACTIVE", zone=QUOTA)
    leave(fake, QUOTA)

    result = FallbackTpuProvider().create(props(TAKES, QUOTA))

    assert (result.outs["zone"], result.outs["candidate"]) == (QUOTA, 2)
    assert not [c for c in fake.calls if c.action == "create" and c.zone == TAKES]


def test_delete_removes_the_request_wherever_a_recover_moved_it(fake: FakeTpuApi) -> None:
    provider = FallbackTpuProvider()
    created = provider.create(props(TAKES, QUOTA))
    fake.script_queued("dev-trainer", "WAITING_FOR_RESOURCES", zone=QUOTA)
    # tpuctl recover moved it: the state still names TAKES.
    tpu_client().delete_queued_resource(
        request={"name": created.id, "force": True}).result(timeout=5)
    leave(fake, QUOTA)

    provider.delete(created.id, created.outs)

    assert left_behind(fake, TAKES, QUOTA) == []


def test_a_transient_error_retries_the_same_candidate(fake: FakeTpuApi) -> None:
    fake.fail(503, times=2, action="create", collection="queuedResources", zone=WAITS)

    result = FallbackTpuProvider().create(props(WAITS, QUOTA, TAKES))

    assert (result.outs["zone"], result.outs["candidate"]) == (WAITS, 1)
    creates = [c.zone for c in fake.calls if c.action == "create"]
    assert creates == [WAITS, WAITS, WAITS]


def test_a_label_change_is_patched_on_the_node_in_the_zone_it_took(fake: FakeTpuApi) -> None:
    provider = FallbackTpuProvider()
    fake.refuse_for_quota(QUOTA, V6E_SPOT_QUOTA)
    created = provider.create(props(QUOTA, TAKES))
    news = props(QUOTA, TAKES, labels={"stack": "dev", "experiment": "lr"})

    diff = provider.diff(created.id, created.outs, news)
    updated = provider.update(created.id, created.outs, news)

    assert diff.changes and diff.replaces == []
    assert fake.node(TAKES, "dev-trainer").labels["experiment"] == "lr"
    assert (updated.outs["labels"], updated.outs["candidate"]) == (
        {"stack": "dev", "experiment": "lr"}, 2)


def test_a_request_provisioning_when_max_wait_passes_is_followed_not_dropped(
        fake: FakeTpuApi) -> None:
    polls = int(3 * MAX_WAIT / 0.05)  # provisioning lasts about three maxWaits
    fake.script_queued("dev-trainer", "WAITING_FOR_RESOURCES", *["PROVISIONING"] * polls,
                       "ACTIVE", zone=WAITS)

    result = FallbackTpuProvider().create(props(WAITS, TAKES))

    assert (result.outs["zone"], [a["outcome"] for a in result.outs["attempts"]]) == (
        WAITS, ["took"])
