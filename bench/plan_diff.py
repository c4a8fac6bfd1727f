"""`tpuctl plan --against` on two N-node plans, against one plain `tpuctl plan`.

The target: a PR comment's diff costs under 2x a single plan. The base plan is
read from its saved JSON (as CI saves it), so the diff adds the read, the
engine-step prediction (ops/plan/steps.py: every node replaced, each with its
chain), and the rendering to one plan run. Figures are ratios against the single
plan measured in the same run; the diff alone (steps and rendering, no plan) is
also given as a ratio of the plan's time.

    .venv/infra/bin/python bench/plan_diff.py [--nodes 500] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from components.stack_config import file_config
from ops.plan.diff import diff_plans, load_plan, render_diff
from ops.plan.offline import offline_plan
from ops.plan.report import duplicate_urns, plain, render
from policy.evaluate import evaluate, load_config


def config_with_nodes(count: int, runtime: str) -> dict[str, str]:
    """The dev stack with `count` copies of its node, each with its own name."""
    config = file_config("dev")
    [template] = json.loads(config["tpu-stack:nodes"])
    nodes = [{**template, "name": f"n{i:03d}", "runtimeVersion": runtime} for i in range(count)]
    config["tpu-stack:nodes"] = json.dumps(nodes)
    return config


def single_plan(config: dict[str, str]) -> str:
    """What `tpuctl plan --format markdown` does."""
    plan = plain(offline_plan("dev", config).to_json())
    return render(plan, "markdown", evaluate(plan, load_config()))


def plan_against(config: dict[str, str], base_file: Path) -> str:
    """What `tpuctl plan --against BASE.json --format markdown` does."""
    head = plain(offline_plan("dev", config).to_json())
    diff = diff_plans(load_plan(base_file), head)
    return render_diff(diff, "markdown", evaluate(head, load_config()))


def seconds(step: Callable[[], Any]) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def best_of(repeat: int, *steps: Callable[[], Any]) -> list[float]:
    """Each step's best time; steps alternate so a busy machine slows them alike."""
    rounds = [[seconds(step) for step in steps] for _ in range(repeat)]
    return [min(times) for times in zip(*rounds, strict=True)]


def older_runtime(plan: dict[str, Any]) -> dict[str, Any]:
    for resource in plan["resources"]:
        if "runtimeVersion" in resource.get("inputs", {}):
            resource["inputs"]["runtimeVersion"] = "tpu-vm-tf-2.17.0-pjrt"
    return plan


def unique_urns(plan: dict[str, Any]) -> dict[str, Any]:
    """The plan with every URN made unique by its component, as a fixed program would."""
    resources = [{**r, "urn": f"{r['urn']}::{r.get('component')}"} for r in plan["resources"]]
    return {**plan, "resources": resources}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()

    head_config = config_with_nodes(args.nodes, "tpu-vm-tf-2.18.0-pjrt")
    # The base ran an older runtime on every node (the catalog accepts one image today,
    # so it is written into the saved base plan): every node is replaced, with its chain.
    base_plan = older_runtime(plain(offline_plan("dev", head_config).to_json()))
    with tempfile.TemporaryDirectory() as tmp:
        base_file = Path(tmp) / "base.json"
        base_file.write_text(json.dumps(base_plan))
        single_plan(head_config)  # warm imports and caches for both measurements
        single, against = best_of(args.repeat, lambda: single_plan(head_config),
                                  lambda: plan_against(head_config, base_file))

    head_plan = plain(offline_plan("dev", head_config).to_json())
    distinct_base, distinct_head = unique_urns(base_plan), unique_urns(head_plan)
    [diff_only] = best_of(args.repeat, lambda: render_diff(
        diff_plans(distinct_base, distinct_head), "markdown"))
    replaced = len(diff_plans(distinct_base, distinct_head).replacements)

    print(f"plans: {len(base_plan['resources'])} resources each, {args.nodes} TPU nodes, "
          f"best of {args.repeat}")
    print(f"single plan (baseline):         {single:7.3f} s   1.00x")
    print(f"plan --against BASE.json:       {against:7.3f} s   {against / single:.2f}x"
          f"   (target < 2.00x)")
    print(f"diff + render, unique URNs:     {diff_only:7.3f} s   {diff_only / single:.2f}x"
          f"   ({replaced} replacements named)")
    duplicates = duplicate_urns(head_plan)
    if duplicates:
        print(f"note: the program declares {len(duplicates)} URN(s) more than once "
              f"(e.g. {duplicates[0]}); the diff above was also timed with unique URNs")


if __name__ == "__main__":
    main()
