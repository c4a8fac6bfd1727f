"""A team's TPU quota caps in its own project (docs/teams.md, "Quota"): pure, so
the platform stack (components/teams.py) declares them and `tpuctl preflight`
(ops/tpu/quota.py) shows what each will do, from one list."""

from __future__ import annotations

from dataclasses import dataclass

from model import catalog
from model.settings.schema import StackSettings, TeamQuota
from model.team_regions import team_regions

# Cloud Quotas refuses a preference that lowers the effective limit by more than
# 10% unless that safety check is skipped (QuotaSafetyCheck, cloud.google.com/docs/
# quotas/reference/rest/v1/QuotaSafetyCheck: QUOTA_DECREASE_PERCENTAGE_TOO_HIGH
# "Validates that a quota mutation would not cause the consumer's effective limit
# to decrease by more than 10 percent"); pulumi-gcp's typed argument is
# `cloudquota.SQuotaPreference(ignore_safety_checks=...)`, one value. A cap of 0
# over a default of 8 is a 100% decrease. What a new project's default is cannot be
# known offline, so every cap skips it: on an increase the check does not apply.
# QUOTA_DECREASE_BELOW_USAGE stays on: a cap below what the team runs now is
# refused at `up` (`tpuctl preflight` shows the current limit beside each cap).
SKIPPED_SAFETY_CHECK = "QUOTA_DECREASE_PERCENTAGE_TOO_HIGH"
SKIP_REASON = ("a cap lowers the project's default TPU quota, often to 0: Cloud Quotas "
               "refuses a decrease of more than 10% unless QUOTA_DECREASE_PERCENTAGE_TOO_HIGH "
               "is skipped; the decrease-below-usage check stays on")


@dataclass(frozen=True)
class QuotaCap:
    """One QuotaPreference of a team's project: `chips` of `family` in `region`."""

    family: str
    quota_type: str  # onDemand | preemptible (settings.QuotaType)
    region: str
    chips: int

    @property
    def quota_id(self) -> str | None:
        return catalog.TPU_QUOTA_IDS.get((self.family, self.quota_type))

    @property
    def unconfirmed(self) -> bool:
        """Whether its quota id is one no public source confirms (catalog)."""
        return self.quota_id in catalog.UNCONFIRMED_QUOTA_IDS

    def to_json(self) -> dict[str, object]:
        return {"family": self.family, "quotaType": self.quota_type, "region": self.region,
                "chips": self.chips, "quotaId": self.quota_id,
                "quotaIdUnconfirmed": self.unconfirmed,
                "ignoreSafetyChecks": SKIPPED_SAFETY_CHECK, "why": SKIP_REASON}


def quota_caps(quota: TeamQuota, granted: dict[str, list[str]],
               network_regions: list[str]) -> list[QuotaCap]:
    """Every TPU family the catalog knows, in every region of the team (its subnets,
    model/team_regions.py: a team deployer holds networkUser on each of those), capped:
    the team's chips where the platform holds quota for the family (`granted`,
    family → regions of tpu-stack:quota), 0 everywhere else. GCP counts TPU quota
    per region, a team's quota is per family: each granted region gets the whole
    figure, and the preview check (settings.team_quota_problems) counts the sum."""
    caps = []
    for family in sorted(catalog.GENERATIONS):
        chips = quota.chips(family)
        by_type = {"onDemand": chips.on_demand + chips.reserved, "preemptible": chips.spot}
        for quota_type, count in by_type.items():
            caps += [QuotaCap(family, quota_type, region,
                              count if region in granted.get(family, ()) else 0)
                     for region in sorted(network_regions)]
    return caps


def stack_caps(settings: StackSettings) -> dict[str, list[QuotaCap]]:
    """Team project id → the caps a platform stack declares there (none elsewhere)."""
    granted = {family: sorted(regions) for family, regions in settings.quota.items()}
    return {settings.naming.team_project(team):
            quota_caps(spec.quota, granted, team_regions(settings, team))
            for team, spec in sorted(settings.teams.items())}


def unconfirmed_id_warning(teams: list[str], caps: list[QuotaCap]) -> str | None:
    """The preview's word on a team's caps whose quota id is unconfirmed: a wrong id
    fails that preference's create; `tpuctl preflight` confirms each against Cloud
    Quotas (QuotaInfo) before `up`."""
    ids = sorted({cap.quota_id for cap in caps if cap.unconfirmed and cap.quota_id})
    if not ids:
        return None
    who = f"team {teams[0]}" if len(teams) == 1 else f"teams {', '.join(teams)}"
    return (f"{who}: {len(ids)} TPU quota id(s) are unconfirmed by a public source "
            f"({', '.join(ids)}); a wrong id fails its cap's create: run `tpuctl preflight` "
            f"first, which asks Cloud Quotas for each")
