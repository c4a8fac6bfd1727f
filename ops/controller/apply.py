"""Carry out a plan's steps against the TPU API; record every outcome.

A move is three recorded phases so that at most one request of a node is alive at any
instant and a run killed between them is finished by the next (plan.py move_steps):

1. intent: the move (old request, new request's props) is written to moves.json;
2. the old request is deleted (force) and confirmed gone (components/queued_tpu.py
   force_delete polls until the API answers 404);
3. the new request is created (components/fallback_tpu.py enqueue), and the move is
   forgotten.

A step that fails is recorded as failed and the run goes on: the next run plans it
again, as long as it is still needed (level-triggered: nothing is retried from memory
but the moves).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from model import capacity
from model.fleet import ExpectedNode
from node_agent.contract import STOP_REQUEST_KEY
from ops.controller.plan import Move, Step
from ops.controller.store import Store
from ops.tpu.api import NodeStatus, TpuApi

# How long before the lease ends a run stops starting steps: the longest step (a delete
# confirmed gone, then a create) must end inside the lease.
LEASE_MARGIN_SECONDS = 60.0
DELETE_TIMEOUT_SECONDS = 600.0
# Steps applied at once (the TPU API client is shared by threads: ops/tpu/api.py TpuApi).
STEPS_IN_FLIGHT = 16


@dataclass(frozen=True)
class Outcome:
    step: Step
    result: str  # done, failed, reported, not started (the lease ran short)
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**self.step.to_json(), "result": self.result, "detail": self.detail}


@dataclass
class Applier:
    api: TpuApi
    store: Store
    raw_queued: Mapping[str, Any]  # request name -> the listed tpu_v2.QueuedResource
    nodes: Mapping[str, NodeStatus]  # node name -> the listed node
    moves: list[Move]
    now: Callable[[], datetime]
    expected: Mapping[tuple[str, str], ExpectedNode]  # (stack, node id) -> the manifest's
    lease_left: Callable[[], float] = lambda: float("inf")
    # Called after each phase ("deleted <name>", "created <name>"): tests stop a run there.
    checkpoint: Callable[[str], None] = lambda _phase: None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def apply(self, steps: Sequence[Step]) -> list[Outcome]:
        """Every step, STEPS_IN_FLIGHT at once: each concerns another node (plan.py
        keeps one step per node), so none waits on another's round trips."""
        if not steps:
            return []
        with ThreadPoolExecutor(max_workers=min(STEPS_IN_FLIGHT, len(steps))) as pool:
            return list(pool.map(self._outcome, steps))

    def _outcome(self, step: Step) -> Outcome:
        if step.verb == "report":
            return Outcome(step, "reported")
        if self.lease_left() < LEASE_MARGIN_SECONDS:
            return Outcome(step, "not started", "the lease ends: the next run")
        try:
            detail = self._one(step)
        except Exception as error:  # recorded; the next run plans it again
            return Outcome(step, "failed", f"{type(error).__name__}: {error}")
        return Outcome(step, "done", detail)

    def _one(self, step: Step) -> str:
        verb = step.verb
        if verb == "move-queued":
            return self._move(step)
        if verb == "finish-move":
            return self._finish(self._move_of(step))
        if verb == "forget-move":
            self._forget(step.node)
            return "forgotten"
        if verb == "save-node":
            return self._save(step)
        if verb == "delete-queued":
            self.api.delete_queued_resource(step.name, DELETE_TIMEOUT_SECONDS)
        elif verb == "delete-node":
            self.api.delete_node(step.name)
        elif verb == "stop-node":
            self.api.stop_node(step.name)
        elif verb == "reset-queued":
            self.api.reset_queued_resource(step.name)
        else:
            raise ValueError(f"unknown step {verb}")
        self.checkpoint(f"{verb} {step.name}")
        return verb

    # ---- moves -------------------------------------------------------------------
    def _move(self, step: Step) -> str:
        from components import fallback_tpu

        props = fallback_tpu.props_from_request(self.raw_queued[step.name], step.to)
        props["queued_resource_id"] = step.to["queued_resource_id"]
        move = Move(step.stack, step.node, step.name, fallback_tpu.request_name(props), props,
                    step.reason,
                    self.now().isoformat())
        self.moves = [m for m in self.moves if m.node != step.node] + [move]
        self.store.save_moves(self.moves)  # 1. the intent, before anything changes
        return self._finish(move)

    def _finish(self, move: Move) -> str:
        if move.old != move.new:
            self.api.delete_queued_resource(move.old, DELETE_TIMEOUT_SECONDS)  # 2. gone
            self.checkpoint(f"deleted {move.old}")
        refused = []
        node = self.expected.get((move.stack, move.node))
        for _ in range(len(node.candidates) if node else 1):
            failure = self._create(move)
            if failure is None:
                self.checkpoint(f"created {move.new}")
                self._forget(move.node)  # 3.
                return "; ".join([*refused, f"moved to {move.new}"])
            if node is None or not (failure.moves_on or failure.kind == "unclassified"):
                raise RuntimeError(f"creating {move.new} failed ({failure.kind}): "
                                   f"{failure.detail}; the next run tries again")
            refused.append(f"{move.new.rsplit('/', 1)[-1]} refused ({failure.kind})")
            move = self._onward(move, node, failure)
        raise RuntimeError("; ".join(refused) + ": every candidate refused; the next run "
                                               "tries again")

    def _create(self, move: Move) -> capacity.Failure | None:
        from google.api_core import exceptions as gexc

        from components import fallback_tpu

        try:
            fallback_tpu.enqueue(self.api.client, dict(move.props), DELETE_TIMEOUT_SECONDS)
        except gexc.Conflict:
            return None  # created by the run this one finishes
        except gexc.GoogleAPICallError as error:
            # A refused create may have queued something: deleted, confirmed gone.
            with contextlib.suppress(Exception):
                self.api.delete_queued_resource(move.new, DELETE_TIMEOUT_SECONDS)
            return capacity.classify(capacity.from_exception(error), move.props["zone"])
        return None

    def _onward(self, move: Move, node: ExpectedNode, failure: capacity.Failure) -> Move:
        """The move retargeted at the candidate after the one that refused it."""
        from components import fallback_tpu

        here = next((i for i in range(len(node.candidates))
                     if move.new.endswith(f"/queuedResources/{node.request_id(i)}")), 0)
        nxt = (here + 1) % len(node.candidates)
        placement = {**node.candidates[nxt], "queued_resource_id": node.request_id(nxt)}
        props = fallback_tpu.retarget(dict(move.props), placement)
        moved = Move(move.stack, move.node, move.old, fallback_tpu.request_name(props), props,
                     f"{move.reason}; candidate {node.candidate_label(here)} refused "
                     f"({failure.kind}): on to {node.candidate_label(nxt)}", move.started)
        self._record(moved)
        return moved

    def _move_of(self, step: Step) -> Move:
        with self._lock:
            return next(m for m in self.moves if m.node == step.node and m.stack == step.stack)

    def _record(self, move: Move) -> None:
        with self._lock:  # steps run side by side: one writer of moves.json at a time
            self.moves = [m for m in self.moves if m.node != move.node] + [move]
            self.store.save_moves(self.moves)

    def _forget(self, node: str) -> None:
        with self._lock:
            self.moves = [m for m in self.moves if m.node != node]
            self.store.save_moves(self.moves)

    # ---- budgets -----------------------------------------------------------------
    def _save(self, step: Step) -> str:
        """The stop request on the node (the agent saves, as for a preemption notice:
        node_agent/limits.py), through UpdateNode with the mask `metadata`, the node's own
        keys kept (functions/budget_stop/main.py request_stop does the same)."""
        from google.cloud import tpu_v2
        from google.protobuf import field_mask_pb2

        node = self.nodes[step.name]
        metadata = {**node.metadata, STOP_REQUEST_KEY: step.reason}
        self.api.call("update_node", step.node, wait=DELETE_TIMEOUT_SECONDS,
                      node=tpu_v2.Node(name=step.name, metadata=metadata),
                      update_mask=field_mask_pb2.FieldMask(paths=["metadata"]))
        return "asked to save"
