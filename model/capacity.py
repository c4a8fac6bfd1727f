"""Why a TPU create failed, and what to try next: pure, shared by the provider and tpuctl.

The shapes the classifier reads (docs/tpu-facts.md, "When a create fails"):

- capacity: the create operation (or a queued resource's `failedData.error`) ends with
  code 8 RESOURCE_EXHAUSTED and `There is no more capacity in the zone "us-central1-b";
  you can try in another zone where Cloud TPU Nodes are offered` (magic-modules #7297,
  which closes terraform-provider-google #10222; gsoc-wav2vec2 #11 for gcloud's wording).
- quota: HTTP 429 RESOURCE_EXHAUSTED with a `google.rpc.QuotaFailure` detail (its
  `quotaId` and `quotaDimensions`, googleapis google/rpc/error_details.proto) and a message
  such as "Quota 'TPUV2sPreemptiblePodPerProjectPerRegionForTPUAPI' exhausted. Limit 32 in
  region europe-west4" (skypilot's GCP failover handler; marin #87) or "Quota limit
  'TPUV6EPreemptiblePerProjectPerRegionForTPUAPI' has been exceeded. Limit: 0 in region
  us-east5." (marin #1612, a 429 from tpu.googleapis.com).
- reservation: "Insufficient reserved capacity. Contact customer support to increase your
  reservation." (skypilot #4579: seen with code 8 and without any reservation in use; the
  issue reports code 9 FAILED_PRECONDITION too): the message decides, not the code.
- preempted while creating: a queued resource SUSPENDED, or its node PREEMPTED, before
  the node was ever ready.
- permanent: PERMISSION_DENIED, INVALID_ARGUMENT, NOT_FOUND, UNAUTHENTICATED, ...: the
  next candidate would fail the same way, so the provider stops and says so.
- transient: UNAVAILABLE, INTERNAL, DEADLINE_EXCEEDED, ABORTED, and a rate limit
  (`ErrorInfo.reason` RATE_LIMIT_EXCEEDED, googleapis google/api/error_reason.proto): the
  same candidate again, after a backoff.
- unclassified: RESOURCE_EXHAUSTED (or UNKNOWN) that names no quota, capacity or rate
  limit: retried on the same candidate UNCLASSIFIED_RETRIES times, then the next one.

The words decide before the code: a capacity or reservation message is capacity or
reservation whatever its code. `ErrorInfo.reason` RESOURCE_QUOTA_EXCEEDED is quota even
without a QuotaFailure. An operation's failure carries its `google.rpc.Status` in the
exception's `.errors` (google-api-core operation.py `_refresh_and_update`:
`from_grpc_status(..., errors=(self._operation.error,))`), so its details are read there too.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from model import catalog

FailureClass = Literal["capacity", "quota", "reservation", "preempted", "timeout",
                       "permanent", "transient", "unclassified"]
# Classes after which the next candidate is tried (the others stop, or retry the same).
MOVE_ON: frozenset[str] = frozenset({"capacity", "quota", "reservation", "preempted", "timeout"})

# google.rpc.Code numbers (googleapis google/rpc/code.proto).
UNKNOWN = 2
INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND, ALREADY_EXISTS = 3, 4, 5, 6
PERMISSION_DENIED, RESOURCE_EXHAUSTED, FAILED_PRECONDITION, ABORTED = 7, 8, 9, 10
INTERNAL, UNAVAILABLE, UNAUTHENTICATED = 13, 14, 16
# HTTP status -> google.rpc.Code, as Google APIs map them (google/rpc/code.proto comments).
HTTP_TO_CODE = {400: INVALID_ARGUMENT, 401: UNAUTHENTICATED, 403: PERMISSION_DENIED,
                404: NOT_FOUND, 409: ALREADY_EXISTS, 429: RESOURCE_EXHAUSTED, 500: INTERNAL,
                503: UNAVAILABLE, 504: DEADLINE_EXCEEDED}
TRANSIENT_CODES = frozenset({DEADLINE_EXCEEDED, ABORTED, INTERNAL, UNAVAILABLE})
QUOTA_FAILURE_TYPE = "type.googleapis.com/google.rpc.QuotaFailure"
ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo"
# ErrorInfo reasons (googleapis google/api/error_reason.proto).
RATE_LIMIT_EXCEEDED = "RATE_LIMIT_EXCEEDED"
RESOURCE_QUOTA_EXCEEDED = "RESOURCE_QUOTA_EXCEEDED"
# An error no rule names is retried on the same candidate this many times, then the
# next candidate is tried (issue 43: never until the create timeout).
UNCLASSIFIED_RETRIES = 2

_CAPACITY_RE = re.compile(r"no more capacity in the zone|currently unavailable in the|"
                          r"does not have enough resources available", re.I)
_RESERVATION_RE = re.compile(r"insufficient reserved capacity", re.I)
# A rate limit said in words ("Maximum number of CreateNode requests per minute").
_RATE_RE = re.compile(r"requests per (?:minute|second)|rate limit|rate exceeded", re.I)
_QUOTA_ID_RE = re.compile(r"Quota (?:limit )?'(?P<id>[A-Za-z0-9_.-]+)'")
_QUOTA_PLACE_RE = re.compile(
    r"\bin (?P<kind>region|zone) (?P<place>[a-z]+-[a-z]+[0-9]+(?:-[a-z])?)")
_ZONE_IN_MESSAGE_RE = re.compile(r'zone "?(?P<zone>[a-z]+-[a-z]+[0-9]+-[a-z])"?')


@dataclass(frozen=True)
class QuotaViolation:
    """One `google.rpc.QuotaFailure.Violation`."""

    quota_id: str = ""
    dimensions: Mapping[str, str] = field(default_factory=dict)  # e.g. {"region": "us-east5"}
    description: str = ""


@dataclass(frozen=True)
class ApiError:
    """What the API said: a google.rpc.Code, its message and any QuotaFailure."""

    code: int
    message: str
    violations: tuple[QuotaViolation, ...] = ()
    reason: str = ""  # google.rpc.ErrorInfo.reason, where the API gave one


@dataclass(frozen=True)
class QuotaScope:
    """Where a quota ran out: `kind` zone, region or project, `place` the zone or region."""

    family: str  # the quota id (its generation and type: catalog.TPU_QUOTA_IDS)
    kind: Literal["zone", "region", "project"]
    place: str = ""

    def covers(self, zone: str) -> bool:
        if self.kind == "zone":
            return zone == self.place
        if self.kind == "region":
            return catalog.region_of(zone) == self.place
        return True

    def __str__(self) -> str:
        return f"{self.family} in {self.kind} {self.place}".rstrip()


@dataclass(frozen=True)
class Failure:
    """A classified failure: its class, the API's words, and for quota where it ran out."""

    kind: FailureClass
    detail: str
    quota: QuotaScope | None = None

    @property
    def moves_on(self) -> bool:
        return self.kind in MOVE_ON


def classify(error: ApiError, zone: str = "") -> Failure:
    """The class of a create failure in `zone` (module docstring: the real shapes)."""
    message = error.message
    if _RESERVATION_RE.search(message):
        return Failure("reservation", message)
    quota = _quota_scope(error, zone)
    if quota is not None:
        return Failure("quota", message, quota)
    if error.reason == RESOURCE_QUOTA_EXCEEDED:
        return Failure("quota", message, _scope("", {}, message, zone))
    if _CAPACITY_RE.search(message):
        return Failure("capacity", message)
    rate_limited = error.reason == RATE_LIMIT_EXCEEDED or bool(_RATE_RE.search(message))
    if rate_limited or error.code in TRANSIENT_CODES:
        return Failure("transient", message)
    if error.code in (RESOURCE_EXHAUSTED, UNKNOWN):
        return Failure("unclassified", message)
    return Failure("permanent", message)


def failed_request(code: int, message: str, zone: str = "") -> Failure:
    """The class of a queued resource that ended FAILED (`state.failedData.error`): the
    provider, `tpuctl recover` and the controller all ask here. One with no error at all
    is capacity: a request the API gave up on without saying why is tried elsewhere."""
    if not message and not code:
        return Failure("capacity", f"the request FAILED in {zone or 'its zone'} "
                                   f"with no error given")
    return classify(ApiError(code, message), zone)


def preempted_while_creating(state: str) -> Failure:
    return Failure("preempted", f"the request became {state} before its node was ready")


def timed_out(state: str, waited: float) -> Failure:
    bound = "the create timeout" if state == "PROVISIONING" else "maxWait"
    return Failure("timeout", f"still {state} after {waited:.0f} s ({bound})")


def _quota_scope(error: ApiError, zone: str) -> QuotaScope | None:
    for violation in error.violations:
        if violation.quota_id:
            return _scope(violation.quota_id, violation.dimensions, violation.description,
                          zone)
    match = _QUOTA_ID_RE.search(error.message)
    if match is None:
        return None
    return _scope(match["id"], {}, error.message, zone)


def _scope(quota_id: str, dimensions: Mapping[str, str], text: str, zone: str) -> QuotaScope:
    if dimensions.get("zone"):
        return QuotaScope(quota_id, "zone", dimensions["zone"])
    if dimensions.get("region"):
        return QuotaScope(quota_id, "region", dimensions["region"])
    place = _QUOTA_PLACE_RE.search(text)
    if place:
        return QuotaScope(quota_id, place["kind"], place["place"])  # type: ignore[arg-type]
    # A quota id says its own scope: ...PerProjectPerRegion..., ...PerProjectPerZone...
    if "PerZone" in quota_id and zone:
        return QuotaScope(quota_id, "zone", zone)
    if "PerRegion" in quota_id and zone:
        return QuotaScope(quota_id, "region", catalog.region_of(zone))
    return QuotaScope(quota_id, "project")


def capacity_zone(failure: Failure) -> str | None:
    """The zone a capacity message names, if any."""
    match = _ZONE_IN_MESSAGE_RE.search(failure.detail)
    return match["zone"] if match else None


# ---- reading the API's error shapes -------------------------------------------------


def from_exception(error: BaseException) -> ApiError:
    """An `google.api_core.exceptions.GoogleAPICallError` (REST: the HTTP status and the
    JSON `details`; gRPC and operations: the rpc code and parsed protos) as an ApiError."""
    code = _rpc_code(error)
    message = str(getattr(error, "message", "") or error)
    details = list(getattr(error, "details", None) or ())
    # An operation's failure: its google.rpc.Status in `.errors` (module docstring).
    for status in getattr(error, "errors", None) or ():
        details += [_unpacked(d) for d in getattr(status, "details", ()) or ()]
    reason = getattr(error, "reason", None) or _reason(details)
    return ApiError(code, message, tuple(_violations(details)), reason or "")


def from_status(status: Any) -> ApiError:
    """A `google.rpc.Status` (an operation's or a queued resource's `error`)."""
    details = [_unpacked(detail) for detail in getattr(status, "details", ()) or ()]
    return ApiError(int(status.code), status.message, tuple(_violations(details)),
                    _reason(details))


def _reason(details: Iterable[Any]) -> str:
    """The first ErrorInfo's reason among `details` (REST JSON or unpacked protos)."""
    for detail in details:
        if isinstance(detail, Mapping):
            if detail.get("@type") == ERROR_INFO_TYPE:
                return str(detail.get("reason") or "")
        elif type(detail).__name__ == "ErrorInfo":
            return str(detail.reason)
    return ""


def _rpc_code(error: BaseException) -> int:
    grpc_code = getattr(error, "grpc_status_code", None)
    if grpc_code is not None:
        value = getattr(grpc_code, "value", grpc_code)
        return int(value[0] if isinstance(value, tuple) else value)
    status = getattr(error, "code", None)
    if isinstance(status, int):
        return HTTP_TO_CODE.get(status, UNAVAILABLE if status >= 500 else INVALID_ARGUMENT)
    return UNAVAILABLE if isinstance(error, (ConnectionError, TimeoutError)) else 2  # UNKNOWN


def _unpacked(detail: Any) -> Any:
    """An `Any` holding a QuotaFailure or an ErrorInfo, unpacked; anything else as it is."""
    type_url = getattr(detail, "type_url", None)
    if type_url in (QUOTA_FAILURE_TYPE, ERROR_INFO_TYPE):
        from google.rpc import error_details_pb2

        message = (error_details_pb2.QuotaFailure() if type_url == QUOTA_FAILURE_TYPE
                   else error_details_pb2.ErrorInfo())
        detail.Unpack(message)
        return message
    return detail


def _violations(details: Iterable[Any]) -> Iterable[QuotaViolation]:
    for detail in details:
        if isinstance(detail, Mapping):  # REST JSON: lowerCamel keys (proto3 JSON mapping)
            if detail.get("@type") != QUOTA_FAILURE_TYPE:
                continue
            for v in detail.get("violations") or ():
                yield QuotaViolation(v.get("quotaId") or v.get("quota_id") or "",
                                     dict(v.get("quotaDimensions") or
                                          v.get("quota_dimensions") or {}),
                                     v.get("description") or "")
        elif type(detail).__name__ == "QuotaFailure":
            for v in detail.violations:
                yield QuotaViolation(v.quota_id, dict(v.quota_dimensions), v.description)


# ---- a round over the candidates ----------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """What the round needs of a candidate: where, which family, how many chips."""

    zone: str
    generation: str
    quota_type: str  # settings.QuotaType
    chips: int


@dataclass
class Round:
    """One pass over the candidates: a quota error blocks its family in its scope for
    the rest of the pass, for that slice and any larger one of the same family."""

    blocks: list[tuple[QuotaScope, Placement]] = field(default_factory=list)

    def block(self, scope: QuotaScope, placement: Placement) -> None:
        self.blocks.append((scope, placement))

    def blocked(self, placement: Placement) -> str | None:
        """Why `placement` is skipped in this round, or None."""
        for scope, failed in self.blocks:
            same_family = (failed.generation, failed.quota_type) == (
                placement.generation, placement.quota_type)
            if same_family and scope.covers(placement.zone) and placement.chips >= failed.chips:
                return f"quota {scope} ran out this round"
        return None


def backoff_seconds(round_index: int, base: float = 30.0, cap: float = 600.0,
                    rng: random.Random | None = None) -> float:
    """Before round `round_index` (1 = the second): doubling from `base` to `cap`, with
    full jitter (half to all of it), so many stacks do not retry in step."""
    delay = min(cap, base * 2 ** max(0, round_index - 1))
    return delay * (0.5 + 0.5 * (rng or random).random())


_DURATION_RE = re.compile(r"^(?P<n>[1-9][0-9]*)(?P<unit>[smhd])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_seconds(text: str) -> int | None:
    """`30m`, `20s`, `6h`, `1d` in seconds; None when it is not such a duration."""
    match = _DURATION_RE.match(text)
    return int(match["n"]) * _SECONDS[match["unit"]] if match else None
