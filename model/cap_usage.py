"""A team's budget and cap usage for the plan's summary (issue 45): what the stack's
nodes of each team take of the team's caps (at their own placement, as `up` tries it
first), its USD-per-hour ceiling and its monthly budget. A team stack reads its team's
settings from the platform's (ops/plan/platform_facts.py)."""

from __future__ import annotations

from typing import Any

from model import catalog
from model.settings.schema import StackSettings, TeamSettings

CAPACITIES = ("onDemand", "spot", "reserved")


def served_teams(settings: StackSettings,
                 platform: StackSettings | None) -> dict[str, TeamSettings]:
    """The teams whose caps this stack's nodes draw on, with their settings."""
    if not settings.is_team_stack:
        return dict(settings.teams)
    if platform is None or settings.team not in platform.teams:
        return {}
    return {settings.team: platform.teams[settings.team]}


def team_usage(settings: StackSettings, platform: StackSettings | None) -> dict[str, Any]:
    """Per team: its caps with the chips this stack's nodes take, its ceiling, budget."""
    result = {}
    for team, spec in sorted(served_teams(settings, platform).items()):
        used: dict[tuple[str, str], int] = {}
        for owner, node in settings.named_nodes:
            if owner == team:
                key = (node.tpu.generation.name, node.capacity)
                used[key] = used.get(key, 0) + node.tpu.chips
        caps = [{"family": family, "capacity": capacity,
                 "used": used.get((family, capacity), 0),
                 "cap": spec.quota.chips(family).of(capacity)}
                for family in sorted(catalog.GENERATIONS) for capacity in CAPACITIES
                if spec.quota.chips(family).of(capacity) or used.get((family, capacity))]
        result[team] = {"caps": caps, "usdPerHourCeiling": spec.quota.usd_per_hour,
                        "budgetUsdPerMonth": spec.budget_usd_per_month,
                        "budgetAction": spec.budget_action}
    return result


def with_team_budgets(settings: StackSettings, platform: StackSettings | None) -> StackSettings:
    """A team stack's settings with its team's budget from the platform (its nodes
    left out: the meter counts this stack's nodes only), for model/meter.py."""
    teams = served_teams(settings, platform)
    if not settings.is_team_stack or not teams:
        return settings
    return settings.model_copy(update={"teams": {
        team: spec.model_copy(update={"nodes": []}) for team, spec in teams.items()}})
