"""The Pulumi program (the repo's __main__.py runs it): settings in, TpuPlatform out.

`pulumi up` and `pulumi preview` parse the stack's settings from the config Pulumi
passes; an offline plan (ops/plan/offline.py) has parsed them already and hands them
in, so one plan parses the config once.
"""

from __future__ import annotations

import pulumi

from components.platform import TpuPlatform
from components.stack_config import program_config
from model.settings.load import load_settings
from model.settings.schema import SettingsError, StackSettings


def program_settings() -> StackSettings:
    """The running stack's settings, from the config Pulumi passes the program."""
    try:
        return load_settings(program_config(), pulumi.get_stack(), pulumi.get_organization())
    except SettingsError as error:
        # One message listing every problem, and no Python traceback (RunError).
        raise pulumi.RunError(str(error)) from None


def declare(settings: StackSettings) -> TpuPlatform:
    """The whole stack and its outputs."""
    platform = TpuPlatform("tpu-stack", settings)
    for key, value in platform.outputs().items():
        pulumi.export(key, value)
    return platform
