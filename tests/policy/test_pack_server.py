"""The pack as the engine meets it: `policy/__main__.py` serving gRPC on loopback.

GetAnalyzerInfo lists the policies; Analyze runs them on properties and
options sent the way `pulumi preview --policy-pack policy` sends them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import empty_pb2, struct_pb2
from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc

from model.pulumi_types import STORAGE_BUCKET, TPU_V2_VM
from policy.tpu_policies import POLICIES

POLICY_DIR = Path(__file__).resolve().parents[2] / "policy"


def _serve(stack_config: dict[str, str] | None) -> Iterator[analyzer_pb2_grpc.AnalyzerStub]:
    # The engine starts the pack in its directory with the stack's config in
    # PULUMI_CONFIG (pulumi/pulumi analyzer_plugin.go, constructEnv); it prints its port.
    env = {k: v for k, v in os.environ.items() if k != "PULUMI_CONFIG"}
    if stack_config is not None:
        env["PULUMI_CONFIG"] = json.dumps(stack_config)
    pack = subprocess.Popen([sys.executable, "__main__.py"], cwd=POLICY_DIR, env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        port = int(pack.stdout.readline())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield analyzer_pb2_grpc.AnalyzerStub(channel)
    finally:
        pack.terminate()
        pack.wait(timeout=10)


@pytest.fixture(scope="module")
def analyzer() -> Iterator[analyzer_pb2_grpc.AnalyzerStub]:
    """The pack for a stack whose config sets no tpu-stack:environment (so prod)."""
    yield from _serve({"tpu-stack:team": "research"})


@pytest.fixture(scope="module")
def dev_analyzer() -> Iterator[analyzer_pb2_grpc.AnalyzerStub]:
    """The pack for a stack with tpu-stack:environment dev, as the engine starts it."""
    yield from _serve({"tpu-stack:environment": "dev", "gcp:project": "acme-ml-dev"})


def _struct(values: dict[str, Any]) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    message.update(values)
    return message


def analyze(stub: analyzer_pb2_grpc.AnalyzerStub, type_: str, name: str,
            props: dict[str, Any], *, stack: str = "prod", protect: bool = False) -> list[str]:
    request = analyzer_pb2.AnalyzeRequest(
        type=type_, name=name, urn=f"urn:pulumi:{stack}::tpu-stack::{type_}::{name}",
        properties=_struct(props), options=analyzer_pb2.AnalyzerResourceOptions(protect=protect))
    return sorted(d.policyName for d in stub.Analyze(request).diagnostics)


def test_the_pack_serves_every_policy_as_mandatory(analyzer):
    info = analyzer.GetAnalyzerInfo(empty_pb2.Empty())
    assert info.name == "tpu-stack-guardrails"
    assert {p.name for p in info.policies} == {p.name for p in POLICIES}
    # Mandatory, but for the advisory team-node-limits warning (issue 36).
    levels = {p.name: p.enforcementLevel for p in info.policies}
    assert levels.pop("tpu-team-node-limits") == analyzer_pb2.ADVISORY
    assert set(levels.values()) == {analyzer_pb2.MANDATORY}
    schemas = {p.name: set(p.configSchema.properties) for p in info.policies}
    assert schemas["tpu-spot-stacks"] == {"spotStacks"}


def test_engine_properties_and_options_reach_the_policies(analyzer):
    node = {"acceleratorType": "v5litepod-8", "schedulingConfig": {"spot": True},
            "serviceAccount": {"email": "tpu@acme-ml-prod.iam.gserviceaccount.com"}}
    assert analyze(analyzer, TPU_V2_VM, "vm", node) == ["tpu-spot-stacks"]
    bucket = {"uniformBucketLevelAccess": True, "publicAccessPrevention": "enforced",
              "labels": {"purpose": "checkpoints"}}
    bucket_type = STORAGE_BUCKET
    assert analyze(analyzer, bucket_type, "ckpt", bucket) == ["protected-data-buckets"]
    assert analyze(analyzer, bucket_type, "ckpt", bucket, protect=True) == []


def test_the_stacks_environment_from_the_engine_decides_not_its_name(analyzer, dev_analyzer):
    node = {"acceleratorType": "v5litepod-8", "schedulingConfig": {"spot": True},
            "serviceAccount": {"email": "tpu@acme-ml-dev.iam.gserviceaccount.com"}}
    assert analyze(dev_analyzer, TPU_V2_VM, "vm", node, stack="t12") == []
    assert analyze(analyzer, TPU_V2_VM, "vm", node, stack="dev") == [
        "tpu-spot-stacks"]


def test_the_engine_config_overrides_a_setting(analyzer):
    config = analyzer_pb2.PolicyConfig(enforcementLevel=analyzer_pb2.MANDATORY,
                                       properties=_struct({"spotStacks": ["prod"]}))
    analyzer.Configure(analyzer_pb2.ConfigureAnalyzerRequest(
        policyConfig={"tpu-spot-stacks": config}))
    node = {"acceleratorType": "v5litepod-8", "schedulingConfig": {"spot": True},
            "serviceAccount": {"email": "tpu@acme-ml-prod.iam.gserviceaccount.com"}}
    try:
        assert analyze(analyzer, TPU_V2_VM, "vm", node) == []
    finally:
        analyzer.Configure(analyzer_pb2.ConfigureAnalyzerRequest())
