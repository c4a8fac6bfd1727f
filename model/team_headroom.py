"""Offline headroom of a team's node from what is known (issue 45): the team's cap in its
project (model/team_quota.py, the platform's settings) less what the team's other nodes
take. An upper bound, shown `<=N` like the platform's declared headroom
(model/candidates.py): nodes made outside the stack are unknown offline."""

from __future__ import annotations

from model import candidates
from model.settings.schema import NodeSettings, StackSettings
from model.team_quota import quota_caps
from model.team_regions import team_regions


def node_team(settings: StackSettings, node: NodeSettings) -> str | None:
    """The team `node` runs for: its team's (a team stack's own nodes: the stack's team)."""
    return next((team for team, n in settings.named_nodes if n is node), None)


def team_caps(platform: StackSettings, team: str) -> dict[candidates.QuotaKey, int]:
    """(quota, region) → chips of the team's caps (as candidates.quota_of keys them)."""
    granted = {family: sorted(regions) for family, regions in platform.quota.items()}
    caps = quota_caps(platform.teams[team].quota, granted, team_regions(platform, team))
    return {(cap.quota_id or f"{cap.family} {cap.quota_type}", cap.region): cap.chips
            for cap in caps}


def cap_headroom(platform: StackSettings | None) -> candidates.Headroom:
    """A Headroom (candidates.stack_candidates) that knows teams' caps: the platform's own
    nodes keep candidates.declared_headroom; a team's node gets its team's cap less its
    team's other nodes; {} (unknown) where the platform's settings are not at hand."""
    def headroom(settings: StackSettings, node: NodeSettings) -> dict[candidates.QuotaKey, str]:
        team = node_team(settings, node)
        if team is None:
            return candidates.declared_headroom(settings, node)
        if platform is None or team not in platform.teams:
            return {}
        taken = candidates.taken_by_others(settings, node)
        return {key: f"<={chips - taken.get(key, 0)}"
                for key, chips in team_caps(platform, team).items()}
    return headroom
