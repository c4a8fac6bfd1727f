"""Offline plan time per node as teams and nodes grow (docs/teams.md).

    .venv/infra/bin/python bench/teams_scale.py [--repeat 3]

Plans a platform stack that declares every team's nodes (settings checks,
then the whole program under the mock engine, as `tpuctl plan` does) for 2
teams with 20 nodes (the baseline) and for 20 teams with 200 nodes, and
prints the time per node of each as a ratio to the baseline measured in the
same run. Linear growth keeps the ratio at or below 1.2. The verdict uses the
process's CPU time: on a shared 2-core machine wall time mostly measures the
neighbours (wall time is printed too). The training package archive is built
in both, once per plan.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from model.pulumi_types import TPU_V2_VM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from components.stack_config import cli_value
from ops.plan.offline import offline_plan

BASELINE = (2, 20)
SCALED = (20, 200)
LIMIT = 1.2
# v5e zones in four US regions (model/catalog.py; the data bucket is in US,
# so no node reads across regions), so nodes spread over
# subnets as a shared project's would.
ZONES = ("us-central1-a", "us-west4-a", "us-south1-a", "us-west1-c")
CHIPS_PER_NODE = 8  # v5litepod-8


def job() -> dict[str, Any]:
    return {"model": "mnist_cnn", "trainData": "datasets/mnist/train-*.tfrecord",
            "globalBatchSize": 1024, "trainSteps": 5000, "stepsPerExecution": 100,
            "checkpointEverySteps": 500}


def team(index: int, nodes: int) -> dict[str, Any]:
    return {
        "members": [f"group:team-{index}@acme.example"],
        "subnetSlot": index,  # the team's own subnets (docs/teams.md, "The network")
        "labels": {"cost-centre": f"cc-{index:04d}"},
        "quota": {"v5e": {"spot": nodes * CHIPS_PER_NODE}},
        # A keyless deployer per team, and (teamProjects.stateBucket) its state grants.
        "ci": {"githubRepository": f"acme/team-{index}", "githubRepositoryId": str(1000 + index),
               "githubRepositoryOwnerId": "42"},
        "jobs": {"mnist": job()},
        "nodes": [{"name": f"n{n}", "zone": ZONES[n % len(ZONES)],
                   "acceleratorType": "v5litepod-8", "provisioning": "spot", "job": "mnist"}
                  for n in range(nodes)],
    }


def platform_config(teams: int, nodes: int) -> dict[str, str]:
    per_team = nodes // teams
    region_chips = nodes * CHIPS_PER_NODE  # every region could hold them all
    regions = sorted({zone.rsplit("-", 1)[0] for zone in ZONES})
    config = {
        "gcp:project": "acme-ml-shared",
        "tpu-stack:environment": "dev",
        "tpu-stack:labels": {"cost-centre": "cc-platform"},
        "tpu-stack:storage": {"location": "US", "forceDestroy": True, "protect": False},
        "tpu-stack:quota": {"v5e": {r: {"preemptible": region_chips} for r in regions}},
        "tpu-stack:teamProjects": {"folderId": "1234567890", "quotaContact": "p@acme.example",
                                   "billingAccount": "01AB23-45CD67-89EF01",
                                   "stateBucket": "acme-pulumi-state",
                                   "deployer": "platform-deployer@acme-ml-shared"
                                               ".iam.gserviceaccount.com"},
        "tpu-stack:teams": {f"t{i}": team(i, per_team) for i in range(teams)},
    }
    return {key: cli_value(value) for key, value in config.items()}


def plan_seconds(teams: int, nodes: int) -> tuple[float, float]:
    """(wall, CPU) seconds of one offline plan of `teams` teams with `nodes` nodes."""
    config = platform_config(teams, nodes)
    wall, cpu = time.perf_counter(), time.process_time()
    plan = offline_plan("bench", config)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    vms = plan.run.of_type(TPU_V2_VM)
    assert len(vms) == nodes, (len(vms), nodes)
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="plans per size (median)")
    args = parser.parse_args()
    plan_seconds(*BASELINE)  # warm-up: imports, wheel cache, archive staging
    sizes = ((BASELINE[0], 0), BASELINE, SCALED)
    samples: dict[tuple[int, int], list[tuple[float, float]]] = {size: [] for size in sizes}
    for _ in range(args.repeat):  # interleaved, so a busy moment hits every size alike
        for size in sizes:
            samples[size].append(plan_seconds(*size))
    wall = {size: statistics.median(w for w, _ in samples[size]) for size in sizes}
    cpu = {size: statistics.median(c for _, c in samples[size]) for size in sizes}
    fixed = cpu[sizes[0]]
    print(f"fixed part (project, network, shared buckets, package; no nodes): "
          f"{fixed:.2f} s CPU, {wall[sizes[0]]:.2f} s wall")
    for size in (BASELINE, SCALED):
        teams, nodes = size
        print(f"{teams:>3} teams {nodes:>4} nodes: "
              f"{cpu[size] / nodes * 1000:6.1f} ms CPU/node "
              f"({cpu[size] / nodes / (cpu[BASELINE] / BASELINE[1]):.2f}x baseline), "
              f"{wall[size] / nodes * 1000:6.1f} ms wall/node "
              f"({wall[size] / nodes / (wall[BASELINE] / BASELINE[1]):.2f}x baseline)")
    ratio = (cpu[SCALED] / SCALED[1]) / (cpu[BASELINE] / BASELINE[1])
    verdict = "linear" if ratio <= LIMIT else f"above the {LIMIT}x limit"
    print(f"CPU per node, {SCALED[0]} teams / {BASELINE[0]} teams: {ratio:.2f} ({verdict})")
    return 0 if ratio <= LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
