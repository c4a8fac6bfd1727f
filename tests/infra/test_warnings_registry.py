"""model/warnings.py: one registry of the preview's warnings (issue 42), each rule run
once, in the order the plan lists them, each warning saying what it is about."""

from __future__ import annotations

import pytest

from components.stack_config import settings_for
from model import locality, progress_deadline, stop_save
from model.warnings import RULES, project_warnings, stack_warnings

SHIPPED = ["dev", "prod", "platform", "team-vision"]


def test_every_rule_has_an_id_of_its_own() -> None:
    ids = [rule for rule, _ in RULES]
    assert ids == ["stop-save", "cross-region", "project", "progress-deadline", "one-quota",
                   "team-quota-id", "team-regions"]


@pytest.mark.parametrize("stack", SHIPPED)
def test_the_registry_lists_each_rules_warnings_in_its_order(stack: str) -> None:
    settings = settings_for(stack)
    warnings = stack_warnings(settings)

    by_rule = [w.rule for w in warnings]
    assert by_rule == sorted(by_rule, key=[rule for rule, _ in RULES].index)
    assert [w.text for w in warnings if w.rule == "stop-save"] == \
        stop_save.stack_warnings(settings)
    assert [w.text for w in warnings if w.rule == "cross-region"] == \
        locality.stack_warnings(settings)
    assert [w.text for w in warnings if w.rule == "project"] == project_warnings(settings)
    assert [w.text for w in warnings if w.rule == "progress-deadline"] == \
        progress_deadline.stack_warnings(settings)


@pytest.mark.parametrize("stack", SHIPPED)
def test_a_warning_names_the_node_or_team_it_is_about(stack: str) -> None:
    settings = settings_for(stack)
    nodes = [node for node, _ in settings.node_jobs]

    for warning in stack_warnings(settings):
        if warning.rule in ("project", "team-quota-id"):  # the stack's: once, every team
            assert warning.node is None and warning.team is None
        elif warning.rule == "team-regions":
            assert warning.node is None and warning.team in settings.teams
        else:
            assert any(warning.about(node) for node in nodes) and warning.team is None


def test_the_platform_stack_has_a_warning_of_several_rules() -> None:
    """So the tests above check an order, not an empty list."""
    rules = {w.rule for w in stack_warnings(settings_for("platform"))}
    assert {"cross-region", "project", "team-quota-id"} <= rules
