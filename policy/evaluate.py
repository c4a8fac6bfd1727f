"""Run the pack's policies on an offline plan (`ops.plan.offline.offline_plan(...).to_json()`).

The engine is not involved: each plan resource becomes the args a policy sees
during `pulumi preview`, every policy runs against it, and the violations come
back as data for `tpuctl plan` to print.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pulumi_policy import (
    EnforcementLevel,
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from model.settings.load import ENVIRONMENT_KEY
from policy.tpu_policies import POLICIES, reviewing

PolicyConfig = Mapping[str, Mapping[str, Any]]
# The config CI passes to `pulumi preview` (.github/workflows/preview.yml).
CONFIG_PATH = Path(__file__).resolve().parent / "config.json"
LEVELS = ("advisory", "mandatory", "remediate", "disabled")


@dataclass(frozen=True)
class Violation:
    policy: str
    message: str
    urn: str | None  # None: the stack as a whole
    advisory: bool = False  # a warning: shown, never failing the plan

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "advisory" or v}


def load_config(path: Path | None = CONFIG_PATH) -> dict[str, dict[str, Any]]:
    """A policy config file (`{policy: {setting: value} | level}`, as `pulumi preview
    --policy-pack-config` reads it), normalised to `{policy: {setting: value}}`."""
    if path is None:
        return {}
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"policy config {path}: {error}") from None
    if not _is_config(raw):
        raise ValueError(f"policy config {path}: expected {{policy name: {{setting: value}} "
                         f"or an enforcement level ({', '.join(LEVELS)})}}")
    return {name: value if isinstance(value, dict) else {"enforcementLevel": value}
            for name, value in raw.items()}


def _is_config(raw: Any) -> bool:
    return isinstance(raw, dict) and all(
        isinstance(v, dict) or v in LEVELS for v in raw.values())


def _options(resource: Mapping[str, Any]) -> PolicyResourceOptions:
    return PolicyResourceOptions(
        protect=bool(resource.get("protect")), ignore_changes=[],
        delete_before_replace=resource.get("deleteBeforeReplace"), aliases=[],
        custom_timeouts=PolicyCustomTimeouts(0, 0, 0), additional_secret_outputs=[],
        parent=resource.get("parent"))


def _custom_resources(plan: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [r for r in plan.get("resources", []) if r.get("custom", True)]


def _settings(config: PolicyConfig, name: str) -> dict[str, Any]:
    settings = dict(config.get(name) or {})
    settings.pop("enforcementLevel", None)
    return settings


def _disabled(config: PolicyConfig, name: str) -> bool:
    level = (config.get(name) or {}).get("enforcementLevel")
    return (level or (config.get("all") or {}).get("enforcementLevel")) == "disabled"


def _collector(violations: list[Violation], policy: str,
               default_urn: str | None = None, advisory: bool = False) -> ReportViolation:
    def report(message: str, urn: str | None = None) -> None:
        violations.append(Violation(policy, message, urn or default_urn, advisory))
    return report


def evaluate(plan: Mapping[str, Any], config: PolicyConfig | None = None) -> list[Violation]:
    """Every violation of every enabled policy on the plan's custom resources.

    The pack sees the stack's config as the engine would hand it: here its
    `tpu-stack:environment`, which the plan records (absent: prod)."""
    environment = plan.get("environment")
    stack_config = {ENVIRONMENT_KEY: environment} if environment else {}
    with reviewing(stack_config):
        return _evaluate(plan, config or {})


def _evaluate(plan: Mapping[str, Any], config: PolicyConfig) -> list[Violation]:
    resources = _custom_resources(plan)
    violations: list[Violation] = []
    for policy in POLICIES:
        if _disabled(config, policy.name):
            continue
        settings = _settings(config, policy.name)
        if isinstance(policy, ResourceValidationPolicy):
            for r in resources:
                args = ResourceValidationArgs(r["type"], r.get("inputs", {}), r["urn"], r["name"],
                                              _options(r), None, settings)
                policy.validate(args, _collector(
                    violations, policy.name, r["urn"],
                    policy.enforcement_level == EnforcementLevel.ADVISORY))
        elif isinstance(policy, StackValidationPolicy):
            stack = [PolicyResource(r["type"], r.get("inputs", {}), r["urn"], r["name"],
                                    _options(r), None, None, [], {}) for r in resources]
            report = _collector(violations, policy.name)
            policy.validate(StackValidationArgs(stack, settings), report)
    return violations
