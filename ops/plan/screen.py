"""The terminal plan a person reads in one screen (issue 45): a summary first (counts,
cost, each team's spend, budget and caps, policy, warnings once each), then the nodes,
then the resources grouped by team and component; the rest behind `--detail`. Lines
fit the terminal's width (`COLUMNS`). Works on the plan's JSON, as report.py does."""

from __future__ import annotations

import shutil
import textwrap
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from model.catalog import HOURS_PER_MONTH
from ops.plan import report
from policy.evaluate import Violation

DEFAULT_COLUMNS = 100
NARROWEST = 60
CAPACITY_WORDS = {"onDemand": "on-demand", "spot": "spot", "reserved": "reserved"}


def terminal_columns() -> int:
    """The terminal's width: `COLUMNS` when set, else the terminal's, else 100."""
    width = shutil.get_terminal_size((DEFAULT_COLUMNS, 40)).columns
    return max(NARROWEST, width)


def wrapped(text: str, columns: int, first: str = "- ", rest: str = "  ") -> list[str]:
    """`text` as lines of at most `columns`, a word longer than a line left whole."""
    return textwrap.wrap(text, width=columns, initial_indent=first, subsequent_indent=rest,
                         break_long_words=False, break_on_hyphens=False) or [first.rstrip()]


def once(items: Sequence[str]) -> list[str]:
    """Each text once, in its first order."""
    return list(dict.fromkeys(items))


def budget_words(p: Mapping[str, Any], ceiling: float | None) -> str:
    """The team's monthly budget in plain words, as the platform declares it
    (components/platform.py _budget): its figure, else its hourly ceiling for a month,
    else last month's spend."""
    budget, why = p.get("budgetUsdPerMonth"), ""
    if budget is None and ceiling is not None:
        budget, why = ceiling * HOURS_PER_MONTH, " (its hourly ceiling for a month)"
    if budget is None:
        return "budget: last month's spend (no figure or ceiling given)"
    burn = p.get("usdPerHour") or 0.0
    if burn <= 0:
        return f"budget {report.money(budget)}/month{why}, not reached: none of its nodes runs here"
    hours = budget / burn
    return (f"budget {report.money(budget)}/month{why}, reached in {hours:,.0f} h "
            f"({hours / 24:,.1f} days) at this rate")


def caps_words(entry: Mapping[str, Any]) -> str:
    caps = [f"{c['family']} {CAPACITY_WORDS.get(c['capacity'], c['capacity'])} "
            f"{c['used']}/{c['cap']}" for c in entry.get("caps", [])]
    ceiling = entry.get("usdPerHourCeiling")
    words = f"caps used {', '.join(caps)}" if caps else "no chips granted"
    return words + (f"; ceiling {report.money(ceiling)}/hour" if ceiling is not None else "")


def team_lines(plan: Mapping[str, Any], columns: int) -> list[str]:
    """One item per team: burn rate, budget, caps, what a budget stop deletes."""
    spend, caps = plan.get("spend") or {}, plan.get("teamCaps") or {}
    lines = []
    for team in sorted(set(spend) | set(caps)):
        p = spend.get(team, {})
        ceiling = caps.get(team, {}).get("usdPerHourCeiling")
        text = (f"team {team}: burn {report.money(p.get('usdPerHour'))}/hour; "
                f"{budget_words(p, ceiling)}")
        if team in caps:
            text += f"; {caps_words(caps[team])}"
        if p.get("budgetAction") == "stop":
            deletes = len(p.get("budgetStopDeletes") or [])
            text += f"; at its budget a budget stop saves and deletes its {deletes} node(s)"
        if held := p.get("held"):
            text += f"; HELD by a budget stop of {held['interval']} until {held['until']}"
        lines += wrapped(text, columns)
    return lines


def cost_line(plan: Mapping[str, Any]) -> str:
    cost = plan.get("cost", {})
    hourly, monthly = report.shown_total(plan), report.shown_total(plan, monthly=True)
    about = "~" if cost.get("unconfirmed") and hourly is not None else ""
    nodes = len(cost.get("nodes", []))
    return (f"{nodes} TPU node(s): {about}{report.money(hourly)}/hour, {about}"
            f"{report.money(monthly)}/month at list prices (TPU nodes only)")


def summary(plan: Mapping[str, Any], violations: Sequence[Violation], columns: int) -> str:
    lines = ["Summary", *wrapped(report.preview_count(plan), columns),
             *wrapped(cost_line(plan), columns), *team_lines(plan, columns)]
    policy = report.policy_section(violations, markdown=False).splitlines()
    lines += wrapped(policy[0], columns)
    lines += [line for item in policy[1:] for line in wrapped(item.removeprefix("- "),
                                                               columns, "  - ", "    ")]
    warnings = once(plan.get("warnings", []))
    if warnings:
        lines.append(f"Warnings ({len(warnings)})")
        lines += [line for w in warnings for line in wrapped(w, columns)]
    return "\n".join(lines)


def team_of(resource: Mapping[str, Any], teams: Sequence[str]) -> str:
    """The team a resource is of (its logical name or component names it), else the
    stack's own (`stack`)."""
    words = f"{resource['name']} {resource.get('component') or ''}".replace(":", " ").split()
    for team in sorted(teams, key=len, reverse=True):
        if any(w.startswith(f"{team}-") or w.endswith(f"-{team}") or f"-{team}-" in w
               for w in words):
            return team
    return "stack"


def plan_teams(plan: Mapping[str, Any]) -> list[str]:
    outputs = plan.get("outputs") or {}
    teams = set(outputs.get("teams") or {}) | set(plan.get("teamCaps") or {})
    return sorted(teams)


def resource_groups(plan: Mapping[str, Any], columns: int) -> str:
    """Resources by team and component: how many, of which types."""
    teams = plan_teams(plan)
    groups: dict[tuple[str, str], Counter[str]] = {}
    for r in plan.get("resources", []):
        if not r.get("custom", True):
            continue
        key = (team_of(r, teams), r.get("component") or "stack")
        groups.setdefault(key, Counter())[report.display_type(r["type"]).rsplit(":", 1)[-1]] += 1
    rows = [[team, component, str(sum(kinds.values())),
             ", ".join(f"{kind} {n}" if n > 1 else kind for kind, n in sorted(kinds.items()))]
            for (team, component), kinds in sorted(groups.items())]
    title = "Resources by team and component (each resource: --detail)"
    return "\n".join([title, fitted_table(("team", "component", "count", "types"), rows,
                                          columns)])


def fitted_table(headers: Sequence[str], rows: list[list[str]], columns: int) -> str:
    """Plain columns; the last column wraps under itself, so no line passes `columns`."""
    widths = [max(len(str(row[i])) for row in [list(headers), *rows])
              for i in range(len(headers) - 1)]
    start = sum(widths) + 2 * len(widths)
    room = max(columns - start, 20)
    lines = []
    for row in [list(headers), *rows]:
        head = "  ".join(str(c).ljust(w) for c, w in zip(row[:-1], widths, strict=True))
        tail = textwrap.wrap(str(row[-1]), room, break_long_words=False) or [""]
        lines.append(f"{head}  {tail[0]}".rstrip())
        lines += [" " * start + more for more in tail[1:]]
    return "\n".join(lines)


def screen(plan: Mapping[str, Any], violations: Sequence[Violation], *, detail: bool,
           columns: int | None = None) -> str:
    """The terminal plan: summary, nodes, resources; `detail` adds what report.py shows
    in full (cost lines, steps, recipes, every resource)."""
    columns = columns or terminal_columns()
    title = f"tpu-stack plan: {plan.get('stack')} ({plan.get('project')})"
    parts = [report.heading(title, markdown=False),
             *report.duplicates_section(plan, markdown=False),
             summary(plan, violations, columns),
             *tables(report.node_tables(plan, markdown=False, columns=columns)),
             *report.candidate_tables(plan, markdown=False, columns=columns)]
    if detail:
        cost_lines = report.cost_summary(plan).splitlines()
        parts += ["\n".join(line for item in cost_lines for line in wrapped(
                      item.removeprefix("- "), columns, "- " if item.startswith("- ") else "",
                      "  "))]
        if section := report.spend_section(plan):
            parts.append("\n".join(line for item in section.splitlines()
                                   for line in wrapped(item, columns, "", "    ")))
        parts += [*report.step_tables(plan, markdown=False, columns=columns),
                  report.resource_table(report._resource_rows(plan), columns=columns)]
    else:
        parts.append(resource_groups(plan, columns))
    return fit_lines("\n\n".join(p for p in parts if p), columns) + "\n"


def fit_lines(text: str, columns: int) -> str:
    """Every line within `columns`: a longer one wraps under its own indent (a single
    word longer than the line, a URN or bucket, stays whole)."""
    out = []
    for line in text.splitlines():
        if len(line) <= columns:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip()))
        out += textwrap.wrap(line.strip(), columns, initial_indent=indent,
                             subsequent_indent=indent + "  ", break_long_words=False,
                             break_on_hyphens=False)
    return "\n".join(out)


def tables(parts: list[str]) -> list[str]:
    return [p for p in parts if p.strip()]
