"""A TPU node tried on ordered candidates: a dynamic provider beside QueuedTpuProvider.

A node with `fallback` (model/settings/, NodeSettings.candidates) is created
here. Every candidate is a queued resource carrying the whole node, as QueuedTpu sends
it (the same node id and metadata in every zone, so the agent's contract never
changes with the candidate), under its own request name (model/naming.py
candidate_request: two candidates in one zone never share one).

`create` submits a request and returns its ID at once, as QueuedTpu does: nothing here
waits for capacity (issue 43). A Python dynamic provider serves every dynamic resource
of a program from one process of four workers (pulumi/pulumi sdk/python/lib/pulumi/
dynamic/__main__.py, `ThreadPoolExecutor(max_workers=4)`), and a create that never
returns records no ID (pulumi/pulumi #4265), so a create that waited for capacity
could block the whole `up` and leak its request. It submits the first candidate whose
create the API accepts: a create refused at once for capacity, quota or a reservation
(model/capacity.py) goes to the next candidate (the refused request deleted and
confirmed gone); a permanent error stops, naming it. A request of this node already
alive under any candidate's name with that candidate's spec is adopted, never deleted.

Moving a waiting or FAILED request on to the next candidate, and back to the first
after a preemption, is the controller's (controller/, docs/design.md "The
controller"). The outputs say which candidate holds the request (`candidate`,
`candidate_label`, `placement`, `attempts`); `read` (refresh) follows it to whichever
candidate holds it; `delete` deletes it wherever it is, found by its labels when the
state lost it. Editing the list is an update that moves nothing, unless the running
candidate is no longer in it: then the node is replaced.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import pulumi
import pulumi.dynamic as dyn

from cloud.tpu import create_retry, tpu_client, transient_retry
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
from model import capacity, naming
from model.candidates import candidate_label
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


def _placement(candidate: dict[str, Any]) -> capacity.Placement:
    return capacity.Placement(candidate["zone"], candidate.get("generation") or "",
                              candidate.get("quota_type") or "", int(candidate.get("chips") or 0))


def _same(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    return a is not None and all(_normal(a.get(k)) == _normal(b.get(k)) for k in PLACEMENT_KEYS)


def removed_candidates(olds: list[dict[str, Any]], news: list[dict[str, Any]]) -> list[str]:
    """Labels (`2/3 us-east5-b spot`) of the old candidates the new list no longer has:
    a node running on one of them is replaced (diff); the plan, which does not know
    which one it runs on, shows the edit as a replacement (ops/plan/steps.py)."""
    return [candidate_label(i, len(olds), c) for i, c in enumerate(olds, start=1)
            if not any(_same(c, n) for n in news)]


def _normal(value: Any) -> Any:
    return value if value not in (None, "", [], {}) else None


def request_name(props: dict[str, Any]) -> str:
    """The queued resource name `props` create: projects/<p>/locations/<z>/queuedResources/<id>."""
    return f"{_parent(props)}/queuedResources/{_queued_id(props)}"


_name = request_name


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
        index, queued, attempts = submit(client, props)
        return dyn.CreateResult(queued.name, outputs_of(
            client, props, index, queued, [asdict(a) for a in attempts]))

    def read(self, id_: str, props: dict[str, Any]) -> dyn.ReadResult:
        from google.api_core import exceptions as gexc

        client = tpu_client()
        candidates = props.get("candidates") or []
        # The recorded request first, then every candidate's name, then a list of the
        # candidates' zones: the controller may have moved it. A refresh keeps a changed
        # id in the state (pulumi/pulumi pkg/resource/deploy/step.go, RefreshStep.Apply:
        # "There is a chance that the ID has changed").
        order = sorted(range(len(candidates)),
                       key=lambda i: not _same(props.get("placement"), candidates[i]))
        for index in order:
            name = _name(request_of(props, index))
            try:
                queued = client.get_queued_resource(name=name, retry=transient_retry())
            except gexc.NotFound:
                continue
            return dyn.ReadResult(name, outputs_of(
                client, props, index, queued, props.get("attempts") or []))
        for queued in requests_by_label(client, props):
            index = _candidate_of(queued, candidates)
            return dyn.ReadResult(queued.name, outputs_of(
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
        # The recorded request, every candidate's name, and any request of this node the
        # candidates' zones list (the controller moved it, or the state lost the ID).
        client = tpu_client()
        candidates = props.get("candidates") or []
        names = [id_, *(_name(request_of(props, i)) for i in range(len(candidates)))]
        names += [queued.name for queued in requests_by_label(client, props)]
        for name in dict.fromkeys(n for n in names if n):
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


def _candidate_of(queued: Any, candidates: list[dict[str, Any]]) -> int:
    """The first candidate whose spec `queued` has (0 when none has)."""
    return next((i for i, c in enumerate(candidates) if spec_matches(queued, c)), 0)


def _fallback_outputs(client: Any, props: dict[str, Any], index: int, queued: Any,
                      attempts: list[dict[str, Any]]) -> dict[str, Any]:
    outs = _outputs(client, merged(props, props["candidates"][index]), queued)
    return {**outs, **_fallback_fields(props, index, attempts)}


def _fallback_fields(props: dict[str, Any], index: int,
                     attempts: list[dict[str, Any]]) -> dict[str, Any]:
    candidates = props["candidates"]
    return {"candidates": candidates, "candidate": index + 1, "placement": candidates[index],
            "candidate_label": candidate_label(index + 1, len(candidates), candidates[index]),
            "attempts": attempts}


# ---- submitting ------------------------------------------------------------------

# A request in one of these states holds no capacity and will not provision: adopting
# it would adopt nothing, so a leftover in one is deleted and the candidate submitted.
DEAD = frozenset({"FAILED", "SUSPENDING", "SUSPENDED"})


def request_of(props: dict[str, Any], index: int) -> dict[str, Any]:
    """Candidate `index` (0-based)'s request: merged, under its own request name."""
    base = props.get("queued_resource_id") or props["node_id"]
    request = merged(props, props["candidates"][index])
    return {**request, "queued_resource_id": naming.candidate_request(base, index + 1)}


def spec_matches(queued: Any, candidate: dict[str, Any]) -> bool:
    """`queued` asks for what `candidate` places: its zone, shape and tier (a leftover
    of another spec is not this candidate's to adopt, issue 43 defect 1)."""
    spec = queued.tpu.node_spec[0] if queued.tpu.node_spec else None
    if spec is None or f"/locations/{candidate['zone']}" not in spec.parent:
        return False
    node = spec.node
    if candidate.get("accelerator_type"):
        shape_ok = node.accelerator_type == candidate["accelerator_type"]
    else:
        shape_ok = node.accelerator_config.topology == candidate.get("accelerator_topology")
    tier_ok = ("spot" in queued) == bool(candidate.get("spot"))  # proto-plus: field presence
    return shape_ok and tier_ok


def submit(client: Any, props: dict[str, Any]) -> tuple[int, Any, list[Attempt]]:
    """(the candidate now holding this node's request, the request, every attempt): an
    alive request of this node is adopted, else the first candidate whose create the API
    accepts. Returns as soon as the API has the request; never waits for capacity."""
    attempts: list[Attempt] = []
    alive = find_alive(client, props)
    if alive is not None:
        index, queued = alive
        attempts.append(Attempt(index + 1, "took", "adopted the request already alive"))
        return index, queued, attempts
    this_round = capacity.Round()
    candidates = props["candidates"]
    for index, candidate in enumerate(candidates):
        blocked = this_round.blocked(_placement(candidate))
        if blocked:
            attempts.append(Attempt(index + 1, "skipped", blocked))
            continue
        failure, queued = _submit_candidate(client, request_of(props, index))
        if failure is None:
            took = candidate_label(index + 1, len(candidates), candidate)
            attempts.append(Attempt(index + 1, "took", took))
            return index, queued, attempts
        attempts.append(Attempt(index + 1, failure.kind, failure.detail))
        if not failure.moves_on and failure.kind != "unclassified":
            raise QueuedTpuError(_stopped(failure, index + 1, attempts))
        if failure.quota is not None:
            this_round.block(failure.quota, _placement(candidate))
    raise QueuedTpuError("every candidate refused the request: nothing is left queued; "
                         "run `pulumi up` again later. " + "; ".join(a.line() for a in attempts))


def find_alive(client: Any, props: dict[str, Any]) -> tuple[int, Any] | None:
    """This node's request under any candidate's name, with that candidate's spec and
    alive (not FAILED or SUSPENDED); one of another spec or dead is left to the
    controller (at most one request per node: the controller deletes the others)."""
    from google.api_core import exceptions as gexc

    for index, candidate in enumerate(props["candidates"]):
        try:
            queued = client.get_queued_resource(name=_name(request_of(props, index)),
                                                retry=transient_retry())
        except gexc.NotFound:
            continue
        if queued.state.state.name not in DEAD and spec_matches(queued, candidate):
            return index, queued
    return None


def _submit_candidate(client: Any, request: dict[str, Any]
                      ) -> tuple[capacity.Failure | None, Any]:
    """Submit one candidate's request, a transient or unclassified refusal retried a
    bounded number of times (capacity.UNCLASSIFIED_RETRIES) a moment apart: (None, the
    request) once the API has it, or why it was refused."""
    failure: capacity.Failure | None = None
    for attempt in range(1 + capacity.UNCLASSIFIED_RETRIES):
        if attempt:
            time.sleep(min(_poll(request), 2.0))
        failure, queued = _submit_once(client, request)
        if failure is None or failure.kind not in ("transient", "unclassified"):
            return failure, queued
    return failure, None


def _submit_once(client: Any, request: dict[str, Any]) -> tuple[capacity.Failure | None, Any]:
    from google.api_core import exceptions as gexc

    name = _name(request)
    try:
        # No retry of a 429: a quota refusal as often as a rate limit, which the
        # classifier tells apart (_submit_candidate retries what it should).
        queued = client.create_queued_resource(
            parent=_parent(request), queued_resource_id=_queued_id(request),
            queued_resource=build_queued_resource(request), retry=create_retry(),
        ).result(timeout=_timeout(request, "create"))
    except gexc.Conflict:
        return _leftover(client, name, request)
    except gexc.GoogleAPICallError as error:
        failure = capacity.classify(capacity.from_exception(error), request["zone"])
        # A refused create may still have queued something: deleted, confirmed gone.
        _delete(client, name, request, failure.detail)
        return failure, None
    return None, queued


def _leftover(client: Any, name: str, request: dict[str, Any]
              ) -> tuple[capacity.Failure | None, Any]:
    """A request of this candidate's name an earlier run left: adopted when alive and of
    this candidate's spec; else deleted, confirmed gone, and submitted once more."""
    queued = client.get_queued_resource(name=name, retry=transient_retry())
    if queued.state.state.name not in DEAD and spec_matches(queued, request):
        return None, queued
    _delete(client, name, request, f"a {queued.state.state.name} request an earlier run left")
    queued = client.create_queued_resource(
        parent=_parent(request), queued_resource_id=_queued_id(request),
        queued_resource=build_queued_resource(request), retry=transient_retry(),
    ).result(timeout=_timeout(request, "create"))
    return None, queued


def requests_by_label(client: Any, props: dict[str, Any]) -> list[Any]:
    """Every request in the candidates' zones that provisions this node (its node id and
    the stack label its node carries): found by listing, when the state lost the ID."""
    zones = dict.fromkeys(c["zone"] for c in props.get("candidates") or [])
    stack = (props.get("labels") or {}).get("stack")
    found = []
    for zone in zones:
        parent = f"projects/{props['project']}/locations/{zone}"
        for queued in client.list_queued_resources(parent=parent, retry=transient_retry()):
            for spec in queued.tpu.node_spec:
                if spec.node_id == props["node_id"] and (
                        stack is None or spec.node.labels.get("stack") == stack):
                    found.append(queued)
                    break
    return found


def _stopped(failure: capacity.Failure, position: int, attempts: list[Attempt]) -> str:
    why = ("a permanent error: the next candidate would fail the same way, so none was tried"
           if failure.kind == "permanent" else "an error that retrying did not clear")
    return (f"candidate {position} stopped the placement with {why}: {failure.detail}; "
            f"nothing is left queued. Attempts: " + "; ".join(a.line() for a in attempts))


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


def outputs_of(client: Any, props: dict[str, Any], index: int, queued: Any,
               attempts: list[dict[str, Any]]) -> dict[str, Any]:
    """The outputs; a failed read of the node leaves its fields empty (a read error
    deletes nothing and fails nothing: refresh fills them in)."""
    from google.api_core import exceptions as gexc

    try:
        return _fallback_outputs(client, props, index, queued, attempts)
    except gexc.GoogleAPICallError:
        outs = {**request_of(props, index), "state": queued.state.state.name,
                "queued_resource_name": queued.name, "node_name": "", "node_state": "",
                "held": []}
        return {**outs, **_fallback_fields(props, index, attempts)}


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
    """Queue `props`' request; its name once the API has it (provisioning follows). A
    refusal (quota: a 429) is raised at once for the caller to classify."""
    client.create_queued_resource(
        parent=_parent(props), queued_resource_id=_queued_id(props),
        queued_resource=build_queued_resource(props), retry=create_retry(),
    ).result(timeout=timeout)
    return _name(props)


def retarget(props: dict[str, Any], placement: dict[str, Any]) -> dict[str, Any]:
    """`props` (a request's, props_from_request) moved to another candidate's
    `placement`: its subnetwork in that region, its own request name."""
    subnetwork = props.get("subnetwork") or ""
    subnet_project = subnetwork.split("/")[1] if subnetwork.startswith("projects/") \
        else props["project"]
    region = placement["zone"].rsplit("-", 1)[0]
    moved = merged(props, {**placement, "subnetwork": (
        f"projects/{subnet_project}/regions/{region}/subnetworks/{placement['subnet_name']}")})
    moved["queued_resource_id"] = placement.get("queued_resource_id") or _queued_id(props)
    return moved


# ---- the resource ------------------------------------------------------------------


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
