"""What every rule shares: the problems it yields (key path, message) and the
suggestion for a misspelt name."""

from __future__ import annotations

import difflib
from collections.abc import Iterator

Problems = Iterator[tuple[str, str]]


def closest(name: str, allowed: list[str]) -> str | None:
    """The allowed word `name` most likely misspells (difflib), or None."""
    match = difflib.get_close_matches(name, allowed, n=1)
    return match[0] if match else None


def did_you_mean(name: str, allowed: tuple[str, ...] | list[str],
                  known: tuple[str, ...] | set[str]) -> str:
    """`; did you mean <the allowed name closest to name>?` for a name that is none of
    the `known` ones (a misspelling), else "": a real zone that lacks the TPU is no typo."""
    if name in known:
        return ""
    meant = closest(name, list(allowed))
    return f"; did you mean {meant}?" if meant else ""
