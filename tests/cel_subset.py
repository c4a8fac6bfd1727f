"""The part of CEL (github.com/google/cel-spec, langdef.md) that components/ci.py
writes into attribute conditions and mappings, evaluated the way Google's Security
Token Service would, so a test can run GitHub tokens through the declared plan.

Grammar: string literals ('…' or "…", no escapes), `assertion.<claim>`, `has(…)`,
`==`, `!=`, `!`, `&&`, `||`, `?:` and parentheses. Anything else is refused, so
an expression this module does not understand fails the test instead of passing.
Semantics from the spec: reading a missing map key is an error; `&&` and `||`
are commutative over errors (false && error is false, true || error is true);
the conditional evaluates only the branch it picks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_TOKEN = re.compile(r"""\s*(?:(?P<string>'[^'\\]*'|"[^"\\]*")|(?P<op>==|!=|&&|\|\||[!?:().])
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
        left = self.primary()
        if self.peek() in ("==", "!="):
            op = self.take()[1]
            return (op, left, self.primary())
        return left

    def primary(self) -> tuple:
        kind, text = self.take()
        if kind == "string":
            return ("lit", text[1:-1])
        if text == "(":
            node = self.expression()
            self.take(")")
            return node
        if text == "has":
            self.take("(")
            path = self.path(self.take()[1])
            self.take(")")
            return ("has", path)
        if kind == "name":
            return ("get", self.path(text))
        raise CelSyntaxError(f"unexpected {text!r}")

    def path(self, first: str) -> tuple[str, ...]:
        parts = [first]
        while self.peek() == ".":
            self.take()
            kind, name = self.take()
            if kind != "name":
                raise CelSyntaxError(f"bad field {name!r}")
            parts.append(name)
        return tuple(parts)


def parse(text: str) -> tuple:
    parser = _Parser(_tokens(text))
    node = parser.expression()
    if parser.peek() is not None:
        raise CelSyntaxError(f"trailing {parser.peek()!r} in {text!r}")
    return node


def _lookup(variables: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = variables
    for part in path:
        if not isinstance(value, dict) or part not in value:
            raise CelError(f"no such key: {part}")
        value = value[part]
    return value


def _bool(node: tuple, variables: dict[str, Any]) -> bool | CelError:
    try:
        value = _eval(node, variables)
    except CelError as error:
        return error
    if not isinstance(value, bool):
        raise CelError(f"{value!r} is not a bool")
    return value


def _eval(node: tuple, variables: dict[str, Any]) -> Any:
    op = node[0]
    if op == "lit":
        return node[1]
    if op == "get":
        return _lookup(variables, node[1])
    if op == "has":
        parent, field = node[1][:-1], node[1][-1]
        holder = _lookup(variables, parent)
        return isinstance(holder, dict) and field in holder
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
