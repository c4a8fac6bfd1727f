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


def cross_region_warning(settings: StackSettings, node: NodeSettings,
                         job: JobConfig) -> str | None:
    """Why `node` reads its job's data across regions, or None when it does not (or
    the bucket is not one whose location the stack knows: a team stack's shared data
    bucket is the platform stack's)."""
    region = catalog.region_of(node.zone)
    # A job's relative paths are in the data bucket: the platform's in a team stack,
    # the stack's own otherwise (platform_naming is the stack's own naming then).
    data_bucket = settings.platform_naming.bucket("data")
    locations = bucket_locations(settings)
    far = []
    for key in JOB_READS:
        path = getattr(job, key)
        if path is None:
            continue
        bucket = path[len("gs://"):].split("/", 1)[0] if path.startswith("gs://") else data_bucket
        location = locations.get(bucket)
        if location is not None and holds_region(location, region) is False:
            far.append(f"{key} from gs://{bucket} ({location})")
    if not far:
        return None
    return (f"node {node.name} in {node.zone} reads {' and '.join(far)}, outside its region "
            f"{region}: GCS charges for data read across regions, every epoch "
            f"(cloud.google.com/storage/pricing, data transfer within Google Cloud); keep "
            f"the data in a bucket in {region}, or the node in the bucket's region")


def stack_warnings(settings: StackSettings) -> list[str]:
    """The cross-region warning of every node of the stack that has one."""
    return [w for node, job in settings.node_jobs
            if (w := cross_region_warning(settings, node, job))]
