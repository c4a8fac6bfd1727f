"""Where a team is: the regions its subnets and quota caps exist in (docs/teams.md,
"Regions per team").

A team's regions are the ones it declares (`tpu-stack:teams.<team>.regions`) and those
of the nodes the platform declares for it, each fallback candidate's included. Declared,
because the platform never reads a team stack's nodes: the team names where its own
stack places them. Another team's region is never one of them, so adding a region for
one team creates no subnet, grant nor cap for any other (issue 45).
"""

from __future__ import annotations

from model import catalog
from model.settings.schema import NAMESPACE, StackSettings, TeamSettings

REGIONS_KEY = "regions"


def regions_key(team: str) -> str:
    return f"{NAMESPACE}:teams.{team}.{REGIONS_KEY}"


def used_regions(spec: TeamSettings) -> set[str]:
    """The regions of the nodes the platform declares for the team, candidates included."""
    return {catalog.region_of(c.zone) for node in spec.nodes for c in node.candidates}


def team_regions(settings: StackSettings, team: str) -> list[str]:
    """The team's regions: declared, and those its platform-declared nodes use; for a
    team with neither, every region of the platform (the rule before issue 45, kept so
    an existing stack changes nothing; the plan warns, regions_warning)."""
    spec = settings.teams[team]
    return sorted(set(spec.regions) | used_regions(spec)) or settings.regions


def regions_warning(settings: StackSettings, team: str) -> str | None:
    """Why a team without regions gets a subnet and caps wherever the platform is."""
    spec = settings.teams[team]
    if spec.regions or used_regions(spec):
        return None
    return (f"team {team} names no regions and the platform declares none of its nodes: its "
            f"subnets and quota caps follow every region of the platform "
            f"({', '.join(settings.regions) or 'none'}), so another team's new region adds "
            f"its own; set {regions_key(team)} to the regions its team stack uses")


def add_region_hint(team: str, regions: list[str], region: str) -> str:
    """The exact key and value that gives `team` a subnet and quota caps in `region`."""
    value = ", ".join(sorted({*regions, region}))
    return f"set {regions_key(team)}: [{value}] in the platform stack"
