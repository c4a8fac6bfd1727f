"""Another project's TPU reservation, used from a consumer project (issue 44): allowed
only when shared with it (cloud.google.com/tpu/docs/share-reservation):
- "Reservation sharing is supported on v4 and later TPU versions";
- "All projects that share a TPU reservation must be part of the same organization";
- the owner project is allowed by the org policy `compute.sharedReservationsOwnerProjects`
  (`gcloud resource-manager org-policies allow compute.sharedReservationsOwnerProjects
  projects/OWNER_PROJECT_NUMBER --organization=ORGANIZATION_ID`), which the bootstrap
  declares for every owner of `tpu-stack:sharedReservations`;
- its share type is fixed when the reservation is requested: SPECIFIC_PROJECTS shares it
  with the consumer projects listed (Compute Engine `shareSettings.shareType`,
  cloud.google.com/compute/docs/reference/rest/v1/reservations; LOCAL: its own project
  only).
Pure: the proof (policy/acting.py) and the bootstrap read it. Unconfirmed: whether a
TPU reservation's share type has other values than Compute Engine's; the same
organization is not checked (an offline plan knows no project's organization).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from model.settings.schema import SharedReservationSettings, StackSettings

OWNER_POLICY = "compute.sharedReservationsOwnerProjects"
SHARED_TYPE = "SPECIFIC_PROJECTS"
FIRST_SHARED_GENERATION = 4  # v4 and later
_RESERVATION = re.compile(r"^projects/(?P<owner>[^/]+)/locations/(?P<zone>[^/]+)/"
                          r"reservations/(?P<name>[^/]+)$")
_GENERATION = re.compile(r"^v(?P<n>[0-9]+)")


@dataclass(frozen=True)
class Missing:
    """What keeps `consumer` from using `reservation`, and the fix."""

    what: str
    fix: str


def owners_allowed(settings: StackSettings) -> list[str]:
    """`projects/<number>` of every owner the bootstrap allows (OWNER_POLICY)."""
    return sorted({f"projects/{r.owner_project_number}" for r in settings.shared_reservations})


def missing(reservation: str, consumer: str,
            declared: list[SharedReservationSettings],
            allowed: list[str]) -> Missing | None:
    """None when `consumer` (a project id) may use `reservation` (its resource name)."""
    match = _RESERVATION.match(reservation)
    if match is None or match["owner"] == consumer:
        return None
    owner, zone, name = match["owner"], match["zone"], match["name"]
    found = next((r for r in declared if (r.owner, r.zone, r.name) == (owner, zone, name)), None)
    block = (f"tpu-stack:sharedReservations: {{name: {name}, owner: {owner}, "
             f"ownerProjectNumber: <N>, zone: {zone}, generation: <v4 or later>, "
             f"shareType: {SHARED_TYPE}, consumers: [{consumer}]}}")
    if found is None:
        return Missing("a reservation of another project not declared shared with it",
                       f"declare it, as requested from Google (share type fixed then): {block}")
    generation = _GENERATION.match(found.generation)
    if generation is None or int(generation["n"]) < FIRST_SHARED_GENERATION:
        return Missing(f"a shared reservation of {found.generation} (sharing is v4 and later)",
                       "use a reservation of the node's own project, or a v4+ one")
    if found.share_type != SHARED_TYPE:
        return Missing(f"share type {found.share_type} (shared with no other project)",
                       f"a reservation requested with share type {SHARED_TYPE} naming "
                       f"{consumer}")
    if consumer not in found.consumers:
        return Missing(f"{consumer} is not among its consumers",
                       f"add {consumer} to its consumers (at Google, then in "
                       f"tpu-stack:sharedReservations)")
    if f"projects/{found.owner_project_number}" not in allowed:
        return Missing(f"owner {owner} not allowed by {OWNER_POLICY}",
                       f"the bootstrap's `org-policies allow {OWNER_POLICY} "
                       f"projects/{found.owner_project_number}`")
    return None
