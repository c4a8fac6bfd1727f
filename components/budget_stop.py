"""A team's budget that stops its TPUs (docs/design.md, "Budgets that stop TPUs").

For a team with `budgetAction: stop`, the platform stack declares in its own project a
Pub/Sub topic the team's budget notifies (every update, `all_updates_rule`), the
budget-stop function (functions/budget_stop, a Cloud Run function built from its source
archive) triggered by that topic, and a service account of the function's own holding,
in the team's project only, the TPU permissions it needs (a custom role), plus
creating its marker objects under `budget-stop/<team>/` of the artifacts bucket.

`price_table` and `function_source` are pure: the function's prices come from
components/catalog.py, so the meter it acts on is the stack's own.
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

from components import catalog

FUNCTION_DIR = Path(__file__).resolve().parents[1] / "functions" / "budget_stop"
FUNCTION_FILES = ("main.py", "spend.py", "requirements.txt")
PRICES_NAME = "prices.json"
ENTRY_POINT = "budget_stop"
# A fixed time for every member: the archive's bytes depend on its content only.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


def price_table() -> dict[str, dict[str, float | None]]:
    """Per accelerator-type prefix, USD per hour of one unit of the number in the type's
    name (TensorCores or chips, catalog.Naming), on-demand and spot: what
    functions/budget_stop/spend.py prices a node with."""
    table: dict[str, dict[str, float | None]] = {}
    for generation in catalog.GENERATIONS.values():
        units_per_chip = generation.cores_per_chip \
            if generation.naming is catalog.Naming.TENSORCORES else 1
        price = generation.price
        table[generation.type_prefix] = {
            rate: None if per_chip is None else per_chip / units_per_chip
            for rate, per_chip in (("onDemand", price.on_demand), ("spot", price.spot))}
    return table


def function_source() -> bytes:
    """The function's source archive (zip): its files and the catalog's prices, the same
    bytes on every machine for the same content."""
    members = {name: (FUNCTION_DIR / name).read_bytes() for name in FUNCTION_FILES}
    members[PRICES_NAME] = json.dumps(price_table(), sort_keys=True, indent=1).encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(members):
            info = zipfile.ZipInfo(name, _ZIP_TIME)
            info.external_attr = 0o644 << 16
            archive.writestr(info, members[name], zipfile.ZIP_DEFLATED)
    return buffer.getvalue()
