"""The create-failure classifier on the real messages and shapes (model/capacity.py)."""

from __future__ import annotations

import random

import pytest
from google.api_core import exceptions as gexc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2

from model import capacity
from model.capacity import ApiError, Placement, QuotaScope, QuotaViolation, Round, classify

CAPACITY = ('There is no more capacity in the zone "us-central1-b"; you can try in another '
            'zone where Cloud TPU Nodes are offered (see https://cloud.google.com/tpu/docs/regions)')
QUOTA_V2 = ("Quota 'TPUV2sPreemptiblePodPerProjectPerRegionForTPUAPI' exhausted. "
            "Limit 32 in region europe-west4")
QUOTA_V6E = ("Quota limit 'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI' has been exceeded. "
             "Limit: 0 in region us-east5.")
RESERVED = ("Insufficient reserved capacity. Contact customer support to increase your "
            "reservation. [EID: 0x7adf6d58c08b0aa4]")


@pytest.mark.parametrize(("error", "zone", "kind", "scope"), [
    (ApiError(8, f"Error code 8, message: {CAPACITY}"), "us-central1-b", "capacity", None),
    (ApiError(8, QUOTA_V2), "europe-west4-a", "quota",
     QuotaScope("TPUV2sPreemptiblePodPerProjectPerRegionForTPUAPI", "region", "europe-west4")),
    (ApiError(8, QUOTA_V6E), "us-east5-b", "quota",
     QuotaScope("TPUV6EPreemptiblePerProjectPerRegionForTPUAPI", "region", "us-east5")),
    (ApiError(8, "quota exceeded", (QuotaViolation(
        "TPUV5PPreemptiblePerProjectPerZoneForTPUAPI", {"zone": "us-east5-a"}),)),
     "us-east5-a", "quota",
     QuotaScope("TPUV5PPreemptiblePerProjectPerZoneForTPUAPI", "zone", "us-east5-a")),
    (ApiError(8, "exhausted", (QuotaViolation("TPUV4sPodPerProjectPerRegionForTPUAPI"),)),
     "us-central2-b", "quota",
     QuotaScope("TPUV4sPodPerProjectPerRegionForTPUAPI", "region", "us-central2")),
    (ApiError(9, RESERVED), "us-central1-a", "reservation", None),
    (ApiError(8, RESERVED), "us-central1-a", "reservation", None),  # skypilot #4579: code 8
    (ApiError(7, "Permission 'tpu.nodes.create' denied on 'projects/p'"), "z", "permanent", None),
    (ApiError(3, "Invalid value for field 'acceleratorType'"), "z", "permanent", None),
    (ApiError(14, "The service is currently unavailable."), "z", "transient", None),
    (ApiError(13, "Internal error"), "z", "transient", None),
    (ApiError(8, "Maximum number of CreateNode requests per minute"), "z", "transient", None),
])
def test_each_real_shape_gets_its_class(error: ApiError, zone: str, kind: str,
                                        scope: QuotaScope | None) -> None:
    failure = classify(error, zone)
    assert (failure.kind, failure.quota) == (kind, scope)
    assert failure.moves_on == (kind in {"capacity", "quota", "reservation"})


def test_a_rest_429_with_a_quota_failure_detail_is_read_from_the_exception() -> None:
    detail = {"@type": capacity.QUOTA_FAILURE_TYPE, "violations": [
        {"subject": "project:acme", "description": QUOTA_V2,
         "quotaId": "TPUV2sPreemptiblePodPerProjectPerRegionForTPUAPI",
         "quotaDimensions": {"region": "europe-west4"}}]}
    error = gexc.TooManyRequests("POST https://tpu.googleapis.com/...: exhausted",
                                 details=[detail])

    failure = classify(capacity.from_exception(error), "europe-west4-a")

    assert failure.kind == "quota"
    assert failure.quota == QuotaScope("TPUV2sPreemptiblePodPerProjectPerRegionForTPUAPI",
                                       "region", "europe-west4")


def test_a_queued_resources_failed_status_with_a_packed_quota_failure() -> None:
    violation = error_details_pb2.QuotaFailure.Violation(
        quota_id="TPUV6EPreemptiblePerProjectPerRegionForTPUAPI")
    violation.quota_dimensions["region"] = "us-east5"
    packed = any_pb2.Any()
    packed.Pack(error_details_pb2.QuotaFailure(violations=[violation]))
    status = status_pb2.Status(code=8, message="exhausted", details=[packed])

    failure = classify(capacity.from_status(status), "us-east5-b")

    assert failure.quota == QuotaScope("TPUV6EPreemptiblePerProjectPerRegionForTPUAPI",
                                       "region", "us-east5")


def test_permission_denied_from_the_client_is_permanent() -> None:
    failure = classify(capacity.from_exception(gexc.PermissionDenied("denied")))
    assert failure.kind == "permanent" and not failure.moves_on


def test_a_quota_block_skips_the_family_in_its_scope_and_larger_slices_only() -> None:
    scope = QuotaScope("TPUV6EPreemptiblePerProjectPerRegionForTPUAPI", "region", "us-east5")
    rnd = Round()
    rnd.block(scope, Placement("us-east5-b", "v6e", "preemptible", 8))

    assert rnd.blocked(Placement("us-east5-a", "v6e", "preemptible", 16))  # same region, larger
    assert rnd.blocked(Placement("us-east5-a", "v6e", "preemptible", 4)) is None  # smaller
    assert rnd.blocked(Placement("us-east1-d", "v6e", "preemptible", 8)) is None  # other region
    assert rnd.blocked(Placement("us-east5-a", "v6e", "onDemand", 8)) is None  # other quota
    assert rnd.blocked(Placement("us-east5-a", "v5p", "preemptible", 8)) is None  # other family


def test_rounds_back_off_doubling_with_jitter() -> None:
    rng = random.Random(7)
    delays = [capacity.backoff_seconds(r, base=10, cap=60, rng=rng) for r in (1, 2, 3, 4)]
    assert 5 <= delays[0] <= 10 and 10 <= delays[1] <= 20 and 20 <= delays[2] <= 40
    assert 30 <= delays[3] <= 60
    assert len({round(d, 6) for d in delays}) == 4


def test_durations() -> None:
    assert [capacity.duration_seconds(t) for t in ("30m", "20s", "2h", "1d", "0s", "5")] == [
        1800, 20, 7200, 86400, None, None]
