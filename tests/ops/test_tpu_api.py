"""ops/tpu/api.py: the real TpuClient against the fake TPU API."""

from __future__ import annotations

import pytest

from ops.tpu.api import NoCredentialsError, TpuApi, TpuApiError
from tests.fakes.tpu_api import FakeTpuApi
from tests.ops.tpu_world import OTHER_ZONE, PROJECT, STACK_LABELS, ZONE


def test_stack_nodes_come_from_one_list_per_zone_filtered_by_labels(
    fake_tpu: FakeTpuApi, tpu: TpuApi
) -> None:
    fake_tpu.add_node(ZONE, "dev-a", labels=STACK_LABELS)
    fake_tpu.add_node(OTHER_ZONE, "dev-b", labels=STACK_LABELS, spot=True)
    fake_tpu.add_node(ZONE, "prod-a", labels={**STACK_LABELS, "stack": "prod"})
    fake_tpu.add_node(ZONE, "hand-made", labels={"stack": "dev"})

    nodes = tpu.stack_nodes([(PROJECT, ZONE), (PROJECT, OTHER_ZONE), (PROJECT, ZONE)], "dev")

    assert [(n.zone, n.node_id, n.spot) for n in nodes] == [
        (OTHER_ZONE, "dev-b", True),
        (ZONE, "dev-a", False),
    ]
    assert sorted((c.action, c.zone) for c in fake_tpu.calls) == [
        ("list", OTHER_ZONE), ("list", ZONE)], "one list per zone, read side by side"


def test_node_states_move_creating_ready_preempted(fake_tpu: FakeTpuApi, tpu: TpuApi) -> None:
    fake_tpu.add_node(ZONE, "dev-a", "CREATING", "READY", "PREEMPTED", labels=STACK_LABELS)

    states = [tpu.stack_nodes([(PROJECT, ZONE)], "dev")[0].state for _ in range(4)]

    assert states == ["CREATING", "READY", "PREEMPTED", "PREEMPTED"]


def test_503s_are_retried_until_success(fake_tpu: FakeTpuApi, tpu: TpuApi) -> None:
    fake_tpu.add_node(ZONE, "dev-a", labels=STACK_LABELS)
    fake_tpu.fail(503, times=2, action="list")

    assert [n.node_id for n in tpu.stack_nodes([(PROJECT, ZONE)], "dev")] == ["dev-a"]
    assert fake_tpu.count("list") == 3


def test_endless_503s_end_in_one_message(fake_tpu: FakeTpuApi) -> None:
    fake_tpu.fail(503, times=1000, action="list")

    with pytest.raises(TpuApiError, match="list_nodes on us-central1-b: the TPU API kept failing"):
        TpuApi(deadline=0.5).list_nodes(PROJECT, ZONE)


def test_permission_denied_names_the_missing_permission(fake_tpu: FakeTpuApi, tpu: TpuApi) -> None:
    fake_tpu.fail(403, action="list", message="The caller does not have permission")

    with pytest.raises(TpuApiError) as raised:
        tpu.list_nodes(PROJECT, ZONE)

    assert str(raised.value) == (
        "permission denied: list_nodes on us-central1-b in project acme-ml-dev needs IAM "
        "permission tpu.nodes.list (e.g. roles/tpu.viewer or roles/tpu.admin)"
    )
    assert fake_tpu.count("list") == 1, "a 403 is not retried"


def test_unknown_zone_is_one_clear_message(fake_tpu: FakeTpuApi, tpu: TpuApi) -> None:
    with pytest.raises(TpuApiError, match="zone 'us-nowhere1-z' is unknown to the TPU API"):
        tpu.list_nodes(PROJECT, "us-nowhere1-z")


def test_job_status_reads_worker_0_guest_attributes(fake_tpu: FakeTpuApi, tpu: TpuApi) -> None:
    fake_tpu.add_node(ZONE, "dev-a", labels=STACK_LABELS)
    fake_tpu.add_node(ZONE, "dev-b", "CREATING", labels=STACK_LABELS)
    status = {"state": "running", "step": "1200", "package": "p", "message": "", "updated": "t"}
    fake_tpu.set_guest_attributes(ZONE, "dev-a", 0, status)
    fake_tpu.set_guest_attributes(ZONE, "dev-a", 1, {"state": "failed"})
    fake_tpu.set_guest_attributes(ZONE, "dev-a", 0, {"other": "x"}, namespace="someone-else")

    nodes = tpu.with_job_status(tpu.stack_nodes([(PROJECT, ZONE)], "dev"))

    assert [n.job for n in nodes] == [status, {}]
    assert fake_tpu.count("getGuestAttributes") == 1, "only READY nodes are asked"


def test_missing_credentials_are_reported_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    monkeypatch.delenv("TPU_STACK_TPU_ENDPOINT", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))

    with pytest.raises(NoCredentialsError, match=r"no usable Google credentials: "
                                                 r"GOOGLE_APPLICATION_CREDENTIALS names .*"
                                                 r"absent\.json, which does not exist"):
        TpuApi().list_nodes(PROJECT, ZONE)
