"""The catalog: type name ↔ chips ↔ topology round-trips for every generation."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model import catalog
from model.archive import read_lock
from model.catalog import CatalogError, Naming, Slice

GENERATIONS = list(catalog.GENERATIONS.values())

slices = st.sampled_from(GENERATIONS).flatmap(
    lambda g: st.sampled_from(catalog.default_topologies(g)).map(lambda t: Slice(g, t)))


# deadline=None on every property: an example's cost varies with the slice and the
# machine's load, and Hypothesis's 200 ms default fails a busy machine, not the catalog.
@settings(deadline=None)
@given(slices)
def test_type_name_round_trips(tpu: Slice) -> None:
    assert catalog.parse_accelerator_type(tpu.accelerator_type) == tpu


@settings(deadline=None)
@given(slices)
def test_type_number_counts_what_the_generation_names(tpu: Slice) -> None:
    count = int(tpu.accelerator_type.rsplit("-", 1)[1])
    per_chip = tpu.generation.cores_per_chip if tpu.generation.naming is Naming.TENSORCORES else 1
    assert count == tpu.chips * per_chip
    assert tpu.chips == math.prod(tpu.shape)


@settings(deadline=None)
@given(slices)
def test_topology_is_valid_and_fills_whole_hosts(tpu: Slice) -> None:
    gen = tpu.generation
    assert catalog.topology_problem(gen, tpu.topology) is None
    assert catalog.slice_for(gen.name, tpu.topology) == tpu
    if tpu.multi_host:
        assert tpu.hosts * gen.chips_per_host == tpu.chips
    else:
        assert tpu.chips <= gen.max_single_host_chips


@settings(deadline=None)
@given(slices)
def test_runtime_matches_host_count(tpu: Slice) -> None:
    runtime = catalog.runtime_for(tpu)
    if catalog.tf_problem(tpu):
        assert runtime is None
        assert catalog.runtime_problem(tpu, "x") == catalog.tf_problem(tpu)
        return
    assert runtime is not None
    assert catalog.runtime_problem(tpu, runtime) is None
    assert runtime.endswith("-pod-pjrt") == tpu.multi_host


@settings(deadline=None)
@given(st.sampled_from([g for g in GENERATIONS if g.dims == 3]),
       st.tuples(*[st.integers(1, 40)] * 3))
def test_3d_rule(gen: catalog.Generation, shape: tuple[int, int, int]) -> None:
    topology = "x".join(map(str, shape))
    chips = math.prod(shape)
    ordered = list(shape) == sorted(shape)
    sides_ok = all(d in (2, 4) for d in shape) or all(d % 4 == 0 for d in shape)
    expected = shape == (2, 2, 1) or (ordered and sides_ok and chips % 4 == 0
                                       and chips <= gen.max_chips)
    assert (catalog.topology_problem(gen, topology) is None) == expected


@pytest.mark.parametrize(("accelerator_type", "chips", "hosts", "replicas"), [
    ("v2-8", 4, 1, 8),        # cloud.google.com/tpu/docs/v2: v2-8 is 4 chips
    ("v3-32", 16, 4, 32),
    ("v4-8", 4, 1, 4),        # 2x2x1, megacore: one replica per chip
    ("v4-32", 16, 4, 16),     # 2x2x4
    ("v5litepod-8", 8, 1, 8),
    ("v5litepod-16", 16, 4, 16),
    ("v5p-8", 4, 1, 4),
    ("v6e-8", 8, 1, 8),
])
def test_documented_slices(accelerator_type: str, chips: int, hosts: int, replicas: int) -> None:
    tpu = catalog.parse_accelerator_type(accelerator_type)
    assert (tpu.chips, tpu.hosts, tpu.replicas) == (chips, hosts, replicas)


def test_v4_32_is_2x2x4() -> None:
    assert catalog.parse_accelerator_type("v4-32").topology == "2x2x4"
    assert catalog.slice_for("v4", "2x2x4").accelerator_type == "v4-32"


@pytest.mark.parametrize("bad", ["v2", "v2-7", "tpu-8", "v5litepod-3", "v4-0", "V2-8"])
def test_bad_type_names_are_refused(bad: str) -> None:
    with pytest.raises(CatalogError):
        catalog.parse_accelerator_type(bad)


def test_prices_scale_with_chips_and_spot_is_cheaper() -> None:
    tpu = catalog.parse_accelerator_type("v5litepod-8")
    assert catalog.usd_per_hour(tpu, spot=False) == pytest.approx(1.20 * 8)
    assert catalog.usd_per_hour(tpu, spot=True) == pytest.approx(0.607 * 8)
    assert catalog.usd_per_hour(catalog.parse_accelerator_type("v2-8"), spot=False) is None


def test_every_zone_names_its_region() -> None:
    for zone in catalog.all_zones():
        assert catalog.region_of(zone) == zone.rsplit("-", 1)[0]


@pytest.mark.parametrize("accelerator", ["v2-8", "v3-8", "v4-8", "v5litepod-8", "v5p-8",
                                         "v6e-8"])
@pytest.mark.parametrize("version", ["2.19.0", "2.20.0", "2.17.2", "2.16.0"])
def test_runtimes_no_google_source_names_are_refused(accelerator: str, version: str) -> None:
    tpu = catalog.parse_accelerator_type(accelerator)
    problem = catalog.runtime_problem(tpu, f"tpu-vm-tf-{version}-pjrt") or ""
    assert "no Google source names such an image" in problem
    assert "documented and supported on" in problem and "2.17.1, 2.18.0" in problem


def test_an_image_older_than_the_carried_tf_keras_is_refused() -> None:
    problem = catalog.runtime_problem(catalog.parse_accelerator_type("v2-8"),
                                      "tpu-vm-tf-2.14.1") or ""
    assert ("the training package carries tf-keras for TensorFlow 2.15 to 2.20 only "
            "(training/wheels.lock)") in problem


DOCUMENTED = [".".join(map(str, v)) for v in catalog.DOCUMENTED_TF]


@pytest.mark.parametrize("version", DOCUMENTED)
@pytest.mark.parametrize("accelerator", ["v2-8", "v3-32", "v4-8", "v4-32", "v5litepod-4",
                                         "v5litepod-16", "v5p-8", "v5p-16", "v6e-8"])
def test_the_documented_convention_is_accepted_for_every_carried_version(
        accelerator: str, version: str) -> None:
    tpu = catalog.parse_accelerator_type(accelerator)
    pod = "-pod" if tpu.multi_host else ""

    assert catalog.runtime_problem(tpu, f"tpu-vm-tf-{version}{pod}-pjrt") is None
    stream_executor = catalog.runtime_problem(tpu, f"tpu-vm-tf-{version}{pod}-se")
    if tpu.generation.name in ("v2", "v3", "v4"):
        assert stream_executor is None
    else:
        assert f"{tpu.generation.name} runs TensorFlow on -pjrt images only" in stream_executor
    assert "names its device API, -pjrt or -se" in (
        catalog.runtime_problem(tpu, f"tpu-vm-tf-{version}{pod}") or "")


def test_every_documented_tensorflow_has_its_tf_keras_in_the_package() -> None:
    carried = {tuple(map(int, pin.requirement.split("==")[1].split(".")[:2]))
               for pin in read_lock() if pin.requirement.startswith("tf-keras==")}

    assert {v[:2] for v in catalog.DOCUMENTED_TF} <= carried
    assert tuple(sorted(carried)) == catalog.SUPPORTED_TF


def test_the_tf_2_17_images_google_uses_are_accepted() -> None:
    # cloud.google.com/tpu/docs/preemptible (v3-8); python-docs-samples tpu/ (v5litepod-1)
    assert catalog.runtime_problem(catalog.parse_accelerator_type("v3-8"),
                                   "tpu-vm-tf-2.17.1-pjrt") is None
    assert catalog.runtime_problem(catalog.parse_accelerator_type("v5litepod-1"),
                                   "tpu-vm-tf-2.17.0-pjrt") is None


@pytest.mark.parametrize(("accelerator", "runtime"), [
    ("v5litepod-8", "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6"),
    ("v6e-4", "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6"),
    ("v2-8", "tpu-vm-tf-2.18.0-pjrt-v5p-and-below"),
    ("v5p-16", "tpu-vm-tf-2.18.0-pod-pjrt-v5p-and-below"),
])
def test_generation_suffixed_images_are_accepted_with_a_note(accelerator: str,
                                                            runtime: str) -> None:
    tpu = catalog.parse_accelerator_type(accelerator)

    assert catalog.runtime_problem(tpu, runtime) is None
    assert "images have only secondary sources (docs/tpu-facts.md): `tpuctl preflight " \
           f"--live` checks that the zone offers {runtime}" in (catalog.runtime_note(tpu, runtime)
                                                               or "")


def test_a_generation_suffix_for_another_generation_is_refused() -> None:
    problem = catalog.runtime_problem(catalog.parse_accelerator_type("v2-8"),
                                      "tpu-vm-tf-2.18.0-pjrt-v5e-and-v6")
    assert problem == ("tpu-vm-tf-2.18.0-pjrt-v5e-and-v6 is an image for v5e, v6e, not v2: "
                       "e.g. tpu-vm-tf-2.18.0-pjrt")


def test_v6e_single_host_runs_tensorflow_with_a_note_and_pods_are_refused() -> None:
    single, pod = (catalog.parse_accelerator_type(t) for t in ("v6e-8", "v6e-16"))

    assert catalog.runtime_for(single) == "tpu-vm-tf-2.18.0-pjrt"
    assert catalog.runtime_problem(single, "tpu-vm-tf-2.18.0-pjrt") is None
    assert "tensorflow/tensorflow issue 82208" in (
        catalog.runtime_note(single, "tpu-vm-tf-2.18.0-pjrt") or "")
    assert catalog.runtime_for(pod) is None
    assert catalog.runtime_problem(pod, "tpu-vm-tf-2.18.0-pod-pjrt") == (
        "TensorFlow cannot drive a multi-host v6e slice: its TPU worker server "
        "(tensorflow/python/tools/grpc_tpu_worker.py) knows host bounds for v2, v3, v4, v5e, "
        "v5p only; use a single-host v6e (at most 8 chips) or a v5e/v5p pod")


@settings(deadline=None)
@given(slices)
def test_every_accepted_runtime_is_documented(tpu: Slice) -> None:
    for version in ("2.14.1", "2.15.0", "2.16.1", "2.17.1", "2.18.0", "2.18.1", "2.19.0"):
        runtime = f"tpu-vm-tf-{version}-{'pod-' if tpu.multi_host else ''}pjrt"
        if catalog.runtime_problem(tpu, runtime) is None:
            assert tuple(map(int, version.split("."))) in catalog.DOCUMENTED_TF


def test_the_3d_rule_text_agrees_with_the_one_host_shape() -> None:
    v4, v5p = catalog.generation("v4"), catalog.generation("v5p")

    assert catalog.topology_problem(v4, "2x2x1") is None
    assert catalog.topology_problem(v5p, "2x2x1") is None
    assert "one host is 2x2x1; a larger slice is AxBxC" in catalog.topology_problem(v4, "1x2x2")
