"""The learning-rate and optimizer recipe as the papers give it (config.recipe): AdamW at
google-research/bert's rate, LAMB from the LAMB paper's Table 4 with its warm-up, clipping
on both; the job prints it once at start (checked in test_bert_checkpoint.py's job)."""

from __future__ import annotations

import math

import pytest

from tpu_training import config as schema
from tpu_training.config import JobConfig

BASE = {"model": "bert_base", "trainData": "x", "trainSteps": 100_000,
        "stepsPerExecution": 100, "checkpointEverySteps": 1000}


def recipe_of(**keys) -> schema.Recipe:
    return schema.recipe(JobConfig.from_dict({**BASE, **keys}, resolved=False))


@pytest.mark.parametrize("batch", [256, 1024, 4096])
def test_adamw_trains_at_google_researchs_rate_whatever_the_batch(batch):
    got = recipe_of(globalBatchSize=batch)
    # README: batch 256, 1e-4; run_pretraining.py: 10,000 warm-up steps of 100,000.
    assert got == schema.Recipe("adamw", 1e-4, 10_000, "linear", 1.0, 0.01)


@pytest.mark.parametrize(("batch", "peak", "warmup_share"), [
    (32768, 5e-3, 1 / 5),  # Table 4: 5/(2^0 x 10^3), warm-up ratio 1/5
    (16384, 5e-3 / math.sqrt(2), 1 / 10),  # 5/(2^0.5 x 10^3), 1/10
    (8192, 2.5e-3, 1 / 20),  # 5/(2^1 x 10^3), 1/20
])
def test_lamb_follows_the_papers_untuned_recipe(batch, peak, warmup_share):
    got = recipe_of(globalBatchSize=batch, trainSteps=7813)
    assert got.optimizer == "lamb"
    assert got.peak_learning_rate == pytest.approx(peak)
    assert got.warmup_steps == round(7813 * warmup_share)
    assert (got.decay, got.clip_norm, got.weight_decay) == ("linear", 1.0, 0.01)


def test_keys_override_the_rate_and_the_warmup_and_image_models_keep_theirs():
    assert recipe_of(globalBatchSize=32768, learningRate=2e-3,
                     warmupSteps=500).peak_learning_rate == 2e-3
    assert recipe_of(globalBatchSize=32768, warmupSteps=500).warmup_steps == 500
    image = schema.recipe(JobConfig.from_dict(
        {"model": "resnet50", "trainData": "x", "globalBatchSize": 1024, "trainSteps": 5000,
         "stepsPerExecution": 100}, resolved=False))
    assert image == schema.Recipe("sgd", 0.4, 500, "cosine", None, None)  # 0.1 x 1024/256


def test_the_recipe_line():
    assert recipe_of(globalBatchSize=32768, trainSteps=7813).line() == (
        "recipe optimizer=lamb peak_learning_rate=0.005 warmup_steps=1563 decay=linear "
        "clip_norm=1 weight_decay=0.01")
    image = schema.Recipe("sgd", 0.4, 500, "cosine", None, None)
    assert image.line().endswith(" clip_norm=none weight_decay=none")
