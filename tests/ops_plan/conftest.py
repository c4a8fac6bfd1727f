"""Plans as `Plan.to_json()` dicts, so diff and report tests need no engine."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from model.pulumi_types import STORAGE_BUCKET, TPU_V2_VM

V2VM = TPU_V2_VM
BUCKET = STORAGE_BUCKET
LABELS = {"stack": "dev", "managed-by": "pulumi"}

PlanFactory = Callable[..., dict[str, Any]]


def node_inputs(accelerator: str = "v5litepod-8", *, spot: bool = False) -> dict[str, Any]:
    return {
        "acceleratorType": accelerator,
        "runtimeVersion": "tpu-vm-tf-2.18.0-pjrt",
        "zone": "us-central1-a",
        "serviceAccount": {"email": "tpu-runtime@acme-ml-dev.iam.gserviceaccount.com"},
        "schedulingConfig": {"spot": spot},
        "labels": dict(LABELS),
        "metadata": {"startup-script": "#!/bin/bash\n"},
    }


def resource(type_: str, name: str, inputs: dict[str, Any], *, stack: str = "dev",
             protect: bool = False) -> dict[str, Any]:
    return {"urn": f"urn:pulumi:{stack}::tpu-stack::{type_}::{name}", "type": type_,
            "name": name, "component": None, "parent": None, "custom": True,
            "inputs": inputs, "protect": protect, "deleteBeforeReplace": type_ == V2VM}


def _plan(nodes: dict[str, dict[str, Any]] | None = None, *, stack: str = "dev",
          usd_per_hour: dict[str, float | None] | None = None) -> dict[str, Any]:
    nodes = {"trainer": node_inputs()} if nodes is None else nodes
    prices = usd_per_hour or {}
    bucket = {"uniformBucketLevelAccess": True, "publicAccessPrevention": "enforced",
              "forceDestroy": True, "labels": dict(LABELS)}
    resources = [resource(BUCKET, "checkpoints", bucket, stack=stack)]
    resources += [resource(V2VM, name, {"name": f"{stack}-{name}", **copy.deepcopy(inputs)},
                           stack=stack)
                  for name, inputs in nodes.items()]
    cost_nodes = [{"name": name, "usdPerHour": prices.get(name, 9.6),
                   "spotSavingUsdPerHour": 4.744} for name in nodes]
    known = [n["usdPerHour"] for n in cost_nodes if n["usdPerHour"] is not None]
    # The environment the repo's stack of that name sets (Plan.to_json records it).
    environment = "dev" if stack == "dev" else "prod"
    return {"stack": stack, "environment": environment, "project": f"acme-ml-{stack}",
            "resources": resources,
            "outputs": {}, "cost": {"nodes": cost_nodes, "usdPerHour": sum(known),
                                    "currency": "USD"}}


@pytest.fixture
def make_plan() -> PlanFactory:
    """`make_plan({name: inputs}, stack=, usd_per_hour={name: price})` → a plan dict."""
    return _plan


@pytest.fixture
def node() -> Callable[..., dict[str, Any]]:
    return node_inputs
