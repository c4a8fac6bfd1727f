"""Rules on the stack's own keys: project, storage, labels, network, jobs."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic.alias_generators import to_camel

from model import catalog, subnets
from model.gcs_locations import gcs_locations
from model.naming import (
    LOGICAL_NAME_RE,
    LOGICAL_NAME_RULE,
    label_key_problem,
    label_value_problem,
)
from model.settings.schema import (
    BILLING_RE,
    GCP_PROJECT_KEY,
    NAMESPACE,
    PROJECT_ID_RE,
    StackSettings,
)
from model.settings.suggest import Problems, closest, did_you_mean
from tpu_training.config import JobConfig, JobConfigError


def project_problems(s: StackSettings) -> Problems:
    if not PROJECT_ID_RE.match(s.gcp_project):
        yield (GCP_PROJECT_KEY, f"{s.gcp_project!r} is not a project id: 6-30 lowercase "
                                f"letters, digits or hyphens, starting with a letter")
    key = f"{NAMESPACE}:project"
    p = s.project
    if p.create and not p.billing_account:
        yield (f"{key}.billingAccount", "is required when create is true")
    if p.billing_account and not BILLING_RE.match(p.billing_account):
        yield (f"{key}.billingAccount", f"{p.billing_account!r} is not a billing account "
                                        f"id (XXXXXX-XXXXXX-XXXXXX, hex digits)")
    for field in ("folder_id", "org_id"):
        value = getattr(p, field)
        if value is not None and not value.isdigit():
            yield (f"{key}.{to_camel(field)}", f"{value!r} must be digits only")
    if p.folder_id and p.org_id:
        yield (f"{key}.folderId", "give folderId or orgId, not both")
    if not p.create and (p.billing_account or p.folder_id or p.org_id):
        yield (f"{key}.create", "billingAccount, folderId and orgId apply only with create: true")


def storage_problems(s: StackSettings) -> Problems:
    key = f"{NAMESPACE}:storage"
    problem = location_problem(s.storage.location)
    if problem:
        yield (f"{key}.location", problem)
    # docs/design.md: prod data is never lost by a command; only dev may opt out.
    if s.environment != "dev":
        if s.storage.force_destroy:
            yield (f"{key}.forceDestroy", f"true is allowed only with "
                                          f"{NAMESPACE}:environment dev (this stack is "
                                          f"{s.environment})")
        if not s.storage.protect:
            yield (f"{key}.protect", f"false is allowed only with {NAMESPACE}:environment "
                                     f"dev (this stack is {s.environment})")


def location_problem(location: str) -> str | None:
    """Why `location` is not a Cloud Storage location, with the closest one
    (model/gcs_locations.json), or None."""
    known = gcs_locations()
    if known.knows(location):
        return None
    meant = closest(location.lower(), list(known.all()))
    shown = meant if meant in known.regions else (meant or "").upper()
    hint = f" (did you mean {shown}?)" if meant else ""
    return (f"{location!r} is not a Cloud Storage location{hint}: a region (e.g. us-central1), "
            f"a dual-region ({', '.join(d.upper() for d in known.dual_regions)}) or a "
            f"multi-region ({', '.join(m.upper() for m in known.multi_regions)}); the list is "
            f"model/gcs_locations.json, read from {known.source}")


def labels_problems(key: str, labels: Mapping[str, str]) -> Problems:
    for name, value in labels.items():
        problem = label_key_problem(name) or label_value_problem(value)
        if problem:
            yield (f"{key}.{name}", problem)


def network_problems(s: StackSettings) -> Problems:
    key = f"{NAMESPACE}:network"
    grid = s.network.subnet_cidr
    problem = range_problem(grid)
    if problem:
        yield (f"{key}.subnetCidr", problem)
        return
    regions = sorted({catalog.region_of(zone) for zone in catalog.all_zones()})
    pinned: dict[str, ipaddress.IPv4Network] = {}
    for region, cidr in sorted(s.network.subnets.items()):
        problem = (range_problem(cidr) if region in regions else
                   f"{region!r} is not a region with TPUs{did_you_mean(region, regions, ())} "
                   f"({', '.join(regions)})")
        net = None if problem else ipaddress.IPv4Network(cidr)
        clash = net and next((f"{other}'s {pin}" for other, pin in pinned.items()
                              if pin.overlaps(net)), None)
        if problem or clash:
            yield (f"{key}.subnets.{region}", problem or f"{region}'s range {net} overlaps "
                                                         f"{clash}")
        else:
            pinned[region] = net
    # The others take grid blocks, which overlap no pin (model/subnets.py). A
    # region with no TPUs comes from a zone or quota region already refused under
    # its own key: one message for the mistake, not a second about its slot.
    pins = {region: str(net) for region, net in pinned.items()}
    for region in sorted(set(s.regions) & set(regions) - set(s.network.subnets)):
        try:
            cidr = subnets.subnet_ranges(grid, [region], pins)[region]
        except subnets.SubnetRangeError as error:
            yield (f"{key}.subnetCidr", str(error))
            continue
        problem = range_problem(cidr)
        if problem:
            yield (f"{key}.subnetCidr", f"{region}'s slot range {cidr}: {problem}; pin "
                                        f"{region} to a range in {key}.subnets")


def moved_range_problems(s: StackSettings) -> Problems:
    """Every unpinned region in use sits in its own slot's block (model/subnets.py),
    so adding a pin never moves a range: a pin over such a block would move that region's
    subnet, a replacement, delete first, of the subnet and every node on it
    (resource_compute_subnetwork.go IsShrinkageIpCidr; docs/design.md, "Stack config").
    The settings cannot tell a region in use from one added with the pin, so both are
    refused and the message says how to pin either."""
    key = f"{NAMESPACE}:network"
    grid, pins = s.network.subnet_cidr, s.network.subnets
    ranges = subnets.grid_ranges(grid, pins)
    for region in sorted(set(s.regions) - set(pins)):
        home, actual = subnets.slot_range(grid, region), ranges.get(region)
        if home is None or actual is None or home == actual:
            continue
        net = ipaddress.IPv4Network(home)
        pin = next((p for p, cidr in sorted(pins.items())
                    if ipaddress.IPv4Network(cidr).overlaps(net)), None)
        by = f"{pin}'s pin {pins[pin]}" if pin else "a range moved by a pin before it"
        yield (f"{key}.subnets.{pin}" if pin else f"{key}.subnets",
               f"{by} overlaps {region}'s slot range {home}, so {region}'s subnet would move "
               f"to {actual}: a replacement, delete first, of the subnet and every node on "
               f"it. If {region} has a subnet already, pin it where it is ({key}.subnets."
               f"{region}: {home}) and give {pin or 'the pin'} a range outside it; for a new "
               f"{region}, pin it to {actual}.")


# RFC 1918's private IPv4 space; cloud.google.com/vpc/docs/subnets#valid-ranges:
# a subnet's primary range is /29 or larger.
_RFC1918 = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12",
                                                    "192.168.0.0/16"))


def range_problem(cidr: str) -> str | None:
    """Why `cidr` cannot be a subnet's primary range, or None."""
    try:
        network = ipaddress.IPv4Network(cidr)
    except ValueError:
        return f"{cidr!r} is not an IPv4 CIDR range, e.g. 10.128.0.0/20"
    if not any(network.subnet_of(block) for block in _RFC1918) or network.prefixlen > 29:
        return (f"{network} must be a private range (RFC 1918: 10.0.0.0/8, 172.16.0.0/12, "
                f"192.168.0.0/16) of /29 or larger")
    return None


def job_configs(jobs: Mapping[str, Mapping[str, Any]]) -> Iterator[tuple[str, JobConfig]]:
    for name, data in jobs.items():
        try:
            yield name, JobConfig.from_dict(data, resolved=False)
        except JobConfigError:
            continue


def jobs_problems(key: str, jobs: Mapping[str, Mapping[str, Any]]) -> Problems:
    """Every job of a `jobs` block (`key`: its path, top-level or a team's)."""
    for name, data in jobs.items():
        if not LOGICAL_NAME_RE.match(name):
            yield (f"{key}.{name}", f"job names are {LOGICAL_NAME_RULE}")
        try:
            JobConfig.from_dict(data, resolved=False)
        except JobConfigError as error:
            for field, message in error.problems:
                yield (f"{key}.{name}" + (f".{field}" if field else ""), message)
