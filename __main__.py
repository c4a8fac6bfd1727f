"""tpu-stack: Cloud TPU training capacity as code. Config in, TpuPlatform out."""

import pulumi

from components.platform import TpuPlatform
from components.stack_config import program_config
from model.settings.load import load_settings
from model.settings.schema import SettingsError

try:
    settings = load_settings(program_config(), pulumi.get_stack(), pulumi.get_organization())
except SettingsError as error:
    # One message listing every problem, and no Python traceback (RunError).
    raise pulumi.RunError(str(error)) from None

platform = TpuPlatform("tpu-stack", settings)
for key, value in platform.outputs().items():
    pulumi.export(key, value)
