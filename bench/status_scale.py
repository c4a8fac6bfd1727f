"""How `tpuctl status` scales: many nodes over many (project, zone) pairs, at a real latency.

A platform with a project per team: `--projects` team projects, each using `--zones`
zones, `--nodes` nodes spread evenly over the pairs, every tenth a queued resource, and
each team's agents publishing their status to the team's own logs bucket. The fixtures
are set up with no latency, in a process of its own: the fake TPU API
(tests/fakes/tpu_api.py) and a Cloud Storage stand-in that answers objects.list of the
status objects (1,000 a page, with their custom metadata, as the JSON API does; the
GCS emulator took minutes to take 10,000 uploads), so their JSON work is not counted as
tpuctl's. Then every request to either waits `--latency` seconds (50 ms by default, a
round trip to a Google API from outside its region). Both runs use the real TpuClient
(on gRPC, its default transport and tpuctl's against GCP; `--transport rest` as the
tests use it, where the client parses every node's JSON in Python) and the real
storage client:

- baseline: the sequential walk tpuctl did before issue 30, one (project, zone) after
  another (a nodes list, then a queued-resources list), then one bucket listing after
  another;
- tpuctl status: the same reads through `read_stack` / `read_queued` (the pairs
  concurrently, at most `--per-project` requests in flight per project), the table and
  the per-team summary lines.

Each figure is printed with its ratio against the baseline measured in the same run.

    .venv/infra/bin/python bench/status_scale.py --nodes 10000 --projects 20 --zones 5
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import StringIO
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

warnings.filterwarnings("ignore", category=FutureWarning)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import requests  # noqa: E402
from rich.console import Console  # noqa: E402

from cloud.tpu import ENDPOINT_ENV  # noqa: E402
from model import catalog  # noqa: E402
from model.fleet import ExpectedNode, StackTarget  # noqa: E402
from node_agent.contract import STATUS_KEY  # noqa: E402
from ops.tpu import api as tpu_api  # noqa: E402
from ops.tpu import status as node_status  # noqa: E402
from ops.tpu import status_views  # noqa: E402
from ops.tpu.api import NodeStatus, TpuApi  # noqa: E402
from ops.tpu.logs import WORKER0_STATUS, AgentLogs  # noqa: E402
from tests.fakes.tpu_api import FakeTpuApi, GrpcFront  # noqa: E402

PLATFORM = "acme-ml-shared"
STACK = "bench"
ZONES = ("us-central1-a", "us-central1-b", "us-central1-c", "europe-west4-a",
         "europe-west4-b", "us-east5-a", "us-south1-a", "asia-northeast1-b")
LABELS = {"stack": STACK, "managed-by": "pulumi"}
ACCELERATOR = "v2-8"
QUEUED_EVERY = 10  # every tenth node is provisioned by a queued resource
RUNTIME = "tpu-vm-tf-2.18.0-pjrt"


@dataclass(frozen=True)
class Placed:
    node_id: str
    team: str
    project: str
    zone: str
    queued: bool

    @property
    def bucket(self) -> str:
        return f"bench-logs-{self.team}"


def layout(nodes: int, projects: int, zones: int) -> list[Placed]:
    """Node i in team i % projects, zone (i // projects) % zones: every pair gets nodes."""
    placed = []
    for index in range(nodes):
        team = f"team{index % projects:02d}"
        zone = ZONES[(index // projects) % zones]
        placed.append(Placed(f"{STACK}-{team}-n{index:05d}", team, f"{PLATFORM}-{team}", zone,
                             index % QUEUED_EVERY == QUEUED_EVERY - 1))
    return placed


def status_fields(node: Placed, index: int) -> dict[str, str]:
    goodput = {"productive": 900.0 + index % 100, "total": 1000.0, "percent": 90.0, "job": "j"}
    return {"state": "running", "step": str(index), "goodput": json.dumps(goodput)}


# ---- the fakes, in a process of their own ----------------------------------------------
LIST_PAGE = 1000  # objects.list returns at most 1,000 objects a page (JSON API reference)
OBJECTS = re.compile(r"^/storage/v1/b/(?P<bucket>[^/]+)/o$")


def listing_server(placed: list[Placed]) -> ThreadingHTTPServer:
    """objects.list of each bucket's `status/*/worker-0/status.json`, with their custom
    metadata, page by page; any other request is a 404."""
    pages: dict[tuple[str, int], bytes] = {}
    by_bucket: dict[str, list[dict[str, Any]]] = {}
    for index, node in enumerate(placed):
        by_bucket.setdefault(node.bucket, []).append(
            {"name": f"status/{node.node_id}/{WORKER0_STATUS}",
             "metadata": status_fields(node, index)})
    for bucket, items in by_bucket.items():
        for start in range(0, len(items), LIST_PAGE):
            answer: dict[str, Any] = {"kind": "storage#objects",
                                      "items": items[start:start + LIST_PAGE]}
            if start + LIST_PAGE < len(items):
                answer["nextPageToken"] = str(start + LIST_PAGE)
            pages[(bucket, start)] = json.dumps(answer).encode()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            match = OBJECTS.match(path)
            token = re.search(r"(?:^|&)pageToken=(\d+)", query)
            body = pages.get((match["bucket"], int(token[1]) if token else 0)) if match else None
            self.send_response(200 if body else 404)
            body = body or b'{"error": {"code": 404, "message": "not found"}}'
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def serve_fake(conn: Connection, nodes: int, projects: int, zones: int) -> None:
    """Build the fakes with every node (no latency), serve them, obey the parent's orders."""
    warnings.filterwarnings("ignore", category=FutureWarning)
    storage = listing_server(layout(nodes, projects, zones))
    offered = {zone: [ACCELERATOR] for zone in ZONES[:zones]}
    root = FakeTpuApi(project=f"{PLATFORM}-team00", accelerator_types=offered)
    fakes = {root.project: root}
    for index, node in enumerate(layout(nodes, projects, zones)):
        fake = fakes.get(node.project) or fakes.setdefault(node.project,
                                                            root.add_project(node.project))
        metadata = {STATUS_KEY: f"gs://{node.bucket}/status/{node.node_id}/"}
        labels = {**LABELS, "team": node.team}
        if node.queued:
            fake.add_queued_node(node.zone, node.node_id, labels=labels, metadata=metadata,
                                 accelerator_type=ACCELERATOR, spot=True)
        else:
            fake.add_node(node.zone, node.node_id, labels=labels, metadata=metadata,
                          accelerator_type=ACCELERATOR, spot=True)
        fake.set_guest_attributes(node.zone, node.node_id, 0, status_fields(node, index))
    root.start()
    front = GrpcFront(root)
    host, port = storage.server_address[:2]
    conn.send((root.endpoint, front.port, f"http://{host}:{port}"))
    while True:
        order, value = conn.recv()
        if order == "latency":
            root.latency = value
            conn.send(None)
        elif order == "reset":
            for fake in fakes.values():
                fake.calls.clear()
            root.reset_peaks()
            conn.send(None)
        elif order == "figures":
            conn.send((sum(len(f.calls) for f in fakes.values()), root.peak_in_flight,
                       max(root.peak_by_project.values(), default=0)))
        else:
            root.stop()
            front.stop()
            storage.shutdown()
            conn.send(None)
            return


class FakeProcess:
    def __init__(self, nodes: int, projects: int, zones: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=serve_fake, args=(child, nodes, projects, zones),
                                       daemon=True)
        self.process.start()
        self.endpoint, self.grpc_port, self.storage = self.conn.recv()

    def client(self, transport: str) -> Any:
        """A TpuClient on `transport`; REST finds the fake through TPU_STACK_TPU_ENDPOINT."""
        if transport == "rest":
            return None
        import grpc
        from google.cloud.tpu_v2 import TpuClient
        from google.cloud.tpu_v2.services.tpu.transports import TpuGrpcTransport

        channel = grpc.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        return TpuClient(transport=TpuGrpcTransport(channel=channel))

    def order(self, order: str, value: Any = None) -> Any:
        self.conn.send((order, value))
        return self.conn.recv()

    def close(self) -> None:
        self.order("stop")
        self.process.join(10)


# ---- the stack as tpuctl reads it -------------------------------------------------------


class SlowSession(requests.Session):
    """The storage client's HTTP session with every request delayed by `latency`."""

    def __init__(self) -> None:
        super().__init__()
        self.latency = 0.0
        self.requests = 0

    def request(self, *args: Any, **kwargs: Any) -> requests.Response:
        self.requests += 1
        time.sleep(self.latency)
        return super().request(*args, **kwargs)


def stack_target(placed: list[Placed]) -> StackTarget:
    v2_8 = catalog.parse_accelerator_type(ACCELERATOR)
    nodes = tuple(ExpectedNode(n.node_id, n.node_id, n.zone, v2_8, RUNTIME, True, n.queued,
                               n.project, team=n.team, capacity="spot") for n in placed)
    per_team: dict[str, int] = {}
    for node in placed:
        per_team[node.team] = per_team.get(node.team, 0) + v2_8.chips
    caps = {team: {("v2", "spot"): chips} for team, chips in per_team.items()}
    return StackTarget(PLATFORM, STACK, nodes, caps=caps)


def render(target: StackTarget, nodes: list[NodeStatus], lines: list[Any]) -> int:
    console = Console(file=StringIO(), width=200)
    console.print(status_views.status_table(target, nodes))
    for line in lines:
        console.print(line)
    return sum(1 for node in nodes if node.job.get("state") == "running")


def sequential_walk(api: TpuApi, target: StackTarget, logs: AgentLogs) -> int:
    """tpuctl status before issue 30: every pair, then every bucket, one after another."""
    nodes = []
    for project, zone in sorted(set(target.places)):
        nodes += [NodeStatus.from_node(n) for n in api.list_nodes(project, zone)
                  if tpu_api.belongs_to(n.labels, target.stack)]
    queued_places = sorted({(n.project, n.zone) for n in target.nodes if n.queued})
    for project, zone in queued_places:
        api.call("list_queued_resources", zone, parent=tpu_api.parent(project, zone))
    jobs = {}
    for bucket in sorted({n.metadata[STATUS_KEY].split("/")[2] for n in nodes}):
        for prefix, fields in logs.published(bucket, "status/").items():
            jobs[prefix.split("/")[1]] = fields
    shown = [replace(n, job=jobs.get(n.node_id, {})) for n in nodes]
    return render(target, shown, [])


def tpuctl_status(api: TpuApi, target: StackTarget, logs: AgentLogs) -> int:
    """What `tpuctl status` does (commands._status_now), with the bench's slow storage."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        queued_read = pool.submit(node_status.read_queued, api, target)
        read = node_status.read_stack(api, target, logs)
        queued = queued_read.result()
    unread = sorted(set(read.unread) | set(queued.unread))
    lines = [status_views.summary_line(s)
             for s in node_status.team_summaries(target, read.items, unread)]
    assert not unread, unread
    return render(target, read.items, lines)


Figures = tuple[float, float, int, int, int, int]


def timed(fake: FakeProcess, session: SlowSession, run: Callable[[], int], repeat: int
          ) -> Figures:
    """Median wall time of `repeat` runs (the machine may be shared), median CPU seconds of
    this process (tpuctl's own work; the fakes run elsewhere), nodes shown running,
    requests, peak requests in flight (all, per project) of the last run."""
    walls, cpus = [], []
    for _ in range(repeat):
        fake.order("reset")
        session.requests = 0
        start, cpu = time.perf_counter(), time.process_time()
        seen = run()
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    calls, peak, peak_project = fake.order("figures")
    return (statistics.median(walls), statistics.median(cpus), seen, calls + session.requests,
            peak, peak_project)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--projects", type=int, default=1, help="team projects (>= 1)")
    parser.add_argument("--zones", type=int, default=2, choices=range(1, len(ZONES) + 1),
                        help="zones each project uses")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per request")
    parser.add_argument("--per-project", type=int, default=tpu_api.DEFAULT_REQUESTS_PER_PROJECT,
                        help="TPU API requests in flight per project")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; the median counts")
    parser.add_argument("--transport", choices=("grpc", "rest"), default="grpc",
                        help="the TpuClient's transport (default grpc, as against GCP)")
    args = parser.parse_args()
    if args.projects < 1 or args.nodes < args.projects * args.zones:
        parser.error("--projects must be 1 or more, and --nodes at least projects x zones")
    placed = layout(args.nodes, args.projects, args.zones)
    target = stack_target(placed)
    started = time.perf_counter()
    fake = FakeProcess(args.nodes, args.projects, args.zones)
    try:
        os.environ[ENDPOINT_ENV] = fake.endpoint
        os.environ["STORAGE_EMULATOR_HOST"] = fake.storage
        from google.cloud import storage

        session = SlowSession()
        logs = AgentLogs(PLATFORM, storage.Client(project=PLATFORM, _http=session))
        api = TpuApi(client=fake.client(args.transport), per_project=args.per_project)
        tpuctl_status(api, target, logs)  # warm up: clients, connection pools, imports
        setup = time.perf_counter() - started
        fake.order("latency", args.latency)
        session.latency = args.latency
        runs = {
            "baseline: sequential walk (pairs, then buckets, one by one)":
                lambda: sequential_walk(api, target, logs),
            "tpuctl status: pairs concurrently, team summaries":
                lambda: tpuctl_status(api, target, logs),
        }
        figures = {name: timed(fake, session, run, max(1, args.repeat))
                   for name, run in runs.items()}
    finally:
        fake.close()
    report(figures, args, len(target.places), setup)


def report(figures: dict[str, Figures], args: argparse.Namespace,
           pairs: int, setup: float) -> None:
    print(f"{args.nodes} nodes in {pairs} (project, zone) pairs ({args.projects} projects x "
          f"{args.zones} zones), {args.latency * 1000:.0f} ms per request ({args.transport}), "
          f"at most "
          f"{args.per_project} in flight per project (fake TPU API and objects.list on "
          f"loopback; fixtures set up in {setup:.0f} s without latency); median of "
          f"{args.repeat} runs")
    print(f"{'run':62} {'seconds':>8} {'cpu s':>6} {'requests':>9} {'peak':>5} {'/proj':>6} "
          f"{'nodes':>6} {'vs baseline':>12}")
    base = next(iter(figures.values()))[0]
    for name, (wall, cpu, seen, requests_made, peak, peak_project) in figures.items():
        print(f"{name:62} {wall:8.2f} {cpu:6.2f} {requests_made:9d} {peak:5d} {peak_project:6d} "
              f"{seen:6d} {base / wall:11.1f}x")
    status, status_cpu = list(figures.values())[-1][:2]
    print(f"tpuctl status under 2 s: {'yes' if status < 2 else 'NO'} ({status:.2f} s; load "
          f"average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    print(f"tpuctl status CPU per 1,000 nodes: {status_cpu * 1000 / args.nodes:.3f} s "
          f"(baseline {next(iter(figures.values()))[1] * 1000 / args.nodes:.3f} s; the per-node "
          "work: the floor once the reads overlap)")


if __name__ == "__main__":
    main()
