"""A controller's world for tests: the fake TPU API, the GCS emulator behind GCS's
create-only precondition, a stack's manifest and a fallback node's provider props."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from model import catalog
from model.fleet import ExpectedNode, StackTarget
from model.manifest import BudgetTeam, manifest_json
from ops.controller import run as controller_run
from ops.controller.store import Store
from ops.tpu.api import TpuApi
from tests.fakes.tpu_api import FakeTpuApi

PROJECT = "acme-ml-dev"
BUCKET = "acme-ml-dev-platform-artifacts"
WAITS, QUOTA, TAKES = "us-east5-a", "us-east5-b", "us-central1-b"
V6E_SPOT_QUOTA = "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI"
NODE = "dev-trainer"
MAX_WAIT = 1800
INTERVAL = 300.0


def candidate(zone: str) -> dict[str, Any]:
    return {"zone": zone, "provisioning": "spot", "accelerator_type": "v6e-8",
            "runtime_version": "tpu-vm-tf-2.18.0-pjrt", "spot": True,
            "generation": "v6e", "chips": 8, "quota_type": "preemptible",
            "subnet_name": f"dev-tpu-{catalog.region_of(zone)}"}


def provider_props(*zones: str) -> dict[str, Any]:
    """The FallbackTpu inputs of NODE (tests/ops/test_fallback_provider.py's shape)."""
    return {"project": PROJECT, "node_id": NODE,
            "candidates": [{**candidate(z), "subnetwork": f"projects/{PROJECT}/regions/"
                            f"{catalog.region_of(z)}/subnetworks/dev-tpu-{catalog.region_of(z)}"}
                           for z in zones],
            "max_wait_seconds": MAX_WAIT, "network": f"projects/{PROJECT}/global/networks/tpu",
            "service_account_email": "tpu-runtime@acme-ml-dev.iam.gserviceaccount.com",
            "metadata": {"tpu-stack-node": NODE}, "labels": {"stack": "dev",
                                                             "managed-by": "pulumi"},
            "poll_seconds": 0.05, "create_timeout_seconds": 30, "delete_timeout_seconds": 5}


def fallback_node(*zones: str) -> ExpectedNode:
    return ExpectedNode(logical="trainer", node_id=NODE, zone=zones[0],
                        tpu=catalog.parse_accelerator_type("v6e-8"),
                        runtime_version="tpu-vm-tf-2.18.0-pjrt", spot=True, queued=True,
                        project=PROJECT, team="platform", capacity="spot",
                        candidates=tuple(candidate(z) for z in zones),
                        max_wait_seconds=MAX_WAIT)


def plain_node(node_id: str, zone: str = TAKES, team: str = "platform",
               queued: bool = False) -> ExpectedNode:
    return ExpectedNode(logical=node_id, node_id=node_id, zone=zone,
                        tpu=catalog.parse_accelerator_type("v6e-8"),
                        runtime_version="tpu-vm-tf-2.18.0-pjrt", spot=False, queued=queued,
                        project=PROJECT, team=team)


def stack(*nodes: ExpectedNode, name: str = "dev") -> StackTarget:
    return StackTarget(project=PROJECT, stack=name, nodes=nodes, artifacts_bucket=BUCKET)


@dataclass
class World:
    tpu: FakeTpuApi
    store: Store
    gcs_host: str
    started: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    runs: int = 0
    peak_alive: dict[str, int] = field(default_factory=dict)

    def publish(self, target: StackTarget, idle: float | None = None,
                budget_teams: tuple[BudgetTeam, ...] = (), **more: Any) -> None:
        """`more`: manifest_json's status_buckets and team_manifests."""
        self.store.write_manifest(target.stack, manifest_json(target, idle, budget_teams,
                                                              **more))

    def clock(self, minutes: float) -> datetime:
        return self.started + timedelta(minutes=minutes)

    def run(self, minutes: float, **options: Any) -> controller_run.RunResult:
        """One controller run at `minutes` past the start (its own lease slot)."""
        at = self.clock(minutes)
        return controller_run.run_once(self.store, TpuApi(deadline=5.0), clock=lambda: at,
                                       interval_seconds=INTERVAL, **options)

    def watch_requests(self, node_id: str = NODE) -> None:
        """Record the most requests of `node_id` alive at once, after every create/delete."""
        lock = threading.Lock()
        for route in ("_create_queued", "_delete_queued"):
            original = getattr(self.tpu, route)

            def recorded(*args: Any, _original: Any = original) -> Any:
                answer = _original(*args)
                with lock:
                    alive = sum(1 for s in self.tpu._queued.values()
                                if node_id in [n.node_id for n in s.message.tpu.node_spec])
                    self.peak_alive[node_id] = max(self.peak_alive.get(node_id, 0), alive)
                return answer

            setattr(self.tpu, route, recorded)

    def requests_of(self, node_id: str = NODE) -> list[str]:
        return sorted(s.message.name for s in self.tpu._queued.values()
                      if node_id in [n.node_id for n in s.message.tpu.node_spec])


def acting(result: controller_run.RunResult) -> list[tuple[str, str]]:
    return [(o.step.verb, o.result) for o in result.outcomes if o.result != "reported"]

