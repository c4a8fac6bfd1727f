"""A TPU node tried on ordered candidates: a dynamic provider beside QueuedTpuProvider.

A node with `fallback` (model/settings/, NodeSettings.candidates) is created
here. Every candidate is a queued resource carrying the whole node, as QueuedTpu sends
it (the same node id and metadata in every zone, so the agent's contract never
changes with the candidate), tried in order:

- at most one attempt is alive at a time: a failed, refused or timed-out attempt is
  deleted (`force`) and confirmed gone (queued_tpu.force_delete) before the next starts;
- a request still waiting for resources after `max_wait_seconds` moves on (class
  `timeout`); one PROVISIONING by then is followed, up to the create timeout;
- the failure is classified (model/capacity.py): capacity, reservation, preempted
  and timeout move on; quota moves on and blocks its family in its scope for the rest
  of the round; transient retries the same candidate after a backoff; permanent stops,
  naming the error, and no later candidate is tried;
- when a whole round fails, the next one starts after a jittered backoff, until the
  create timeout; the error then lists every attempt's class and the API's words.

`create` returns once a candidate's request is ACTIVE: the candidate that took is in
the outputs (`candidate`, `placement`, `attempts`). `read` (refresh) finds the request
in whichever candidate zone it lives. Editing the list is an update that moves nothing,
unless the running candidate is no longer in it: then the node is replaced.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass
from typing import Any

import pulumi
import pulumi.dynamic as dyn

from cloud.tpu import tpu_client, transient_retry
from components.queued_tpu import (
    IN_PLACE,
    QueuedTpuError,
    QueuedTpuProvider,
    _outputs,
    _parent,
    _poll,
    _queued_id,
    _timeout,
    build_queued_resource,
    check_inputs,
    force_delete,
)
from model import capacity
from model.pulumi_types import DYNAMIC_MODULE, FALLBACK_TPU_NAME

# What a candidate sets of the request; everything else is the node's, shared.
PLACEMENT_KEYS = ("zone", "accelerator_type", "accelerator_config_type", "accelerator_topology",
                  "runtime_version", "subnetwork", "spot", "guaranteed", "reservation_name",
                  "valid_until_seconds", "generation", "chips", "quota_type", "provisioning")
# Outputs only this provider writes.
FALLBACK_OUTPUTS = ("candidate", "candidate_label", "placement", "attempts", "zone")
# Steer this provider only: a change is an update that touches no cloud field.
STEERING = ("candidates", "max_wait_seconds", "round_backoff_seconds",
            "create_timeout_seconds", "delete_timeout_seconds", "poll_seconds")
VIEW_KEYS = ("zone", "runtime_version", "accelerator_type", "accelerator_config_type",
             "accelerator_topology", "spot", "guaranteed", "reservation_name")
ACTIVE = "ACTIVE"
PROVISIONING = "PROVISIONING"
SUSPENDED = ("SUSPENDING", "SUSPENDED")


@dataclass(frozen=True)
class Attempt:
    """One candidate's turn: its 1-based position, the class of its end, why."""

    candidate: int
    outcome: str  # a capacity.FailureClass, "skipped", or "took"
    detail: str

    def line(self) -> str:
        return f"candidate {self.candidate}: {self.outcome}: {self.detail}"


def merged(props: dict[str, Any], candidate: dict[str, Any]) -> dict[str, Any]:
    """The request of one candidate: the node's props under the candidate's placement."""
    shared = {k: v for k, v in props.items() if k not in (*PLACEMENT_KEYS, "candidates")}
    return {**shared, **{k: candidate.get(k) for k in PLACEMENT_KEYS}}


def label(index: int, count: int, candidate: dict[str, Any]) -> str:
    """`2/4 us-east5-b spot`: where the node is and on which tier."""
    return f"{index}/{count} {candidate['zone']} {candidate.get('provisioning') or 'on-demand'}"


def _placement(candidate: dict[str, Any]) -> capacity.Placement:
    return capacity.Placement(candidate["zone"], candidate.get("generation") or "",
                              candidate.get("quota_type") or "", int(candidate.get("chips") or 0))


def _same(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    return a is not None and all(_normal(a.get(k)) == _normal(b.get(k)) for k in PLACEMENT_KEYS)


def removed_candidates(olds: list[dict[str, Any]], news: list[dict[str, Any]]) -> list[str]:
    """Labels (`2/3 us-east5-b spot`) of the old candidates the new list no longer has:
    a node running on one of them is replaced (diff); the plan, which does not know
    which one it runs on, shows the edit as a replacement (ops/plan/steps.py)."""
    return [label(i, len(olds), c) for i, c in enumerate(olds, start=1)
            if not any(_same(c, n) for n in news)]


def _normal(value: Any) -> Any:
    return value if value not in (None, "", [], {}) else None


def _name(props: dict[str, Any]) -> str:
    return f"{_parent(props)}/queuedResources/{_queued_id(props)}"


class FallbackTpuProvider(QueuedTpuProvider):
    """create/read/diff/update/delete of a node placed on the first candidate that takes."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dyn.CheckResult:
        failures = []
        candidates = news.get("candidates") or []
        if not candidates:
            failures.append(dyn.CheckFailure("candidates", "candidates is required"))
        for index, candidate in enumerate(candidates):
            for key, why in check_inputs(merged(news, candidate)):
                failures.append(dyn.CheckFailure("candidates", f"[{index}].{key} {why}"))
        return dyn.CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> dyn.CreateResult:
        client = tpu_client()
        index, queued, attempts = place(client, props)
        return dyn.CreateResult(queued.name, _fallback_outputs(
            client, props, index, queued, [asdict(a) for a in attempts]))

    def read(self, id_: str, props: dict[str, Any]) -> dyn.ReadResult:
        from google.api_core import exceptions as gexc

        client = tpu_client()
        candidates = props.get("candidates") or []
        # The recorded request first, then every candidate's zone: the node lives in one
        # (`tpuctl recover` may have moved it). A refresh keeps a changed id in the state
        # (pulumi/pulumi pkg/resource/deploy/step.go, RefreshStep.Apply: "There is a chance
        # that the ID has changed").
        order = sorted(range(len(candidates)),
                       key=lambda i: not _same(props.get("placement"), candidates[i]))
        for index in order:
            name = _name(merged(props, candidates[index]))
            try:
                queued = client.get_queued_resource(name=name, retry=transient_retry())
            except gexc.NotFound:
                continue
            return dyn.ReadResult(name, _fallback_outputs(
                client, props, index, queued, props.get("attempts") or []))
        return dyn.ReadResult("", {})  # gone everywhere: the next `up` places it again

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.DiffResult:
        placement = olds.get("placement")
        kept = any(_same(placement, c) for c in news.get("candidates") or [])
        ignored = set(PLACEMENT_KEYS) | set(FALLBACK_OUTPUTS) | {
            "state", "node_name", "node_state", "queued_resource_name", "held", "__provider"}
        keys = sorted((set(olds) | set(news)) - ignored)
        changed = [k for k in keys if _normal(olds.get(k)) != _normal(news.get(k))]
        replaces = [k for k in changed if k not in IN_PLACE + STEERING]
        if not kept:
            changed.append("candidates")
            replaces.append("candidates")
        return dyn.DiffResult(changes=bool(changed), replaces=replaces,
                              delete_before_replace=True)

    def delete(self, id_: str, props: dict[str, Any]) -> None:
        # The recorded request, and any of this node's in another candidate zone: one
        # `tpuctl recover` moved there since the last refresh, or an interrupted run left.
        client = tpu_client()
        names = dict.fromkeys([id_, *(_name(merged(props, c))
                                      for c in props.get("candidates") or [])])
        for name in names:
            force_delete(client, name, _timeout(props, "delete"), _poll(props))

    def update(self, id_: str, olds: dict[str, Any], news: dict[str, Any]) -> dyn.UpdateResult:
        candidates = news["candidates"]
        index = next(i for i, c in enumerate(candidates) if _same(olds.get("placement"), c))
        # QueuedTpu's update: in place on the node, or held while a request waits (its
        # outputs keep what the request carries, so the change shows again).
        result = super().update(id_, merged(olds, olds["placement"]),
                                merged(news, candidates[index]))
        return dyn.UpdateResult({**result.outs, **_fallback_fields(
            news, index, olds.get("attempts") or [])})


def _fallback_outputs(client: Any, props: dict[str, Any], index: int, queued: Any,
                      attempts: list[dict[str, Any]]) -> dict[str, Any]:
    outs = _outputs(client, merged(props, props["candidates"][index]), queued)
    return {**outs, **_fallback_fields(props, index, attempts)}


def _fallback_fields(props: dict[str, Any], index: int,
                     attempts: list[dict[str, Any]]) -> dict[str, Any]:
    candidates = props["candidates"]
    return {"candidates": candidates, "candidate": index + 1, "placement": candidates[index],
            "candidate_label": label(index + 1, len(candidates), candidates[index]),
            "attempts": attempts}


# ---- placing ---------------------------------------------------------------------


def place(client: Any, props: dict[str, Any], sleep: Any = time.sleep,
          rng: random.Random | None = None) -> tuple[int, Any, list[Attempt]]:
    """(index of the candidate that took, its ACTIVE request, every attempt), or a
    QueuedTpuError that says why it stopped."""
    candidates = props["candidates"]
    deadline = time.monotonic() + _timeout(props, "create")
    attempts: list[Attempt] = []
    left = _leftover(client, props, attempts)
    if left is not None:
        return left
    rounds = 0
    while True:
        this_round = capacity.Round()
        for index, candidate in enumerate(candidates):
            blocked = this_round.blocked(_placement(candidate))
            if blocked:
                attempts.append(Attempt(index + 1, "skipped", blocked))
                continue
            failure, queued = _attempt(client, merged(props, candidate), props, deadline, sleep)
            if failure is None:
                attempts.append(Attempt(index + 1, "took", label(index + 1, len(candidates),
                                                                 candidate)))
                return index, queued, attempts
            attempts.append(Attempt(index + 1, failure.kind, failure.detail))
            if not failure.moves_on:
                raise QueuedTpuError(_stopped(failure, index + 1, attempts))
            if failure.quota is not None:
                this_round.block(failure.quota, _placement(candidate))
        rounds += 1
        delay = capacity.backoff_seconds(rounds, base=float(
            props.get("round_backoff_seconds") or 30), rng=rng)
        if time.monotonic() + delay >= deadline:
            raise QueuedTpuError(
                f"no candidate took in {rounds} round(s) within {_timeout(props, 'create'):.0f} "
                f"s; nothing is left queued. " + "; ".join(a.line() for a in attempts))
        sleep(delay)


def _leftover(client: Any, props: dict[str, Any], attempts: list[Attempt]
              ) -> tuple[int, Any, list[Attempt]] | None:
    """Requests of this node that an interrupted run left in a candidate zone (a failed
    dynamic create records nothing in the state): an ACTIVE one is adopted, the others are
    deleted and confirmed gone, so the round starts with none alive."""
    from google.api_core import exceptions as gexc

    candidates = props["candidates"]
    adopted = None
    for index, candidate in enumerate(candidates):
        request = merged(props, candidate)
        name = _name(request)
        try:
            queued = client.get_queued_resource(name=name, retry=transient_retry())
        except gexc.NotFound:
            continue
        if adopted is None and queued.state.state.name == ACTIVE:
            adopted = (index, queued)
            continue
        attempts.append(Attempt(index + 1, "leftover", f"{queued.state.state.name}: deleted"))
        _delete(client, name, request, "a request an earlier run left")
    if adopted is None:
        return None
    index, queued = adopted
    where = label(index + 1, len(candidates), candidates[index])
    attempts.append(Attempt(index + 1, "took",
                            f"adopted the ACTIVE request an earlier run left: {where}"))
    return index, queued, attempts


def _stopped(failure: capacity.Failure, position: int, attempts: list[Attempt]) -> str:
    why = ("a permanent error: the next candidate would fail the same way, so none was tried"
           if failure.kind == "permanent" else "transient errors until the create timeout")
    return (f"candidate {position} stopped the placement with {why}: {failure.detail}; "
            f"nothing is left queued. Attempts: " + "; ".join(a.line() for a in attempts))


def _attempt(client: Any, request: dict[str, Any], props: dict[str, Any], deadline: float,
             sleep: Any) -> tuple[capacity.Failure | None, Any]:
    """One candidate, transient errors retried: None and the ACTIVE request, or the
    failure, with the request deleted and confirmed gone."""
    name = _name(request)
    backoff = _poll(request)
    while True:
        try:
            failure, queued = _try_once(client, name, request, props, deadline)
        except Exception as error:  # an unexpected end: nothing may stay queued
            _delete(client, name, request, error)
            raise
        if failure is None:
            return None, queued
        _delete(client, name, request, failure.detail)
        if failure.kind != "transient" or time.monotonic() + backoff >= deadline:
            return failure, None
        sleep(backoff)
        backoff = min(backoff * 2, 60.0)


def _try_once(client: Any, name: str, request: dict[str, Any], props: dict[str, Any],
              deadline: float) -> tuple[capacity.Failure | None, Any]:
    from google.api_core import exceptions as gexc

    zone = request["zone"]
    try:
        client.create_queued_resource(
            parent=_parent(request), queued_resource_id=_queued_id(request),
            queued_resource=build_queued_resource(request),
        ).result(timeout=_timeout(request, "create"))
    except gexc.Conflict:
        pass  # a request of this name an earlier run left: this node's, adopted
    except gexc.GoogleAPICallError as error:
        return capacity.classify(capacity.from_exception(error), zone), None
    max_wait = float(props.get("max_wait_seconds") or 1800)
    started = time.monotonic()
    while True:
        try:
            queued = client.get_queued_resource(name=name, retry=transient_retry())
        except gexc.GoogleAPICallError as error:
            return capacity.classify(capacity.from_exception(error), zone), None
        state = queued.state.state.name
        if state == ACTIVE:
            return None, queued
        if state == "FAILED":
            error = queued.state.failed_data.error
            if error and error.message:
                return capacity.classify(capacity.from_status(error), zone), None
            return capacity.Failure("capacity", f"the request FAILED in {zone}"), None
        if state in SUSPENDED:
            return capacity.preempted_while_creating(state), None
        waited = time.monotonic() - started
        # maxWait bounds the wait for resources; a request they were found for
        # (PROVISIONING) is followed to the end, bounded by the create timeout only.
        bound = deadline if state == PROVISIONING else started + max_wait
        if time.monotonic() >= bound:
            return capacity.timed_out(state, waited), None
        time.sleep(min(_poll(request), max(0.0, bound - time.monotonic())))


def _delete(client: Any, name: str, request: dict[str, Any], why: object) -> None:
    """Delete (force) and confirm gone; a request that will not go stops everything."""
    try:
        force_delete(client, name, _timeout(request, "delete"), _poll(request))
    except Exception as cleanup:
        raise QueuedTpuError(
            f"{why}; deleting the request failed too ({cleanup}): it may still be queued and "
            f"provision a TPU no stack owns, so no further candidate is tried. Delete it with "
            f"`gcloud compute tpus queued-resources delete {_queued_id(request)} --zone "
            f"{request['zone']} --force`") from None


# ---- moving a request (tpuctl recover) ------------------------------------------------


def props_from_request(queued: Any, placement: dict[str, Any]) -> dict[str, Any]:
    """The props that queue `queued`'s node (metadata, account, network, labels: all it
    carries) at `placement`; the subnetwork follows the placement's region, named as
    components/network.py names it (`placement["subnet_name"]`) in the network's project."""
    spec = queued.tpu.node_spec[0]
    node = spec.node
    project = spec.parent.split("/")[1]
    subnet_project = node.network_config.subnetwork.split("/")[1] \
        if node.network_config.subnetwork.startswith("projects/") else project
    region = placement["zone"].rsplit("-", 1)[0]
    shared = {
        "project": project, "node_id": spec.node_id,
        "queued_resource_id": queued.name.rsplit("/", 1)[-1],
        "network": node.network_config.network,
        "enable_external_ips": node.network_config.enable_external_ips,
        "service_account_email": node.service_account.email,
        "scopes": list(node.service_account.scope), "metadata": dict(node.metadata),
        "labels": dict(node.labels), "tags": list(node.tags), "description": node.description,
    }
    subnetwork = (f"projects/{subnet_project}/regions/{region}/subnetworks/"
                  f"{placement['subnet_name']}")
    return merged(shared, {**placement, "subnetwork": subnetwork})


def enqueue(client: Any, props: dict[str, Any], timeout: float) -> str:
    """Queue `props`' request; its name once the API has it (provisioning follows)."""
    client.create_queued_resource(
        parent=_parent(props), queued_resource_id=_queued_id(props),
        queued_resource=build_queued_resource(props), retry=transient_retry(),
    ).result(timeout=timeout)
    return _name(props)


# ---- the resource ------------------------------------------------------------------


def candidate_props(node: Any, subnetwork: pulumi.Input[str]) -> dict[str, Any]:
    """One candidate (a NodeSettings) as the provider's placement."""
    tpu = node.tpu
    by_shape = node.accelerator_type is None
    queue = node.queue
    # Every candidate is queued: its label names the tier (`2/4 us-east5-b spot`).
    tier = ("spot" if node.spot else "reserved" if queue and queue.reservation_name else
            "guaranteed" if queue and queue.guaranteed else "on-demand")
    return {
        "zone": node.zone,
        "provisioning": tier,
        "accelerator_type": node.accelerator_type,
        "accelerator_config_type": tpu.generation.api_type if by_shape else None,
        "accelerator_topology": tpu.topology if by_shape else None,
        "runtime_version": node.runtime,
        "subnetwork": subnetwork,
        "spot": node.spot,
        "guaranteed": bool(queue and queue.guaranteed),
        "reservation_name": queue.reservation_name if queue else None,
        "valid_until_seconds": queue.valid_until_seconds if queue else None,
        "generation": tpu.generation.name,
        "chips": tpu.chips,
        "quota_type": node.quota_type,
    }


class FallbackTpu(dyn.Resource, module=DYNAMIC_MODULE, name=FALLBACK_TPU_NAME):
    """A TPU node placed on the first of its candidates that takes (module docstring).

    Outputs: candidate (1-based), candidate_label (`2/4 us-east5-b spot`), placement,
    attempts, zone, and QueuedTpu's state, queued_resource_name, node_name, node_state."""

    candidate: pulumi.Output[int]
    candidate_label: pulumi.Output[str]
    zone: pulumi.Output[str]
    state: pulumi.Output[str]
    node_name: pulumi.Output[str]

    def __init__(self, resource_name: str, *, project: pulumi.Input[str], node_id: str,
                 candidates: list[dict[str, Any]], max_wait_seconds: int,
                 queued_resource_id: str | None = None,
                 network: pulumi.Input[str] | None = None, enable_external_ips: bool = False,
                 service_account_email: pulumi.Input[str] | None = None,
                 scopes: list[str] | None = None,
                 metadata: pulumi.Input[dict[str, pulumi.Input[str]]] | None = None,
                 labels: dict[str, str] | None = None, tags: list[str] | None = None,
                 description: str | None = None, create_timeout_seconds: float = 6 * 3600,
                 delete_timeout_seconds: float = 1800, poll_seconds: float = 15,
                 round_backoff_seconds: float = 30,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        inputs = {key: value for key, value in locals().items()
                  if not key.startswith("_") and key not in {"self", "resource_name", "opts"}}
        outputs = (*FALLBACK_OUTPUTS, "state", "queued_resource_name", "node_name",
                   "node_state", "held")
        inputs.update(dict.fromkeys(outputs))
        # The first candidate's placement at the top level too, the shape of a QueuedTpu's
        # inputs: the policy pack and the plan's report read a node from them
        # (policy/tpu_policies.py tpu_view). The provider reads the candidates only.
        inputs.update({key: candidates[0].get(key) for key in VIEW_KEYS})
        super().__init__(FallbackTpuProvider(), resource_name, inputs, opts)
