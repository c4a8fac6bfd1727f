"""tpuctl status: how busy each node's TPU is, and advice for one under 30%."""

from __future__ import annotations

import json

import pytest

from model import catalog
from ops.tpu.api import NodeStatus
from ops.tpu.status import utilisation_advice
from ops.tpu.status_views import perf_cells
from tests.fakes.tpu_api import FakeTpuApi
from tests.ops.test_tpu_cli import NODE, STATUS_PREFIX, tpuctl  # noqa: F401  (fixture)
from tests.ops.tpu_world import STACK_LABELS, ZONE


def node(accelerator_type: str, perf: dict | None, *, spot: bool = False,
         zone: str = "us-west4-a") -> NodeStatus:
    job = {"state": "running", "step": "900"}
    if perf is not None:
        job["perf"] = json.dumps(perf, separators=(",", ":"))
    return NodeStatus(zone, "prod-trainer", "READY", "HEALTHY", accelerator_type,
                      "tpu-vm-tf-2.18.0-pjrt", spot, {}, {}, "", job=job)


def perf(wait: float, mfu: float | str) -> dict:
    return {"step": 900, "examplesPerSec": 1000.0, "inputWaitShare": wait, "mfu": mfu}


def test_both_figures_per_node_and_a_flag_under_30_percent():
    assert perf_cells(node("v5litepod-8", perf(0.62, 0.081)).job) == ("62%", "8.1% LOW")
    assert perf_cells(node("v5litepod-8", perf(0.05, 0.45)).job) == ("5%", "45.0%")
    assert perf_cells(node("v5litepod-8", perf(0.4, "na")).job) == ("40%", "na")
    assert perf_cells(node("v5litepod-8", None).job) == ("", "")


def test_an_input_bound_node_is_told_to_fix_its_pipeline():
    advice = utilisation_advice(node("v5litepod-8", perf(0.7, 0.12)))
    assert advice.startswith("prod-trainer: its model FLOPs are 12.0% of the slice's peak "
                             "(under 30%), and it waits for input 70% of its time: "
                             "input-bound: fix the input pipeline: interleave")
    assert "prefetch" in advice and "more (and larger) shards" in advice
    assert "the data in the node's region (us-west4)" in advice
    # Busy 40% of the time it does not wait: fixing the input is enough.
    assert "smaller slice" not in advice


def test_a_node_that_barely_waits_is_offered_a_smaller_slice_with_its_price():
    # 6% of a v5litepod-8 with 10% waiting: 6.7% while busy, the work of 1.8 chips at 30%.
    advice = utilisation_advice(node("v5litepod-8", perf(0.1, 0.06)))
    on_demand = catalog.GENERATIONS["v5e"].price.on_demand
    assert ": too large for the job: a smaller slice, e.g. v5litepod-4 (4 chips instead of 8)" \
        in advice
    assert advice.endswith(f"${(8 - 4) * on_demand:,.2f}/hour less at on-demand list prices; "
                           "keep globalBatchSize a multiple of its 4 replicas and within "
                           "its HBM")
    spot = utilisation_advice(node("v5litepod-8", perf(0.1, 0.06), spot=True))
    assert f"${(8 - 4) * catalog.GENERATIONS['v5e'].price.spot:,.2f}/hour less at spot" in spot


def test_the_smallest_slice_gets_other_advice_and_a_busy_node_none():
    advice = utilisation_advice(node("v5litepod-1", perf(0.0, 0.05)))
    assert "v5litepod-1 is the smallest v5e slice: make each step bigger" in advice
    assert utilisation_advice(node("v5litepod-8", perf(0.9, 0.35))) is None
    assert utilisation_advice(node("v5litepod-8", perf(0.2, "na"))) is None  # off a TPU
    assert utilisation_advice(node("v5litepod-8", None)) is None


@pytest.mark.parametrize("figures", ["{", "[1]", json.dumps({"mfu": "x"})])
def test_broken_figures_show_nothing(figures: str):
    broken = node("v5litepod-8", None)
    broken.job["perf"] = figures
    assert utilisation_advice(broken) is None
    assert perf_cells(broken.job)[1] == ""


def test_status_shows_the_figures_and_the_advice(tpuctl, fake_tpu: FakeTpuApi) -> None:  # noqa: F811
    fake_tpu.add_node(ZONE, NODE, accelerator_type="v5litepod-8", spot=True,
                      labels={**STACK_LABELS, "node": "trainer"},
                      metadata={"tpu-stack-status": STATUS_PREFIX})
    fake_tpu.set_guest_attributes(ZONE, NODE, 0, {
        "state": "running", "step": "900",
        "perf": json.dumps(perf(0.72, 0.091), separators=(",", ":"))})

    run = tpuctl("status", "--stack", "dev", "--wide")  # input wait and MFU: wide columns

    assert run.code == 0, run.err
    row = next(line for line in run.out.splitlines() if NODE in line and "READY" in line)
    assert "72%" in row and "9.1% LOW" in row
    text = " ".join(run.out.split())
    assert (f"{NODE}: its model FLOPs are 9.1% of the slice's peak (under 30%), and it "
            "waits for input 72% of its time: input-bound: fix the input pipeline") in text
