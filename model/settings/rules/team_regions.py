"""The rules on a team's regions (model/team_regions.py): each a TPU region with a
subnet slot."""

from __future__ import annotations

from model import catalog, subnets
from model.settings.schema import TeamSettings
from model.settings.suggest import Problems, did_you_mean
from model.team_regions import regions_key


def team_region_problems(team: str, spec: TeamSettings) -> Problems:
    key = regions_key(team)
    tpu_regions = sorted({catalog.region_of(zone) for zone in catalog.all_zones()})
    slotted = [r for r in tpu_regions if r in subnets.REGION_SLOTS]
    for index, region in enumerate(spec.regions):
        if region not in slotted:
            hint = did_you_mean(region, slotted, set())
            yield (f"{key}[{index}]", f"{region!r} is not a TPU region with a subnet slot"
                                      f"{hint} (regions: {', '.join(slotted)})")
