"""The engine's steps between two offline plans, predicted as `pulumi preview` would.

For each resource of the head plan (custom and component), in dependency order: create
(new URN), same (no diff: a protect-only change too), update (changed inputs that update
in place), replace (an input that forces a new resource changed, or took the outputs of
a replaced resource), and delete for each URN the head no longer declares. The rules,
each mirrored from its source (ops/plan/facts/replacement.json records repository,
path, line and commit; `citation(rule)`):

- Inputs compare as the provider's diff compares them: after the field's `StateFunc`
  and without a change its `DiffSuppressFunc` suppresses (the facts' `normalise`; rule
  `normalisedBeforeDiff`: the bridge runs the SDK's diff).
- A changed input replaces a resource when the provider marks it `ForceNew`, or a
  `ForceNewIfChange` condition holds (terraform-provider-google-beta schemas); a
  Python dynamic resource replaces when its provider's `diff` says so.
- A replacement deletes first when the `delete_before_replace` option says so; unset,
  when pulumi-gcp's ResourceInfo sets `DeleteBeforeReplace`, or an auto-named property
  is set explicitly (pulumi-terraform-bridge `nameRequiresDeleteBeforeReplace`), which
  the engine then follows (pulumi/pulumi step_generator.go: the option overrides).
- Only a delete-first replacement condemns its dependents: every resource whose inputs
  take its outputs (the engine's propertyDependencies, transitively) and whose diff with
  those inputs unknown replaces it is deleted before it (`calculateDependentReplacements`,
  rules `dependentsDiffWithUnknowns`, `deleteFirstDependentsGoFirst`). A create-before-
  delete replacement's dependents see its new outputs: a computed one is unknown in a
  preview, one it echoes from its inputs is known.
- Protect (rules `protectRefusesReplace`, `protectedDependentBails`,
  `protectRefusesDelete`): the replace of a resource protected before and after, the
  delete-first of a protected dependent and the delete of a protected resource are
  errors; a preview shows them, `up` stops (the deletes beside a refused one still run:
  `deletesBesideARefusalRun`). A retainOnDelete resource's delete leaves it in GCP.
- What GCP refuses: a create whose GCP name a resource deleted later in the same
  update still holds (deletes run after every create: the create fails, or, for an
  object, the later delete removes the new one).
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
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


OPS = ("create", "update", "replace", "delete")  # what the summary counts as changes


@dataclass(frozen=True)
class Step:
    op: str  # create | same | update | replace | delete
    urn: str
    type: str
    name: str
    resource: Mapping[str, Any]  # the head's, or the base's for a delete
    base: Mapping[str, Any] | None = None
    changes: tuple[Change, ...] = ()
    delete_first: bool = False
    delete_first_because: str = ""
    # The error the engine (or GCP) stops this step with, as `pulumi preview` prints it.
    refused: str = ""
    # Why a delete leaves the resource in GCP (retainOnDelete, a provider whose Delete
    # only forgets it).
    stays_in_gcp: str = ""
    deleted_before: str | None = None  # the delete-first root that condemned it

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
        """The engine's prefix (pulumi/pulumi step.go RawPrefix; rule `displayPrefixes`)."""
        return {"create": "+ ", "same": "  ", "update": "~ ", "replace": "+-",
                "delete": "- "}[self.op]

    @property
    def custom(self) -> bool:
        return bool(self.resource.get("custom", True))


@dataclass
class Steps:
    steps: list[Step] = field(default_factory=list)
    unchanged: int = 0  # resources both plans declare with no change step
    _index: dict[str, Step] = field(default_factory=dict, repr=False, compare=False)

    def by_urn(self) -> dict[str, Step]:
        """Every step by URN (built once: chains look steps up by URN)."""
        if len(self._index) != len(self.steps):
            self._index = {s.urn: s for s in self.steps}
        return self._index

    def of(self, op: str) -> list[Step]:
        return [s for s in self.steps if s.op == op]

    def counts(self) -> dict[str, int]:
        """Steps by operation as the engine's summary counts them; a same step (a
        protect-only change) is unchanged."""
        counts = {op: len(self.of(op)) for op in OPS}
        counts["same"] = self.unchanged + len(self.of("same"))
        return counts

    @property
    def refused(self) -> list[Step]:
        return [s for s in self.steps if s.refused]


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


# --- normalisation: the provider's StateFunc and DiffSuppressFunc (facts `normalise`) ---
# Each: whether the provider's diff sees no change from `old` to `new`, as the function
# of terraform-provider-google-beta the facts name (file and line in the entry).

def _last_segment(link: str) -> str:
    """tpgresource.GetResourceNameFromSelfLink."""
    return link.split("/")[-1]


def _relative(link: str) -> str | None:
    """tpgresource.GetRelativePath: from `projects/` on, None for no self link."""
    _, found, tail = link.partition("projects/")
    return f"projects/{tail}" if found else None


def _self_link_or_name(old: str, new: str) -> bool:
    """tpgresource.CompareSelfLinkOrResourceName."""
    if "/" not in new and _last_segment(old) == new:
        return True
    return _relative(old) is not None and _relative(old) == _relative(new)


def _iam_member(old: str, new: str) -> bool:
    """tpgiamresource iamMemberCaseDiffSuppress (tpgresource.IamPrincipalIsCaseSensitive)."""
    sensitive = ("allAuthenticatedUsers", "allUsers")
    prefixes = ("principalSet:", "principal:", "principalHierarchy:")
    if any(w in v for v in (old, new) for w in sensitive) or \
            any(v.startswith(prefixes) for v in (old, new)):
        return old == new
    return old.upper() == new.upper()


def _folder(value: str) -> str:
    """resourcemanager.ParseFolderId: the id without `folders/`."""
    return value.removeprefix("folders/")


def _int64(value: str) -> bool:
    """tpgresource.StringToFixed64 parses (strconv.ParseInt base 10, 64 bits)."""
    return re.fullmatch(r"[+-]?[0-9]+", value) is not None and -2**63 <= int(value) < 2**63


def _monitored_project_name(old: str, new: str) -> bool:
    """resource_monitoring_monitored_project.go
    ResourceMonitoringMonitoredProjectNameDiffSuppressFunc: never for an empty value; the
    same short name; or a project number against a project id (either way)."""
    if old == "" or new == "":
        return False
    old_short, new_short = _last_segment(old), _last_segment(new)
    return old_short == new_short or _int64(old_short) != _int64(new_short)


def _without_computed(old: Any, new: Any) -> Any:
    """resource_monitoring_dashboard.go removeComputedKeys: the old object without the
    keys the new one lacks (or holds null), through objects and the objects of lists.
    Where the Go type assertions would panic (a shape changed), the old value stays."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return old
    out = {}
    for key, value in old.items():
        if new.get(key) is None:
            continue
        if isinstance(value, dict):
            value = _without_computed(value, new[key])
        elif isinstance(value, list) and isinstance(new[key], list):
            value = [_without_computed(item, new[key][i]) if i < len(new[key]) else item
                     for i, item in enumerate(value)]
        out[key] = value
    return out


def _json_equal(a: Any, b: Any) -> bool:
    """reflect.DeepEqual of decoded JSON (a bool is no number)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_json_equal, a, b))
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)  # both float64 to encoding/json
    return type(a) is type(b) and a == b


def _dashboard_json(old: str, new: str) -> bool:
    """resource_monitoring_dashboard.go monitoringDashboardDiffSuppress: both parse as JSON
    objects (structure.ExpandJsonFromString), and the old one without the keys the new
    one does not set equals the new one."""
    try:
        old_map, new_map = json.loads(old), json.loads(new)
    except ValueError:
        return False
    if not isinstance(old_map, dict) or not isinstance(new_map, dict):
        return False
    return _json_equal(_without_computed(old_map, new_map), new_map)


NORMALISERS: dict[str, Callable[[str, str], bool]] = {
    "inline:upper": lambda old, new: old.upper() == new.upper(),  # state holds upper(old)
    "inline:lower": lambda old, new: old.lower() == new.lower(),
    "CaseDiffSuppress": lambda old, new: old.upper() == new.upper(),
    "iamMemberCaseDiffSuppress": _iam_member,
    "CompareSelfLinkOrResourceName": _self_link_or_name,
    "CompareSelfLinkRelativePaths": lambda old, new: _relative(old) is not None
    and _relative(old) == _relative(new),
    "CompareResourceNames": lambda old, new: _last_segment(old) == _last_segment(new),
    "StorageBucketDiffSuppress": lambda old, new: _last_segment(old) == _last_segment(new),
    "CompareProjectName": lambda old, new: _last_segment(old) == _last_segment(new),
    "QuotaPreferredValueDiffSuppress": lambda old, new: {old, new} == {"", "0"},
    "ParseFolderId": lambda old, new: _folder(old) == _folder(new),
    # resource_billing_budget.go: calendar_period passes ("MONTH", the custom period's
    # start date); unset and MONTH are the same while no custom period is set, and the
    # program sets none (components/teams.py budgets a calendar month).
    "checkValAndDefaultStringSuppress": lambda old, new: {old, new} <= {"", "MONTH"},
    "resourceMonitoringMonitoredProjectNameDiffSuppress": _monitored_project_name,
    "monitoringDashboardDiffSuppress": _dashboard_json,
    # resource_cloud_scheduler_job.go LastSlashDiffSuppress: one trailing slash of each
    # side is dropped, then they compare as written.
    "LastSlashDiffSuppress": lambda old, new: old.removesuffix("/") == new.removesuffix("/"),
}


def _source_ranges(old: Any, new: Any) -> bool:
    """resource_compute_firewall.go diffSuppressSourceRanges on a TypeSet: the same set,
    or `["0.0.0.0/0"]` and none."""
    sets = [frozenset(v or ()) for v in (old, new)]
    return sets[0] == sets[1] or set(sets) == {frozenset(), frozenset({"0.0.0.0/0"})}


PUBSUB_SCOPE = "https://www.googleapis.com/auth/pubsub"


def _tpu_scopes(old: Any, new: Any) -> bool:
    """resource_tpu_v2_vm.go tpuServiceAccountAddedScopesSuppress: the same scopes once
    the pubsub one is left out (normalizeScopes); never when the new list is empty."""
    if not new:
        return old == new
    return [s for s in old or () if s != PUBSUB_SCOPE] == [s for s in new if s != PUBSUB_SCOPE]


def _function_environment(old: Any, new: Any) -> bool:
    """resource_cloudfunctions2_function.go environmentVariablesDiffSuppress: the map's
    `LOG_EXECUTION_ID` (which Cloud Run functions set themselves) is no change when the
    new map lacks it; every other key compares as written."""
    old, new = dict(old or {}), dict(new or {})
    if "LOG_EXECUTION_ID" not in new:
        old.pop("LOG_EXECUTION_ID", None)
    return old == new


def _auth_header(old: Any, new: Any) -> bool:
    """resource_cloud_scheduler_job.go authHeaderDiffSuppress on an oidc_token (or
    oauth_token) block: an `audience` (`scope`) the configuration leaves out is the
    API's default (the target's URI; cloud-platform) in the state, no change. Read here
    as: the same block once a key the new block leaves empty is dropped from the old one
    (the program sets the audience, so for its inputs this compares as written)."""
    old_block, new_block = (_block(v) for v in (old, new))
    for key in ("audience", "scope"):
        if not new_block.get(key):
            old_block.pop(key, None)
            new_block.pop(key, None)
    return old_block == new_block


def _block(value: Any) -> dict[str, Any]:
    """A MaxItems-1 block as the bridge passes it: an object, or a list of one."""
    if isinstance(value, list):
        value = value[0] if value else None
    return dict(value or {})


LIST_NORMALISERS: dict[str, Callable[[Any, Any], bool]] = {
    "authHeaderDiffSuppress": _auth_header,
    "diffSuppressSourceRanges": _source_ranges,
    "tpuServiceAccountAddedScopesSuppress": _tpu_scopes,
    "environmentVariablesDiffSuppress": _function_environment,
}


def normalise_rule(facts: Mapping[str, Any], path: str) -> Mapping[str, Any] | None:
    """The facts' normalisation of `path`. The facts name fields as Terraform does, made
    camelCase; the bridge names a list field in the plural (`scope` → `scopes`), so a
    plural path also finds its singular entry."""
    rules = facts.get("normalise", {})
    return rules.get(path) or (rules.get(path.removesuffix("s")) if path.endswith("s")
                               else None)


def no_diff(facts: Mapping[str, Any], path: str, old: Any, new: Any) -> bool:
    """Whether the provider's normalisation makes `old` and `new` the same value. A
    function the preview does not model (listed in the facts all the same) compares as
    written: the preview may show a change the engine does not."""
    rule = normalise_rule(facts, path)
    if rule is None:
        return False
    if rule["function"] in LIST_NORMALISERS:
        return LIST_NORMALISERS[rule["function"]](old, new)
    same = NORMALISERS.get(rule["function"])
    if same is None:
        return False
    if isinstance(old, int | float) and isinstance(new, int | float):
        old, new = str(old), str(new)
    if old is None or new is None:  # a value set or unset: "" to the SDK
        old, new = old or "", new or ""
    return isinstance(old, str) and isinstance(new, str) and same(old, new)


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
    if path == facts.get("replaceWhenRemoved") and isinstance(old, list) \
            and isinstance(new, list):
        return _removes_candidates(old, new)
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


def _removes_candidates(old: list[Any], new: list[Any]) -> tuple[bool, str]:
    """A FallbackTpu's candidates edited: replaced when the candidate it runs on goes.
    The preview does not know which one that is, so a removal is shown as one."""
    from components.fallback_tpu import removed_candidates

    removed = removed_candidates(old, new)
    if not removed:
        return False, "update"
    return True, f"replaced if it runs on the removed candidate {', '.join(removed)}"


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
    for key in ("provider", "parent"):
        if resource.get(key):
            deps.add(resource[key])
    return deps


def _unknown_paths(inputs: Mapping[str, Any], key: str, needles: set[str]) -> list[str]:
    """The leaves under `key` that hold one of `needles` (a replaced resource's name, or
    its computed outputs); the key itself when `needles` is None-like or none does."""
    found = [p for p, value in leaves(inputs.get(key), key)
             if isinstance(value, str) and any(n in value for n in needles)]
    return found or [key]


def leaves(tree: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if isinstance(tree, Mapping):
        for key, value in sorted(tree.items()):
            yield from leaves(value, f"{prefix}.{key}")
    else:
        yield prefix, tree


def _name_of(resource: Mapping[str, Any]) -> set[str]:
    return {str(resource.get("inputs", {}).get("name") or resource.get("name"))}


def _computed(resource: Mapping[str, Any]) -> set[str]:
    """The replaced resource's outputs a preview does not know yet: those it computes
    (a self link, an email), not the inputs it echoes (a bucket's name)."""
    return {v for v in resource.get("outputs", {}).values() if isinstance(v, str) and v}


def _unknown_changes(old: Mapping[str, Any], new: Mapping[str, Any],
                     replaced: Mapping[str, Mapping[str, Any]],
                     deleted_first: set[str]) -> list[Change]:
    """Inputs that take a replaced resource's outputs and are unknown in the diff: all
    of them for a delete-first root (the engine's dependent diff); a create-before-delete
    root's computed outputs only."""
    base_inputs, head_inputs = old.get("inputs", {}), new.get("inputs", {})
    changes = []
    for key, urns in sorted(new.get("propertyDependencies", {}).items()):
        for source in sorted(u for u in urns if u in replaced):
            root = replaced[source]
            first = source in deleted_first
            needles = _name_of(root) if first else _computed(root)
            if not first and not any(n in str(head_inputs.get(key)) for n in needles):
                continue
            for path in _unknown_paths(head_inputs, key, needles):
                forced, reason = replaces(new, path, value_at(base_inputs, path), UNKNOWN)
                changes.append(Change(path, value_at(base_inputs, path), UNKNOWN, forced,
                                      reason, source))
    return changes


def _changes(old: Mapping[str, Any], new: Mapping[str, Any],
             replaced: Mapping[str, Mapping[str, Any]],
             deleted_first: set[str]) -> list[Change]:
    base_inputs, head_inputs = old.get("inputs", {}), new.get("inputs", {})
    changes = _unknown_changes(old, new, replaced, deleted_first)
    unknown = {c.path.split(".", 1)[0] for c in changes}
    facts = type_facts(new["type"]) or {}
    for path in changed_paths(base_inputs, head_inputs):
        before, after = value_at(base_inputs, path), value_at(head_inputs, path)
        if path.split(".", 1)[0] in unknown or no_diff(facts, path, before, after):
            continue
        forced, reason = replaces(new, path, before, after)
        changes.append(Change(path, before, after, forced, reason))
    if bool(old.get("protect")) != bool(new.get("protect")):
        changes.append(Change("(protect)", bool(old.get("protect")), bool(new.get("protect")),
                              False, "option"))
    if new.get("provider") in replaced:
        changes.append(Change("(provider)", old.get("provider"), UNKNOWN, True,
                              "its provider is replaced", new["provider"]))
    return changes


def _quoted(urn: str) -> str:
    return f"'{urn}'"


def replace_refusal(urn: str) -> str:
    """pulumi/pulumi step_generator.go continueStepsFromDiff (`protectRefusesReplace`)."""
    return (f'unable to replace resource "{urn}"\nas it is currently marked for protection. '
            "To unprotect the resource, remove the `protect` flag from the resource in your "
            "Pulumi program and run `pulumi up`")


def dependent_refusal(urn: str, root: str) -> str:
    """step_generator.go, a protected dependent of a delete-first root
    (`protectedDependentBails`)."""
    return (f'unable to replace resource "{urn}" as part of replacing "{root}" as it is '
            "currently marked for protection. To unprotect the resource, remove the "
            "`protect` flag from the resource in your Pulumi program and run `pulumi up`, "
            f"or use the command:\n`pulumi state unprotect {_quoted(urn)}`")


def delete_refusal(urn: str) -> str:
    """step.go deleteProtectedError (`protectRefusesDelete`)."""
    return (f'resource "{urn}" cannot be deleted\nbecause it is protected. To unprotect the '
            "resource, either remove the `protect` flag from the resource in your Pulumi "
            f"program and run `pulumi up`, or use the command:\n`pulumi state unprotect "
            f"{_quoted(urn)}`")


def _dependents_index(resources: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """URN → the URNs whose inputs take its outputs (or that it provides for)."""
    index: dict[str, list[str]] = {}
    for urn, resource in resources.items():
        takes = {u for urns in resource.get("propertyDependencies", {}).values() for u in urns}
        if resource.get("provider"):
            takes.add(resource["provider"])
        for source in takes:
            index.setdefault(source, []).append(urn)
    return index


def dependent_replacements(root: str, before: Mapping[str, Mapping[str, Any]],
                           dependents: Mapping[str, list[str]]) -> list[str]:
    """pulumi/pulumi step_generator.go calculateDependentReplacements, on the base's
    state: the transitive dependents of `root` whose diff, with every input taking a
    resource of the replace set unknown, replaces them (components never)."""
    replace_set = {root}
    found: list[str] = []
    queue = sorted(dependents.get(root, ()))
    seen: set[str] = set(queue)
    while queue:
        urn = queue.pop(0)
        resource = before[urn]
        if not resource.get("custom", True):
            continue
        if resource.get("provider") in replace_set or any(
                replaces(resource, key, None, UNKNOWN)[0]
                for key, urns in resource.get("propertyDependencies", {}).items()
                if replace_set.intersection(urns)):
            replace_set.add(urn)
            found.append(urn)
            for later in sorted(dependents.get(urn, ())):
                if later not in seen:
                    seen.add(later)
                    queue.append(later)
    return found


def gcp_identity(resource: Mapping[str, Any]) -> tuple[str, str] | None:
    """What GCP knows a resource by, for the kinds two URNs can share: a TPU node (a
    V2Vm or a queued one: node id and zone), a bucket, an object."""
    inputs = resource.get("inputs", {})
    kind = resource["type"].rsplit(":", 1)[-1]
    node_id = inputs.get("node_id") if "node_id" in inputs else \
        inputs.get("name") if kind == "V2Vm" else None
    if node_id:
        return "TPU node", f"{node_id} in {inputs.get('zone', '')}"
    if kind == "Bucket":
        return "bucket", f"gs://{inputs.get('name', '')}"
    if kind == "BucketObject":
        return "object", f"gs://{inputs.get('bucket', '')}/{inputs.get('name', '')}"
    return None


def collision_refusal(kind: str, name: str, deleted: Step) -> str:
    if kind == "object":
        return (f"{name} is written here and then deleted with {deleted.name}, which the "
                "engine deletes after every create: the object is gone after `pulumi up`. "
                "Give the new object another name.")
    how = ("remove the node from the stack's nodes first (merge, `pulumi up`), then add "
           "it back with its new provisioning" if kind == "TPU node" else
           f"remove {deleted.name} first (merge, `pulumi up`), then add the new one")
    return (f"GCP refuses the create: {kind} {name} still exists, held by {deleted.name}, "
            "which the engine deletes only after every create and update. Make the change "
            f"in two reviewed changes: {how}.")


def _refuse_collisions(steps: list[Step]) -> list[Step]:
    held = {gcp_identity(s.resource): s for s in steps if s.op == "delete"}
    held.pop(None, None)
    out = []
    for step in steps:
        identity = gcp_identity(step.resource) if step.op == "create" else None
        if identity in held and not step.refused:
            step = replace(step, refused=collision_refusal(*identity, held[identity]))
        out.append(step)
    return out


def _delete_step(urn: str, old: Mapping[str, Any]) -> Step:
    facts = type_facts(old["type"]) or {}
    stays = ("retainOnDelete: the engine only drops it from the state" if old.get(
        "retainOnDelete") else "the provider's Delete only drops it from the state "
        f"({_where(facts['deleteOnlyForgets'])})" if facts.get("deleteOnlyForgets") else "")
    return Step("delete", urn, old["type"], old["name"], old,
                refused=delete_refusal(urn) if old.get("protect") else "", stays_in_gcp=stays)


def _where(cite: Mapping[str, Any]) -> str:
    return f"{cite['repo']} {cite['path']}:{cite['line']}@{cite['commit'][:12]}"


def _replace_step(urn: str, old: Mapping[str, Any], new: Mapping[str, Any],
                  changes: list[Change], condemned_by: Mapping[str, str]) -> Step:
    root = condemned_by.get(urn)
    if root is not None:
        first, why = True, f"deleted before {root.rsplit('::', 1)[-1]}, whose outputs it takes"
    else:
        first, why = delete_first(new)
    refused = replace_refusal(urn) if old.get("protect") and new.get("protect") else ""
    return Step("replace", urn, new["type"], new["name"], new, old, tuple(changes), first, why,
                refused=refused, deleted_before=root)


def plan_steps(base: Mapping[str, Any], head: Mapping[str, Any]) -> Steps:
    """The steps from `base` to `head` (Plan.to_json() dicts), custom and component
    resources both, as the engine counts them."""
    before = {r["urn"]: r for r in base.get("resources", [])}
    after = {r["urn"]: r for r in head.get("resources", [])}
    dependents = _dependents_index(before)
    replaced: dict[str, Mapping[str, Any]] = {}
    condemned_by: dict[str, str] = {}  # dependent → the delete-first root it goes before
    deleted_first: set[str] = set()
    steps: list[Step] = []
    unchanged = 0
    for urn in dependency_order(after):
        new = after[urn]
        if urn not in before:
            steps.append(Step("create", urn, new["type"], new["name"], new))
            continue
        old = before[urn]
        changes = _changes(old, new, replaced, deleted_first)
        if urn in condemned_by and not any(c.replaces for c in changes):
            changes.append(Change("(dependency)", None, UNKNOWN, True, "its dependency is "
                                  "replaced, delete first", condemned_by[urn]))
        if not changes:
            unchanged += 1
        elif any(c.replaces for c in changes):
            replaced[urn] = new
            step = _replace_step(urn, old, new, changes, condemned_by)
            if step.delete_first:
                deleted_first.add(urn)
                for dependent in dependent_replacements(urn, before, dependents):
                    condemned_by.setdefault(dependent, urn)
            steps.append(step)
        elif all(c.path == "(protect)" for c in changes):
            steps.append(Step("same", urn, new["type"], new["name"], new, old, tuple(changes)))
        else:
            steps.append(Step("update", urn, new["type"], new["name"], new, old,
                              tuple(changes)))
    steps = _refuse_condemned(steps, before, condemned_by)
    gone = [urn for urn in dependency_order(before) if urn not in after]
    steps += [_delete_step(urn, before[urn]) for urn in reversed(gone)]  # dependents first
    return Steps(_refuse_collisions(steps), unchanged)


def _refuse_condemned(steps: list[Step], before: Mapping[str, Mapping[str, Any]],
                      condemned_by: Mapping[str, str]) -> list[Step]:
    """A dependent deleted first that is protected: the engine's error, and it stops
    (the dependent may also be one the head no longer declares)."""
    out = []
    for step in steps:
        root = condemned_by.get(step.urn)
        if root is not None and before[step.urn].get("protect") and not step.refused:
            step = replace(step, refused=dependent_refusal(step.urn, root))
        out.append(step)
    return out
