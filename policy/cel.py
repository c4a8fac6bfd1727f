"""CEL as Google evaluates the conditions this stack writes: Workload Identity
Federation's attribute conditions and mappings (components/ci.py, evaluated by the
Security Token Service) and IAM conditions (components/ci.py, teams.py, evaluated
by IAM; policy/iam.py runs the plan's bindings through them).

The language is cel-python (`celpy`, PyPI `cel-python`, a maintained implementation
of github.com/google/cel-spec): parsing, types, `has()`, the conditional, and the
spec's error semantics (reading a missing key is an error; `&&` and `||` are
commutative over errors). Google's extensions are registered as functions:
- `list.hasOnly(list)`: true when every element of the receiver is in the argument
  (cloud.google.com/iam/docs/conditions-attribute-reference, "API attributes");
- `api.getAttribute(name, default)`: the request's API attribute, or `default`
  (same page; the only one this stack reads is iam.googleapis.com/
  modifiedGrantsByRole, cloud.google.com/iam/docs/setting-limits-on-granting-roles).
What Google refuses stays refused: an expression that does not parse, or that calls
a function outside GCP_FUNCTIONS, raises CelSyntaxError (IAM and STS reject such a
condition when it is set, so `pulumi up` would fail).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

import celpy
from celpy import celtypes

# Functions and macros the conditions may call: CEL's standard string, size and
# macro functions that IAM's attribute reference and STS's attribute-condition
# docs use (startsWith, endsWith, matches, contains, size, has; cloud.google.com/
# iam/docs/conditions-attribute-reference, /iam/docs/workload-identity-federation
# "Attribute conditions"), and Google's own hasOnly and getAttribute. Unconfirmed
# beyond those examples: any other function is refused, never assumed.
GCP_FUNCTIONS = frozenset({"has", "size", "startsWith", "endsWith", "matches", "contains",
                           "hasOnly", "getAttribute"})


class CelError(Exception):
    """An evaluation error (CEL's error value), e.g. a missing claim."""


class CelSyntaxError(Exception):
    """An expression Google would refuse: it does not parse, or calls an unknown function."""


_ENVIRONMENT = celpy.Environment()


def _has_only(receiver: Any, allowed: Any) -> celtypes.BoolType:
    if not isinstance(receiver, list) or not isinstance(allowed, list):
        raise celpy.CELEvalError("hasOnly takes a list and a list")
    return celtypes.BoolType(all(item in allowed for item in receiver))


@cache
def _compiled(text: str) -> Any:
    try:
        tree = _ENVIRONMENT.compile(text)
    except celpy.CELParseError as error:
        raise CelSyntaxError(f"{text!r}: {str(error).splitlines()[0]}") from None
    for node in tree.iter_subtrees():
        name = None
        if node.data == "member_dot_arg":
            name = str(node.children[1])
        elif node.data == "ident_arg":
            name = str(node.children[0])
        if name is not None and name not in GCP_FUNCTIONS:
            raise CelSyntaxError(f"{text!r}: {name}() is not a function GCP's conditions offer")
    return tree


def evaluate(text: str, variables: Mapping[str, Any],
             attributes: Mapping[str, Any] | None = None) -> Any:
    """The value of `text` (plain Python) with `variables` (JSON-like values) bound;
    `attributes`: the API attributes `api.getAttribute` reads. Raises CelError for
    CEL's error value, CelSyntaxError for what Google would refuse."""
    found = dict(attributes or {})

    def get_attribute(_api: Any, name: Any, default: Any) -> Any:
        return celpy.json_to_cel(found[str(name)]) if str(name) in found else default

    program = _ENVIRONMENT.program(_compiled(text), functions={
        "hasOnly": _has_only, "getAttribute": get_attribute})
    activation = {key: celpy.json_to_cel(value) for key, value in variables.items()}
    activation.setdefault("api", celpy.json_to_cel({}))
    try:
        value = program.evaluate(activation)
    except celpy.CELEvalError as error:
        raise CelError(str(error.args[0] if error.args else error)) from None
    if isinstance(value, celpy.CELEvalError):
        raise CelError(str(value.args[0] if value.args else value))
    return _plain(value)


def _plain(value: Any) -> Any:
    """celpy's values as Python's (bool before int: BoolType is no int here)."""
    if isinstance(value, celtypes.BoolType):
        return bool(value)
    if isinstance(value, celtypes.StringType):
        return str(value)
    if isinstance(value, celtypes.ListType):
        return [_plain(item) for item in value]
    if isinstance(value, celtypes.MapType):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, celtypes.IntType):
        return int(value)
    return value
