"""How `tpuctl status` scales to 200 nodes: one list per zone vs one get per node.

Runs the real TpuClient against the loopback fake TPU API (tests/fakes/tpu_api.py)
and prints each figure as a ratio against a baseline measured in the same run:
the naive tool that asks for every node by name (one `get_node` per node, then
its guest attributes, one after the other).

    .venv/infra/bin/python bench/status_scale.py [--nodes 200] [--zones 2] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from collections.abc import Callable
from io import StringIO
from pathlib import Path

warnings.filterwarnings("ignore", category=FutureWarning)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402

from components.queued_tpu import ENDPOINT_ENV  # noqa: E402
from ops.tpu.api import NodeStatus, TpuApi, parse_guest_attributes  # noqa: E402
from ops.tpu.status import collect, status_table  # noqa: E402
from ops.tpu.target import ExpectedNode, StackTarget  # noqa: E402
from tests.fakes.tpu_api import FakeTpuApi, running  # noqa: E402

PROJECT = "acme-ml-dev"
ZONES = ("us-central1-b", "us-central1-c", "europe-west4-a")
LABELS = {"stack": "bench", "managed-by": "pulumi"}


def populate(fake: FakeTpuApi, nodes: int, zones: tuple[str, ...]) -> StackTarget:
    from components import catalog

    v2_8 = catalog.parse_accelerator_type("v2-8")
    expected = []
    for index in range(nodes):
        zone, node_id = zones[index % len(zones)], f"bench-n{index:03d}"
        fake.add_node(zone, node_id, labels=LABELS)
        fake.set_guest_attributes(zone, node_id, 0, {"state": "running", "step": str(index)})
        expected.append(
            ExpectedNode(node_id, node_id, zone, v2_8, "tpu-vm-tf-2.18.0-pjrt", True, False)
        )
    return StackTarget(PROJECT, "bench", tuple(expected))


def tpuctl_status(api: TpuApi, target: StackTarget) -> int:
    nodes = collect(api, target)
    Console(file=StringIO(), width=200).print(status_table(target, nodes))
    return len(nodes)


def one_get_per_node(api: TpuApi, target: StackTarget) -> int:
    found = 0
    for expected in target.nodes:
        node = api.call(
            "get_node", expected.node_id, name=api.node_name(expected.zone, expected.node_id)
        )
        status = NodeStatus.from_node(node)
        parse_guest_attributes(
            api.call(
                "get_guest_attributes", status.node_id, name=node.name, query_path="tpu-stack/"
            )
        )
        found += 1
    return found


def list_only(api: TpuApi, target: StackTarget) -> int:
    return len(api.stack_nodes(target.zones, target.stack))


def gets_only(api: TpuApi, target: StackTarget) -> int:
    for expected in target.nodes:
        api.call("get_node", expected.node_id, name=api.node_name(expected.zone, expected.node_id))
    return len(target.nodes)


def best_of(repeat: int, fake: FakeTpuApi, run: Callable[[], int]) -> tuple[float, int, int]:
    """Fastest wall time of `repeat` runs, the nodes seen, and the requests one run made."""
    times, seen, requests = [], 0, 0
    for _ in range(repeat):
        fake.calls.clear()
        start = time.perf_counter()
        seen = run()
        times.append(time.perf_counter() - start)
        requests = len(fake.calls)
    return min(times), seen, requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--zones", type=int, default=2, choices=range(1, len(ZONES) + 1))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    zones = ZONES[: args.zones]
    fake = FakeTpuApi(project=PROJECT, accelerator_types={z: ["v2-8"] for z in zones})
    with running(fake):
        os.environ[ENDPOINT_ENV] = fake.endpoint
        api = TpuApi(PROJECT)
        target = populate(fake, args.nodes, zones)
        tpuctl_status(api, target)  # warm up: client, connection pool, imports
        runs = {
            "baseline: get_node + guest attributes per node": lambda: one_get_per_node(api, target),
            "tpuctl status (list per zone + guest attributes)": lambda: tpuctl_status(api, target),
            "node listing only: get_node per node": lambda: gets_only(api, target),
            "node listing only: list_nodes per zone": lambda: list_only(api, target),
        }
        figures = {name: best_of(args.repeat, fake, run) for name, run in runs.items()}
    report(figures, args.nodes, len(zones))


def report(figures: dict[str, tuple[float, int, int]], nodes: int, zones: int) -> None:
    names = list(figures)
    print(f"{nodes} nodes in {zones} zones, fake TPU API on loopback, best of runs")
    print(f"{'run':52} {'seconds':>8} {'requests':>9} {'nodes':>6} {'vs baseline':>12}")
    for pair in (names[:2], names[2:]):
        base = figures[pair[0]][0]
        for name in pair:
            wall, seen, requests = figures[name]
            print(f"{name:52} {wall:8.3f} {requests:9d} {seen:6d} {base / wall:11.1f}x")
    status = figures[names[1]][0]
    print(f"tpuctl status under 2 s: {'yes' if status < 2 else 'NO'} ({status:.3f} s)")


if __name__ == "__main__":
    main()
