"""Replacement facts (replacement.json, written by generate.py): per resource type,
the inputs that force a replacement and whether the replacement deletes first."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

FACTS = Path(__file__).with_name("replacement.json")


@functools.cache
def facts() -> dict[str, Any]:
    return json.loads(FACTS.read_text())


def type_facts(resource_type: str) -> dict[str, Any] | None:
    return facts()["types"].get(resource_type)


def citation(rule: str) -> str:
    """`repo path:line@commit12` of a rule the preview mirrors (facts()["rules"])."""
    return "; ".join(f"{c['repo']} {c['path']}:{c['line']}@{c['commit'][:12]}"
                     for c in facts()["rules"][rule])
