"""What placing a node through its fallback candidates costs beyond waiting, at a real latency.

The fake TPU API (tests/fakes/tpu_api.py) answers every request after `--latency` seconds
(50 ms by default, a round trip to a Google API from outside its region), and each
request waits `--provision` seconds in WAITING_FOR_RESOURCES before it turns ACTIVE.
Two placements with the real TpuClient (REST) and components/fallback_tpu.py:

- baseline: one candidate that provisions;
- fallback: three candidates, the first waiting for resources past `--max-wait`, the
  second refused for quota (429 with a QuotaFailure), the third provisioning as the
  baseline's does.

Printed: each placement's seconds, the fallback's time beyond the baseline and the
first candidate's maxWait (the cost of deleting two requests and confirming them gone,
and of the refused create), as a ratio against the baseline measured in the same run,
and the requests each sent.

    .venv/infra/bin/python bench/fallback_placement.py --latency 0.05 --max-wait 5
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cloud.tpu import ENDPOINT_ENV
from components.fallback_tpu import FallbackTpuProvider
from tests.fakes.tpu_api import FakeTpuApi, running

PROJECT = "acme-ml-dev"
ZONES = ("us-east5-a", "us-east5-b", "us-central1-b")
QUOTA = "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI"


def candidate(zone: str) -> dict[str, object]:
    return {"zone": zone, "provisioning": "spot", "accelerator_type": "v6e-8",
            "runtime_version": "tpu-vm-tf-2.18.0-pjrt", "spot": True, "generation": "v6e",
            "chips": 8, "quota_type": "preemptible",
            "subnetwork": f"projects/{PROJECT}/regions/{zone[:-2]}/subnetworks/tpu"}


def place(zones: tuple[str, ...], args: argparse.Namespace, script) -> tuple[float, int]:
    api = FakeTpuApi(project=PROJECT, accelerator_types={z: ["v6e-8"] for z in ZONES})
    polls = max(1, round(args.provision / args.poll))
    script(api, ["WAITING_FOR_RESOURCES"] * polls + ["ACTIVE"])
    with running(api):
        os.environ[ENDPOINT_ENV] = api.endpoint
        api.latency = args.latency
        props = {"project": PROJECT, "node_id": "bench-node",
                 "candidates": [candidate(z) for z in zones],
                 "max_wait_seconds": args.max_wait, "poll_seconds": args.poll,
                 "metadata": {"tpu-stack-node": "bench-node"}, "labels": {"stack": "bench"},
                 "create_timeout_seconds": 600, "delete_timeout_seconds": 60}
        started = time.perf_counter()
        FallbackTpuProvider().create(props)
        return time.perf_counter() - started, len(api.calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--latency", type=float, default=0.05)
    parser.add_argument("--max-wait", type=float, default=5.0)
    parser.add_argument("--provision", type=float, default=2.0)
    parser.add_argument("--poll", type=float, default=0.5)
    args = parser.parse_args()

    def takes(api: FakeTpuApi, states: list[str]) -> None:
        api.script_queued("bench-node", *states, zone=ZONES[2])

    def falls_back(api: FakeTpuApi, states: list[str]) -> None:
        api.script_queued("bench-node", "WAITING_FOR_RESOURCES", zone=ZONES[0])
        api.refuse_for_quota(ZONES[1], QUOTA)
        takes(api, states)

    base, base_calls = place(ZONES[2:], args, takes)
    fallback, calls = place(ZONES, args, falls_back)
    overhead = fallback - base - args.max_wait
    print(f"baseline (one candidate): {base:.2f} s, {base_calls} requests")
    print(f"fallback (waits, quota, takes): {fallback:.2f} s, {calls} requests "
          f"({fallback / base:.2f}x baseline)")
    print(f"beyond baseline + maxWait {args.max_wait:.0f} s: {overhead:.2f} s "
          f"({overhead / base:.2f}x baseline), {calls / base_calls:.2f}x the requests")


if __name__ == "__main__":
    main()
