"""Where each region's subnet lives: a range that never moves.

Standard library only: the settings check the ranges (overlaps, private space) with
the same function the network declares them with.
"""

from __future__ import annotations

import ipaddress

# Each region's fixed slot in the stack's address grid: slot k is the k-th block of
# `subnetCidr`'s size from `subnetCidr` on (slot 0 is `subnetCidr` itself). Append
# only: a region's slot, and so its range, must never move. A range that moves is a
# new subnet: the google provider forces a replacement unless the new range contains
# the old one (terraform-provider-google google/services/compute/
# resource_compute_subnetwork.go: customdiff.ForceNewIfChange("ip_cidr_range",
# IsShrinkageIpCidr)), and the nodes on it follow (a V2Vm's networkConfig is
# immutable, magic-modules mmv1/products/tpuv2/Vm.yaml). tests/infra holds every
# catalog region to a slot.
REGION_SLOTS: tuple[str, ...] = (
    "us-central1", "us-central2", "europe-west4", "us-east1", "us-east5", "us-south1",
    "us-west1", "us-west4", "asia-northeast1",
)


class SubnetRangeError(ValueError):
    """A region without a slot, or a slot outside IPv4."""


def slot_range(cidr: str, region: str) -> str:
    """`region`'s own block of the grid that starts at `cidr` (REGION_SLOTS)."""
    if region not in REGION_SLOTS:
        raise SubnetRangeError(f"{region} has no subnet slot; pin its range in "
                               f"tpu-stack:network.subnets")
    base = ipaddress.IPv4Network(cidr)
    start = int(base.network_address) + REGION_SLOTS.index(region) * base.num_addresses
    try:
        return str(ipaddress.IPv4Network((start, base.prefixlen)))
    except ValueError:
        raise SubnetRangeError(f"{region}'s slot is past the end of IPv4; pin its range "
                               f"in tpu-stack:network.subnets") from None


def subnet_ranges(cidr: str, regions: list[str],
                  pinned: dict[str, str] | None = None) -> dict[str, str]:
    """Every region's range: its pinned one, else its slot's. No range depends on
    which other regions exist, so adding or removing a region moves none."""
    pinned = pinned or {}
    return {region: pinned.get(region) or slot_range(cidr, region) for region in regions}
