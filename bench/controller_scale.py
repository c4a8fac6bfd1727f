"""One controller run at platform scale (issue 43): `--nodes` nodes over `--projects` x
`--zones` (project, zone) pairs, every TPU API call answered after `--latency` seconds
(50 ms by default, a round trip to a Google API from outside its region) by an
in-memory client with a sleep (its lists paged `--page-size` at a time, each page one
call); the controller's GCS objects in memory.

The fleet: every node queued; every tenth a fallback node with three candidates (zones
of its project); `--failed` fallback requests FAILED for capacity (each a move: delete,
confirmed gone, create on the next candidate) and `--expired` nodes past their
maxRuntime (each a delete). Printed:

- baseline: the same lists one (project, zone) pair after another, with no planning:
  what reading the actual state costs done naively;
- the controller run (ops/controller/run.py run_once: lease, lists, plan, apply, audit),
  its time, its ratio to the baseline, and its TPU API calls against the bound
  pairs x pages + actions (pages: a node list's and a queued list's, per pair; actions:
  the calls the steps made, each counted).

    .venv/infra/bin/python bench/controller_scale.py --nodes 10000 --projects 10 --zones 10
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import warnings
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
warnings.filterwarnings("ignore", category=FutureWarning)

from google.api_core import exceptions as gexc  # noqa: E402
from google.cloud import tpu_v2  # noqa: E402

from model import catalog  # noqa: E402
from model.fleet import ExpectedNode, StackTarget  # noqa: E402
from model.manifest import Manifest  # noqa: E402
from node_agent.contract import MAX_RUNTIME_KEY  # noqa: E402
from ops.controller.run import run_once  # noqa: E402
from ops.tpu.api import TpuApi  # noqa: E402

NOW = datetime.now(timezone.utc)
ZONES = [f"{region}-{letter}" for region in ("us-central1", "us-east5", "europe-west4",
                                             "us-east1", "us-west4") for letter in "abcd"]


class Done:
    def __init__(self, value: Any = None) -> None:
        self.value = value

    def result(self, timeout: float | None = None) -> Any:
        return self.value


class FakeClient:
    """The TpuClient methods the controller calls, each call one sleep of `latency`."""

    def __init__(self, latency: float, page_size: int) -> None:
        self.latency, self.page_size = latency, page_size
        self.nodes: dict[str, list[tpu_v2.Node]] = {}
        self.queued: dict[str, dict[str, tpu_v2.QueuedResource]] = {}
        self.calls = self.list_calls = 0
        self.lock = threading.Lock()

    def _call(self, listing: bool = False) -> None:
        with self.lock:
            self.calls += 1
            self.list_calls += listing
        time.sleep(self.latency)

    def _pages(self, items: list[Any]) -> Any:
        for start in range(0, max(len(items), 1), self.page_size):
            self._call(listing=True)
            yield from items[start:start + self.page_size]

    def list_nodes(self, request: dict, retry: Any = None) -> Any:
        return self._pages(list(self.nodes.get(request["parent"], [])))

    def list_queued_resources(self, request: dict, retry: Any = None) -> Any:
        return self._pages(list(self.queued.get(request["parent"], {}).values()))

    def delete_queued_resource(self, request: Any = None, retry: Any = None) -> Done:
        self._call()
        name = request.name
        self.queued.get(name.rsplit("/queuedResources/", 1)[0], {}).pop(name, None)
        return Done()

    def get_queued_resource(self, name: str, retry: Any = None) -> Any:
        self._call()
        found = self.queued.get(name.rsplit("/queuedResources/", 1)[0], {}).get(name)
        if found is None:
            raise gexc.NotFound(name)
        return found

    def create_queued_resource(self, parent: str, queued_resource_id: str,
                               queued_resource: Any, retry: Any = None) -> Done:
        self._call()
        queued_resource.name = f"{parent}/queuedResources/{queued_resource_id}"
        self.queued.setdefault(parent, {})[queued_resource.name] = queued_resource
        return Done(queued_resource)

    def delete_node(self, request: dict, retry: Any = None) -> Done:
        self._call()
        name = request["name"]
        parent = name.rsplit("/nodes/", 1)[0]
        self.nodes[parent] = [n for n in self.nodes.get(parent, []) if n.name != name]
        return Done()


class MemoryStore:
    """ops/controller/store.py Store's interface, in memory."""

    def __init__(self, manifests: list[Manifest]) -> None:
        self._manifests, self._moves, self.audit = manifests, [], None
        self.bucket_name = "memory"

    def manifests(self) -> tuple[list[Manifest], list[str]]:
        return self._manifests, []

    def marker_names(self) -> list[str]:
        return []

    def moves(self) -> list[Any]:
        return list(self._moves)

    def save_moves(self, moves: list[Any]) -> None:
        self._moves = list(moves)

    def try_lease(self, run_id: str, now: datetime, seconds: float) -> Any:
        from ops.controller.store import Lease

        return Lease("memory", now + timedelta(seconds=seconds))

    def release(self, lease: Any) -> None:
        pass

    def write_audit(self, record: dict) -> str:
        self.audit = record
        return "memory"


def fleet(args: argparse.Namespace, client: FakeClient) -> StackTarget:
    pairs = [(f"acme-team-{p:02d}", ZONES[z % len(ZONES)])
             for p in range(args.projects) for z in range(args.zones)]
    nodes, tpu = [], catalog.parse_accelerator_type("v6e-8")
    for index in range(args.nodes):
        project, zone = pairs[index % len(pairs)]
        node_id, fallback = f"n{index:05d}", index % 10 == 0
        others = [z for p, z in pairs if p == project and z != zone][:2]
        candidates = tuple({"zone": z, "accelerator_type": "v6e-8", "spot": True,
                            "provisioning": "spot", "generation": "v6e", "chips": 8,
                            "quota_type": "preemptible", "subnet_name": "tpu"}
                           for z in (zone, *others)) if fallback else ()
        nodes.append(ExpectedNode(logical=node_id, node_id=node_id, zone=zone, tpu=tpu,
                                  runtime_version="v2-alpha-tpuv6e", spot=True, queued=True,
                                  project=project, team="platform", candidates=candidates,
                                  max_wait_seconds=1800 if fallback else 0))
        failed = fallback and index // 10 < args.failed
        expired = not fallback and index % 10 == 1 and index // 10 < args.expired
        _put(client, project, zone, node_id, failed, expired)
    return StackTarget(project="acme-platform", stack="platform", nodes=tuple(nodes))


def _put(client: FakeClient, project: str, zone: str, node_id: str, failed: bool,
         expired: bool) -> None:
    parent = f"projects/{project}/locations/{zone}"
    qr = tpu_v2.QueuedResource
    node = tpu_v2.Node(accelerator_type="v6e-8", runtime_version="v2-alpha-tpuv6e",
                       labels={"stack": "platform", "managed-by": "pulumi"},
                       metadata={MAX_RUNTIME_KEY: "3600"} if expired else {},
                       network_config=tpu_v2.NetworkConfig(
                           subnetwork=f"projects/{project}/regions/x/subnetworks/tpu"))
    request = qr(name=f"{parent}/queuedResources/{node_id}",
                 tpu=qr.Tpu(node_spec=[qr.Tpu.NodeSpec(parent=parent, node_id=node_id,
                                                       node=node)]),
                 state=tpu_v2.QueuedResourceState(state="FAILED" if failed else "ACTIVE"),
                 spot=qr.Spot())
    client.queued.setdefault(parent, {})[request.name] = request
    if not failed:
        live = tpu_v2.Node(node, name=f"{parent}/nodes/{node_id}", state="READY",
                           queued_resource=request.name)
        live.create_time = NOW - timedelta(hours=5 if expired else 0.5)
        client.nodes.setdefault(parent, []).append(live)


def baseline(client: FakeClient, target: StackTarget) -> float:
    started = time.perf_counter()
    for project, zone in target.places:
        parent = f"projects/{project}/locations/{zone}"
        list(client.list_nodes({"parent": parent}))
        list(client.list_queued_resources({"parent": parent}))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--projects", type=int, default=10)
    parser.add_argument("--zones", type=int, default=10)
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--page-size", type=int, default=100)
    parser.add_argument("--failed", type=int, default=10)
    parser.add_argument("--expired", type=int, default=10)
    args = parser.parse_args()
    client = FakeClient(args.latency, args.page_size)
    target = fleet(args, client)
    pairs = len(target.places)
    base = baseline(client, target)
    client.calls = client.list_calls = 0
    store = MemoryStore([Manifest(target)])
    api = TpuApi(client=client, deadline=10.0, per_project=8, in_flight=64)
    started = time.perf_counter()
    result = run_once(store, api)  # type: ignore[arg-type]
    took = time.perf_counter() - started
    pages = sum(-(-max(len(client.nodes.get(f"projects/{p}/locations/{z}", [])), 1)
                  // args.page_size) + -(-max(len(client.queued.get(
                      f"projects/{p}/locations/{z}", {})), 1) // args.page_size)
                for p, z in target.places)
    steps = [o for o in result.outcomes if o.result == "done"]
    failed = [o for o in result.outcomes if o.result == "failed"]
    step_calls = client.calls - client.list_calls
    print(f"fleet: {args.nodes} nodes in {pairs} (project, zone) pairs, {args.latency * 1000:.0f}"
          f" ms a call, {args.page_size} a page")
    print(f"baseline (pairs one after another, lists only): {base:.2f} s")
    print(f"controller run: {took:.2f} s ({took / base:.2f}x the baseline); "
          f"{len(steps)} steps done, {len(failed)} failed "
          f"({', '.join(sorted({o.step.verb for o in steps}))})")
    print(f"TPU API calls: {client.calls}: {client.list_calls} list pages (pairs x pages = "
          f"{pages}: {'within' if client.list_calls <= pages else 'OVER'}) and {step_calls} "
          f"by the {len(steps)} steps (a delete confirmed gone 2, a move 3); no per-node read")
    for outcome in failed[:3]:
        print(f"  failed: {outcome.step.verb} {outcome.step.name}: {outcome.detail}")
    replace(target)  # the fleet object stays alive until here (its protos are large)


if __name__ == "__main__":
    main()
