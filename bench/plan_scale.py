"""Offline plan time of tpu-stack against a raw pulumi-gcp program, 1 to 500 nodes.

The baseline is measured in the same run: the very resources our plan
declared (same pulumi-gcp classes, inputs and dependency edges), declared flat
by a plain program with no components, no settings validation and no package
build. The ratio is
what the components and validation cost on top of the engine's own work.

The diff column is the preview's own work on that plan (ops/plan/steps.py and the
PR-comment rendering, as `tpuctl plan --against` runs them): against a base where every
node ran an older runtime, so every node is replaced with its chain (the worst case),
as a ratio of the plan's own time (target: under 0.25 at 500 nodes).

    .venv/infra/bin/python bench/plan_scale.py [--sizes 1,10,100,500] [--repeat 3]
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pulumi
import pulumi_gcp as gcp

from model.pulumi_types import (
    COMPUTE_FIREWALL,
    COMPUTE_NETWORK,
    COMPUTE_SUBNETWORK,
    PROJECTS_IAM_MEMBER,
    PROJECTS_SERVICE,
    SERVICEACCOUNT_ACCOUNT,
    STORAGE_BUCKET,
    STORAGE_BUCKET_IAM_MEMBER,
    STORAGE_BUCKET_OBJECT,
    TPU_V2_VM,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from components.stack_config import cli_value, file_config
from ops.plan.diff import diff_plans, render_diff
from ops.plan.mock_engine import Registration, run_program
from ops.plan.offline import offline_plan
from ops.plan.report import plain


def config_with_nodes(count: int) -> dict[str, str]:
    """The dev stack with `count` copies of its node."""
    base = file_config("dev")
    (template,) = json.loads(base["tpu-stack:nodes"])
    nodes = []
    for index in range(count):
        node = copy.deepcopy(template)
        node["name"] = f"n{index}"
        nodes.append(node)
    return {**base, "tpu-stack:nodes": cli_value(nodes)}


# The pulumi-gcp classes a stack declares, by type token.
GCP_CLASSES: dict[str, type[pulumi.CustomResource]] = {
    PROJECTS_SERVICE: gcp.projects.Service,
    COMPUTE_NETWORK: gcp.compute.Network,
    COMPUTE_SUBNETWORK: gcp.compute.Subnetwork,
    COMPUTE_FIREWALL: gcp.compute.Firewall,
    STORAGE_BUCKET: gcp.storage.Bucket,
    STORAGE_BUCKET_IAM_MEMBER: gcp.storage.BucketIAMMember,
    STORAGE_BUCKET_OBJECT: gcp.storage.BucketObject,
    SERVICEACCOUNT_ACCOUNT: gcp.serviceaccount.Account,
    PROJECTS_IAM_MEMBER: gcp.projects.IAMMember,
    TPU_V2_VM: gcp.tpu.V2Vm,
}


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def replay(registrations: list[Registration]) -> Callable[[], None]:
    """A flat pulumi-gcp program: each resource our plan declared, with the same
    inputs, as its pulumi-gcp class at the top level (names made unique)."""
    custom = [r for r in registrations if r.custom]

    def program() -> None:
        declared: dict[str, pulumi.CustomResource] = {}
        for index, resource in enumerate(custom):
            kwargs = {snake(key): value for key, value in resource.inputs.items()}
            # The same ordering a correct flat program needs (APIs before
            # nodes, grants before a job boots): the plan's dependency edges.
            after = [declared[urn] for urn in resource.dependencies if urn in declared]
            declared[resource.urn] = GCP_CLASSES[resource.type](
                f"{resource.name}-{index}", **kwargs,
                opts=pulumi.ResourceOptions(depends_on=after))
    return program


def older_runtime(plan: dict) -> dict:
    """The plan as it was with an older runtime on every node: each one is replaced."""
    base = copy.deepcopy(plan)
    for resource in base["resources"]:
        if "runtimeVersion" in resource.get("inputs", {}):
            resource["inputs"]["runtimeVersion"] = "tpu-vm-tf-2.17.0-pjrt"
    return base


def diff_work(base: dict, head: dict) -> Callable[[], object]:
    return lambda: render_diff(diff_plans(base, head), "markdown")


def best_of(repeat: int, work: Callable[[], object]) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,10,100,500")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    offline_plan("dev")  # warm imports and the wheel cache once, outside the timings
    print(f"{'nodes':>6} {'tpu-stack s':>12} {'raw s':>8} {'ratio':>6} "
          f"{'ms/node':>8} {'raw ms/node':>12} {'diff s':>7} {'diff/plan':>9}")
    for count in sizes:
        config = config_with_nodes(count)
        repeat = args.repeat if count <= 100 else 1
        result = offline_plan("bench", config)
        flat = replay(result.run.registrations)
        head = plain(result.to_json())
        base = older_runtime(head)
        ours = best_of(repeat, lambda c=config: offline_plan("bench", c))
        raw = best_of(repeat, lambda c=config, p=flat: run_program(c, "bench", program=p))
        diff = best_of(repeat, diff_work(base, head))
        print(f"{count:>6} {ours:>12.3f} {raw:>8.3f} {ours / raw:>6.2f} "
              f"{1000 * ours / count:>8.2f} {1000 * raw / count:>12.2f} {diff:>7.3f} "
              f"{diff / ours:>9.3f}")


if __name__ == "__main__":
    main()
