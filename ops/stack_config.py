"""The ops CLI reads stacks the way `pulumi up` does: through components.stack_config."""

from components.settings import StackSettings
from components.stack_config import settings_for


def load_settings(stack: str) -> StackSettings:
    return settings_for(stack)
