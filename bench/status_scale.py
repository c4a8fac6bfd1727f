"""How `tpuctl status` scales: 2,000 nodes against API round trips of realistic latency.

Runs the real TpuClient against the loopback fake TPU API (tests/fakes/tpu_api.py) and
the real google-cloud-storage client against a GCS emulator, each request delayed by
`--latency` seconds (50 ms by default, a round trip to a Google API from outside its
region). Prints each figure as a ratio against the naive baseline measured in the same
run: one list per zone, then every node's guest attributes one after the other.

    .venv/infra/bin/python bench/status_scale.py [--nodes 2000] [--latency 0.05]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from io import StringIO
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore", category=FutureWarning)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import requests  # noqa: E402
from rich.console import Console  # noqa: E402

from components import catalog  # noqa: E402
from components.queued_tpu import ENDPOINT_ENV  # noqa: E402
from node_agent.contract import STATUS_KEY  # noqa: E402
from ops.local.storage_emulator import StorageEmulator  # noqa: E402
from ops.tpu.api import TpuApi  # noqa: E402
from ops.tpu.logs import AgentLogs  # noqa: E402
from ops.tpu.status import collect, status_table  # noqa: E402
from ops.tpu.target import ExpectedNode, StackTarget  # noqa: E402
from tests.fakes.tpu_api import FakeTpuApi, running  # noqa: E402

PROJECT = "acme-ml-dev"
BUCKET = "bench-logs"
ZONES = ("us-central1-b", "us-central1-c", "europe-west4-a")
LABELS = {"stack": "bench", "managed-by": "pulumi"}
PER_CALL: list[float] = []  # seconds per guest-attributes call of the baseline


class SlowSession(requests.Session):
    """The storage client's HTTP session with every request delayed by `latency`."""

    def __init__(self, latency: float) -> None:
        super().__init__()
        self.latency = latency
        self.requests = 0

    def request(self, *args: Any, **kwargs: Any) -> requests.Response:
        self.requests += 1
        time.sleep(self.latency)
        return super().request(*args, **kwargs)


def populate(fake: FakeTpuApi, logs: AgentLogs, nodes: int, zones: tuple[str, ...]) -> StackTarget:
    v2_8 = catalog.parse_accelerator_type("v2-8")
    bucket = logs.client.bucket(BUCKET)
    expected = []

    def publish(node_id: str, fields: dict[str, str]) -> None:
        blob = bucket.blob(f"status/{node_id}/worker-0/status.json")
        blob.metadata = fields
        blob.upload_from_string(json.dumps(fields), content_type="application/json")

    with ThreadPoolExecutor(max_workers=8) as pool:
        for index in range(nodes):
            zone, node_id = zones[index % len(zones)], f"bench-n{index:04d}"
            fields = {"state": "running", "step": str(index)}
            metadata = {STATUS_KEY: f"gs://{BUCKET}/status/{node_id}/"}
            fake.add_node(zone, node_id, labels=LABELS, metadata=metadata)
            fake.set_guest_attributes(zone, node_id, 0, fields)
            pool.submit(publish, node_id, fields)
            expected.append(
                ExpectedNode(node_id, node_id, zone, v2_8, "tpu-vm-tf-2.18.0-pjrt", True, False,
                             PROJECT)
            )
    return StackTarget(PROJECT, "bench", tuple(expected))


def render(target: StackTarget, nodes: list) -> int:
    Console(file=StringIO(), width=200).print(status_table(target, nodes))
    return sum(1 for node in nodes if node.job.get("state") == "running")


def naive(api: TpuApi, target: StackTarget, sample: int) -> int:
    """The list per zone, then guest attributes for the first `sample` nodes one by one."""
    nodes = api.stack_nodes(target.places, target.stack)
    start = time.perf_counter()
    asked = [replace(n, job=api.job_status(n)) for n in nodes[:sample]]
    PER_CALL.append((time.perf_counter() - start) / max(sample, 1))
    return render(target, asked + nodes[sample:])


def guest_attributes_pool(api: TpuApi, target: StackTarget) -> int:
    return render(target, api.with_job_status(api.stack_nodes(target.places, target.stack)))


def tpuctl_status(api: TpuApi, target: StackTarget, logs: AgentLogs) -> int:
    return render(target, collect(api, target, logs))


def timed(fake: FakeTpuApi, session: SlowSession, run: Callable[[], int]) -> tuple[float, int, int]:
    """Wall time, nodes shown with their job status, and the requests of one run."""
    fake.calls.clear()
    session.requests = 0
    start = time.perf_counter()
    seen = run()
    return time.perf_counter() - start, seen, len(fake.calls) + session.requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--zones", type=int, default=2, choices=range(1, len(ZONES) + 1))
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per request")
    parser.add_argument("--baseline-sample", type=int, default=0, metavar="N",
                        help="time the baseline's one-by-one calls for N nodes and scale them "
                             "to all (they add up linearly); default: all nodes")
    args = parser.parse_args()
    zones = ZONES[: args.zones]
    fake = FakeTpuApi(project=PROJECT, accelerator_types={z: ["v2-8"] for z in zones})
    with running(fake), StorageEmulator() as gcs:
        os.environ[ENDPOINT_ENV] = fake.endpoint
        os.environ["STORAGE_EMULATOR_HOST"] = gcs.host
        gcs.create_bucket(BUCKET)
        target = populate(fake, AgentLogs(PROJECT), args.nodes, zones)
        session = SlowSession(args.latency)
        from google.cloud import storage

        logs = AgentLogs(PROJECT, storage.Client(project=PROJECT, _http=session))
        api = TpuApi()
        tpuctl_status(api, target, logs)  # warm up: clients, connection pools, imports
        fake.latency = args.latency
        sample = min(args.baseline_sample or args.nodes, args.nodes)
        runs = {
            "baseline: guest attributes per node, one by one":
                lambda: naive(api, target, sample),
            "guest attributes per node, 8 in flight": lambda: guest_attributes_pool(api, target),
            "tpuctl status: list per zone + one bucket listing":
                lambda: tpuctl_status(api, target, logs),
        }
        figures = {name: timed(fake, session, run) for name, run in runs.items()}
    if sample < args.nodes:
        figures = {(f"{name} (timed for {sample}, scaled)" if i == 0 else name):
                   (scaled(figure, sample, args.nodes) if i == 0 else figure)
                   for i, (name, figure) in enumerate(figures.items())}
    report(figures, args.nodes, len(zones), args.latency)


def scaled(figure: tuple[float, int, int], sample: int, nodes: int) -> tuple[float, int, int]:
    """The baseline as if it had asked every node: the rest at the sampled time per call."""
    wall, _seen, requests_made = figure
    rest = nodes - sample
    return wall + PER_CALL[-1] * rest, nodes, requests_made + rest


def report(figures: dict[str, tuple[float, int, int]], nodes: int, zones: int,
           latency: float) -> None:
    print(f"{nodes} nodes in {zones} zones, {latency * 1000:.0f} ms per request "
          "(fake TPU API and GCS emulator on loopback)")
    print(f"{'run':70} {'seconds':>8} {'requests':>9} {'nodes':>6} {'vs baseline':>12}")
    base = next(iter(figures.values()))[0]
    for name, (wall, seen, requests_made) in figures.items():
        print(f"{name:70} {wall:8.2f} {requests_made:9d} {seen:6d} {base / wall:11.1f}x")
    status = list(figures.values())[-1][0]
    print(f"tpuctl status under 2 s: {'yes' if status < 2 else 'NO'} ({status:.2f} s)")


if __name__ == "__main__":
    main()
