"""The job schema's checkpoint-size table against the real models' checkpoints."""

from __future__ import annotations

import io

import pytest

from tpu_training import config as schema
from tpu_training import models, train
from tpu_training.config import JobConfig
from tpu_training.tf_env import keras, tf

TOLERANCE = 0.01  # the preview's estimate, within 1% of the bytes the job writes


@pytest.mark.parametrize("shape", [
    {"model": "mnist_cnn"},
    {"model": "mnist_cnn", "widthMultiplier": 0.5, "numClasses": 100},
    {"model": "resnet18", "imageSize": 32},
    {"model": "resnet50", "imageSize": 32},
    {"model": "resnet50", "imageSize": 32, "widthMultiplier": 0.5, "numClasses": 10},
], ids=lambda shape: "-".join(map(str, shape.values())))
def test_the_table_matches_the_checkpoint_the_job_writes(strategy, tmp_path, shape):
    config = JobConfig.from_dict({
        "trainData": "unused", "globalBatchSize": 2, "trainSteps": 1, "stepsPerExecution": 1,
        "checkpointEverySteps": 1, "checkpointDir": str(tmp_path / "ckpt"),
        "exportDir": str(tmp_path / "export"), "tensorboardDir": str(tmp_path / "tb"),
        **shape})
    job = train.Job(config, models.model_spec(config), tf.distribute.get_strategy(),
                    io.StringIO())
    written = train.checkpoint_bytes(job.manager.save(checkpoint_number=0))
    assert schema.checkpoint_bytes(config) == pytest.approx(written, rel=TOLERANCE)


def test_the_table_covers_every_model():
    """Every image model; BERT's sizes come from its shape (test_bert.py holds them)."""
    for table in (schema.CHECKPOINT_TRUNK_BYTES, schema.HEAD_FEATURES, schema.DEFAULT_CLASSES):
        assert set(table) == set(schema.IMAGE_MODELS)
    assert set(schema.BERT_SIZES) == set(schema.MODEL_NAMES) - set(schema.IMAGE_MODELS)
    for name in schema.IMAGE_MODELS:  # the defaults are the models' own
        spec = models.model_spec(JobConfig(name, "unused", 1, 1))
        assert spec.num_classes == schema.DEFAULT_CLASSES[name]


def forward_macs(model) -> int:
    """The multiply-adds of one example through the model's Conv2D and Dense layers."""
    total = 0
    for layer in model.submodules:
        if isinstance(layer, keras.layers.Conv2D):
            height, width = layer.output.shape[1:3]
            total += height * width * layer.kernel.shape.num_elements()
        elif isinstance(layer, keras.layers.Dense):
            total += layer.kernel.shape.num_elements()
    return total


@pytest.mark.parametrize(("shape", "tolerance"), [
    ({"model": "mnist_cnn"}, 0.01),
    ({"model": "resnet50", "imageSize": 224}, 0.01),
    # Scaled about: the first layer's input channels do not scale with the width.
    ({"model": "resnet18", "imageSize": 112, "widthMultiplier": 0.5}, 0.15),
], ids=["mnist_cnn", "resnet50-224", "resnet18-112-0.5"])
def test_the_flops_table_matches_the_models(strategy, shape, tolerance):
    """The preview's step-time estimate (model/stop_save.py) counts these."""
    config = JobConfig.from_dict({"trainData": "unused", "globalBatchSize": 1, "trainSteps": 1,
                                  "stepsPerExecution": 1, "checkpointEverySteps": 1, **shape},
                                 resolved=False)
    macs = forward_macs(models.build_model(models.model_spec(config)))
    assert schema.train_flops_per_example(config) == pytest.approx(6 * macs, rel=tolerance)
