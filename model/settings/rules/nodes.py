"""Rules on nodes: slice, zone, runtime, batch, HBM, queueing, commitments, fallback
candidates and run-time limits; one placement check for a node and a candidate."""

from __future__ import annotations

import json
from collections.abc import Generator, Mapping
from typing import Any

from model import catalog, subnets
from model.cost import node_cost
from model.naming import (
    LOGICAL_NAME_RE,
    LOGICAL_NAME_RULE,
)
from model.settings.rules.stack import job_configs, labels_problems
from model.settings.schema import DURATION_RE, NAMESPACE, ZONE_RE, NodeSettings, duration_seconds
from model.settings.suggest import Problems, did_you_mean
from tpu_training.config import JobConfig, train_device_bytes


def node_list_problems(key: str, nodes: list[NodeSettings],
                        job_data: Mapping[str, Mapping[str, Any]], jobs_key: str) -> Problems:
    """Every node of a `nodes` list (`key`) whose jobs are `job_data` (at `jobs_key`)."""
    jobs = dict(job_configs(job_data))
    seen: dict[str, int] = {}
    for index, node in enumerate(nodes):
        node_key = f"{key}[{index}]"
        if node.name in seen:
            yield (f"{node_key}.name",
                   f"{node.name!r} is already the name of nodes[{seen[node.name]}]")
        seen.setdefault(node.name, index)
        yield from node_problems(node_key, node, job_data, jobs, jobs_key)


def node_problems(key: str, node: NodeSettings, job_names: Mapping[str, Any],
                  jobs: Mapping[str, JobConfig], jobs_key: str = f"{NAMESPACE}:jobs") -> Problems:
    """Every rule of one node; `key` is its path in the config, `jobs_key` the
    path of the jobs it may name."""
    if not LOGICAL_NAME_RE.match(node.name):
        yield (f"{key}.name", f"{node.name!r}: node names are {LOGICAL_NAME_RULE}")
    yield from labels_problems(f"{key}.labels", node.labels)
    yield from _queue_problems(key, node)
    yield from _commitment_problems(key, node)
    yield from _fallback_problems(key, node)
    yield from _limit_problems(key, node)
    if not (yield from placement_problems(key, node)):
        return
    tpu = node.tpu
    if node.job not in job_names:
        allowed = ", ".join(job_names) or "none defined"
        yield (f"{key}.job", f"{node.job!r} is not a key of {jobs_key} ({allowed})")
    elif node.job in jobs:
        yield from _batch_problems(key, node, tpu, jobs[node.job], jobs_key)
        yield from _hbm_problems(key, tpu, jobs[node.job], f"{jobs_key}.{node.job}")


def _slice_problems(key: str, node: NodeSettings) -> Problems:
    by_type = node.accelerator_type is not None
    by_shape = node.generation is not None or node.topology is not None
    if by_type and by_shape:
        yield (f"{key}.acceleratorType", "give acceleratorType or generation + topology, "
                                         "not both")
        return
    if not by_type and not by_shape:
        yield (f"{key}.acceleratorType", "give acceleratorType (e.g. v2-8) or generation + "
                                         "topology (e.g. v4 + 2x2x4)")
        return
    try:
        if by_type:
            catalog.parse_accelerator_type(node.accelerator_type or "")
            return
        if node.generation is None or node.topology is None:
            missing = "generation" if node.generation is None else "topology"
            yield (f"{key}.{missing}", "is required with "
                   f"{'topology' if missing == 'generation' else 'generation'}")
            return
        gen = catalog.generation(node.generation)
    except catalog.CatalogError as error:
        field = "acceleratorType" if by_type else "generation"
        yield (f"{key}.{field}", str(error))
        return
    problem = catalog.topology_problem(gen, node.topology)
    if problem:
        yield (f"{key}.topology", problem)


def _zone_problems(key: str, node: NodeSettings, tpu: catalog.Slice) -> Problems:
    gen = tpu.generation
    if not ZONE_RE.match(node.zone):
        yield (f"{key}.zone", f"{node.zone!r} is not a zone name: "
                              f"{catalog.zone_suggestion(gen, node.zone)}")
    elif node.zone not in gen.zones:
        yield (f"{key}.zone", f"{node.zone} does not offer TPU {gen.name}"
                              f"{did_you_mean(node.zone, gen.zones, catalog.all_zones())} "
                              f"({', '.join(gen.zones)})")




def _runtime_problems(key: str, node: NodeSettings, tpu: catalog.Slice) -> Problems:
    if node.runtime_version is None:
        if catalog.runtime_for(tpu) is None:
            yield (f"{key}.runtimeVersion", catalog.runtime_problem(tpu, "") or "")
        return
    problem = catalog.runtime_problem(tpu, node.runtime_version)
    if problem:
        yield (f"{key}.runtimeVersion", problem)


def _batch_problems(key: str, node: NodeSettings, tpu: catalog.Slice,
                    job: JobConfig, jobs_key: str) -> Problems:
    if job.globalBatchSize % tpu.replicas:
        yield (f"{jobs_key}.{node.job}.globalBatchSize",
               f"{job.globalBatchSize} is not divisible by the {tpu.replicas} replicas of "
               f"{key} ({tpu.accelerator_type}); use a multiple of {tpu.replicas}")


def _hbm_problems(key: str, tpu: catalog.Slice, job: JobConfig, job_key: str) -> Problems:
    """A batch whose replica share cannot fit one replica's HBM (catalog: HBM per chip
    over the replicas a chip runs). The need is a lower bound (`train_device_bytes`:
    weights and optimizer state, activations with the attention scores recomputed), so
    what is refused cannot fit; what passes may still need a smaller batch."""
    replicas = tpu.replicas
    need = train_device_bytes(job, job.globalBatchSize // replicas)
    if need is None or job.globalBatchSize % replicas:
        return
    gen = tpu.generation
    have = gen.hbm_gib_per_chip * 2**30 / gen.replicas_per_chip
    if need <= have:
        return
    fixed = train_device_bytes(job, 0) or 0
    per_example = (train_device_bytes(job, 1) or 0) - fixed
    fits = max(0, int((have - fixed) // per_example)) * replicas
    advice = f"use a globalBatchSize of at most {fits}" if fits else \
        "its weights and optimizer state alone do not fit"
    yield (f"{job_key}.globalBatchSize",
           f"{job.globalBatchSize} is {job.globalBatchSize // replicas} examples per replica "
           f"on {key} ({tpu.accelerator_type}, {replicas} replicas); {job.model} at "
           f"maxSeqLength {job.maxSeqLength} needs at least {need / 2**30:.1f} GiB of HBM for "
           f"them, and a {gen.name} chip has {gen.hbm_gib_per_chip} GiB ({_hbm_share(gen)}, "
           f"cloud.google.com/tpu/docs/{gen.name}): {advice}, or a larger slice")


def _hbm_share(gen: catalog.Generation) -> str:
    if gen.replicas_per_chip == 1:
        return "one replica per chip"
    return f"{gen.hbm_gib_per_chip // gen.replicas_per_chip} GiB per replica, " \
           f"{gen.replicas_per_chip} per chip"


def _queue_problems(key: str, node: NodeSettings) -> Problems:
    queue = node.queue
    if queue is None:
        return
    if node.provisioning != "queued":
        yield (f"{key}.queue", f"applies only with provisioning: queued "
                               f"(this node is {node.provisioning})")
        return
    if queue.spot and queue.guaranteed:
        yield (f"{key}.queue.spot", "a queued resource is spot or guaranteed, not both")
    if queue.reservation_name and queue.spot:
        yield (f"{key}.queue.reservationName", "a reservation cannot be spot capacity")
    if queue.valid_until_duration and not DURATION_RE.match(queue.valid_until_duration):
        yield (f"{key}.queue.validUntilDuration", f"{queue.valid_until_duration!r} is not a "
                                                  f"duration: a number and s, m, h or d "
                                                  f"(e.g. 6h)")


def _commitment_problems(key: str, node: NodeSettings) -> Problems:
    """A Cloud TPU commitment is a future reservation with a 1- or 3-year committed use
    discount attached (cloud.google.com/tpu/docs/long-term-reservation): a node runs
    under it by consuming that reservation, never as spot capacity."""
    if node.commitment is not None and node.capacity != "reserved":
        yield (f"{key}.commitment", f"{node.commitment} applies to reserved capacity only (a "
                                    f"future reservation with a committed use discount, "
                                    f"cloud.google.com/tpu/docs/long-term-reservation); this "
                                    f"node is {node.provisioning}: use provisioning: reserved, "
                                    f"or a queue with a reservationName")


def _fallback_problems(key: str, node: NodeSettings) -> Problems:
    """`fallback`, `maxWait`, `allowCostlier` (docs/design.md, "Capacity that finds
    itself"): each candidate is checked as a node of its own, at its own key."""
    if node.max_wait is not None and not DURATION_RE.match(node.max_wait):
        yield (f"{key}.maxWait", f"{node.max_wait!r} is not a duration: a number and s, m, "
                                 f"h or d (e.g. 30m, 20s)")
    if not node.fallback:
        if node.max_wait is not None:
            yield (f"{key}.maxWait", "applies only with fallback (how long a request waits "
                                     "before the next candidate is tried)")
        if node.allow_costlier:
            yield (f"{key}.allowCostlier", "applies only with fallback")
        return
    yield from _queueable_problems(f"{key}.provisioning", node)
    if list(_slice_problems(key, node)):
        return  # the node's own problem says it; nothing to compare the candidates with
    own_price = _hourly(node)
    seen: dict[tuple[Any, ...], str] = {_placement(node): "the node's own placement"}
    for index, candidate in enumerate(node.candidates[1:]):
        entry_key = f"{key}.fallback[{index}]"
        inherited = node.fallback[index].provisioning is None
        problems = list(_candidate_problems(entry_key, candidate, inherited))
        yield from problems
        if problems:
            continue
        placement = _placement(candidate)
        if placement in seen:  # under .zone: a misspelt zone key's own problem says it
            yield (f"{entry_key}.zone", f"the same placement as {seen[placement]}: "
                                        f"{_label(candidate)}")
            continue
        seen[placement] = f"{key}.fallback[{index}]"
        price = _hourly(candidate)
        if (not node.allow_costlier and own_price is not None and price is not None
                and price > own_price + 1e-9):
            yield (entry_key, f"{_label(candidate)} costs ${price:.2f}/h, more than the node's "
                              f"own ${own_price:.2f}/h: set allowCostlier: true on the node "
                              f"to allow it")


def _queueable_problems(key: str, node: NodeSettings) -> Problems:
    """With fallback every candidate is a queued resource (components/fallback_tpu.py),
    whose tiers are spot, guaranteed, a reservation by name, or none: on demand
    (google-cloud-tpu 1.27 QueuedResource). Legacy preemptible and a reserved node
    without a reservation's name have no queued form."""
    if node.provisioning in ("preemptible", "reserved"):
        instead = "spot" if node.provisioning == "preemptible" else \
            "queued with queue.reservationName"
        yield (key, f"{node.provisioning} cannot be a candidate of a node with fallback (each "
                    f"candidate is a queued resource): use {instead}")


def _candidate_problems(key: str, candidate: NodeSettings, inherited: bool = False
                        ) -> Problems:
    """A candidate's own problems; its provisioning's only where the entry sets it (an
    inherited one is the node's, said once at the node's key; issue 45)."""
    if not inherited:
        yield from _queueable_problems(f"{key}.provisioning", candidate)
    yield from _queue_problems(key, candidate)
    yield from placement_problems(key, candidate, candidate=True)


def placement_problems(key: str, node: NodeSettings, candidate: bool = False
                       ) -> Generator[tuple[str, str], None, bool]:
    """The one placement check of a node and of each of its fallback candidates: its
    slice, its zone (a candidate's region needs a subnet slot too: it may be the only
    node there), its runtime. Returns whether the slice is known, so the node's own
    job checks may run."""
    slice_problems = list(_slice_problems(key, node))
    if slice_problems:
        yield from slice_problems
        return False
    tpu = node.tpu
    yield from _zone_problems(key, node, tpu)
    if candidate:
        if not ZONE_RE.match(node.zone) or node.zone not in tpu.generation.zones:
            return True
        region = catalog.region_of(node.zone)
        if region not in subnets.REGION_SLOTS:
            yield (f"{key}.zone", f"{node.zone}: the stack's network has no subnet slot for "
                                  f"{region} (model/subnets.py REGION_SLOTS)")
    yield from _runtime_problems(key, node, tpu)
    return True


def _placement(node: NodeSettings) -> tuple[Any, ...]:
    queue = node.queue.model_dump() if node.queue else None
    return (node.zone, node.tpu.accelerator_type, node.provisioning,
            json.dumps(queue, sort_keys=True))


def _label(node: NodeSettings) -> str:
    return f"{node.zone} {node.tpu.accelerator_type} {node.provisioning}"


def _hourly(node: NodeSettings) -> float | None:
    return node_cost(node).usd_per_hour


# The agent looks once a second (node_agent/limits.py): a shorter limit stops at once.
_LEAST_LIMIT_SECONDS = 60


def _limit_problems(key: str, node: NodeSettings) -> Problems:
    """maxRuntime and idleStop are durations of at least a minute."""
    for field, value in (("maxRuntime", node.max_runtime), ("idleStop", node.idle_stop)):
        if value is None:
            continue
        seconds = duration_seconds(value)
        if seconds is None:
            yield (f"{key}.{field}", f"{value!r} is not a duration: a number and s, m, h or d "
                                     f"(e.g. 30m, 12h, 7d)")
        elif seconds < _LEAST_LIMIT_SECONDS:
            yield (f"{key}.{field}", f"{value} is under a minute: use 1m or more")
