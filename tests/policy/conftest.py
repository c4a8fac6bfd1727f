"""Call the pack's policies directly (importing policy/__main__ would block serving)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    StackValidationArgs,
)

from model.settings.load import ENVIRONMENT_KEY
from policy.tpu_policies import POLICIES, reviewing

BY_NAME = {policy.name: policy for policy in POLICIES}


def urn(type_: str, name: str, stack: str = "prod") -> str:
    return f"urn:pulumi:{stack}::tpu-stack::{type_}::{name}"


def _opts(protect: bool) -> PolicyResourceOptions:
    return PolicyResourceOptions(protect, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])


def _stack_config(environment: str | None) -> dict[str, str]:
    """The stack config the engine hands the pack (None: no tpu-stack:environment)."""
    return {} if environment is None else {ENVIRONMENT_KEY: environment}


def _check(policy: str, type_: str, props: Mapping[str, Any], *, name: str = "res",
          stack: str = "prod", environment: str | None = None, protect: bool = False,
          config: Mapping[str, Any] | None = None) -> list[str]:
    """Messages a resource policy reports for one resource of `stack`, whose
    tpu-stack:environment is `environment` (None: unset, so prod)."""
    messages: list[str] = []
    args = ResourceValidationArgs(type_, props, urn(type_, name, stack), name, _opts(protect),
                                  None, dict(config or {}))
    with reviewing(_stack_config(environment)):
        BY_NAME[policy].validate(args, lambda message, _urn=None: messages.append(message))
    return messages


def _check_stack(policy: str, resources: list[tuple[str, str, Mapping[str, Any]]], *,
                stack: str = "prod", environment: str | None = None,
                config: Mapping[str, Any] | None = None) -> list[str]:
    """Messages a stack policy reports; resources are (type, name, props)."""
    messages: list[str] = []
    stack_resources = [
        PolicyResource(t, p, urn(t, n, stack), n, _opts(False), None, None, [], {})
        for t, n, p in resources
    ]
    with reviewing(_stack_config(environment)):
        BY_NAME[policy].validate(StackValidationArgs(stack_resources, dict(config or {})),
                                 lambda message, _urn=None: messages.append(message))
    return messages


@pytest.fixture
def check():
    """`check(policy, type, props, name=, stack=, environment=, protect=, config=)` → messages."""
    return _check


@pytest.fixture
def check_stack():
    """`check_stack(policy, [(type, name, props)], stack=, environment=, config=)` → messages."""
    return _check_stack


@pytest.fixture
def good_node() -> dict[str, Any]:
    """A compliant TPU node's inputs, camelCase as the engine sends them."""
    return {
        "acceleratorType": "v5litepod-8",
        "runtimeVersion": "tpu-vm-tf-2.18.0-pjrt",
        "serviceAccount": {"email": "tpu-runtime@acme-ml-prod.iam.gserviceaccount.com"},
        "networkConfig": {"enableExternalIps": False},
        "schedulingConfig": {},
        "labels": {"stack": "prod", "managed-by": "pulumi", "team": "vision"},
    }
