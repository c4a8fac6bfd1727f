"""Where the stack config comes from: the one place it is read.

`program_config()` is what the Pulumi CLI hands a running program;
`file_config(stack)` builds the same mapping from the files, exactly as the CLI
would (Pulumi.yaml's project config, then Pulumi.<stack>.yaml key by key), so
offline plans and tests see what `pulumi up` sees.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pulumi.runtime import config as runtime_config

from components.archive import REPO_ROOT
from components.settings import NAMESPACE, StackSettings, load_settings


class StackFileError(ValueError):
    """A missing or unreadable Pulumi.<stack>.yaml."""


def program_config() -> dict[str, Any]:
    """Every config value of the running program (PULUMI_CONFIG and any set
    explicitly, as under the mock engine)."""
    return {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}


def cli_value(value: Any) -> str:
    """A config value as the CLI passes it: objects as JSON, scalars as text."""
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _full_key(key: str) -> str:
    return key if ":" in key else f"{NAMESPACE}:{key}"


def project_defaults(root: Path = REPO_ROOT) -> dict[str, Any]:
    """Pulumi.yaml's `config`: schema defaults and plain values, by full key."""
    project = yaml.safe_load((root / "Pulumi.yaml").read_text()) or {}
    values: dict[str, Any] = {}
    for key, declared in (project.get("config") or {}).items():
        if isinstance(declared, dict) and ({"type", "description", "default", "value"}
                                           & declared.keys()):
            if "value" in declared:
                values[_full_key(key)] = declared["value"]
            elif "default" in declared:
                values[_full_key(key)] = declared["default"]
        else:
            values[_full_key(key)] = declared
    return values


def stack_names(root: Path = REPO_ROOT) -> list[str]:
    return sorted(p.name[len("Pulumi."):-len(".yaml")] for p in root.glob("Pulumi.*.yaml"))


def file_config(stack: str, root: Path = REPO_ROOT) -> dict[str, str]:
    """The program's config for `stack`, as the CLI would build it."""
    path = root / f"Pulumi.{stack}.yaml"
    if not path.exists():
        known = ", ".join(stack_names(root)) or "none"
        raise StackFileError(f"no stack file {path.name} (stacks here: {known})")
    try:
        stack_file = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as error:
        raise StackFileError(f"{path.name} is not valid YAML: {error}") from None
    values = project_defaults(root)
    values.update({_full_key(k): v for k, v in (stack_file.get("config") or {}).items()})
    return {key: cli_value(value) for key, value in values.items()}


def settings_for(stack: str, root: Path = REPO_ROOT) -> StackSettings:
    """The checked settings of a stack file (raises SettingsError/StackFileError)."""
    return load_settings(file_config(stack, root), stack)
