"""The engine's steps between two offline plans, predicted as `pulumi preview` would.

For each resource of the head plan, in dependency order: create (new URN), update
(changed inputs that update in place), replace (an input that forces a new
resource changed, or took the outputs of a replaced resource), and delete for each
URN the head no longer declares. The rules, each mirrored from its source
(ops/plan/facts/replacement.json records file and commit):

- A changed input replaces a resource when the provider marks it `ForceNew`, or a
  `ForceNewIfChange` condition holds (terraform-provider-google-beta schemas); a
  Python dynamic resource replaces when its provider's `diff` says so.
- A replacement deletes first when the `delete_before_replace` option says so; unset,
  when pulumi-gcp's ResourceInfo sets `DeleteBeforeReplace`, or an auto-named property
  is set explicitly (pulumi-terraform-bridge `nameRequiresDeleteBeforeReplace`), which
  the engine then follows (pulumi/pulumi step_generator.go: the option overrides).
- A replaced resource's outputs are unknown; every input that took them (the
  engine's propertyDependencies) is unknown in its dependent's diff, which replaces
  the dependent when that input forces a replacement (pulumi/pulumi
  pkg/resource/deploy/step_generator.go, `calculateDependentReplacements`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ops.plan.facts import type_facts

UNKNOWN = "(unknown)"  # what a replaced resource's output is until it exists again


@dataclass(frozen=True)
class Change:
    """One changed input of a resource."""

    path: str  # dotted; `(protect)` for the option
    old: Any
    new: Any  # UNKNOWN when it takes a replaced resource's output
    replaces: bool
    reason: str  # `immutable`, `shrinks`, `update`, ...
    unknown_from: str | None = None  # the replaced resource's URN


@dataclass(frozen=True)
class Step:
    op: str  # create | update | replace | delete
    urn: str
    type: str
    name: str
    resource: Mapping[str, Any]  # the head's, or the base's for a delete
    base: Mapping[str, Any] | None = None
    changes: tuple[Change, ...] = ()
    delete_first: bool = False
    delete_first_because: str = ""

    @property
    def replaced_by(self) -> tuple[Change, ...]:
        return tuple(c for c in self.changes if c.replaces)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(c.path for c in self.changes)

    @property
    def replaced_paths(self) -> tuple[str, ...]:
        return tuple(c.path for c in self.replaced_by)

    @property
    def held_while_waiting(self) -> bool:
        """An update of a queued node that waits for its node while the request waits
        (the facts' `heldWhileWaiting` inputs, components/queued_tpu.py)."""
        keys = (type_facts(self.type) or {}).get("heldWhileWaiting", ())
        return self.op == "update" and any(p.split(".", 1)[0] in keys for p in self.paths)

    @property
    def marker(self) -> str:
        return {"create": "+", "update": "~", "replace": "+-", "delete": "-"}[self.op]


@dataclass
class Steps:
    steps: list[Step] = field(default_factory=list)
    _index: dict[str, Step] = field(default_factory=dict, repr=False, compare=False)

    def by_urn(self) -> dict[str, Step]:
        """Every step by URN (built once: chains look steps up by URN)."""
        if len(self._index) != len(self.steps):
            self._index = {s.urn: s for s in self.steps}
        return self._index

    def of(self, op: str) -> list[Step]:
        return [s for s in self.steps if s.op == op]

    def counts(self) -> dict[str, int]:
        return {op: len(self.of(op)) for op in ("create", "update", "replace", "delete")}


def changed_paths(base: Any, head: Any, prefix: str = "") -> Iterator[str]:
    """Dotted paths where two input trees differ; lists compare whole.

    Engine-internal keys (`__provider`, a dynamic resource's pickled provider) are skipped."""
    if isinstance(base, Mapping) and isinstance(head, Mapping):
        for key in sorted(k for k in {*base, *head} if not k.startswith("__")):
            yield from changed_paths(base.get(key), head.get(key), f"{prefix}{key}.")
    elif base != head:
        yield prefix.rstrip(".")


def value_at(tree: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(tree, Mapping):
            return None
        tree = tree.get(key)
    return tree


def shrinks(old: Any, new: Any) -> bool:
    """terraform-provider-google-beta resource_compute_subnetwork.go IsShrinkageIpCidr:
    the new range does not hold both ends of the old one (an unparsable value: False)."""
    try:
        old_net = ipaddress.ip_network(old, strict=False)
        new_net = ipaddress.ip_network(new, strict=False)
    except (TypeError, ValueError):
        return False
    return not (old_net[0] in new_net and old_net[-1] in new_net)


CONDITIONS = {"IsShrinkageIpCidr": (shrinks, "shrinks")}


def _forces(facts: Mapping[str, Any], path: str) -> bool:
    for fixed in facts.get("forceNew", ()):
        fixed = fixed.replace("[]", "")
        if fixed == path or fixed.startswith(path + ".") or path.startswith(fixed + "."):
            return True
    return False


def replaces(resource: Mapping[str, Any], path: str, old: Any, new: Any) -> tuple[bool, str]:
    """Whether a change of `path` replaces the resource, and the word for why."""
    if path == "(protect)":
        return False, "option"
    if path.split(".", 1)[0] in resource.get("replaceOnChanges", ()):
        return True, "replaceOnChanges"
    facts = type_facts(resource["type"])
    if facts is None:
        return False, "update (no replacement facts for this type)"
    if "replaceUnless" in facts:  # a dynamic provider: its own diff's rule
        forced = path.split(".", 1)[0] not in facts["replaceUnless"]
        return forced, "immutable" if forced else "update"
    if _forces(facts, path):
        return True, "immutable"
    condition = facts.get("forceNewIf", {}).get(path)
    if condition is not None:
        test, word = CONDITIONS.get(condition, (lambda _o, _n: True, condition))
        return (True, word) if test(old, new) else (False, "update")
    return False, "update"


def delete_first(resource: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether a replacement deletes the old resource first, and why."""
    option = resource.get("deleteBeforeReplace")
    if option is not None:
        return bool(option), "the delete_before_replace option"
    facts = type_facts(resource["type"]) or {}
    if facts.get("deleteBeforeReplace"):
        return True, "the provider deletes it first"
    auto = facts.get("autoName")
    if auto and resource.get("inputs", {}).get(auto) is not None:
        return True, f"its {auto} is set explicitly, so two cannot exist at once"
    return False, ""


def dependency_order(resources: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """URNs with every resource after those whose outputs it takes (depth first)."""
    order: list[str] = []
    seen: set[str] = set()
    for root in sorted(resources):
        stack = [(root, False)]
        while stack:
            urn, done = stack.pop()
            if done:
                order.append(urn)
                continue
            if urn in seen:
                continue
            seen.add(urn)
            stack.append((urn, True))
            stack += [(dep, False) for dep in sorted(_dependencies(resources[urn]), reverse=True)
                      if dep in resources and dep not in seen]
    return order


def _dependencies(resource: Mapping[str, Any]) -> set[str]:
    deps = {urn for urns in resource.get("propertyDependencies", {}).values() for urn in urns}
    deps.update(resource.get("dependencies", ()))
    if resource.get("provider"):
        deps.add(resource["provider"])
    return deps


def _unknown_inputs(resource: Mapping[str, Any], replaced: Mapping[str, Any]
                    ) -> dict[str, str]:
    """Input key → the replaced resource whose outputs it takes."""
    return {key: urn for key, urns in resource.get("propertyDependencies", {}).items()
            for urn in urns if urn in replaced}


def _unknown_paths(inputs: Mapping[str, Any], key: str, source: Mapping[str, Any]) -> list[str]:
    """The leaves under `key` that hold the replaced resource's name (its self link, id);
    the key itself when none does."""
    name = str(source.get("inputs", {}).get("name") or source.get("name"))
    found = [p for p, value in leaves(inputs.get(key), key)
             if isinstance(value, str) and name in value]
    return found or [key]


def leaves(tree: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if isinstance(tree, Mapping):
        for key, value in sorted(tree.items()):
            yield from leaves(value, f"{prefix}.{key}")
    else:
        yield prefix, tree


def _changes(old: Mapping[str, Any], new: Mapping[str, Any],
             replaced: Mapping[str, Mapping[str, Any]]) -> list[Change]:
    base_inputs, head_inputs = old.get("inputs", {}), new.get("inputs", {})
    unknown = _unknown_inputs(new, replaced)
    changes = []
    for key, source in sorted(unknown.items()):
        for path in _unknown_paths(head_inputs, key, replaced[source]):
            forced, reason = replaces(new, path, value_at(base_inputs, path), UNKNOWN)
            changes.append(Change(path, value_at(base_inputs, path), UNKNOWN, forced, reason,
                                  source))
    for path in changed_paths(base_inputs, head_inputs):
        if path.split(".", 1)[0] in unknown:
            continue
        before, after = value_at(base_inputs, path), value_at(head_inputs, path)
        forced, reason = replaces(new, path, before, after)
        changes.append(Change(path, before, after, forced, reason))
    if bool(old.get("protect")) != bool(new.get("protect")):
        changes.append(Change("(protect)", bool(old.get("protect")), bool(new.get("protect")),
                              False, "option"))
    if new.get("provider") in replaced:
        changes.append(Change("(provider)", old.get("provider"), UNKNOWN, True,
                              "its provider is replaced", new["provider"]))
    return changes


def plan_steps(base: Mapping[str, Any], head: Mapping[str, Any]) -> Steps:
    """The steps from `base` to `head` (Plan.to_json() dicts of custom resources)."""
    before = {r["urn"]: r for r in base.get("resources", []) if r.get("custom", True)}
    after = {r["urn"]: r for r in head.get("resources", []) if r.get("custom", True)}
    replaced: dict[str, Mapping[str, Any]] = {}
    steps = Steps()
    for urn in dependency_order(after):
        new = after[urn]
        if urn not in before:
            steps.steps.append(Step("create", urn, new["type"], new["name"], new))
            continue
        changes = _changes(before[urn], new, replaced)
        if not changes:
            continue
        if any(c.replaces for c in changes):
            replaced[urn] = new
            first, why = delete_first(new)
            steps.steps.append(Step("replace", urn, new["type"], new["name"], new, before[urn],
                                    tuple(changes), first, why))
        else:
            steps.steps.append(Step("update", urn, new["type"], new["name"], new, before[urn],
                                    tuple(changes)))
    gone = [urn for urn in dependency_order(before) if urn not in after]
    steps.steps += [Step("delete", urn, before[urn]["type"], before[urn]["name"], before[urn])
                    for urn in reversed(gone)]  # dependents first, as the engine deletes
    return steps
