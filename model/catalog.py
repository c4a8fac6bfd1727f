"""Cloud TPU facts: the one place that knows them.

Settings validation, the cost estimate, the policy pack and `tpuctl` all read
this module. Every fact carries its source; "docs/tpu-facts.md" is the
project's facts page (gathered December 2026), which names the primary
source for each row.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from enum import Enum
from functools import cache, cached_property

from model.archive import read_lock


class Naming(Enum):
    """What the number in an accelerator type counts (docs/tpu-facts.md, "Generations";
    cloud.google.com/tpu/docs/types-topologies: TensorCore-based names for v2-v4,
    v5p; chip-based for v5e and v6e)."""

    TENSORCORES = "TensorCores"
    CHIPS = "chips"


@dataclass(frozen=True)
class Price:
    """List price, USD per chip-hour. `None` where no source gives one."""

    on_demand: float | None
    spot: float | None
    source: str
    confirmed: bool = True  # False where docs/tpu-facts.md marks the price unconfirmed
    # Committed use (a future reservation with a 1- or 3-year CUD attached,
    # cloud.google.com/tpu/docs/long-term-reservation), per chip-hour, with their own source.
    one_year: float | None = None
    three_year: float | None = None
    committed_source: str = "no committed-use price in docs/tpu-facts.md"
    committed_confirmed: bool = True


# The commitments a node may run under (`tpu-stack:nodes[].commitment`).
COMMITMENTS = ("1-year", "3-year")
# Committed-use prices per chip-hour (docs/tpu-facts.md, "Prices"). v6e: Google's Trillium
# GA announcement (2024-12-11, as neowin.net quotes it): "starting at $2.7000 per
# chip-hour ... With 1-year and 3-year commitments ... $1.8900 ... and $1.2200", the same
# regions as the on-demand 2.70. v5e, v5p, v4: the Cloud TPU pricing page's CUD columns as
# recalled (cloud.google.com/tpu/pricing, not re-read 2026-12-04: unconfirmed); every one
# is the on-demand price less 30% (1 year) and 55% (3 years), as v6e's is.
_V6E_CUD = "Google's Trillium GA announcement, 2024-12-11 (starting-at prices)"
_RECALLED_CUD = "cloud.google.com/tpu/pricing as recalled, not re-read 2026-12-04: unconfirmed"


@dataclass(frozen=True)
class Generation:
    name: str  # what users write: v2, v3, v4, v5e, v5p, v6e
    type_prefix: str  # accelerator-type prefix: v5e is "v5litepod"
    api_type: str  # AcceleratorConfig.type enum (docs/tpu-facts.md, "The API")
    naming: Naming
    cores_per_chip: int
    # TF replicas per chip: v2/v3 expose each TensorCore as a device; v4 and v5p
    # run both cores as one "megacore" device (cloud.google.com/tpu/docs/v4,
    # /v5p: "megacore"); v5e and v6e have one core per chip.
    replicas_per_chip: int
    # HBM per chip, each generation's system architecture page (cloud.google.com/tpu/docs/
    # v2, v3, v4: 16, 32, 32 GiB; v5e, v5p, v6e: "HBM2 capacity" 16 GB, "HBM2e" 95 GB, 32
    # GB); docs/tpu-facts.md, "Generations". A chip running two replicas (v2, v3: one a
    # TensorCore) gives each half; settings refuse a BERT batch that cannot fit it.
    hbm_gib_per_chip: int
    max_chips: int
    zones: tuple[str, ...]
    base_runtime: str  # the framework-free image (install TF yourself)
    # 2D generations list every offered shape; 3D ones follow a rule (_problem_3d).
    topologies: tuple[str, ...] = ()
    # TPU VMs (workers) of a multi-host slice hold this many chips each; v5e
    # and v6e single-host VMs hold up to 8 (docs/tpu-facts.md, "Generations").
    chips_per_host: int = 4
    max_single_host_chips: int = 4
    # The TensorFlow runtime image family, or None where Google documents no
    # TensorFlow image for the generation (docs/tpu-facts.md, "Runtime versions").
    tf_runtime: str | None = None
    price: Price = Price(None, None, "no list price in docs/tpu-facts.md")

    @property
    def dims(self) -> int:
        return 2 if self.topologies else 3


# Newest documented TensorFlow TPU VM image (cloud.google.com/tpu/docs/runtimes,
# via docs/tpu-facts.md): tpu-vm-tf-2.18.0-pjrt, and -pod-pjrt for multi-host slices.
TF_RUNTIME = "tpu-vm-tf-2.18.0"


def _carried_tf() -> tuple[tuple[int, int], ...]:
    """TensorFlow minors the training package can run on: those whose tf-keras
    training/wheels.lock pins (the archive carries it; the agent installs the match)."""
    versions = (pin.requirement.split("==")[1] for pin in read_lock()
                if pin.requirement.startswith("tf-keras=="))
    return tuple(sorted({(int(v.split(".")[0]), int(v.split(".")[1])) for v in versions}))


SUPPORTED_TF = _carried_tf()
# TensorFlow versions (from 2.15, where -pjrt images begin) with a TPU VM image a
# Google source names (docs/tpu-facts.md, "Runtime versions"): 2.15.0, 2.15.1, 2.16.1
# and 2.18.0 on cloud.google.com/tpu/docs/runtimes; 2.17.1 on /tpu/docs/preemptible
# (`tpu-vm-tf-2.17.1-pjrt`); 2.17.0 in GoogleCloudPlatform/python-docs-samples
# tpu/create_tpu_test.py (a v5litepod-1 in us-south1-a). 2.19 and 2.20 images appear
# in no Google source, so a node asking for one is refused: its replacement (old
# node deleted first) would fail to create.
DOCUMENTED_TF = ((2, 15, 0), (2, 15, 1), (2, 16, 1), (2, 17, 0), (2, 17, 1), (2, 18, 0))
# The runtimes page: "TPU v6e, v5e and v5p support TensorFlow 2.15.0 and newer", in
# the form `tpu-vm-tf-x.y.z[-pod]-pjrt` only; v4 from TF 2.10.1 and v2/v3 use the same
# images. Device APIs (cloud.google.com/tpu/docs/supported-tpu-versions, "TensorFlow":
# the name ends in `-pjrt` or `-se`, stream executor): v2, v3 and v4 take either
# (tensorflow/tensorflow issue 82208 names a `tpu-vm-tf-2.18.0-pod-se` image).
PJRT_ONLY_GENERATIONS = ("v5e", "v5p", "v6e")
MIN_TF_V5_ON = (2, 15, 0)
# Image names with a generation suffix, seen only in secondary sources (users' notes
# in public repositories: tpu-vm-tf-2.18.0-pjrt-v5e-and-v6 on a v5litepod-8,
# tpu-vm-tf-2.18.0-pjrt-v5p-and-below on a v2-8; docs/tpu-facts.md). Accepted for the
# generations the suffix names, with a note: whether a zone offers one is for
# `tpuctl preflight --live` (the zone's list_runtime_versions) to decide.
GENERATION_SUFFIXES = {"-v5e-and-v6": ("v5e", "v6e"), "-v5p-and-below": ("v2", "v3", "v4", "v5p")}
# TensorFlow's own TPU worker server (tensorflow/python/tools/grpc_tpu_worker.py,
# setup_env_vars) sets host bounds from a table of v2 and v3 types, leaves v4 and
# v5* to libtpu, and fails (KeyError) for any other type: a v6e pod slice's workers
# cannot serve a TensorFlow client. Unconfirmed that the image's tpu-runtime runs
# that script; no Google page shows TensorFlow on a multi-host v6e.
TF_WORKER_SERVER_GENERATIONS = ("v2", "v3", "v4", "v5e", "v5p")
# v6e single host: documented (the runtimes page) but untested by any Google sample
# found; tensorflow/tensorflow issue 82208 reports `import tensorflow` crashing on
# tpu-vm-tf-2.17.1 and 2.18.0 pod images (generation not given). A note, not a refusal.
TF_V6E_NOTE = ("TensorFlow on v6e is documented (cloud.google.com/tpu/docs/runtimes) but "
               "no Google sample runs it, and tensorflow/tensorflow issue 82208 reports TF "
               "2.17.1/2.18 images crashing on import: rehearse it on one node first")

_V5E_V6E_TOPOLOGIES = ("1x1", "2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16")

GENERATIONS: dict[str, Generation] = {
    g.name: g
    for g in (
        Generation(
            # cloud.google.com/tpu/docs/v2: v2-8 … v2-512, 2D torus.
            name="v2", type_prefix="v2", api_type="V2", naming=Naming.TENSORCORES,
            cores_per_chip=2, replicas_per_chip=2, hbm_gib_per_chip=16,
            topologies=("2x2", "4x4", "8x8", "8x16", "16x16"), max_chips=256,
            zones=("us-central1-b", "us-central1-c", "europe-west4-a"),
            tf_runtime=TF_RUNTIME, base_runtime="tpu-ubuntu2204-base",
        ),
        Generation(
            # cloud.google.com/tpu/docs/v3: v3-8 … v3-2048, 2D torus.
            name="v3", type_prefix="v3", api_type="V3", naming=Naming.TENSORCORES,
            cores_per_chip=2, replicas_per_chip=2, hbm_gib_per_chip=32,
            topologies=("2x2", "4x4", "4x8", "8x8", "8x16", "16x16", "16x32", "32x32"),
            max_chips=1024,
            zones=("us-central1-a", "us-central1-b", "europe-west4-a"),
            tf_runtime=TF_RUNTIME, base_runtime="tpu-ubuntu2204-base",
        ),
        Generation(
            # cloud.google.com/tpu/docs/v4: 3D, 4096-chip pod; v4-8 is 2x2x1.
            name="v4", type_prefix="v4", api_type="V4", naming=Naming.TENSORCORES,
            cores_per_chip=2, replicas_per_chip=1, hbm_gib_per_chip=32,
            max_chips=4096,
            zones=("us-central2-b",),
            tf_runtime=TF_RUNTIME, base_runtime="tpu-ubuntu2204-base",
            price=Price(3.22, None, "docs/tpu-facts.md: unconfirmed secondary source",
                        confirmed=False, one_year=2.03, three_year=1.45,
                        committed_source=_RECALLED_CUD, committed_confirmed=False),
        ),
        Generation(
            # cloud.google.com/tpu/docs/v5e: 1, 4 or 8 chips per VM; multi-host
            # slices use 4-chip VMs (4x4 = 16 chips on 4 hosts).
            name="v5e", type_prefix="v5litepod", api_type="V5LITE_POD",
            naming=Naming.CHIPS, cores_per_chip=1, replicas_per_chip=1,
            hbm_gib_per_chip=16, max_single_host_chips=8,
            topologies=_V5E_V6E_TOPOLOGIES, max_chips=256,
            zones=("us-central1-a", "us-south1-a", "us-west1-c", "us-west4-a",
                   "europe-west4-b"),
            tf_runtime=TF_RUNTIME, base_runtime="v2-alpha-tpuv5-lite",
            price=Price(1.20, 0.607, "docs/tpu-facts.md: third-party catalog extract, 2026-08",
                        one_year=0.84, three_year=0.54, committed_source=_RECALLED_CUD,
                        committed_confirmed=False),
        ),
        Generation(
            # cloud.google.com/tpu/docs/v5p: 3D, 2x2x1 … 16x16x24 (6144 chips).
            name="v5p", type_prefix="v5p", api_type="V5P", naming=Naming.TENSORCORES,
            cores_per_chip=2, replicas_per_chip=1, hbm_gib_per_chip=95,
            max_chips=6144,
            zones=("us-central1-a", "us-east5-a", "europe-west4-b"),
            tf_runtime=TF_RUNTIME, base_runtime="v2-alpha-tpuv5",
            price=Price(4.20, 1.20, "docs/tpu-facts.md: SkyPilot issue 4579, 2025-01 "
                                    "(a 2026 table says 2.40 on-demand: conflict)",
                        one_year=2.94, three_year=1.89, committed_source=_RECALLED_CUD,
                        committed_confirmed=False),
        ),
        Generation(
            # cloud.google.com/tpu/docs/v6e: shapes as v5e. The runtimes page says
            # v6e supports TensorFlow 2.15+ with tpu-vm-tf-x.y.z[-pod]-pjrt images
            # (docs/tpu-facts.md, "Runtime versions").
            name="v6e", type_prefix="v6e", api_type="V6E", naming=Naming.CHIPS,
            cores_per_chip=1, replicas_per_chip=1, hbm_gib_per_chip=32,
            max_single_host_chips=8,
            topologies=_V5E_V6E_TOPOLOGIES, max_chips=256,
            zones=("us-central1-b", "us-east1-d", "us-east5-a", "us-east5-b",
                   "europe-west4-a", "asia-northeast1-b"),
            tf_runtime=TF_RUNTIME, base_runtime="v2-alpha-tpuv6e",
            price=Price(2.70, 1.78, "docs/tpu-facts.md: SkyPilot PR 4540, 2025-01 (us-east1); "
                                    "spot from europe-west4, 2026-08",
                        one_year=1.89, three_year=1.22, committed_source=_V6E_CUD),
        ),
    )
}

_BY_PREFIX = {g.type_prefix: g for g in GENERATIONS.values()}
_TYPE_RE = re.compile(r"^(?P<prefix>[a-z0-9]+)-(?P<count>[1-9][0-9]*)$")
SINGLE_HOST_3D = (2, 2, 1)
_TOPOLOGY_RE = re.compile(r"^[1-9][0-9]*(x[1-9][0-9]*)+$")

# Hours in a billing month, as cloud pricing pages count them.
HOURS_PER_MONTH = 730


@dataclass(frozen=True)
class Slice:
    """One TPU slice: a generation in a topology, and everything that follows."""

    generation: Generation
    topology: str

    @cached_property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.topology.split("x"))

    @cached_property
    def chips(self) -> int:
        return math.prod(self.shape)

    @property
    def tensorcores(self) -> int:
        return self.chips * self.generation.cores_per_chip

    @property
    def hosts(self) -> int:
        g = self.generation
        if self.chips <= g.max_single_host_chips:
            return 1
        return self.chips // g.chips_per_host

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    @property
    def replicas(self) -> int:
        """`num_replicas_in_sync` of a TPUStrategy over the whole slice."""
        return self.chips * self.generation.replicas_per_chip

    @property
    def accelerator_type(self) -> str:
        g = self.generation
        count = self.tensorcores if g.naming is Naming.TENSORCORES else self.chips
        return f"{g.type_prefix}-{count}"


class CatalogError(ValueError):
    """A value the catalog does not know; the message says what is allowed."""


def generation(name: str) -> Generation:
    try:
        return GENERATIONS[name]
    except KeyError:
        raise CatalogError(f"{name!r} is not a TPU generation; allowed: "
                           f"{', '.join(GENERATIONS)}") from None


def topology_problem(gen: Generation, topology: str) -> str | None:
    """Why `topology` is not a `gen` slice shape, or None when it is one."""
    if not _TOPOLOGY_RE.match(topology) or topology.count("x") + 1 != gen.dims:
        return (f"{topology} is not a {gen.name} topology: {gen.name} slices are "
                f"{gen.dims}D ({'AxBxC' if gen.dims == 3 else 'AxB'}), "
                f"e.g. {', '.join(example_topologies(gen))}")
    if gen.dims == 2:
        if topology not in gen.topologies:
            return (f"{topology} is not a {gen.name} topology "
                    f"({', '.join(gen.topologies)})")
        return None
    return _problem_3d(gen, tuple(int(d) for d in topology.split("x")))


def _problem_3d(gen: Generation, shape: tuple[int, ...]) -> str | None:
    # cloud.google.com/tpu/docs/types-topologies (v4; v5p follows the same
    # rule, /tpu/docs/v5p): AxBxC with A<=B<=C, all <= 4 or all multiples of 4;
    # a slice is whole 4-chip hosts; one host is written 2x2x1 (v4-8, v5p-8).
    # Sides of 1 or 3 appear in no documented slice, so they are refused.
    chips = math.prod(shape)
    if shape == SINGLE_HOST_3D:
        return None
    ordered = list(shape) == sorted(shape)
    small = all(d in (2, 4) for d in shape)
    large = all(d % 4 == 0 for d in shape)
    whole_hosts = chips % gen.chips_per_host == 0
    if not ordered or not (small or large) or not whole_hosts or chips > gen.max_chips:
        one_host = "x".join(map(str, SINGLE_HOST_3D))
        return (f"{'x'.join(map(str, shape))} is not a {gen.name} topology: one host is "
                f"{one_host}; a larger slice is AxBxC with A<=B<=C, every side 2 or 4 or "
                f"every side a multiple of 4, whole {gen.chips_per_host}-chip hosts, at most "
                f"{gen.max_chips} chips (e.g. {', '.join(example_topologies(gen))})")
    return None


def example_topologies(gen: Generation) -> tuple[str, ...]:
    if gen.dims == 2:
        return gen.topologies
    return ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "…")


@cache
def slice_for(gen_name: str, topology: str) -> Slice:
    gen = generation(gen_name)
    problem = topology_problem(gen, topology)
    if problem:
        raise CatalogError(problem)
    return Slice(gen, topology)


@cache
def parse_accelerator_type(accelerator_type: str) -> Slice:
    """`v4-32` → the v4 slice 2x2x4; the default topology for the size."""
    match = _TYPE_RE.match(accelerator_type)
    gen = _BY_PREFIX.get(match["prefix"]) if match else None
    if gen is None:
        raise CatalogError(
            f"{accelerator_type} is not an accelerator type: <prefix>-<count> with prefix "
            f"{', '.join(_BY_PREFIX)} (e.g. v2-8, v4-32, v5litepod-8)")
    count = int(match["count"])
    per_chip = gen.cores_per_chip if gen.naming is Naming.TENSORCORES else 1
    if count % per_chip:
        raise CatalogError(f"{accelerator_type}: {gen.name} names count TensorCores, "
                           f"{per_chip} per chip, so the count must be even")
    chips = count // per_chip
    for topology in default_topologies(gen):
        if math.prod(int(d) for d in topology.split("x")) == chips:
            return Slice(gen, topology)
    raise CatalogError(
        f"{accelerator_type} is not offered: {gen.name} types are "
        f"{', '.join(Slice(gen, t).accelerator_type for t in default_topologies(gen))}")


@cache
def default_topologies(gen: Generation) -> tuple[str, ...]:
    """The shape each size gets when named by accelerator type alone.

    3D: the most cube-like valid shape (types-topologies, "Topology variants":
    the default for a chip count is the one closest to a cube), written with
    the smaller sides first and v4-8's documented 2x2x1 for one host.
    """
    if gen.dims == 2:
        return gen.topologies
    shapes: dict[int, tuple[int, ...]] = {gen.chips_per_host: SINGLE_HOST_3D}
    sides = (2, *range(4, 33, 4))
    for shape in itertools.combinations_with_replacement(sides, 3):
        if _problem_3d(gen, shape) is not None:
            continue
        chips = math.prod(shape)
        best = shapes.get(chips)
        if best is None or _cubeness(shape) < _cubeness(best):
            shapes[chips] = shape
    return tuple("x".join(map(str, shapes[n])) for n in sorted(shapes))


def _cubeness(shape: tuple[int, ...]) -> tuple[int, int]:
    return max(shape) - min(shape), max(shape)


def runtime_for(tpu: Slice) -> str | None:
    """The TensorFlow image for a slice, or None where TensorFlow cannot run there."""
    base = tpu.generation.tf_runtime
    if base is None or tf_problem(tpu):
        return None
    return f"{base}-pod-pjrt" if tpu.multi_host else f"{base}-pjrt"


def tf_problem(tpu: Slice) -> str | None:
    """Why no TensorFlow image can run the job on `tpu`, whatever its version."""
    gen = tpu.generation
    if gen.tf_runtime is None:
        return (f"no TensorFlow runtime image is documented for {gen.name} "
                f"(cloud.google.com/tpu/docs/runtimes); the TensorFlow job cannot run "
                f"there: choose v2, v3, v4, v5e or v5p")
    if tpu.multi_host and gen.name not in TF_WORKER_SERVER_GENERATIONS:
        return (f"TensorFlow cannot drive a multi-host {gen.name} slice: its TPU worker "
                f"server (tensorflow/python/tools/grpc_tpu_worker.py) knows host bounds "
                f"for {', '.join(TF_WORKER_SERVER_GENERATIONS)} only; use a single-host "
                f"{gen.name} (at most {gen.max_single_host_chips} chips) or a v5e/v5p pod")
    return None


_TF_RUNTIME_RE = re.compile(
    r"^tpu-vm-tf-(?P<major>\d+)\.(?P<minor>\d+)\.(?P<patch>\d+)(?P<pod>-pod)?(?P<api>-pjrt|-se)?"
    r"(?P<suffix>-v5e-and-v6|-v5p-and-below)?$")


def runtime_problem(tpu: Slice, runtime: str) -> str | None:
    """Why `runtime` cannot run the TensorFlow job on `tpu`, or None."""
    gen = tpu.generation
    problem = tf_problem(tpu)
    if problem:
        return problem
    match = _TF_RUNTIME_RE.match(runtime)
    if not match:
        return (f"{runtime} is not a TensorFlow TPU VM image: "
                f"tpu-vm-tf-X.Y.Z[-pod]-pjrt, e.g. {runtime_for(tpu)}")
    version = (int(match["major"]), int(match["minor"]), int(match["patch"]))
    if version not in documented_tf(gen):
        carried = f"{'.'.join(map(str, SUPPORTED_TF[0]))} to {'.'.join(map(str, SUPPORTED_TF[-1]))}"
        why = (f"the training package carries tf-keras for TensorFlow {carried} only "
               f"(training/wheels.lock)" if version[:2] not in SUPPORTED_TF else
               "no Google source names such an image (cloud.google.com/tpu/docs/runtimes)")
        usable = ", ".join(".".join(map(str, v)) for v in documented_tf(gen))
        return (f"{runtime} carries TensorFlow {'.'.join(map(str, version))}: {why}; "
                f"documented and supported on {gen.name}: {usable} "
                f"(e.g. {runtime_for(tpu)})")
    if match["api"] is None:
        return (f"{runtime}: from TensorFlow 2.15 the image names its device API, -pjrt or "
                f"-se, e.g. {runtime_for(tpu)}")
    if match["api"] == "-se" and gen.name in PJRT_ONLY_GENERATIONS:
        return (f"{runtime}: {gen.name} runs TensorFlow on -pjrt images only "
                f"(cloud.google.com/tpu/docs/runtimes), e.g. {runtime_for(tpu)}")
    if match["suffix"] and gen.name not in GENERATION_SUFFIXES[match["suffix"]]:
        return (f"{runtime} is an image for "
                f"{', '.join(GENERATION_SUFFIXES[match['suffix']])}, not {gen.name}: "
                f"e.g. {runtime_for(tpu)}")
    if tpu.multi_host and not match["pod"]:
        return (f"{runtime} is a single-host image but {tpu.accelerator_type} spans "
                f"{tpu.hosts} hosts: use a -pod image, e.g. {runtime_for(tpu)}")
    if not tpu.multi_host and match["pod"]:
        return (f"{runtime} is a multi-host (-pod) image but {tpu.accelerator_type} is "
                f"one host: use e.g. {runtime_for(tpu)}")
    return None


def runtime_note(tpu: Slice, runtime: str) -> str | None:
    """What to know about an accepted runtime before relying on it, or None."""
    if runtime_problem(tpu, runtime):
        return None
    match = _TF_RUNTIME_RE.match(runtime)
    notes = []
    if match and match["suffix"]:
        notes.append(f"{match['suffix'].removeprefix('-')} images have only secondary "
                     f"sources (docs/tpu-facts.md): `tpuctl preflight --live` checks that "
                     f"the zone offers {runtime}")
    if tpu.generation.name == "v6e":
        notes.append(TF_V6E_NOTE)
    return "; ".join(notes) or None


def documented_tf(gen: Generation) -> tuple[tuple[int, int, int], ...]:
    """TensorFlow versions with a documented image on `gen` that the package supports."""
    floor = MIN_TF_V5_ON if gen.name in PJRT_ONLY_GENERATIONS else (0, 0, 0)
    return tuple(v for v in DOCUMENTED_TF if v[:2] in SUPPORTED_TF and v >= floor)


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def zone_suggestion(gen: Generation, place: str) -> str:
    """The zones to offer someone who wrote `place` (a region, or a typo) for `gen`."""
    nearby = [zone for zone in gen.zones if region_of(zone) == place]
    if nearby:
        zones = "zone" if len(nearby) == 1 else "zones"
        return f"{place} is a region; TPU {gen.name} is in its {zones} {', '.join(nearby)}"
    return f"TPU {gen.name} is in {', '.join(gen.zones)}"


def all_zones() -> tuple[str, ...]:
    return tuple(sorted({z for g in GENERATIONS.values() for z in g.zones}))


def usd_per_hour(tpu: Slice, *, spot: bool, commitment: str | None = None) -> float | None:
    """Hourly list price of the slice (spot, on-demand, or under a 1- or 3-year
    commitment), or None where the catalog has none."""
    price = tpu.generation.price
    per_chip = {None: price.on_demand, "1-year": price.one_year,
                "3-year": price.three_year}[commitment]
    if spot:
        per_chip = price.spot
    return None if per_chip is None else round(per_chip * tpu.chips, 4)


# A stop notice: Compute Engine gives a VM this long from the ACPI G2 soft-off to the
# G3 power-off, 30 s for Spot (and preemptible) VMs, 120 s for standard ones (Compute
# Engine API, `Scheduling.skipGuestOsShutdown`; docs/tpu-facts.md, "Preemption notice").
SPOT_NOTICE_SECONDS = 30
STANDARD_NOTICE_SECONDS = 120
# Cloud Storage's write rate for one stream (TF writes a host's checkpoint shard as one
# upload): about 200 MiB/s. Unconfirmed: Google's Cloud Storage docs give no
# single-stream figure; the one found is secondary (beginswithdata.com, "High
# throughput file transfers with Google Cloud Storage", 2024-02: "200 MiB/s for a
# single stream").
GCS_STREAM_WRITE_BYTES_PER_SECOND = 200 * 2**20
# The stop save may use this share of the notice; the rest is for the agent noticing,
# the execution under way, and the OS shutting down.
STOP_SAVE_SHARE_OF_NOTICE = 0.5

# The mean time between disruptions a node's job assumes for `checkpointEvery: auto`
# (tpu_training.config.checkpoint_interval): preemptible TPUs run at most 24 hours
# (docs.cloud.google.com/tpu/docs/preemptible: "TPU Spot VMs don't have the 24 hour run
# time limit of preemptible TPUs"), so 24 h bounds their mean from above. Spot TPUs have
# no documented preemption rate: the same 24 h is assumed (unconfirmed). Standard VMs
# are disrupted by maintenance events, for which no rate is documented: 30 days is
# assumed (unconfirmed).
PREEMPTIBLE_MAX_RUN_SECONDS = 24 * 3600
SPOT_MTBF_SECONDS = PREEMPTIBLE_MAX_RUN_SECONDS  # unconfirmed
STANDARD_MTBF_SECONDS = 30 * 24 * 3600  # unconfirmed


# Peak bf16 FLOPs per chip, for the preview's step-time estimate: v3 123 T (cloud.google.
# com/tpu/docs/v3), v5e 197 T (/tpu/docs/v5e), v5p 459 T (/tpu/docs/v5p), v6e 918 T
# (/tpu/docs/v6e), all "Peak compute per chip (bf16)". v2 45 T and v4 275 T: unconfirmed
# (their pages were not found in the docs searched, 2026-12-03).
PEAK_BF16_FLOPS_PER_CHIP = {"v2": 45e12, "v3": 123e12, "v4": 275e12, "v5e": 197e12,
                            "v5p": 459e12, "v6e": 918e12}
PEAK_FLOPS_UNCONFIRMED = frozenset({"v2", "v4"})  # as said above: the preview marks them ~


def peak_flops_per_second(tpu: Slice) -> float:
    """The slice's peak bf16 FLOPs per second: the preview's step time, the job's MFU."""
    return PEAK_BF16_FLOPS_PER_CHIP[tpu.generation.name] * tpu.chips


# The share of that peak a training step reaches. Unconfirmed: an assumption for ResNet-
# style convolutional training in bfloat16 (no measured TPU step time for these models).
ASSUMED_FLOPS_UTILIZATION = 0.3
ASSUMED_FLOPS_UTILIZATION_CONFIRMED = False  # the preview marks what rests on it ~


def stop_notice_seconds(*, spot: bool) -> int:
    """How long a node has between its stop notice and power-off."""
    return SPOT_NOTICE_SECONDS if spot else STANDARD_NOTICE_SECONDS


def mtbf_seconds(*, spot: bool) -> int:
    """The mean seconds between a node's disruptions `checkpointEvery: auto` assumes."""
    return SPOT_MTBF_SECONDS if spot else STANDARD_MTBF_SECONDS


# ---- Cloud Quotas ids (components/teams.py caps each team's project) ---------
# The tpu.googleapis.com quota of one family's chips in a region, by quota type
# (settings.QuotaType), as `gcloud beta quotas info list --service=tpu.googleapis.com`
# names them. Google's quota page (cloud.google.com/tpu/docs/quota) names the
# quotas but not their ids; these come from public listings and quota errors
# (read 2026-12): v5e and v6e from `quotas info` listings, v4 preemptible
# ("Quota limit 'TPUV4sPreemptiblePodPerProjectPerRegionForTPUAPI' has been
# exceeded") and v5p on-demand from quota errors. v4 on-demand is unconfirmed (by
# analogy with its preemptible id). v2 preemptible from SkyPilot's quota-error
# handling (skypilot-org/skypilot, FailoverCloudErrorHandlerV2._gcp_handler: "Quota
# 'TPUV2sPreemptiblePodPerProjectPerRegionForTPUAPI' exhausted. Limit 32 in region
# europe-west4", and its zonal twin "...PerProjectPerZoneForTPUAPI ... in zone": a
# node must fit both, so capping the regional one bounds it); v2 on-demand, v3 and
# v5p preemptible are unconfirmed, by analogy (v5p's zonal
# TPUV5PPreemptiblePerProjectPerZoneForTPUAPI appears in quota errors). These are
# the pod (slice) quotas: v2-8/v3-8 single devices draw on other quotas, not capped.
# `tpuctl preflight` reads each id from Cloud Quotas and says which ones GCP does
# not know (ops/tpu/quota.py). A family without an id
# gets no cap in its team's project and a warning at preview.
TPU_QUOTA_IDS: dict[tuple[str, str], str] = {
    ("v2", "onDemand"): "TPUV2sPodPerProjectPerRegionForTPUAPI",  # unconfirmed
    ("v2", "preemptible"): "TPUV2sPreemptiblePodPerProjectPerRegionForTPUAPI",
    ("v3", "onDemand"): "TPUV3sPodPerProjectPerRegionForTPUAPI",  # unconfirmed
    ("v3", "preemptible"): "TPUV3sPreemptiblePodPerProjectPerRegionForTPUAPI",  # unconfirmed
    ("v5e", "onDemand"): "TPUV5sLitepodPerProjectPerRegionForTPUAPI",
    ("v5e", "preemptible"): "TPUV5sPreemptibleLitepodPerProjectPerRegionForTPUAPI",
    ("v6e", "onDemand"): "TPUV6EPerProjectPerRegionForTPUAPI",
    ("v6e", "preemptible"): "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI",
    ("v4", "onDemand"): "TPUV4sPodPerProjectPerRegionForTPUAPI",  # unconfirmed
    ("v4", "preemptible"): "TPUV4sPreemptiblePodPerProjectPerRegionForTPUAPI",
    ("v5p", "onDemand"): "TPUV5PPerProjectPerRegionForTPUAPI",
    ("v5p", "preemptible"): "TPUV5PPreemptiblePerProjectPerRegionForTPUAPI",  # unconfirmed
}
# The ids above named by analogy, confirmed by no public source: the preview warns on
# each cap that uses one, and `tpuctl preflight` asks Cloud Quotas whether it exists.
UNCONFIRMED_QUOTA_IDS = frozenset({
    TPU_QUOTA_IDS[("v2", "onDemand")], TPU_QUOTA_IDS[("v3", "onDemand")],
    TPU_QUOTA_IDS[("v3", "preemptible")], TPU_QUOTA_IDS[("v4", "onDemand")],
    TPU_QUOTA_IDS[("v5p", "preemptible")]})


# Cloud Storage "Data transfer within Google Cloud" (cloud.google.com/storage/pricing,
# section "Network usage"): free within one location; charged per GB when another
# Google Cloud service in a different location reads a bucket (or writes to it), more
# between continents than within one. USD per TB (1,000 GB) as a planning estimate;
# UNCONFIRMED: recalled from the pricing page's table (same continent $0.02/GB, between
# continents other than Oceania $0.08/GB), not re-read in this session
# (docs/tpu-facts.md, "Cloud Storage locations").
GCS_CROSS_REGION_USD_PER_TB = {"same continent": 20.0, "between continents": 80.0}
GCS_CROSS_REGION_CONFIRMED = False


def continent_of(region: str) -> str:
    """A region's continent as GCS prices transfer: its name's first word (us, europe,
    asia, ...; northamerica and southamerica apart, unconfirmed that GCS groups them)."""
    return region.split("-", 1)[0].lower()


def cross_region_usd_per_tb(from_region: str, to_region: str) -> float:
    """The estimate of moving a TB between two regions (GCS_CROSS_REGION_USD_PER_TB)."""
    same = continent_of(from_region) == continent_of(to_region)
    return GCS_CROSS_REGION_USD_PER_TB["same continent" if same else "between continents"]
