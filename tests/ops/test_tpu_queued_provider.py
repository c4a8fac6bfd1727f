"""The QueuedTpu dynamic provider against the fake TPU API, called method by method."""

from __future__ import annotations

import base64
import subprocess
import sys

import pytest
from pulumi.dynamic.dynamic import serialize_provider

from components.queued_tpu import (
    QueuedTpuError,
    QueuedTpuProvider,
    build_queued_resource,
    check_inputs,
)
from tests.fakes.tpu_api import FakeTpuApi
from tests.ops.tpu_world import PROJECT, STACK_LABELS, ZONE

QR_NAME = f"projects/{PROJECT}/locations/{ZONE}/queuedResources/dev-trainer"


def props(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {
        "project": PROJECT,
        "zone": ZONE,
        "node_id": "dev-trainer",
        "runtime_version": "tpu-vm-tf-2.18.0-pjrt",
        "accelerator_type": "v2-8",
        "network": "projects/acme-ml-dev/global/networks/tpu",
        "service_account_email": "tpu-runtime@acme-ml-dev.iam.gserviceaccount.com",
        "metadata": {"startup-script": "#!/bin/bash\necho hi", "tpu-stack-workers": "all"},
        "labels": dict(STACK_LABELS),
        "spot": True,
        "valid_until_seconds": 6 * 3600,
        "poll_seconds": 0.01,
        "create_timeout_seconds": 5,
        "delete_timeout_seconds": 5,
    }
    return {**base, **overrides}


def test_create_sends_the_full_node_and_returns_once_queued(fake_tpu: FakeTpuApi) -> None:
    fake_tpu.script_queued("dev-trainer", "CREATING", "WAITING_FOR_RESOURCES",
                           "WAITING_FOR_RESOURCES", "ACTIVE")
    provider = QueuedTpuProvider()

    result = provider.create(props())

    assert result.id == QR_NAME
    assert (result.outs["state"], result.outs["node_state"]) == ("WAITING_FOR_RESOURCES", "")
    sent = fake_tpu.queued_resource(ZONE, "dev-trainer")
    node = sent.tpu.node_spec[0].node
    assert node.metadata["startup-script"].startswith("#!/bin/bash")
    assert node.service_account.email == "tpu-runtime@acme-ml-dev.iam.gserviceaccount.com"
    assert list(node.service_account.scope) == ["https://www.googleapis.com/auth/cloud-platform"]
    assert node.network_config.enable_external_ips is False
    assert "spot" in sent and sent.queueing_policy.valid_until_duration.total_seconds() == 21600
    # Provisioning is followed by `read` (pulumi refresh), not by create.
    provider.read(QR_NAME, props())
    read = provider.read(QR_NAME, props())
    assert (read.outs["state"], read.outs["node_state"]) == ("ACTIVE", "READY")
    assert fake_tpu.node(ZONE, "dev-trainer").labels["stack"] == "dev"


def test_create_adopts_a_request_of_its_own_name(fake_tpu: FakeTpuApi) -> None:
    provider = QueuedTpuProvider()
    provider.create(props())
    fake_tpu.set_queued_states(ZONE, "dev-trainer", "WAITING_FOR_RESOURCES", "ACTIVE")

    again = provider.create(props())

    assert again.outs["state"] == "WAITING_FOR_RESOURCES"
    assert fake_tpu.count("create", "queuedResources") == 2


def force_deletes(fake_tpu: FakeTpuApi) -> int:
    return fake_tpu.count("delete", "queuedResources")


@pytest.mark.parametrize(
    ("states", "fault", "expected"),
    [
        (("CREATING", "FAILED"), None, "FAILED"),
        (("CREATING",), None, "still CREATING after"),
        (("CREATING", "WAITING_FOR_RESOURCES"), 403, "injected"),
    ],
)
def test_a_failure_after_the_create_call_leaves_no_request_queued(
    fake_tpu: FakeTpuApi, states: tuple[str, ...], fault: int | None, expected: str
) -> None:
    """A failed dynamic create records nothing in the state: whatever was queued
    must be deleted, or it provisions a TPU nobody owns."""
    fake_tpu.script_queued("dev-trainer", *states)
    if fault:
        fake_tpu.fail(fault, times=1, action="get", collection="queuedResources")

    with pytest.raises(QueuedTpuError, match=expected) as raised:
        QueuedTpuProvider().create(props(create_timeout_seconds=0.2))

    assert "was deleted, nothing is left queued" in str(raised.value)
    assert fake_tpu.queued_resource(ZONE, "dev-trainer") is None
    assert fake_tpu.node(ZONE, "dev-trainer") is None
    assert force_deletes(fake_tpu) == 1


def test_a_request_that_cannot_be_deleted_says_how_to_delete_it(fake_tpu: FakeTpuApi) -> None:
    fake_tpu.script_queued("dev-trainer", "CREATING", "FAILED")
    fake_tpu.fail(403, times=99, action="delete", collection="queuedResources")

    with pytest.raises(QueuedTpuError) as raised:
        QueuedTpuProvider().create(props())

    message = str(raised.value)
    assert "FAILED; deleting the request failed too" in message
    assert "gcloud compute tpus queued-resources delete dev-trainer --zone" in message
    assert message.endswith("--force`")


def test_create_retries_503s(fake_tpu: FakeTpuApi) -> None:
    fake_tpu.fail(503, times=2, action="create", collection="queuedResources")

    assert QueuedTpuProvider().create(props()).outs["state"] == "WAITING_FOR_RESOURCES"
    assert fake_tpu.count("create", "queuedResources") == 3


def test_read_reports_state_and_drift_and_gone(fake_tpu: FakeTpuApi) -> None:
    provider = QueuedTpuProvider()
    provider.create(props())
    fake_tpu.set_node_states(ZONE, "dev-trainer", "PREEMPTED")

    read = provider.read(QR_NAME, props())
    assert (read.id, read.outs["state"], read.outs["node_state"]) == (
        QR_NAME,
        "ACTIVE",
        "PREEMPTED",
    )

    provider.delete(QR_NAME, props())
    assert provider.read(QR_NAME, props()).id == ""


def test_diff_updates_metadata_and_labels_in_place_and_replaces_the_rest() -> None:
    provider = QueuedTpuProvider()
    olds = {**props(), "state": "ACTIVE", "node_name": "n"}

    in_place = provider.diff(
        QR_NAME, olds, props(labels={**STACK_LABELS, "team": "ml"}, metadata={"a": "b"})
    )
    assert (in_place.changes, in_place.replaces) == (True, [])

    replaced = provider.diff(QR_NAME, olds, props(accelerator_type="v3-8", spot=False))
    assert replaced.changes and sorted(replaced.replaces) == ["accelerator_type", "spot"]
    assert replaced.delete_before_replace is True

    assert provider.diff(QR_NAME, olds, props()).changes is False
    assert provider.diff(QR_NAME, olds, props(poll_seconds=1)).replaces == []


def test_update_patches_only_the_changed_node_fields(fake_tpu: FakeTpuApi) -> None:
    provider = QueuedTpuProvider()
    provider.create(props())
    news = props(labels={**STACK_LABELS, "team": "ml"})

    outs = provider.update(QR_NAME, props(), news).outs

    assert outs["labels"]["team"] == "ml"
    assert fake_tpu.node(ZONE, "dev-trainer").metadata["tpu-stack-workers"] == "all"
    assert fake_tpu.count("patch") == 1


def test_keys_others_added_survive_updates_and_are_no_drift(fake_tpu: FakeTpuApi) -> None:
    provider = QueuedTpuProvider()
    provider.create(props())
    fake_tpu.node_message(ZONE, "dev-trainer").metadata["ssh-keys"] = "ana:ssh-ed25519 AAAA"
    news = props(metadata={"startup-script": "#!/bin/bash\necho v2"})

    read = provider.read(QR_NAME, props())
    assert read.outs["metadata"] == props()["metadata"], "ssh-keys is not drift"
    provider.update(QR_NAME, props(), news)

    assert dict(fake_tpu.node(ZONE, "dev-trainer").metadata) == {
        "startup-script": "#!/bin/bash\necho v2",
        "ssh-keys": "ana:ssh-ed25519 AAAA",
    }


def test_delete_of_an_active_request_takes_its_node_with_it(fake_tpu: FakeTpuApi) -> None:
    provider = QueuedTpuProvider()
    provider.create(props())
    provider.read(QR_NAME, props())
    assert fake_tpu.node(ZONE, "dev-trainer") is not None

    provider.delete(QR_NAME, props())

    assert fake_tpu.node(ZONE, "dev-trainer") is None
    assert fake_tpu.queued_resource(ZONE, "dev-trainer") is None
    order = [(c.action, c.collection) for c in fake_tpu.mutating_calls()]
    assert order[-1:] == [("delete", "queuedResources")]


@pytest.mark.parametrize("state", ["WAITING_FOR_RESOURCES", "PROVISIONING", "CREATING"])
def test_delete_ends_a_request_still_in_the_queue(fake_tpu: FakeTpuApi, state: str) -> None:
    name = fake_tpu.add_queued_request(ZONE, "dev-trainer", state)  # no node yet

    QueuedTpuProvider().delete(name, props(delete_timeout_seconds=1))

    assert fake_tpu.queued_resource(ZONE, "dev-trainer-qr") is None


def test_the_fake_refuses_a_plain_delete_of_a_waiting_request(fake_tpu: FakeTpuApi) -> None:
    """As the API documents DeleteQueuedResourceRequest.force: without it, only an
    ACCEPTED, FAILED or SUSPENDED request (or one without nodes) is deleted."""
    from google.api_core import exceptions as gexc

    from cloud.tpu import tpu_client

    fake_tpu.add_queued_request(ZONE, "dev-w", "WAITING_FOR_RESOURCES")
    with pytest.raises(gexc.BadRequest, match="delete it with force"):
        tpu_client().delete_queued_resource(
            name=f"projects/{PROJECT}/locations/{ZONE}/queuedResources/dev-w-qr"
        ).result(timeout=5)
    assert fake_tpu.queued_resource(ZONE, "dev-w-qr") is not None


def test_a_waiting_request_keeps_its_place_and_gets_a_label_change_once_its_node_exists(
    fake_tpu: FakeTpuApi,
) -> None:
    """A label change while the request waits (e.g. a new cost-centre) used to queue
    it again with the new spec. Now it is held: the request stays as it is, the outputs
    keep what it carries, and the next `up` after the node exists patches the node."""
    fake_tpu.script_queued("dev-trainer", "WAITING_FOR_RESOURCES")
    provider = QueuedTpuProvider()
    created = provider.create(props()).outs
    news = props(labels={**STACK_LABELS, "cost-centre": "cc-2"})

    held = provider.update(QR_NAME, created, news).outs

    assert fake_tpu.count("create", "queuedResources") == 1
    assert fake_tpu.count("delete", "queuedResources") == 0
    assert held["state"] == "WAITING_FOR_RESOURCES" and held["held"] == ["labels"]
    assert held["labels"] == dict(STACK_LABELS)
    sent = fake_tpu.queued_resource(ZONE, "dev-trainer").tpu.node_spec[0].node
    assert "cost-centre" not in sent.labels
    # The next preview still shows the change (olds are the outputs), still in place.
    pending = provider.diff(QR_NAME, held, news)
    assert (pending.changes, pending.replaces) == (True, [])

    fake_tpu.set_queued_states(ZONE, "dev-trainer", "WAITING_FOR_RESOURCES", "ACTIVE")
    refreshed = provider.read(QR_NAME, held).outs  # `up --refresh`: the node is up
    assert refreshed["node_state"] == "READY" and "cost-centre" not in refreshed["labels"]
    assert provider.diff(QR_NAME, refreshed, news).changes

    applied = provider.update(QR_NAME, refreshed, news).outs

    assert fake_tpu.node(ZONE, "dev-trainer").labels["cost-centre"] == "cc-2"
    assert applied["labels"]["cost-centre"] == "cc-2" and applied["held"] == []
    assert provider.diff(QR_NAME, applied, news).changes is False
    assert fake_tpu.count("create", "queuedResources") == 1


def test_a_held_metadata_change_still_waits_on_the_next_up(fake_tpu: FakeTpuApi) -> None:
    fake_tpu.script_queued("dev-trainer", "WAITING_FOR_RESOURCES")
    provider = QueuedTpuProvider()
    created = provider.create(props()).outs
    news = props(metadata={"startup-script": "#!/bin/bash\necho v2"})

    again = provider.update(QR_NAME, provider.update(QR_NAME, created, news).outs, news).outs

    assert again["metadata"] == props()["metadata"] and again["held"] == ["metadata"]
    assert fake_tpu.count("create", "queuedResources") == 1
    assert fake_tpu.count("patch") == 0


def test_check_names_each_bad_input() -> None:
    problems = dict(check_inputs(props(accelerator_type="", spot=True, guaranteed=True)))
    assert problems["accelerator_type"].startswith("give it, or accelerator_topology")
    assert problems["spot"].startswith("cannot be combined with guaranteed")
    shaped = props(
        accelerator_type=None, accelerator_topology="2x2x1", accelerator_config_type="V9"
    )
    assert check_inputs(shaped) == [
        ("accelerator_config_type", "must be one of V2, V3, V4, V5LITE_POD, V5P, V6E")
    ]
    failures = QueuedTpuProvider().check({}, props(runtime_version="")).failures
    assert [(f.property, f.reason) for f in failures] == [
        ("runtime_version", "runtime_version is required")
    ]
    with pytest.raises(QueuedTpuError, match="runtime_version is required"):
        QueuedTpuProvider().create(props(runtime_version=""))


def test_topology_and_reservation_are_sent_as_the_api_expects() -> None:
    queued = build_queued_resource(
        props(
            accelerator_type=None,
            accelerator_topology="2x2x1",
            accelerator_config_type="V4",
            spot=False,
            guaranteed=True,
            reservation_name="team-a",
        )
    )
    node = queued.tpu.node_spec[0].node
    assert (node.accelerator_config.type_.name, node.accelerator_config.topology) == ("V4", "2x2x1")
    assert queued.reservation_name == f"projects/{PROJECT}/locations/{ZONE}/reservations/team-a"
    assert "guaranteed" in queued and "spot" not in queued


def test_the_provider_survives_dill_serialisation_in_a_fresh_process() -> None:
    blob = serialize_provider(QueuedTpuProvider())
    code = (
        "import base64, sys, dill; p = dill.loads(base64.b64decode(sys.argv[1])); "
        "print(type(p).__name__, p.diff('x', {'a': 1}, {'a': 2}).replaces)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, blob], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "QueuedTpuProvider ['a']"
    assert base64.b64decode(blob)
