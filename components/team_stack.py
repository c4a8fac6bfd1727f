"""A team stack's view of its platform stack, through a StackReference.

The platform stack (docs/teams.md) exports its project, network and, per team,
members, quota and labels. A team stack reads them here and checks, before any
node is declared, that the platform serves this team in this project, that its
nodes fit the quota the platform granted it and that every node's region has
a platform subnet. Everything of the team stack (buckets, grants, package,
nodes) takes the team's project id and runtime account from that check, so a
failed check stops all of it at preview.
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_gcp as gcp

from model import catalog, team_state
from model.settings.rules.teams import COST_CENTRE, TEAMS_KEY, team_quota_problems
from model.settings.schema import NAMESPACE, StackSettings, TeamQuota
from model.team_regions import add_region_hint

REFERENCE_NAME = "platform"


class PlatformStackError(pulumi.RunError):
    """The platform stack does not serve this team stack; names every problem."""


def contract_problems(settings: StackSettings, outputs: dict[str, Any]) -> list[tuple[str, str]]:
    """What the platform stack's `outputs` refuse this team stack, as (key, message)."""
    ref, team = settings.platform_stack, settings.team
    bucket = settings.platform_outputs_bucket
    if bucket and not outputs:
        platform = (ref or "").rsplit("/", 1)[-1]
        uri = f"gs://{bucket}/{team_state.outputs_object(platform, team)}"
        return [(f"{NAMESPACE}:team",
                 f"{team!r}: no outputs object {uri}: {ref} writes one for each of its "
                 f"{TEAMS_KEY} (its teamProjects.stateBucket being {bucket}); is {team!r} "
                 f"one of them, spelt as there, and has its `pulumi up` run since?")]
    missing = [key for key in ("projectId", "teams", "network") if outputs.get(key) is None]
    if missing:
        return [(f"{ref}", f"has no output {', '.join(missing)}: is it a platform stack "
                           f"(one with {TEAMS_KEY})?")]
    problems: list[tuple[str, str]] = []
    if outputs["projectId"] != settings.gcp_project:
        problems.append(("gcp:project", f"{settings.gcp_project} is not the platform's "
                                        f"project ({outputs['projectId']})"))
    entry = outputs["teams"].get(team)
    if entry is None:
        known = ", ".join(sorted(outputs["teams"])) or "none"
        return [*problems, ("tpu-stack:team", f"{team!r} is not a team of {ref} "
                                              f"({TEAMS_KEY}: {known})")]
    for key in ("projectId", "serviceAccount"):
        if entry.get(key) is None:
            problems.append((f"{TEAMS_KEY}.{team}", f"{ref} has no output teams.{team}.{key}: "
                                                   f"it predates team projects; run its `pulumi "
                                                   f"up` first (docs/teams.md, Migrating)"))
    theirs, ours = entry.get("labels", {}).get(COST_CENTRE), settings.labels.get(COST_CENTRE)
    if theirs != ours:
        problems.append((f"tpu-stack:labels.{COST_CENTRE}", f"{ours!r} is not team {team}'s cost "
                                                            f"centre in {ref} ({theirs!r})"))
    quota = TeamQuota.model_validate(entry["quota"])
    problems += team_quota_problems(f"{TEAMS_KEY}.{team}.quota", team, settings.nodes, quota)
    subnets = entry.get("subnets")
    if subnets is None:
        return [*problems, (f"{TEAMS_KEY}.{team}", f"{ref} has no output teams.{team}.subnets: "
                                                  f"it predates team subnets; run its `pulumi "
                                                  f"up` first (docs/teams.md, The network)")]
    for index, node in enumerate(settings.nodes):
        # A fallback candidate's region too (issue 35): the node may be placed there.
        for position, candidate in enumerate(node.candidates):
            region = catalog.region_of(candidate.zone)
            if region not in subnets:
                where = "" if position == 0 else f".fallback[{position - 1}]"
                problems.append((f"tpu-stack:nodes[{index}]{where}.zone",
                                 f"{ref} has no subnet of team {team} in {region} (team "
                                 f"{team}'s regions: {', '.join(sorted(subnets)) or 'none'}): "
                                 f"{add_region_hint(team, sorted(subnets), region)}"))
    return problems


def usage(settings: StackSettings) -> dict[str, dict[str, int]]:
    """Chips the team stack's nodes hold, per family and capacity."""
    used: dict[str, dict[str, int]] = {}
    for node in settings.nodes:
        by_capacity = used.setdefault(node.tpu.generation.name, {})
        by_capacity[node.capacity] = by_capacity.get(node.capacity, 0) + node.tpu.chips
    return used


class PlatformReference:
    """The platform stack's outputs this team stack consumes, checked."""

    def __init__(self, settings: StackSettings,
                 opts: pulumi.ResourceOptions | None = None) -> None:
        self.settings = settings
        outputs = self._outputs(opts)
        checked = self._checked = outputs.apply(self._check)
        self.checked_project_id: pulumi.Output[str] = checked.apply(lambda o: o["projectId"])
        team = settings.team
        # The team's own project and runtime account, which the platform declares.
        self.team_project_id: pulumi.Output[str] = checked.apply(
            lambda o: o["teams"][team]["projectId"])
        self.account_email: pulumi.Output[str] = checked.apply(
            lambda o: o["teams"][team]["serviceAccount"])
        self.checked_usage = checked.apply(lambda _: usage(settings))
        self.network_id: pulumi.Output[str] = checked.apply(lambda o: o["network"]["id"])
        self.members: pulumi.Output[list[str]] = checked.apply(
            lambda o: o["teams"][settings.team]["members"])

    def _outputs(self, opts: pulumi.ResourceOptions | None) -> pulumi.Output[dict[str, Any]]:
        """The platform's outputs for this team: its object in the state bucket on a
        shared gs:// backend (`platformOutputsBucket`, team_state.outputs_object), else a
        StackReference (Pulumi Cloud, where a team token reads the stack)."""
        settings = self.settings
        if not settings.platform_outputs_bucket:
            self.reference = pulumi.StackReference(
                REFERENCE_NAME, stack_name=settings.platform_stack, opts=opts)
            return self.reference.outputs
        platform = (settings.platform_stack or "").rsplit("/", 1)[-1]
        found = gcp.storage.get_bucket_object_content_output(
            bucket=settings.platform_outputs_bucket,
            name=team_state.outputs_object(platform, settings.team))
        return found.content.apply(lambda text: json.loads(text) if text else {})

    def subnet(self, region: str) -> pulumi.Output[str]:
        return self._checked.apply(lambda o: o["network"]["subnets"][region])

    def team_subnet(self, region: str) -> pulumi.Output[str]:
        """The team's own subnet in `region` (teams.<team>.subnets): its nodes' addresses."""
        team = self.settings.team
        return self._checked.apply(lambda o: o["teams"][team]["subnets"][region])

    def _check(self, outputs: dict[str, Any]) -> dict[str, Any]:
        problems = contract_problems(self.settings, outputs or {})
        if problems:
            raise PlatformStackError(refusal(self.settings.platform_stack or "", problems))
        return outputs


def refusal(ref: str, problems: list[tuple[str, str]]) -> str:
    """One message: every problem, `tpu-stack:teams…` keys being the platform stack's."""
    lines = "\n".join(f"  {key}: {message}" for key, message in problems)
    count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
    return (f"the platform stack {ref} does not serve this team stack ({count}; "
            f"{TEAMS_KEY} keys are {ref}'s config):\n{lines}")


def read_outputs_object(settings: StackSettings) -> dict[str, Any]:
    """The platform's outputs object for this team stack's team, read synchronously at
    program time (gcp.storage.get_bucket_object_content, the invoke the platform
    reference reads it with): what the nodes' hold and the manifest's grant depend on
    before any Output resolves. Empty on Pulumi Cloud (a StackReference: not read here),
    without an object, or when it is not JSON."""
    if not settings.platform_outputs_bucket:
        return {}
    platform = (settings.platform_stack or "").rsplit("/", 1)[-1]
    found = gcp.storage.get_bucket_object_content(
        bucket=settings.platform_outputs_bucket,
        name=team_state.outputs_object(platform, settings.team))
    try:
        view = json.loads(found.content or "{}")
    except ValueError:
        return {}
    return view if isinstance(view, dict) else {}
