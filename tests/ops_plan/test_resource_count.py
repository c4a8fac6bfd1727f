"""One count of resources everywhere: the plan's headline, its diff against itself and a
diff from an empty stack count the same resources, by the project's rule for what
`pulumi preview` counts (the program's resources, components included, the stack and
its default providers).

The reference is our own, not Pulumi: the figures (31 in GCP, 7 components) are what the
project's mock engine registers for the dev stack (ops/plan/offline.py), and the rule is
the project's. No real `pulumi preview` output is recorded here, so that a preview
counts the same, default providers included, stays unconfirmed (pulumi/pulumi#1767
elides default providers' events in preview)."""

from __future__ import annotations

import re

import pytest

from ops.plan.diff import diff_plans, render_diff
from ops.plan.offline import offline_plan
from ops.plan.report import plain, render

HEADLINE = re.compile(r"^(\d+) resources \(pulumi preview's count\): (\d+) in GCP, "
                      r"(\d+) components, the stack, (\d+) default providers?$", re.M)


@pytest.fixture(scope="module")
def dev() -> dict:
    return plain(offline_plan("dev").to_json())


def test_the_headline_counts_the_mock_engines_resources_by_the_preview_rule(
        dev: dict) -> None:
    [(total, custom, components, providers)] = HEADLINE.findall(render(dev, "table"))
    resources = dev["resources"]
    assert int(custom) == sum(1 for r in resources if r.get("custom", True)) == 33
    assert int(components) == sum(1 for r in resources if not r.get("custom", True)) == 8
    assert int(providers) == 1  # gcp
    # Issue 46 added a dashboard, a log metric (custom) and Monitoring (a component).
    assert int(total) == 33 + 8 + 1 + 1 == 43


def test_the_diff_and_its_summary_count_the_same_mock_engine_resources(
        dev: dict) -> None:
    [(total, *_)] = HEADLINE.findall(render(dev, "table"))
    assert f"Resources:\n    {total} unchanged\n" in render_diff(diff_plans(dev, dev), "table")
    empty = {**dev, "resources": []}
    counts = diff_plans(empty, dev)
    text = render_diff(counts, "table")
    assert "Resources:\n    + 41 to create\n    2 unchanged\n" in text  # the stack, gcp
    assert int(total) == 41 + 2
