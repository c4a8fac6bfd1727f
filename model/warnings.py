"""Every warning a stack's preview shows, in one registry: the program logs each on
its resource at preview and up, the offline plan lists the same text in the same order.

A rule is a function of the settings; `stack_warnings` runs every rule once, in the
registry's order, and says what each warning is about (a node, a team's project, the
stack's project), so the program logs it on that resource (components/platform.py)
and `tpuctl plan` lists the texts (ops/plan/offline.py). Pure: no pulumi.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from model.candidates import one_quota_warning
from model.locality import cross_region_warning
from model.progress_deadline import progress_deadline_warning
from model.settings.schema import NodeSettings, StackSettings
from model.stop_save import stop_save_warning
from model.team_quota import stack_caps, unconfirmed_id_warning
from model.team_regions import regions_warning
from tpu_training.config import JobConfig


@dataclass(frozen=True)
class StackWarning:
    rule: str  # the registry's id of the rule that made it
    text: str
    node: NodeSettings | None = None  # the node it is about (logged on that node)
    team: str | None = None  # the team whose project it is about (logged on that project)

    def about(self, node: NodeSettings) -> bool:
        return self.node is node


def project_warnings(settings: StackSettings) -> list[str]:
    """What a reviewer must not miss about the stack's projects: a project it creates,
    and a project it turns into a Shared VPC host with a new project per team (docs/
    teams.md, "Who deploys what")."""
    warnings = []
    if settings.project.create:
        p = settings.project
        place = (f"folder {p.folder_id}" if p.folder_id else
                 f"organization {p.org_id}" if p.org_id else "no folder or organization")
        warnings.append(
            f"the stack CREATES project {settings.gcp_project} in {place}, billed to "
            f"{p.billing_account}: the deployer needs roles/resourcemanager.projectCreator "
            f"there and roles/billing.user on the account; `pulumi destroy` will not delete "
            f"it (protect, deletion_policy PREVENT)")
    if settings.teams and not settings.is_team_stack:
        projects = ", ".join(sorted(settings.naming.team_project(team) for team in settings.teams))
        warnings.append(
            f"the stack turns project {settings.gcp_project} into a Shared VPC HOST project "
            f"and attaches one project per team ({projects}) as its service projects: the "
            f"bootstrap step (scripts/bootstrap_team_projects.py, an admin) must have made "
            f"them first, and the deployer needs the folder roles it grants "
            f"(docs/teams.md, \"Who deploys what\")")
    return warnings


Rule = Callable[[StackSettings, str | None], Iterator[StackWarning]]


def _per_node(rule: str, warning: Callable[[StackSettings, NodeSettings, JobConfig],
                                           str | None]) -> tuple[str, Rule]:
    """A rule about each node with its job, every node of the stack in order."""
    def run(settings: StackSettings, _data_location: str | None) -> Iterator[StackWarning]:
        for node, job in settings.node_jobs:
            if text := warning(settings, node, job):
                yield StackWarning(rule, text, node=node)
    return rule, run


def _cross_region(settings: StackSettings, data_location: str | None
                  ) -> Iterator[StackWarning]:
    """Every placement of every node, fallback candidates too; a team stack's data is
    the platform's, whose location only the offline plan reads (`data_location`)."""
    for node, job in settings.node_jobs:
        if text := cross_region_warning(settings, node, job, data_location):
            yield StackWarning("cross-region", text, node=node)


def _stack_rule(run: Callable[[StackSettings], Iterator[StackWarning]]) -> Rule:
    return lambda settings, _data_location: run(settings)


def _projects(settings: StackSettings) -> Iterator[StackWarning]:
    for text in project_warnings(settings):
        yield StackWarning("project", text)


def _team_quota(settings: StackSettings) -> Iterator[StackWarning]:
    """Once for every team whose caps name an unconfirmed id (the stack's, not a team's)."""
    caps = [cap for team_caps in stack_caps(settings).values() for cap in team_caps]
    if settings.teams and (text := unconfirmed_id_warning(sorted(settings.teams), caps)):
        yield StackWarning("team-quota-id", text)


def _team_regions(settings: StackSettings) -> Iterator[StackWarning]:
    for team in sorted(settings.teams):
        if text := regions_warning(settings, team):
            yield StackWarning("team-regions", text, team=team)


# The registry, in the order the plan lists the warnings (and each node's are logged).
RULES: tuple[tuple[str, Rule], ...] = (
    _per_node("stop-save", lambda _, node, job: stop_save_warning(node, job)),
    ("cross-region", _cross_region),
    ("project", _stack_rule(_projects)),
    _per_node("progress-deadline", lambda _, node, job: progress_deadline_warning(node, job)),
    _per_node("one-quota", lambda _, node, job: one_quota_warning(node)),
    ("team-quota-id", _stack_rule(_team_quota)),
    ("team-regions", _stack_rule(_team_regions)),
)


def stack_warnings(settings: StackSettings, data_location: str | None = None
                   ) -> list[StackWarning]:
    """Every warning of the stack: each rule of the registry once, in its order.
    `data_location`: where a team stack's platform keeps its data, when known."""
    return [warning for _, rule in RULES for warning in rule(settings, data_location)]
