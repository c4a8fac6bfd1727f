"""What a team stack's offline plan knows of its platform stack: the platform's checked
settings, read from its stack file in this repository (as the mock engine plans its
outputs, ops/plan/mock_engine.py referenced_stack_outputs). None where there is no such
file or it does not load: the plan then shows what it cannot know as unknown."""

from __future__ import annotations

import functools

from components.stack_config import StackFileError, settings_for
from model.settings.schema import NAMESPACE, SettingsError, StackSettings
from model.settings.suggest import did_you_mean


def platform_settings(settings: StackSettings) -> StackSettings | None:
    """The platform stack's settings for a team stack; the stack's own otherwise."""
    if not settings.is_team_stack:
        return settings
    return read_platform((settings.platform_stack or "").rsplit("/", 1)[-1])


@functools.cache
def read_platform(stack: str) -> StackSettings | None:
    """A platform stack's settings from its file here, read once per process (as
    mock_engine.planned_stack_run plans it once); None where it does not load."""
    try:
        return settings_for(stack)
    except (StackFileError, SettingsError, OSError):
        return None


def data_location(settings: StackSettings) -> str | None:
    """Where the stack's nodes read their relative data paths: the platform's storage
    location (a team stack reads the platform's data bucket)."""
    platform = platform_settings(settings)
    return platform.storage.location if platform is not None else None


def check_team(settings: StackSettings) -> None:
    """A team stack's `team` that its platform does not serve: one settings error that
    lists the platform's teams (the program, reading one outputs object, cannot)."""
    platform = platform_settings(settings)
    if not settings.is_team_stack or platform is None or settings.team in platform.teams:
        return
    teams = sorted(platform.teams)
    raise SettingsError([(f"{NAMESPACE}:team", (
        f"{settings.team!r} is not a team of {settings.platform_stack} (its "
        f"{NAMESPACE}:teams: {', '.join(teams) or 'none'})"
        f"{did_you_mean(settings.team, teams, set())}"))])
