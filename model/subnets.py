"""Where each region's subnet lives: a range that never moves.

Standard library only: the settings check the ranges (overlaps, private space) with
the same function the network declares them with.
"""

from __future__ import annotations

import ipaddress

# Each region's fixed slot in the stack's address grid: slot k is the k-th block of
# `subnetCidr`'s size from `subnetCidr` on (slot 0 is `subnetCidr` itself), where the
# region's search for a free block starts (grid_ranges). Append only: a region's
# slot, and so its range, must never move. A range that moves is a new subnet: the
# google provider forces a replacement unless the new range holds the old one
# (terraform-provider-google google/services/compute/resource_compute_subnetwork.go:
# customdiff.ForceNewIfChange("ip_cidr_range", IsShrinkageIpCidr)), and the nodes on
# it follow (a V2Vm's networkConfig is immutable, magic-modules
# mmv1/products/tpuv2/Vm.yaml). tests/infra holds every catalog region to a slot.
REGION_SLOTS: tuple[str, ...] = (
    "us-central1", "us-central2", "europe-west4", "us-east1", "us-east5", "us-south1",
    "us-west1", "us-west4", "asia-northeast1",
)


class SubnetRangeError(ValueError):
    """A region without a slot, or no free block left for it in IPv4."""


def grid_ranges(cidr: str, pinned: dict[str, str] | None = None) -> dict[str, str]:
    """Every slotted region's range, whether the stack uses it or not: its pinned one,
    else the first block of `cidr`'s size at or after its own slot that overlaps no pin
    and no earlier region's block. It depends on `cidr` and the pins only, never on
    which regions are in use, and a pin never moves, so no range moves. A region with
    no free block before the end of IPv4 is left out."""
    pinned = pinned or {}
    base = ipaddress.IPv4Network(cidr)
    taken = [ipaddress.IPv4Network(p) for p in pinned.values()]
    ranges = dict(pinned)
    for slot, region in enumerate(REGION_SLOTS):
        if region in pinned:
            continue
        block = _first_free(base, slot, taken)
        if block is not None:
            taken.append(block)
            ranges[region] = str(block)
    return ranges


def slot_range(cidr: str, region: str) -> str | None:
    """The block of `region`'s own slot (where its search starts), None past IPv4 or for
    a region without a slot."""
    if region not in REGION_SLOTS:
        return None
    base = ipaddress.IPv4Network(cidr)
    start = int(base.network_address) + REGION_SLOTS.index(region) * base.num_addresses
    if start + base.num_addresses > 2 ** 32:
        return None
    return str(ipaddress.IPv4Network((start, base.prefixlen)))


def _first_free(base: ipaddress.IPv4Network, slot: int,
                taken: list[ipaddress.IPv4Network]) -> ipaddress.IPv4Network | None:
    start = int(base.network_address) + slot * base.num_addresses
    while start + base.num_addresses <= 2 ** 32:
        block = ipaddress.IPv4Network((start, base.prefixlen))
        if not any(block.overlaps(other) for other in taken):
            return block
        start += base.num_addresses
    return None


def subnet_ranges(cidr: str, regions: list[str],
                  pinned: dict[str, str] | None = None) -> dict[str, str]:
    """The range of each of `regions` (grid_ranges): adding or removing a region
    moves none."""
    grid = grid_ranges(cidr, pinned)
    missing = next((region for region in regions if region not in grid), None)
    if missing is not None:
        why = "has no subnet slot" if missing not in REGION_SLOTS else \
            "has no free block before the end of IPv4"
        raise SubnetRangeError(f"{missing} {why}; pin its range in tpu-stack:network.subnets")
    return {region: grid[region] for region in regions}


# A team's own subnets (docs/teams.md, "The network"): team slot t (tpu-stack:teams.<t>.
# subnetSlot, append-only like REGION_SLOTS) owns the t-th /18 block of
# `network.teamSubnetCidr`, and in it region slot k the k-th /22 (1,024 addresses; a
# TPU VM worker takes one). A team's range depends on the base, its slot and the
# region's slot only: adding a team or a region moves none.
TEAM_BLOCK_PREFIX = 18
TEAM_REGION_PREFIX = 22
REGIONS_PER_TEAM = 2 ** (TEAM_REGION_PREFIX - TEAM_BLOCK_PREFIX)  # 16 >= len(REGION_SLOTS)


def team_slots(cidr: str) -> int:
    """How many team blocks `cidr` holds (0 when it is narrower than one)."""
    prefix = ipaddress.IPv4Network(cidr).prefixlen
    return 2 ** (TEAM_BLOCK_PREFIX - prefix) if prefix <= TEAM_BLOCK_PREFIX else 0


def team_range(cidr: str, slot: int, region: str) -> str:
    """The range of team slot `slot` in `region` (a slotted region, slot < team_slots)."""
    base = ipaddress.IPv4Network(cidr)
    if region not in REGION_SLOTS or not 0 <= slot < team_slots(cidr):
        raise SubnetRangeError(f"no team range for slot {slot} in {region} of {cidr}")
    start = (int(base.network_address) + slot * 2 ** (32 - TEAM_BLOCK_PREFIX)
             + REGION_SLOTS.index(region) * 2 ** (32 - TEAM_REGION_PREFIX))
    return str(ipaddress.IPv4Network((start, TEAM_REGION_PREFIX)))


def team_ranges(cidr: str, slot: int, regions: list[str]) -> dict[str, str]:
    return {region: team_range(cidr, slot, region) for region in regions}
