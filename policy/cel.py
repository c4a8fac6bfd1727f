"""The part of CEL (github.com/google/cel-spec, langdef.md) that this stack writes
into conditions, evaluated the way Google evaluates them: Workload Identity
Federation's attribute conditions and mappings (components/ci.py, evaluated by
the Security Token Service) and IAM conditions (components/ci.py, teams.py,
evaluated by IAM; policy/iam.py runs the plan's bindings through them).

Grammar: string literals ('…' or "…", no escapes), list literals, variables and
field selection (`assertion.<claim>`), `has(…)`, `==`, `!=`, `!`, `&&`, `||`,
`?:`, parentheses, the string methods `startsWith` and `endsWith`, IAM's list
method `hasOnly` (cloud.google.com/iam/docs/conditions-attribute-reference, "API
attributes": `list.hasOnly(list)` is true when every element of the receiver is
in the argument) and calls of functions the variables hold (`api.getAttribute`).
Anything else is refused, so an expression this module does not understand
fails instead of passing. Semantics from the spec: reading a missing map key is
an error; `&&` and `||` are commutative over errors (false && error is false,
true || error is true); the conditional evaluates only the branch it picks.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_TOKEN = re.compile(r"""\s*(?:(?P<string>'[^'\\]*'|"[^"\\]*")|(?P<op>==|!=|&&|\|\||[!?:().\[\],])
                        |(?P<name>[A-Za-z_][A-Za-z0-9_]*))""", re.VERBOSE)


class CelError(Exception):
    """An evaluation error (CEL's error value), e.g. a missing claim."""


class CelSyntaxError(Exception):
    """An expression outside the subset."""


def _tokens(text: str) -> list[tuple[str, str]]:
    tokens, position = [], 0
    while position < len(text.rstrip()):
        match = _TOKEN.match(text, position)
        if match is None:
            raise CelSyntaxError(f"cannot read {text[position:]!r}")
        kind = match.lastgroup
        assert kind is not None
        tokens.append((kind, match.group(kind)))
        position = match.end()
    return tokens


@dataclass
class _Parser:
    tokens: list[tuple[str, str]]
    at: int = 0

    def peek(self) -> str | None:
        return self.tokens[self.at][1] if self.at < len(self.tokens) else None

    def take(self, expected: str | None = None) -> tuple[str, str]:
        if self.at >= len(self.tokens):
            raise CelSyntaxError("unexpected end")
        token = self.tokens[self.at]
        if expected is not None and token[1] != expected:
            raise CelSyntaxError(f"expected {expected!r}, got {token[1]!r}")
        self.at += 1
        return token

    def expression(self) -> tuple:
        condition = self.disjunction()
        if self.peek() != "?":
            return condition
        self.take("?")
        then = self.expression()
        self.take(":")
        return ("if", condition, then, self.expression())

    def disjunction(self) -> tuple:
        node = self.conjunction()
        while self.peek() == "||":
            self.take()
            node = ("or", node, self.conjunction())
        return node

    def conjunction(self) -> tuple:
        node = self.unary()
        while self.peek() == "&&":
            self.take()
            node = ("and", node, self.unary())
        return node

    def unary(self) -> tuple:
        if self.peek() == "!":
            self.take()
            return ("not", self.unary())
        left = self.postfix()
        if self.peek() in ("==", "!="):
            op = self.take()[1]
            return (op, left, self.postfix())
        return left

    def postfix(self) -> tuple:
        node = self.atom()
        while self.peek() == ".":
            self.take()
            kind, name = self.take()
            if kind != "name":
                raise CelSyntaxError(f"bad field {name!r}")
            if self.peek() == "(":
                node = ("method", node, name, self.arguments())
            else:
                node = ("field", node, name)
        return node

    def arguments(self, close: str = ")") -> tuple:
        self.take("(" if close == ")" else "[")
        items: list[tuple] = []
        while self.peek() != close:
            if items:
                self.take(",")
            items.append(self.expression())
        self.take(close)
        return tuple(items)

    def atom(self) -> tuple:
        kind, text = self.tokens[self.at] if self.at < len(self.tokens) else ("", "")
        if text == "[":
            return ("list", self.arguments("]"))
        kind, text = self.take()
        if kind == "string":
            return ("lit", text[1:-1])
        if text == "(":
            node = self.expression()
            self.take(")")
            return node
        if text == "has":
            self.take("(")
            selection = self.postfix()
            self.take(")")
            if selection[0] != "field":
                raise CelSyntaxError("has() takes a field selection")
            return ("has", selection)
        if kind == "name":
            return ("var", text)
        raise CelSyntaxError(f"unexpected {text!r}")


def parse(text: str) -> tuple:
    parser = _Parser(_tokens(text))
    node = parser.expression()
    if parser.peek() is not None:
        raise CelSyntaxError(f"trailing {parser.peek()!r} in {text!r}")
    return node


def _field(holder: Any, name: str) -> Any:
    if not isinstance(holder, dict) or name not in holder:
        raise CelError(f"no such key: {name}")
    return holder[name]


def _bool(node: tuple, variables: dict[str, Any]) -> bool | CelError:
    try:
        value = _eval(node, variables)
    except CelError as error:
        return error
    if not isinstance(value, bool):
        raise CelError(f"{value!r} is not a bool")
    return value


def _has_only(receiver: Any, allowed: Any) -> bool:
    if not isinstance(receiver, list) or not isinstance(allowed, list):
        raise CelError("hasOnly takes a list and a list")
    return all(item in allowed for item in receiver)


def _string_method(method: Callable[[str, str], bool]) -> Callable[[Any, Any], bool]:
    def checked(receiver: Any, argument: Any) -> bool:
        if not isinstance(receiver, str) or not isinstance(argument, str):
            raise CelError(f"{method.__name__} takes strings")
        return method(receiver, argument)
    return checked


_METHODS: dict[str, Callable[[Any, Any], bool]] = {
    "startsWith": _string_method(str.startswith),
    "endsWith": _string_method(str.endswith),
    "hasOnly": _has_only,
}


def _call(node: tuple, variables: dict[str, Any]) -> Any:
    _, target, name, args = node
    values = [_eval(arg, variables) for arg in args]
    if target[0] == "var" and isinstance(variables.get(target[1]), dict):
        function = variables[target[1]].get(name)
        if callable(function):  # a function a variable holds: api.getAttribute
            return function(*values)
    if name not in _METHODS or len(values) != 1:
        raise CelSyntaxError(f"unknown function {name}")
    return _METHODS[name](_eval(target, variables), values[0])


def _eval(node: tuple, variables: dict[str, Any]) -> Any:
    op = node[0]
    if op == "lit":
        return node[1]
    if op == "list":
        return [_eval(item, variables) for item in node[1]]
    if op == "var":
        return _field(variables, node[1])
    if op == "field":
        return _field(_eval(node[1], variables), node[2])
    if op == "method":
        return _call(node, variables)
    if op == "has":
        holder = _eval(node[1][1], variables)
        return isinstance(holder, dict) and node[1][2] in holder
    if op in ("==", "!="):
        equal = _eval(node[1], variables) == _eval(node[2], variables)
        return equal if op == "==" else not equal
    if op == "not":
        value = _eval(node[1], variables)
        if not isinstance(value, bool):
            raise CelError(f"!{value!r}")
        return not value
    if op in ("and", "or"):
        short = op == "or"  # the value that decides alone
        left, right = _bool(node[1], variables), _bool(node[2], variables)
        if left is short or right is short:
            return short
        for side in (left, right):
            if isinstance(side, CelError):
                raise side
        return not short
    if op == "if":
        condition = _eval(node[1], variables)
        if not isinstance(condition, bool):
            raise CelError(f"{condition!r} is not a bool")
        return _eval(node[2] if condition else node[3], variables)
    raise CelSyntaxError(f"unknown node {op}")


def evaluate(text: str, variables: dict[str, Any]) -> Any:
    """The value of `text`; raises CelError for CEL's error value."""
    return _eval(parse(text), variables)
