"""Issue 43's defects 3-5, each at its cause (1 and 2: tests/ops/test_fallback_provider.py
test_same_zone_candidates_never_delete_an_adopted_request and
test_a_504_on_the_read_after_create_deletes_nothing)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone
from io import StringIO

import pytest
from google.api_core import exceptions as gexc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from rich.console import Console
from typer.testing import CliRunner

from cloud.tpu import tpu_client
from model import capacity
from ops.cli import app
from ops.commands import tpu as tpu_cmds
from ops.tpu.actions import fallback_recovery_plan, queued_janitor_plan
from ops.tpu.api import QueuedStatus
from tests.fakes.tpu_api import FakeTpuApi
from tests.ops.tpu_world import OTHER_ZONE, PROJECT, ZONE, expected_node, target

NOW = datetime(2026, 12, 4, 12, 0, tzinfo=timezone.utc)
NODE = "dev-trainer"


def packed(message: object) -> any_pb2.Any:
    holder = any_pb2.Any()
    holder.Pack(message)  # type: ignore[arg-type]
    return holder


# ---- defect 3: the classifier reads every shape the API sends ------------------------


def test_an_operations_quota_failure_is_read_from_its_errors_status() -> None:
    violation = error_details_pb2.QuotaFailure.Violation(
        quota_id="TPUV6EPreemptiblePerProjectPerRegionForTPUAPI",
        quota_dimensions={"region": "us-east5"})
    status = status_pb2.Status(code=8, message="the operation failed", details=[
        packed(error_details_pb2.QuotaFailure(violations=[violation]))])
    # As google-api-core operation.py raises an operation's error.
    error = gexc.from_grpc_status(8, status.message, errors=(status,))

    failure = capacity.classify(capacity.from_exception(error), "us-east5-b")

    assert failure.kind == "quota"
    assert str(failure.quota) == "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI in region us-east5"


@pytest.mark.parametrize(("reason", "kind"), [
    (capacity.RATE_LIMIT_EXCEEDED, "transient"), (capacity.RESOURCE_QUOTA_EXCEEDED, "quota")])
def test_error_info_reason_tells_a_rate_limit_from_a_quota(reason: str, kind: str) -> None:
    info = error_details_pb2.ErrorInfo(reason=reason, domain="googleapis.com")
    status = status_pb2.Status(code=8, message="Resource has been exhausted",
                               details=[packed(info)])

    assert capacity.classify(capacity.from_status(status), "us-east5-b").kind == kind


def test_error_info_reason_in_rest_json_details_is_read() -> None:
    error = gexc.TooManyRequests("Resource has been exhausted", details=[
        {"@type": capacity.ERROR_INFO_TYPE, "reason": capacity.RATE_LIMIT_EXCEEDED}])

    assert capacity.classify(capacity.from_exception(error)).kind == "transient"


def test_a_capacity_message_with_another_code_is_capacity() -> None:
    error = capacity.ApiError(9, 'There is no more capacity in the zone "us-east5-b"')

    assert capacity.classify(error, "us-east5-b").kind == "capacity"


def test_a_code_8_matching_no_rule_is_unclassified_not_transient_forever() -> None:
    failure = capacity.classify(capacity.ApiError(8, "Resource exhausted"), "us-east5-b")

    assert failure.kind == "unclassified"
    assert capacity.UNCLASSIFIED_RETRIES >= 1


# ---- defect 4: validUntil bounds the wait only ---------------------------------------


def status(state: str, **fields: object) -> QueuedStatus:
    return QueuedStatus(zone=ZONE, name=f"projects/{PROJECT}/locations/{ZONE}/queuedResources/"
                        f"{NODE}", state=state, node_ids=(NODE,), accelerator_type="v2-8",
                        chips=4, **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("state", ["ACTIVE", "PROVISIONING"])
def test_the_janitor_never_deletes_an_active_or_provisioning_request_for_its_valid_until(
        state: str) -> None:
    past = status(state, valid_until=NOW - timedelta(hours=2))

    assert queued_janitor_plan([past], NOW) == []


@pytest.fixture
def tpuctl(fake_tpu: FakeTpuApi, monkeypatch: pytest.MonkeyPatch):
    node = replace(expected_node(NODE), queued=True)
    monkeypatch.setattr(tpu_cmds, "load_target", lambda _stack: target(node))

    def run(*args: str) -> str:
        out = StringIO()
        monkeypatch.setattr(tpu_cmds, "console", Console(file=out, width=250, color_system=None))
        result = CliRunner().invoke(app, list(args))
        if result.exception and not isinstance(result.exception, SystemExit):
            raise result.exception
        return out.getvalue()

    return run


def test_janitor_apply_leaves_an_active_request_past_valid_until(
        tpuctl, fake_tpu: FakeTpuApi) -> None:
    from google.cloud import tpu_v2

    qr = tpu_v2.QueuedResource
    fake_tpu.script_queued(NODE, "ACTIVE", zone=ZONE)
    spec = qr.Tpu.NodeSpec(parent=f"projects/{PROJECT}/locations/{ZONE}", node_id=NODE,
                           node=tpu_v2.Node(accelerator_type="v2-8"))
    tpu_client().create_queued_resource(
        parent=f"projects/{PROJECT}/locations/{ZONE}", queued_resource_id=NODE,
        queued_resource=qr(tpu=qr.Tpu(node_spec=[spec]), queueing_policy=qr.QueueingPolicy(
            valid_until_time=datetime.now(timezone.utc) - timedelta(hours=1)))).result(timeout=5)

    tpuctl("janitor", "--stack", "dev", "--apply")

    assert fake_tpu.queued_resource(ZONE, NODE) is not None
    assert not [c for c in fake_tpu.mutating_calls() if c.action == "delete"]


# ---- defect 5: one answer for a FAILED request with no message -----------------------


def test_recover_and_the_provider_agree_a_failed_request_with_no_message_is_capacity() -> None:
    candidates = tuple({"zone": z, "provisioning": "spot", "accelerator_type": "v2-8",
                        "spot": True, "generation": "v2", "chips": 4,
                        "quota_type": "preemptible"} for z in (ZONE, OTHER_ZONE))
    node = replace(expected_node(NODE, spot=True), queued=True, max_wait_seconds=1800,
                   candidates=candidates)

    [action] = fallback_recovery_plan([node], [], [status("FAILED")], NOW)

    assert capacity.failed_request(0, "", ZONE).kind == "capacity"
    assert (action.verb, action.to["zone"]) == ("move-queued", OTHER_ZONE)
    assert action.to["queued_resource_id"] == f"{NODE}-c2"
