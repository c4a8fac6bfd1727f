"""`tpuctl plan`: an offline plan of a stack, through Pulumi's mock engine.

No cloud credentials: the program runs against mocks with the config the CLI
would give it, and the plan is every resource it declares (inputs and the
options that matter), the stack outputs and the cost estimate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pulumi

from components.program import declare
from components.stack_config import file_config
from model import (
    candidates,
    cap_usage,
    catalog,
    meter,
    team_headroom,
)
from model.archive import PackageError
from model.cost import RATES, StackCost, StepCost, settings_cost
from model.settings.load import load_settings
from model.settings.schema import StackSettings
from model.warnings import stack_warnings
from ops.plan import platform_facts
from ops.plan.mock_engine import (
    GcpMocks,
    ProgramRun,
    Registration,
    referenced_stack_outputs,
    run_program,
)

PLAN_FORMAT_VERSION = 1


class PlanError(RuntimeError):
    """The Pulumi program stopped (PlatformStackError, PackageError, any other error of
    the program): its one message, which `pulumi preview` would also end with."""


@dataclass
class Plan:
    stack: str
    settings: StackSettings
    run: ProgramRun
    cost: StackCost

    def component_of(self, resource: Registration) -> str | None:
        """The nearest enclosing component, as `Type:name` (None at the top)."""
        by_urn = self.run.by_urn()
        parent = by_urn.get(resource.parent or "")
        while parent is not None and parent.custom:
            parent = by_urn.get(parent.parent or "")
        if parent is None:
            return None
        return f"{parent.type.rsplit(':', 1)[-1]}:{parent.name}"

    def _spend_json(self) -> dict[str, Any]:
        """spend_json, and `held` on a team a budget stop holds (the program's output)."""
        platform = platform_facts.platform_settings(self.settings)
        spend = spend_json(meter.team_previews(cap_usage.with_team_budgets(self.settings,
                                                                          platform)))
        for team, outputs in (self.run.outputs.get("teams") or {}).items():
            if isinstance(outputs, dict) and "budgetHold" in outputs and team in spend:
                spend[team]["held"] = outputs["budgetHold"]
        return spend

    def to_json(self) -> dict[str, Any]:
        return {
            "version": PLAN_FORMAT_VERSION,
            "stack": self.stack,
            "environment": self.settings.environment,
            "project": self.settings.gcp_project,
            "resources": [self._resource_json(r)
                          for r in sorted(self.run.registrations, key=lambda r: r.urn)],
            "outputs": self.run.outputs,
            "cost": cost_json(self.cost),
            # Per team: burn rate by the meter, the budget, what a budget stop deletes,
            # each node's run-time limits (model/meter.py).
            "spend": self._spend_json(),
            # Per team: its caps and what this stack's nodes take, ceiling, budget (issue 45).
            "teamCaps": cap_usage.team_usage(
                self.settings, platform_facts.platform_settings(self.settings)),
            # What the program warns on its nodes at preview and up, the same text.
            "warnings": [warning.text for warning in stack_warnings(
                self.settings, platform_facts.data_location(self.settings))],
            # Nodes with fallback only: absent from a plan without any (issue 35).
            **({"candidates": rows} if (rows := candidates.stack_candidates(
                self.settings, team_headroom.cap_headroom(
                    platform_facts.platform_settings(self.settings)))) else {}),
        }

    def _resource_json(self, r: Registration) -> dict[str, Any]:
        return {
            "urn": r.urn,
            "type": r.type,
            "name": r.name,
            "component": self.component_of(r),
            "parent": r.parent,
            "custom": r.custom,
            "inputs": r.inputs,
            # What the mock computed (an account's email, a self link): the names to show.
            "outputs": {k: v for k, v in r.outputs.items() if k not in r.inputs},
            "protect": r.protect,
            "deleteBeforeReplace": r.delete_before_replace,
            # Sorted: the program registers them as its outputs resolve, in no fixed
            # order, and two plans of the same stack must be the same bytes.
            "dependencies": sorted(r.dependencies),
            "propertyDependencies": {k: sorted(v) for k, v in
                                     sorted(r.property_dependencies.items())},
            "provider": r.provider,
            "secrets": r.secrets,
            "replaceOnChanges": r.replace_on_changes,
            "retainOnDelete": r.retain_on_delete,
        }


def cost_json(cost: StackCost) -> dict[str, Any]:
    return {
        "currency": "USD",
        "covers": "TPU nodes only, at list prices (components/cost.py)",
        "nodes": [
            {"name": n.name, "chips": n.chips, "usdPerHour": n.usd_per_hour,
             "onDemandUsdPerHour": n.on_demand_usd_per_hour,
             "spotSavingUsdPerHour": n.spot_saving_usd_per_hour,
             "reserved": n.reserved, "priceConfirmed": n.price_confirmed,
             "priceSource": n.price_source, "commitment": n.commitment,
             "byRate": n.by_rate, "committedConfirmed": n.committed_confirmed,
             **({"step": step_json(n.step)} if n.step is not None else {})}
            for n in cost.nodes
        ],
        # Every node at each rate, side by side: on-demand, spot, 1- and 3-year commitments.
        "byRate": {rate: cost.usd_per_hour_at(rate) for rate in RATES},
        "usdPerHour": cost.usd_per_hour,
        "usdPerMonth": cost.usd_per_month,
        "unpriced": cost.unpriced,
        "reserved": cost.reserved,
        "unconfirmed": cost.unconfirmed,
        # Only where the stack serves teams (docs/teams.md).
        **({"byTeam": {team: {"usdPerHour": c.usd_per_hour, "usdPerMonth": c.usd_per_month}
                       for team, c in cost.by_team().items()}} if cost.by_team() else {}),
    }


def spend_json(previews: list[meter.TeamPreview]) -> dict[str, Any]:
    return {p.team: {"usdPerHour": significant(p.usd_per_hour),
                     "budgetUsdPerMonth": p.budget_usd_per_month,
                     "hoursToBudget": significant(p.hours_to_budget),
                     "budgetAction": p.budget_action, "budgetStopDeletes": list(p.stop_deletes),
                     "unpriced": list(p.unpriced),
                     "nodes": [{"node": n.node_id, "maxRuntime": n.max_runtime,
                                "idleStop": n.idle_stop} for n in p.limits]}
            for p in previews}


def significant(value: float | None, digits: int = 4) -> float | None:
    """`value` to `digits` significant digits: an estimate's JSON without float noise."""
    return None if value is None else float(f"{value:.{digits}g}")


def step_json(step: StepCost) -> dict[str, Any]:
    """One training step of the node's job: FLOPs-bound seconds at the assumed
    utilisation (model/stop_save.py) and its cost at the node's rate."""
    return {"job": step.job, "model": step.model, "globalBatchSize": step.global_batch_size,
            "flopsPerExample": step.flops_per_example,
            "peakFlopsPerSecond": step.peak_flops_per_second,
            "assumedUtilization": catalog.ASSUMED_FLOPS_UTILIZATION,
            "seconds": significant(step.seconds), "usd": significant(step.usd),
            "usdPer1000Steps": significant(step.usd_per_1000_steps),
            "unconfirmed": list(step.unconfirmed), "recipe": step.recipe}


def offline_plan(stack: str, config: dict[str, str] | None = None,
                 bucket_objects: Mapping[str, list[str]] | None = None) -> Plan:
    """Plan `stack` from its files (or from `config`, as the CLI would pass it);
    `bucket_objects`: object names per bucket the program's listings see (the budget-stop
    and janitor markers, components/budget_hold.py), none by default.

    Raises SettingsError (one message, every problem) for a bad config and
    StackFileError for a missing stack file, before anything runs; PlanError for
    whatever else stops the program.
    """
    config = config if config is not None else file_config(stack)
    settings = load_settings(config, stack)
    platform_facts.check_team(settings)
    try:
        mock = None if bucket_objects is None else GcpMocks(
            stack_outputs=referenced_stack_outputs(config), bucket_objects=bucket_objects)
        # The program gets the settings parsed above: one plan parses the config once.
        run = run_program(config, stack, program=lambda: declare(settings), mock=mock)
    except Exception as error:  # the program's error, whatever it is, becomes one message
        raise PlanError(program_message(error)) from None
    return Plan(stack=stack, settings=settings, run=run, cost=settings_cost(settings))


def program_message(error: Exception) -> str:
    """The message of an error the program raised; a bug also names its type."""
    if isinstance(error, (pulumi.RunError, PackageError, ValueError)):
        return str(error)
    return f"the Pulumi program failed: {type(error).__name__}: {error}"
