"""The rules that need several values or the catalog, one module per concern: the
stack's own keys (stack), its nodes and their placement (nodes), CI (ci), shared
capacity (teams). `rule_problems` runs them all."""

from __future__ import annotations

from model.settings.rules.alerts import alerts_problems
from model.settings.rules.ci import ci_problems
from model.settings.rules.nodes import node_list_problems
from model.settings.rules.stack import (
    jobs_problems,
    labels_problems,
    moved_range_problems,
    network_problems,
    project_problems,
    storage_problems,
)
from model.settings.rules.teams import team_problems
from model.settings.schema import NAMESPACE, StackSettings
from model.settings.suggest import Problems


def rule_problems(s: StackSettings) -> Problems:
    yield from project_problems(s)
    yield from storage_problems(s)
    yield from labels_problems(f"{NAMESPACE}:labels", s.labels)
    network = list(network_problems(s))
    yield from network
    if not network:
        yield from moved_range_problems(s)
    yield from jobs_problems(f"{NAMESPACE}:jobs", s.jobs)
    yield from node_list_problems(f"{NAMESPACE}:nodes", s.nodes, s.jobs, f"{NAMESPACE}:jobs")
    if s.ci:
        yield from ci_problems(s.ci)
    yield from team_problems(s)
    yield from alerts_problems(s)
