"""A valid stack config to start from, and ways to break it, for infra tests."""

from __future__ import annotations

import copy
import json
from typing import Any

BASE: dict[str, Any] = {
    "gcp:project": "acme-ml-test",
    "tpu-stack:environment": "dev",
    "tpu-stack:team": "research",
    "tpu-stack:storage": {"location": "us-central1", "forceDestroy": True, "protect": False},
    "tpu-stack:nodes": [
        {"name": "trainer", "zone": "us-central1-a", "acceleratorType": "v5litepod-8",
         "provisioning": "spot", "job": "mnist"},
    ],
    "tpu-stack:jobs": {
        "mnist": {"model": "mnist_cnn", "trainData": "datasets/mnist/train-*.tfrecord",
                  "globalBatchSize": 1024, "trainSteps": 5000, "stepsPerExecution": 100,
                  "checkpointEverySteps": 500},
    },
}


def config(**changes: Any) -> dict[str, Any]:
    """BASE with top-level keys replaced (`tpu_stack_nodes=` → `tpu-stack:nodes`)."""
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        full = key.replace("tpu_stack_", "tpu-stack:").replace("gcp_project", "gcp:project")
        if value is None:
            data.pop(full, None)
        else:
            data[full] = value
    return data


def node(**changes: Any) -> dict[str, Any]:
    """The base node with fields changed (None removes a field)."""
    data = copy.deepcopy(BASE["tpu-stack:nodes"][0])
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


def job(**changes: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE["tpu-stack:jobs"]["mnist"])
    data.update(changes)
    return data


def as_cli(data: dict[str, Any]) -> dict[str, str]:
    """The config as the Pulumi CLI hands it to the program."""
    return {k: json.dumps(v) if isinstance(v, (dict, list)) else str(v) for k, v in data.items()}
