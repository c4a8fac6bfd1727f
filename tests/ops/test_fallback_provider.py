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


def test_create_returns_within_10s_with_the_request_id_while_the_first_candidate_waits_forever(
        fake: FakeTpuApi) -> None:
    fake.script_queued("dev-trainer", "WAITING_FOR_RESOURCES", zone=WAITS)  # forever

    started = time.monotonic()
    result = FallbackTpuProvider().create(props(WAITS, QUOTA, TAKES))
    took = time.monotonic() - started

    assert result.id == f"projects/{PROJECT}/locations/{WAITS}/queuedResources/dev-trainer"
    assert took < 10.0
    assert (result.outs["zone"], result.outs["candidate"], result.outs["state"]) == (
        WAITS, 1, "WAITING_FOR_RESOURCES")
    assert result.outs["candidate_label"] == f"1/3 {WAITS} spot"
    mutations = [(c.action, c.zone) for c in fake.mutating_calls()]
    assert mutations == [("create", WAITS)]


def test_a_create_refused_for_quota_at_once_submits_the_next_candidate_under_its_own_name(
        fake: FakeTpuApi) -> None:
    fake.refuse_for_quota(QUOTA, V6E_SPOT_QUOTA)

    result = FallbackTpuProvider().create(props(QUOTA, TAKES))

    assert result.id == f"projects/{PROJECT}/locations/{TAKES}/queuedResources/dev-trainer-c2"
    assert [a["outcome"] for a in result.outs["attempts"]] == ["quota", "took"]
    assert V6E_SPOT_QUOTA in result.outs["attempts"][0]["detail"]
    assert left_behind(fake, QUOTA) == []


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


def test_every_candidate_refused_stops_with_every_reason_and_leaves_nothing(
        fake: FakeTpuApi) -> None:
    fake.refuse_for_quota(QUOTA, V6E_SPOT_QUOTA)
    fake.refuse_for_quota("us-east1-d", V6E_SPOT_QUOTA)

    with pytest.raises(QueuedTpuError, match="every candidate refused") as raised:
        FallbackTpuProvider().create(props(QUOTA, "us-east1-d"))

    assert "candidate 1: quota" in raised.value.args[0]
    assert left_behind(fake, QUOTA, "us-east1-d") == []


def test_an_unclassified_code_8_is_retried_a_bounded_number_of_times_then_the_next_candidate(
        fake: FakeTpuApi) -> None:
    fake.fail(429, times=99, action="create", collection="queuedResources", zone=WAITS,
              message="Resource exhausted for reasons nobody wrote down")

    result = FallbackTpuProvider().create(props(WAITS, TAKES))

    assert (result.outs["zone"], result.outs["candidate"]) == (TAKES, 2)
    assert result.outs["attempts"][0]["outcome"] == "unclassified"


def test_refresh_finds_the_node_in_whichever_candidate_zone_it_lives(fake: FakeTpuApi) -> None:
    provider = FallbackTpuProvider()
    fake.refuse_for_quota(QUOTA, V6E_SPOT_QUOTA)
    created = provider.create(props(QUOTA, TAKES))

    read = provider.read(created.id, created.outs)
    gone = provider.read(f"projects/{PROJECT}/locations/{QUOTA}/queuedResources/dev-trainer",
                         {**created.outs, "placement": candidate(QUOTA)})

    assert (read.id, read.outs["candidate"]) == (created.id, 2)
    assert (gone.id, gone.outs["zone"]) == (created.id, TAKES)
    assert created.id.endswith("/queuedResources/dev-trainer-c2")


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
    assert fake.queued_resource(TAKES, "dev-trainer-c2") is not None


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


def leave(props_: dict[str, object], index: int) -> str:
    """This node's request of candidate `index` (0-based), as an earlier run left it."""
    from components.fallback_tpu import enqueue, request_of

    return enqueue(tpu_client(), request_of(props_, index), 5)


def test_an_alive_request_under_another_candidates_name_is_adopted_not_deleted(
        fake: FakeTpuApi) -> None:
    fake.script_queued("dev-trainer-c2", "ACTIVE", zone=QUOTA)
    both = props(TAKES, QUOTA)
    left = leave(both, 1)

    result = FallbackTpuProvider().create(both)

    assert (result.id, result.outs["candidate"]) == (left, 2)
    assert fake.queued_resource(QUOTA, "dev-trainer-c2") is not None
    assert not [c for c in fake.calls if c.action == "create" and c.zone == TAKES]


def test_same_zone_candidates_never_delete_an_adopted_request(fake: FakeTpuApi) -> None:
    # Defect 1: two candidates in one zone (spot, then on-demand) shared one name; the
    # second force-deleted the request the first adopted.
    on_demand = {**candidate(TAKES), "spot": False, "provisioning": "on-demand",
                 "quota_type": "on-demand"}
    both = {**props(TAKES), "candidates": [candidate(TAKES), on_demand]}
    fake.script_queued("dev-trainer", "ACTIVE", zone=TAKES)
    left = leave(both, 0)

    result = FallbackTpuProvider().create(both)
    FallbackTpuProvider().read(result.id, result.outs)

    assert (result.id, result.outs["candidate"]) == (left, 1)
    assert fake.queued_resource(TAKES, "dev-trainer") is not None
    assert not [c for c in fake.mutating_calls() if c.action == "delete"]


def test_a_leftover_of_another_spec_under_the_name_is_not_adopted(fake: FakeTpuApi) -> None:
    from google.cloud import tpu_v2

    tpu_client().create_queued_resource(
        parent=f"projects/{PROJECT}/locations/{TAKES}", queued_resource_id="dev-trainer",
        queued_resource=tpu_v2.QueuedResource()).result(timeout=5)

    result = FallbackTpuProvider().create(props(TAKES))

    queued = fake.queued_resource(TAKES, "dev-trainer")
    assert result.outs["candidate"] == 1
    assert queued.tpu.node_spec[0].node.accelerator_type == "v6e-8"


def test_delete_removes_the_request_wherever_the_controller_moved_it(
        fake: FakeTpuApi) -> None:
    provider = FallbackTpuProvider()
    both = props(TAKES, QUOTA)
    created = provider.create(both)
    tpu_client().delete_queued_resource(
        request={"name": created.id, "force": True}).result(timeout=5)
    fake.script_queued("dev-trainer-c2", "WAITING_FOR_RESOURCES", zone=QUOTA)
    leave(both, 1)  # the controller moved it: the state still names TAKES

    provider.delete(created.id, created.outs)

    assert fake.queued_resource(QUOTA, "dev-trainer-c2") is None


def test_delete_finds_the_request_by_its_labels_when_the_state_lost_it(
        fake: FakeTpuApi) -> None:
    from components.fallback_tpu import enqueue, request_of

    both = props(TAKES, QUOTA)
    fake.script_queued("moved-by-hand", "WAITING_FOR_RESOURCES", zone=QUOTA)
    enqueue(tpu_client(), {**request_of(both, 1), "queued_resource_id": "moved-by-hand"}, 5)

    FallbackTpuProvider().delete("", {**both, "placement": candidate(TAKES)})

    assert fake.queued_resource(QUOTA, "moved-by-hand") is None


def test_a_504_on_the_read_after_create_deletes_nothing(fake: FakeTpuApi) -> None:
    # Defect 2: one failed status read was taken as a failed attempt and deleted the request.
    fake.script_queued("dev-trainer", "WAITING_FOR_RESOURCES", zone=WAITS)
    fake.fail(504, times=99, action="get", collection="nodes", zone=WAITS)

    result = FallbackTpuProvider().create(props(WAITS, TAKES))

    assert result.outs["candidate"] == 1
    assert fake.queued_resource(WAITS, "dev-trainer") is not None
    assert not [c for c in fake.mutating_calls() if c.action == "delete"]


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
    provider.read(created.id, created.outs)  # the refresh that sees it provisioned
    news = props(QUOTA, TAKES, labels={"stack": "dev", "experiment": "lr"})

    diff = provider.diff(created.id, created.outs, news)
    updated = provider.update(created.id, created.outs, news)

    assert diff.changes and diff.replaces == []
    assert fake.node(TAKES, "dev-trainer").labels["experiment"] == "lr"
    assert (updated.outs["labels"], updated.outs["candidate"]) == (
        {"stack": "dev", "experiment": "lr"}, 2)
