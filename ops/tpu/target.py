"""What tpuctl needs to know about a stack: its project, its nodes, where they live.

Built from the lead's `StackSettings` (components/stack_config.py) so the node ids,
slices and projects are exactly those `pulumi up` makes; tests build one directly.
A team's nodes live in the team's own project (docs/teams.md), so one stack's
nodes may span several projects: every node carries its own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from cloud import gcp_credentials
from components.stack_config import StackFileError, settings_for, stack_file_config
from model.archive import REPO_ROOT
from model.fleet import (
    StackTarget,
    TargetError,
    target_for,
)
from model.settings.schema import SettingsError, StackSettings

# The stack file's gcp: keys that choose the gcp provider's credentials.
GCP_AUTH_KEYS = (*gcp_credentials.CONFIG_KEYS.values(), *gcp_credentials.UNSUPPORTED_KEYS)
# The provider's environment variables that stand for a key tpuctl cannot read: a
# secret (`secure:`) needs the stack's passphrase or secrets provider to decrypt.
ENV_FOR_SECRET = {
    gcp_credentials.CONFIG_KEYS["access_token"]: (gcp_credentials.ACCESS_TOKEN_ENV,),
    gcp_credentials.CONFIG_KEYS["credentials"]: gcp_credentials.CREDENTIALS_ENV,
}


def load_target(stack: str, root: Path = REPO_ROOT,
                env: Mapping[str, str] | None = None) -> StackTarget:
    """The stack's target from Pulumi.yaml + Pulumi.<stack>.yaml, or one clear TargetError."""
    try:
        settings = settings_for(stack, root)
        target = target_for(settings, platform_settings(settings, root))
        return replace(target, gcp=gcp_config(stack, root, os.environ if env is None else env))
    except (SettingsError, StackFileError) as error:
        raise TargetError(str(error)) from None


def platform_settings(settings: StackSettings, root: Path) -> StackSettings | None:
    """A team stack's platform stack (`tpu-stack:platformStack`, org/project/<stack>), if
    its file is in this checkout and valid: the team's cap is set there. Else None."""
    if not settings.platform_stack:
        return None
    try:
        return settings_for(settings.platform_stack.rsplit("/", 1)[-1], root)
    except (SettingsError, StackFileError):
        return None


def gcp_config(stack: str, root: Path, env: Mapping[str, str]) -> dict[str, Any]:
    """The stack file's gcp: credential keys. A secret one is left to the provider's
    environment variable for it, which tpuctl then needs: it decrypts no secrets."""
    raw = stack_file_config(stack, root)
    config = {}
    for key in GCP_AUTH_KEYS:
        value = raw.get(key)
        if not (isinstance(value, dict) and "secure" in value):
            if value is not None:
                config[key] = value
            continue
        names = ENV_FOR_SECRET.get(key, ())
        if not any(env.get(name) for name in names):
            instead = f": set {' or '.join(names)} to its value" if names else ""
            raise TargetError(f"{key} is a secret in Pulumi.{stack}.yaml, which tpuctl cannot "
                              f"decrypt{instead}")
    return config
