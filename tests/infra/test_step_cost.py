"""The cost of a training step (issue #28): the stop budget's step-time estimate at the
node's hourly price, in the plan's JSON and text. Expected figures are worked out here
from the catalog's figures and the models' published shapes, not from the code's helpers."""

from __future__ import annotations

import json

import pytest

from components.stack_config import file_config
from model import catalog, cost
from model.settings.load import load_settings
from ops.plan.offline import cost_json, offline_plan
from ops.plan.report import plain, render, significant, step_rows
from tests.infra.stack_fixtures import as_cli, config, node

# mnist_cnn's forward multiply-adds, counted over its Conv2D and Dense layers
# (training/tpu_training/config.py FORWARD_MACS); a training step is about three
# forward passes of two FLOPs per multiply-add.
MNIST_FORWARD_MACS = 379_078_912
UTILISATION = catalog.ASSUMED_FLOPS_UTILIZATION


def bert_base_forward_macs(sequence: int = 128, predictions: int = 20,
                           vocab: int = 30522) -> int:
    """BERT-Base (google-research/bert: 12 layers, hidden 768): per token and layer the
    Q, K, V and output projections (4 H^2) and the 4H feed-forward (8 H^2), attention's
    scores and weighted sum (2 S H); then the pooler (H^2), the masked-LM head's
    transform and vocabulary projection per prediction, the next-sentence layer (2 H)."""
    layers, hidden = 12, 768
    per_token = layers * (4 * hidden**2 + 8 * hidden**2 + 2 * sequence * hidden)
    head = predictions * (hidden**2 + hidden * vocab)
    return sequence * per_token + hidden**2 + head + 2 * hidden


def bert_base_settings(accelerator: str = "v4-8", provisioning: str = "on-demand"):
    job = {"model": "bert_base", "recordFormat": "bert_pretraining",
           "trainData": "bert/train-*.tfrecord", "globalBatchSize": 256,
           "trainSteps": 1000, "stepsPerExecution": 100, "checkpointEverySteps": 500}
    trainer = node(acceleratorType=accelerator, zone="us-central2-b",
                   provisioning=provisioning, job="bert")
    data = config(tpu_stack_nodes=[trainer], tpu_stack_jobs={"bert": job},
                  tpu_stack_storage={"location": "us-central2", "forceDestroy": True,
                                     "protect": False})
    return load_settings(as_cli(data), "test")


def test_the_dev_stacks_mnist_step_is_its_flops_over_the_slices_peak_at_spot_price():
    [trainer] = cost.settings_cost(load_settings(file_config("dev"), "dev")).nodes
    # Pulumi.dev.yaml: mnist_cnn, globalBatchSize 1024, on a spot v5litepod-8.
    seconds = 6 * MNIST_FORWARD_MACS * 1024 / (
        8 * catalog.PEAK_BF16_FLOPS_PER_CHIP["v5e"] * UTILISATION)
    usd = 8 * catalog.GENERATIONS["v5e"].price.spot * seconds / 3600
    step = trainer.step
    assert (step.job, step.model, step.global_batch_size) == ("mnist", "mnist_cnn", 1024)
    assert step.seconds == pytest.approx(seconds, rel=1e-9)
    assert step.seconds == pytest.approx(0.004926, rel=1e-3)
    assert step.usd == pytest.approx(usd, rel=1e-9)
    assert step.usd_per_1000_steps == pytest.approx(1000 * usd, rel=1e-9)
    # v5e's peak and spot price are confirmed; the utilisation is an assumption.
    assert step.unconfirmed == ("utilisation",)


def test_a_bert_base_step_on_a_v4_slice_is_priced_on_demand_and_marked_unconfirmed():
    [trainer] = cost.settings_cost(bert_base_settings()).nodes
    flops = 6 * bert_base_forward_macs() * 256
    seconds = flops / (4 * catalog.PEAK_BF16_FLOPS_PER_CHIP["v4"] * UTILISATION)
    usd = 4 * catalog.GENERATIONS["v4"].price.on_demand * seconds / 3600
    step = trainer.step
    assert step.flops_per_example * 256 == pytest.approx(flops, rel=1e-9)
    assert step.seconds == pytest.approx(seconds, rel=1e-9)
    assert step.seconds == pytest.approx(0.05424, rel=1e-3)  # ~70 GFLOP an example
    assert step.usd == pytest.approx(usd, rel=1e-9)
    # v4's peak FLOPs and its price are unconfirmed in the catalog, as is the utilisation.
    assert step.unconfirmed == ("utilisation", "peak", "price")


def test_a_step_costs_the_nodes_own_rate_and_unknown_without_a_price():
    # A v4 spot slice has no list price (model/catalog.py): its step's seconds are
    # known, its cost is not.
    [spot] = cost.settings_cost(bert_base_settings(provisioning="spot")).nodes
    [on_demand] = cost.settings_cost(bert_base_settings()).nodes
    assert spot.step.seconds == on_demand.step.seconds
    assert spot.step.usd is None and spot.step.usd_per_1000_steps is None
    assert "price" not in spot.step.unconfirmed  # nothing priced, nothing to doubt
    plan = {"cost": cost_json(cost.settings_cost(bert_base_settings(provisioning="spot")))}
    [row] = step_rows(plan)
    assert row == ["trainer", "bert_base", "256", "~0.054", "unknown", "unknown",
                   "utilisation, peak"]


def test_a_committed_node_prices_its_step_at_the_committed_rate():
    settings = load_settings(as_cli(config(tpu_stack_nodes=[node(
        acceleratorType="v6e-8", zone="us-east1-d", provisioning="reserved",
        commitment="3-year")])), "test")
    [trainer] = cost.settings_cost(settings).nodes
    seconds = 6 * MNIST_FORWARD_MACS * 1024 / (
        8 * catalog.PEAK_BF16_FLOPS_PER_CHIP["v6e"] * UTILISATION)
    assert trainer.step.usd == pytest.approx(8 * 1.22 * seconds / 3600, rel=1e-9)


def test_the_plan_shows_the_dev_stacks_step_in_its_text_and_json():
    plan = plain(offline_plan("dev").to_json())
    [trainer] = plan["cost"]["nodes"]
    step = trainer["step"]
    assert step == {
        "job": "mnist", "model": "mnist_cnn", "globalBatchSize": 1024,
        "flopsPerExample": 6 * MNIST_FORWARD_MACS, "peakFlopsPerSecond": 8 * 197e12,
        "assumedUtilization": 0.3, "seconds": 0.004926, "usd": 6.645e-06,
        "usdPer1000Steps": 0.006645, "unconfirmed": ["utilisation"],
        # 0.1 per 256 examples x 1024, warm-up a tenth of 5,000 steps (at most 1,000).
        "recipe": "optimizer=sgd peak_learning_rate=0.4 warmup_steps=500 decay=cosine "
                  "clip_norm=none weight_decay=none"}
    text = render(plan, "table")
    assert ("node     model      batch  step seconds  USD/step     USD/1,000 steps  unconfirmed\n"
            "trainer  mnist_cnn  1024   ~0.0049       ~$0.0000066  ~$0.0066         utilisation"
            ) in text
    assert ("- a training step: the job's FLOPs per example x globalBatchSize over the slice's "
            "peak bf16 FLOPs at an assumed 30% utilisation (unconfirmed;") in text
    markdown = render(plan, "markdown")
    assert "| trainer | mnist_cnn | 1024 | ~0.0049 | ~$0.0000066 | ~$0.0066 | utilisation |" \
        in markdown
    assert json.loads(render(plan, "json"))["cost"]["nodes"][0]["step"] == step


def test_the_plan_shows_each_jobs_training_recipe():
    plan = {"cost": cost_json(cost.settings_cost(bert_base_settings()))}
    text = render(plan, "table")
    # google-research/bert's AdamW: 1e-4 at its batch of 256, warm-up a tenth of 1,000 steps,
    # linear decay, gradients clipped to a global norm of 1, weight decay 0.01.
    assert ("Training recipe per job:\n- trainer: optimizer=adamw peak_learning_rate=0.0001 "
            "warmup_steps=100 decay=linear clip_norm=1 weight_decay=0.01") in text


def test_significant_keeps_two_digits_in_fixed_notation():
    assert [significant(v) for v in (0.004926, 6.645e-06, 0.05424, 12.34, 1234.4, 0)] == \
        ["0.0049", "0.0000066", "0.054", "12", "1,234", "0"]
