"""Cloud Run function: a team's budget notification stops and deletes its TPUs.

Deployed by the platform stack for every team with `budgetAction: stop`
(components/budget_stop.py), triggered by the team budget's Pub/Sub topic. On a
notification whose spend (the larger of the reported cost and the meter, spend.py)
reaches the stop, or is projected to within the horizon, it:

1. claims the stop in GCS with a create-only marker (ifGenerationMatch=0, one per
   budget, interval start and threshold): instances live briefly and several may run,
   so only the one that creates the object acts, and a duplicate is ignored;
2. asks every node of the team to save: the `tpu-stack-stop` metadata key, which the
   node agent honours like a preemption notice (node_agent/limits.py), set through
   UpdateNode with the update mask `metadata` (the whole map, the node's own keys kept);
3. waits the save grace, then deletes the team's labelled nodes (a queued node through
   its queued resource, with force) and the team's queued resources still waiting.

Only the team's project is read or changed, only nodes labelled `team=<team>` and
`managed-by=pulumi`. It never disables billing and never touches a bucket but its
marker object. Environment (set by the stack): TPU_STACK_TEAM, TPU_STACK_PROJECT,
TPU_STACK_ZONES, TPU_STACK_MARKER_BUCKET, TPU_STACK_SAVE_GRACE_SECONDS,
TPU_STACK_BUDGET_HORIZON_HOURS, TPU_STACK_STOP_AT; TPU_STACK_TPU_ENDPOINT points the
TPU client at another endpoint (anonymous REST, as ops/tpu/api.py does for tests).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import functions_framework
import spend  # model/spend.py, at the archive's root (components/budget_stop.py SHARED_FILES)
from google.api_core import exceptions as gexc
from google.cloud import storage, tpu_v2
from google.protobuf import field_mask_pb2

from cloud.tpu import tpu_client, transient_retry

STOP_KEY = "tpu-stack-stop"  # node_agent/contract.py STOP_REQUEST_KEY: the same key
PRICES_FILE = Path(__file__).with_name("prices.json")
MANAGED_BY = "pulumi"


@dataclass(frozen=True)
class Config:
    team: str
    team_label: str
    project: str
    zones: tuple[str, ...]
    marker_bucket: str
    save_grace_seconds: float
    horizon_hours: float
    stop_at: float

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Config:
        return cls(team=env["TPU_STACK_TEAM"],
                   team_label=env.get("TPU_STACK_TEAM_LABEL") or env["TPU_STACK_TEAM"],
                   project=env["TPU_STACK_PROJECT"],
                   zones=tuple(z for z in env["TPU_STACK_ZONES"].split(",") if z),
                   marker_bucket=env["TPU_STACK_MARKER_BUCKET"],
                   save_grace_seconds=float(env.get("TPU_STACK_SAVE_GRACE_SECONDS") or 150),
                   horizon_hours=float(env.get("TPU_STACK_BUDGET_HORIZON_HOURS") or 24),
                   stop_at=float(env.get("TPU_STACK_STOP_AT") or 1.0))


def log(event: str, **fields: object) -> None:
    """One JSON line per event (Cloud Logging parses structured stdout)."""
    print(json.dumps({"message": event, **fields}, default=str), file=sys.stdout, flush=True)


# The one TPU client of tpu-stack (cloud/tpu.py, carried in the archive): the function's
# own service account, or anonymous REST against $TPU_STACK_TPU_ENDPOINT; 503, 429, 500
# and dropped connections retried (the TPU v2 client retries none itself).
RETRY = transient_retry()


class Team:
    """The team's TPUs in its own project, read and changed through the TPU API."""

    def __init__(self, client: tpu_v2.TpuClient, config: Config):
        self.client, self.config = client, config

    def _parent(self, zone: str) -> str:
        return f"projects/{self.config.project}/locations/{zone}"

    def _ours(self, labels: Mapping[str, str]) -> bool:
        return labels.get("team") == self.config.team_label and \
            labels.get("managed-by") == MANAGED_BY

    def _listed(self, method: Any) -> list[Any]:
        """Every item `method` lists in each zone; a zone the TPU API does not serve the
        project (404 "Location ... not found") holds nothing. Any other failure raises:
        the function must not act on half a list."""
        items: list[Any] = []
        for zone in self.config.zones:
            try:
                items += list(method(parent=self._parent(zone), retry=RETRY))
            except gexc.NotFound as error:
                log("zone not served", zone=zone, error=str(error))
        return items

    def nodes(self) -> list[tpu_v2.Node]:
        return [node for node in self._listed(self.client.list_nodes) if self._ours(node.labels)]

    def queued(self, node_ids: set[str]) -> list[tpu_v2.QueuedResource]:
        """Queued resources for the team: a node spec labelled the team's, or naming one
        of its nodes (queued resources carry no labels of their own)."""
        return [queued for queued in self._listed(self.client.list_queued_resources)
                if any(self._ours(spec.node.labels) or spec.node_id in node_ids
                       for spec in queued.tpu.node_spec)]

    def request_stop(self, node: tpu_v2.Node, reason: str) -> bool:
        """The stop request on `node`; False (logged) when the API refuses it (a node
        still CREATING, say): the node is deleted after the grace all the same."""
        metadata = dict(node.metadata) | {STOP_KEY: reason}
        try:
            self.client.update_node(node=tpu_v2.Node(name=node.name, metadata=metadata),
                                    update_mask=field_mask_pb2.FieldMask(paths=["metadata"]),
                                    retry=RETRY)
        except gexc.GoogleAPICallError as error:
            log("stop request refused", node=node.name, error=str(error))
            return False
        return True

    def delete(self, nodes: list[tpu_v2.Node]) -> list[str]:
        """Every node, a queued one through its queued resource (force: its node first),
        then the team's queued resources left; the names deleted. The operations run on
        at GCP: a node's deletion takes minutes and the function need not wait."""
        deleted: list[str] = []
        for queued in self.queued({n.name.rsplit("/", 1)[-1] for n in nodes}):
            self._delete(lambda q=queued: self.client.delete_queued_resource(
                request=tpu_v2.DeleteQueuedResourceRequest(name=q.name, force=True),
                retry=RETRY), queued.name, deleted)
        for node in nodes:
            if node.queued_resource and node.queued_resource in deleted:
                continue
            self._delete(lambda n=node: self.client.delete_node(name=n.name, retry=RETRY),
                         node.name, deleted)
        return deleted

    @staticmethod
    def _delete(call: Any, name: str, deleted: list[str]) -> None:
        """One deletion; a failure is logged and the others go on (no retry would come:
        the marker is claimed, and the trigger does not retry)."""
        try:
            with contextlib.suppress(gexc.NotFound):  # gone already: another path, or by hand
                call()
        except gexc.GoogleAPICallError as error:
            log("delete failed", resource=name, error=str(error))
            return
        deleted.append(name)


def claim(bucket: str, name: str, record: Mapping[str, object]) -> bool:
    """Create `name` only if it does not exist (ifGenerationMatch=0,
    cloud.google.com/storage/docs/request-preconditions): True for the one caller that
    created it, False for every later one."""
    blob = storage.Client().bucket(bucket).blob(name)
    try:
        blob.upload_from_string(json.dumps(record, default=str), content_type="application/json",
                                if_generation_match=0)
    except gexc.PreconditionFailed:
        return False
    return True


def metered(nodes: list[tpu_v2.Node]) -> list[spend.MeteredNode]:
    running = [n for n in nodes if n.state.name in spend.BILLED_STATES and n.create_time]
    return [spend.MeteredNode(n.name, n.accelerator_type,
                              n.scheduling_config.spot or n.scheduling_config.preemptible,
                              n.create_time) for n in running]


def handle(message: spend.BudgetMessage, config: Config, client: tpu_v2.TpuClient,
           prices: spend.PriceTable, now: datetime) -> spend.Decision:
    team = Team(client, config)
    nodes = team.nodes()
    running = metered(nodes)
    decision = spend.decide(message, spend.meter_usd(prices, running, message.interval_start, now),
                            spend.burn_usd_per_hour(prices, running), config.horizon_hours,
                            config.stop_at)
    log("budget", team=config.team, budget=message.budget_id, act=decision.act,
        reason=decision.reason, nodes=[n.name for n in nodes],
        unpriced=spend.unpriced(prices, running))
    if not decision.act:
        return decision
    marker = spend.marker_name(config.team, message, config.stop_at)
    if not claim(config.marker_bucket, marker, {"reason": decision.reason, "at": now,
                                                "nodes": [n.name for n in nodes]}):
        log("budget stop already done", team=config.team, marker=marker)
        return decision
    reason = f"budget {message.display_name or message.budget_id}: {decision.reason}"
    asked = [node.name for node in nodes if team.request_stop(node, reason)]
    log("stop requested", team=config.team, nodes=asked, grace_seconds=config.save_grace_seconds)
    time.sleep(config.save_grace_seconds)
    deleted = team.delete(team.nodes())
    log("deleted", team=config.team, resources=deleted)
    return decision


@functions_framework.cloud_event
def budget_stop(cloud_event: Any) -> None:
    """The entry point: a Pub/Sub CloudEvent (google.cloud.pubsub.topic.v1.messagePublished)
    whose `data["message"]` is the budget notification."""
    try:
        message = spend.BudgetMessage.from_pubsub(cloud_event.data["message"])
    except (spend.MessageError, KeyError, TypeError) as error:
        log("ignored: not a budget notification", error=str(error))
        return  # acknowledged: a retry would not make it one
    prices = json.loads(PRICES_FILE.read_text())
    handle(message, Config.from_env(os.environ), tpu_client(), prices,
           datetime.now(timezone.utc))
