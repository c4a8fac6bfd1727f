"""Does a node read its data from another region? A preview warning if it does.

GCS bills the bytes another Google Cloud service reads from a bucket in a different
location ("Data transfer within Google Cloud": free within the same location, charged
between locations on one continent and more between continents;
cloud.google.com/storage/pricing#network-buckets), and a training job reads its data
every epoch. Pure, like model/stop_save.py: the program warns on the node at
preview and up, the offline plan lists the same text.
"""

from __future__ import annotations

from model import catalog
from model.gcs_locations import gcs_locations
from model.naming import PURPOSES
from model.settings.schema import NodeSettings, StackSettings
from tpu_training.config import JobConfig

# The predefined dual-regions and their regions (model/gcs_locations.json).
DUAL_REGIONS: dict[str, frozenset[str]] = gcs_locations().dual_regions
# The multi-regions (same page): US, data centres in the United States (us-* regions);
# EU, in member states of the European Union (not London, europe-west2, nor Zurich,
# europe-west6); ASIA, in Asia.
MULTI_REGIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "us": ("us-", ()),
    "eu": ("europe-", ("europe-west2", "europe-west6")),
    "asia": ("asia-", ()),
}
JOB_READS = ("trainData", "evalData")


def holds_region(location: str, region: str) -> bool | None:
    """Whether a bucket in `location` keeps its data in `region`; None: unknown location.

    A node inside a dual- or multi-region counts as local (decided here, not read in
    the pricing page: whether a read from a multi-region by a region inside it is
    free is unconfirmed); a node outside it reads across regions."""
    location = location.lower()
    if location in DUAL_REGIONS:
        return region in DUAL_REGIONS[location]
    if location in MULTI_REGIONS:
        prefix, excluded = MULTI_REGIONS[location]
        return region.startswith(prefix) and region not in excluded
    if location.count("-") == 1:  # a region, e.g. us-central1
        return region == location
    return None


def bucket_locations(settings: StackSettings) -> dict[str, str]:
    """The location of every bucket the stack creates (all in `storage.location`)."""
    teams = [settings.team] if settings.is_team_stack else [None, *settings.teams]
    return {settings.naming.bucket(purpose, team): settings.storage.location
            for team in teams for purpose in PURPOSES}


def location_region(location: str) -> str:
    """A bucket location as a region name for the transfer estimate: a dual-region's
    first region, a multi-region's continent word, a region itself."""
    location = location.lower()
    if location in DUAL_REGIONS:
        return sorted(DUAL_REGIONS[location])[0]
    if location in MULTI_REGIONS:
        return MULTI_REGIONS[location][0].rstrip("-")
    return location


def node_team(settings: StackSettings, node: NodeSettings) -> str | None:
    """The team in `node`'s bucket names (StackSettings.named_nodes)."""
    return next((team for team, n in settings.named_nodes if n is node), None)


def _far(settings: StackSettings, team: str | None, region: str, job: JobConfig,
         data_location: str | None) -> list[tuple[str, str]]:
    """(what, bucket location) for each read and write of the job outside `region`."""
    data_bucket = settings.platform_naming.bucket("data")
    locations = bucket_locations(settings)
    if data_location is not None:
        locations.setdefault(data_bucket, data_location)
    far = []
    for key in JOB_READS:
        path = getattr(job, key)
        if path is None:
            continue
        bucket = path[len("gs://"):].split("/", 1)[0] if path.startswith("gs://") else data_bucket
        location = locations.get(bucket)
        if location is not None and holds_region(location, region) is False:
            shown = "reads " if not far else ""
            far.append((f"{shown}{key} from gs://{bucket} ({location})", location))
    checkpoints = settings.naming.bucket("checkpoints", team)
    location = locations.get(checkpoints)
    if location is not None and holds_region(location, region) is False:
        far.append((f"writes checkpoints to gs://{checkpoints} ({location})", location))
    return far


def _estimate(region: str, locations: list[str]) -> str:
    """`~$20/TB moved (…` (or a range) for moving data between `region` and
    `locations`; the caller closes the bracket after its source."""
    prices = sorted({catalog.cross_region_usd_per_tb(region, location_region(location))
                     for location in locations})
    about = "" if catalog.GCS_CROSS_REGION_CONFIRMED else "unconfirmed, "
    shown = " to ".join(f"~${price:,.0f}/TB" for price in prices)
    return f"{shown} moved ({about}model/catalog.py"


def cross_region_warning(settings: StackSettings, node: NodeSettings, job: JobConfig,
                         data_location: str | None = None) -> str | None:
    """Why `node`, at its own placement or at any fallback candidate, reads its job's data
    or writes its checkpoints across regions; None when no placement does. A bucket
    whose location the stack does not know is left out: a team stack's shared data
    bucket is the platform's, known only as `data_location` (the platform's
    storage.location, read where the platform's settings are at hand)."""
    team = node_team(settings, node)
    clauses, locations, regions = [], [], []
    count = len(node.candidates)
    for position, candidate in enumerate(node.candidates, start=1):
        region = catalog.region_of(candidate.zone)
        far = _far(settings, team, region, job, data_location)
        if not far:
            continue
        where = (f"node {node.name} in {candidate.zone}" if position == 1 else
                 f"its fallback candidate {position}/{count} in {candidate.zone}")
        clauses.append(f"{where} {' and '.join(what for what, _ in far)}, outside its "
                       f"region {region}")
        locations += [location for _, location in far]
        regions.append(region)
    if not clauses:
        return None
    if not clauses[0].startswith("node "):
        clauses[0] = f"node {node.name}: {clauses[0]}"
    estimate = _estimate(regions[0], locations)
    return (f"{'; '.join(clauses)}: GCS charges for data moved across regions, every epoch "
            f"for training data, {estimate}; cloud.google.com/storage/pricing, data "
            f"transfer within Google Cloud); keep the buckets in the node's region, or the "
            f"node in the buckets' region")


def stack_warnings(settings: StackSettings, data_location: str | None = None) -> list[str]:
    """The cross-region warning of every node of the stack that has one."""
    return [w for node, job in settings.node_jobs
            if (w := cross_region_warning(settings, node, job, data_location))]
