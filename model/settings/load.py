"""Reading a stack config: gather the `tpu-stack:` keys, check their shape, repair what
pydantic refused so the rules still run, and raise one SettingsError listing every
problem at once (model/settings/__init__.py)."""

from __future__ import annotations

import copy
import json
import re
import types
from collections.abc import Mapping
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.alias_generators import to_camel

from model import catalog
from model.settings.rules import rule_problems
from model.settings.schema import (
    GCP_PROJECT_KEY,
    NAMESPACE,
    Environment,
    SettingsError,
    StackSettings,
)
from model.settings.suggest import closest

ENVIRONMENT_KEY = f"{NAMESPACE}:environment"
ENVIRONMENTS: tuple[str, ...] = get_args(Environment)


def environment_of(config: Mapping[str, Any]) -> str:
    """dev or prod: decided by `tpu-stack:environment` alone (Pulumi.yaml's
    default: prod), here and in the policy pack. A value load_settings would
    refuse counts as prod, the stricter one."""
    value = config.get(ENVIRONMENT_KEY)
    return value if value in ENVIRONMENTS else StackSettings.model_fields["environment"].default


# Keys of the stack config the program reads, with the model field each fills.
TOP_LEVEL_KEYS: dict[str, str] = {
    f"{NAMESPACE}:{to_camel(name)}": name
    for name in StackSettings.model_fields if name not in ("stack", "gcp_project", "organization")
}


def load_settings(raw: Mapping[str, Any], stack: str,
                  organization: str | None = None) -> StackSettings:
    """Check the config `raw` (`namespace:key` → value, as the CLI passes it) of
    `stack` in `organization` (None: unknown, e.g. offline). Every problem of the
    file at once: its shape's and its rules' (module docstring)."""
    data, problems = _gather(raw, stack)
    data["organization"] = organization
    try:
        settings = StackSettings.model_validate(data)
    except ValidationError as error:
        shape = _pydantic_problems(error)
        problems += shape + _rules_despite(data, error, _suggested_keys(problems + shape))
        raise SettingsError(with_suggestions(problems)) from None
    problems += list(rule_problems(settings))
    if problems:
        raise SettingsError(with_suggestions(problems))
    return settings


_UNKNOWN = "unknown key; allowed: "




def _suggested_keys(problems: list[tuple[str, str]]) -> set[str]:
    """The keys an unknown key's "did you mean" points to."""
    suggested = set()
    for key, message in problems:
        if message.startswith(_UNKNOWN):
            parent, _, name = key.rpartition(".")
            match = closest(name, message[len(_UNKNOWN):].split(", "))
            if match:
                suggested.add(f"{parent}.{match}" if parent else match)
    return suggested


def with_suggestions(problems: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A misspelt key is one problem with a "did you mean": the unknown key gets
    the closest allowed one (difflib), and that key's own "is required" goes."""
    suggested = _suggested_keys(problems)
    out = []
    for key, message in problems:
        if message.startswith(_UNKNOWN):
            name = key.rpartition(".")[2]
            allowed = message[len(_UNKNOWN):].split(", ")
            match = closest(name, allowed) or _family_of_prefix(name, allowed)
            if match:
                message = f"unknown key; did you mean {match}? allowed: {', '.join(allowed)}"
        out.append((key, message))
    return [(key, message) for key, message in out
            if not (key in suggested and message.startswith("is required"))
            and not _knock_on(key, message, suggested)]


def _family_of_prefix(name: str, allowed: list[str]) -> str | None:
    """The TPU family whose accelerator-type prefix `name` is (v5litepod: v5e), where a
    family is allowed (a quota's keys)."""
    return next((g.name for g in catalog.GENERATIONS.values()
                 if g.type_prefix == name and g.name in allowed), None)


def _knock_on(key: str, message: str, suggested: set[str]) -> bool:
    """A sibling's "applies only with <name>" where <name> is the key a misspelt one
    meant (`maxWait: applies only with fallback` after `fallbacks: unknown key`)."""
    prefix = "applies only with "
    if not message.startswith(prefix):
        return False
    parent = key.rpartition(".")[0]
    meant = message[len(prefix):].split(" ", 1)[0]
    return (f"{parent}.{meant}" if parent else meant) in suggested


def _gather(raw: Mapping[str, Any], stack: str) -> tuple[dict[str, Any], list]:
    problems: list[tuple[str, str]] = []
    data: dict[str, Any] = {"stack": stack}
    if raw.get(GCP_PROJECT_KEY):
        data["gcpProject"] = raw[GCP_PROJECT_KEY]
    for key, value in raw.items():
        namespace, _, name = key.partition(":")
        if namespace != NAMESPACE:
            continue
        if key not in TOP_LEVEL_KEYS:
            problems.append((key, f"unknown key; allowed: {', '.join(sorted(TOP_LEVEL_KEYS))}"))
            continue
        decoded = _decode(value)
        # An empty block ({} or null, e.g. a Pulumi.yaml default) is no block.
        if decoded not in ({}, None, "null"):
            data[name] = decoded
    return data, problems


def _decode(value: Any) -> Any:
    """Pulumi hands object and array values to the program as JSON text."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _key_path(loc: tuple[int | str, ...]) -> str:
    head, *rest = loc
    path = GCP_PROJECT_KEY if head == "gcpProject" else f"{NAMESPACE}:{head}"
    for part in rest:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _pydantic_problems(error: ValidationError) -> list[tuple[str, str]]:
    problems = []
    for item in error.errors():
        loc = tuple(item["loc"])
        if item["type"] == "extra_forbidden":
            message = f"unknown key; allowed: {_allowed_keys(loc[:-1])}"
        elif item["type"] == "missing":
            message = f"is required{_required_inside(loc)}"
        else:
            message = f"{item['msg']}, got {item.get('input')!r}"
        problems.append((_key_path(loc), message))
    return problems


def _allowed_keys(parent: tuple[int | str, ...]) -> str:
    model = _model_at(parent)
    return ", ".join(_key_of(n, f) for n, f in model.model_fields.items())


def _required_inside(loc: tuple[int | str, ...]) -> str:
    """', with location' for a missing block that has keys of its own to give."""
    model = _model_at(loc)
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return ""
    required = [_key_of(n, f) for n, f in model.model_fields.items() if f.is_required()]
    return f", with at least {', '.join(required)}" if required else ""


def _model_at(path: tuple[int | str, ...]) -> Any:
    model: Any = StackSettings
    for part in path:
        if isinstance(part, int) or not hasattr(model, "model_fields"):
            continue
        field = next((f for n, f in model.model_fields.items() if _key_of(n, f) == part), None)
        if field is not None:  # else a key of a dict (a team or family name)
            model = _model_of(field.annotation)
    return model


def _key_of(name: str, field: Any) -> str:
    return field.alias or to_camel(name)


def _model_of(annotation: Any) -> Any:
    for candidate in getattr(annotation, "__args__", ()) or (annotation,):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
        inner = _model_of(candidate) if getattr(candidate, "__args__", None) else None
        if inner is not None:
            return inner
    return annotation


# ---- the rules despite shape problems ---------------------------------------

Loc = tuple[int | str, ...]  # a pydantic error location: keys and list indices
_DROPPED = object()  # a list entry taken out, until the list is compacted
_REPAIR_ROUNDS = 4  # a blank block can only reveal its own required keys


def _rules_despite(data: dict[str, Any], error: ValidationError,
                   suggested: set[str]) -> list[tuple[str, str]]:
    """The rule problems of `data`, which pydantic refused with `error`: the rules
    run on a repaired copy (`_Repair`), and what they say about a repaired part,
    or about a key an unknown key was probably meant to be, is left out: that part
    has its own problem already. [] when no copy validates."""
    repair = _Repair(copy.deepcopy(data))
    for _ in range(_REPAIR_ROUNDS):
        if not repair.apply(error):
            return []
        try:
            settings = StackSettings.model_validate(repair.data)
            break
        except ValidationError as again:
            error = again
    else:
        return []
    try:
        found = list(rule_problems(settings))
    except Exception:  # a rule that cannot read a repaired copy: the shape problems only
        return []
    # A key an unknown key probably meant, and that the file lacks: its value is
    # under the misspelt key, so the rules' word about it is not news.
    meant = {key for key in suggested if not _present(data, key)}
    return [(key, message) for key, message in ((repair.original_key(k), m) for k, m in found)
            if key not in meant and not any(_about(key, message, done)
                                            for done in repair.keys)]


def _present(data: dict[str, Any], key: str) -> bool:
    """Whether the key path `key` (tpu-stack:nodes[0].zone) is set in `data`."""
    value: Any = data
    path = key.split(":", 1)[1] if key.startswith(f"{NAMESPACE}:") else key
    for part in re.findall(r"[^.\[\]]+", path):
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return False
    return True


def _about(key: str, message: str, repaired: str) -> bool:
    """Whether a rule's problem is at or under a repaired key, or names it (e.g.
    "allowed only with tpu-stack:environment dev"): its own problem says it all."""
    return (key == repaired or key.startswith((f"{repaired}.", f"{repaired}["))
            or re.search(re.escape(repaired) + r"(?![\w.\[-])", message) is not None)


class _Repair:
    """A copy of the config made valid part by part: an unknown key or dict entry
    goes, an invalid optional value goes (its default applies), an invalid required
    string or block becomes blank, and what cannot be repaired in place goes with
    the nearest list entry holding it. Keeps where list entries were, so the rules'
    key paths name the file's entries."""

    def __init__(self, data: dict[str, Any]):
        self.data = data
        self.keys: list[str] = []  # the repaired parts, as key paths of the file
        self._origin: dict[Loc, list[int]] = {}  # a shortened list's original indices

    def apply(self, error: ValidationError) -> bool:
        """Repair every location `error` names; False when one cannot be."""
        for item in error.errors():
            loc = tuple(item["loc"])
            if not self._repair(loc):
                return False
            self.keys.append(_key_path(self._original(loc)))
        self._compact(self.data, ())
        return True

    def _repair(self, loc: Loc) -> bool:
        kind, required, annotation = _slot(loc)
        if kind == "field" and required:
            blank = _blank(annotation)
            if blank is not None:
                return self._set(loc, blank)
        for end in range(len(loc), 0, -1):
            kind, required, _ = _slot(loc[:end])
            if kind in ("extra", "item", "entry") or (kind == "field" and not required):
                return self._set(loc[:end], _DROPPED)
        return False

    def _set(self, loc: Loc, value: Any) -> bool:
        parent: Any = self.data
        for part in loc[:-1]:
            try:
                parent = parent[part]
            except (KeyError, IndexError, TypeError):
                return True  # already gone with an enclosing part
        last = loc[-1]
        if isinstance(parent, list) and isinstance(last, int) and last < len(parent):
            parent[last] = value
        elif isinstance(parent, dict):
            if value is _DROPPED:
                parent.pop(last, None)
            else:
                parent[last] = value
        return True

    def _compact(self, value: Any, loc: Loc) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                self._compact(inner, (*loc, key))
        elif isinstance(value, list):
            kept = [index for index, inner in enumerate(value) if inner is not _DROPPED]
            if len(kept) < len(value):
                origin = self._origin.get(loc, list(range(len(value))))
                self._origin[loc] = [origin[index] for index in kept]
                value[:] = [value[index] for index in kept]
            for index, inner in enumerate(value):
                self._compact(inner, (*loc, index))

    def _original(self, loc: Loc) -> Loc:
        """`loc` in the file's list indices."""
        out: list[int | str] = []
        for part in loc:
            origin = self._origin.get(tuple(loc[:len(out)]))
            out.append(origin[part] if isinstance(part, int) and origin
                       and part < len(origin) else part)
        return tuple(out)

    def original_key(self, key: str) -> str:
        """A rule's key path in the file's list indices."""
        for loc, origin in self._origin.items():
            prefix = re.escape(_key_path(loc)) + r"\[(\d+)\]"
            key = re.sub(f"^{prefix}", lambda m, loc=loc, origin=origin:
                         f"{_key_path(loc)}[{origin[int(m[1])]}]", key)
        return key


def _slot(loc: Loc) -> tuple[str, bool, Any]:
    """What the last part of `loc` is in StackSettings: ("field", required,
    annotation) of a model, ("item" | "entry", False, annotation) of a list or a
    dict, ("extra", False, None) for a key no model has."""
    annotation: Any = StackSettings
    kind, required = "field", True
    for part in loc:
        annotation = _unwrap_optional(annotation)
        origin = get_origin(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = next((f for n, f in annotation.model_fields.items()
                          if _key_of(n, f) == part), None)
            if field is None:
                return "extra", False, None
            kind, required, annotation = "field", field.is_required(), field.annotation
        elif origin is list:
            kind, required, annotation = "item", False, get_args(annotation)[0]
        elif origin is dict:
            kind, required, annotation = "entry", False, get_args(annotation)[1]
        else:
            return "extra", False, None
    return kind, required, annotation


def _unwrap_optional(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        inner = [arg for arg in get_args(annotation) if arg is not type(None)]
        return inner[0] if len(inner) == 1 else annotation
    return annotation


def _blank(annotation: Any) -> Any:
    """A stand-in for a required value: an empty string, or a block whose own
    required keys the next round fills; None for other types."""
    if annotation is str:
        return ""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {}
    return None
