"""Cloud Storage's bucket locations: regions, predefined dual-regions, multi-regions.

Read from model/gcs_locations.json, which names its source page and the date
it was read; a location missing there is refused by model/settings/ (GCS
refuses an unknown location at `up`, after the rest of the plan has been reviewed).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DATA_FILE = Path(__file__).with_name("gcs_locations.json")


@dataclass(frozen=True)
class GcsLocations:
    source: str
    regions: tuple[str, ...]
    dual_regions: dict[str, frozenset[str]]
    multi_regions: tuple[str, ...]

    def all(self) -> tuple[str, ...]:
        """Every location code as written in the file (lowercase)."""
        return (*self.regions, *self.dual_regions, *self.multi_regions)

    def knows(self, location: str) -> bool:
        """GCS takes location codes in either case (us-central1, US-CENTRAL1)."""
        return location.lower() in self.all()


@cache
def gcs_locations() -> GcsLocations:
    data = json.loads(DATA_FILE.read_text())
    return GcsLocations(
        source=data["source"],
        regions=tuple(data["regions"]),
        dual_regions={name: frozenset(regions) for name, regions in data["dual_regions"].items()},
        multi_regions=tuple(data["multi_regions"]),
    )
