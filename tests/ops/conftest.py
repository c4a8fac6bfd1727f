"""Shared fixtures: a fake TPU API on loopback that every client in the test talks to."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest

from cloud.tpu import ENDPOINT_ENV
from ops.tpu.api import TpuApi
from tests.fakes.tpu_api import FakeTpuApi, running
from tests.ops.tpu_world import OTHER_ZONE, PROJECT, ZONE

warnings.filterwarnings("ignore", category=FutureWarning, module="google.api_core")


@pytest.fixture
def fake_tpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeTpuApi]:
    api = FakeTpuApi(
        project=PROJECT,
        accelerator_types={ZONE: ["v2-8", "v3-8", "v6e-8"], OTHER_ZONE: ["v2-8", "v3-8"]},
        runtime_versions={
            ZONE: ["tpu-vm-tf-2.18.0-pjrt", "tpu-vm-tf-2.18.0-pod-pjrt"],
            OTHER_ZONE: ["tpu-vm-tf-2.18.0-pjrt"],
        },
    )
    with running(api):
        monkeypatch.setenv(ENDPOINT_ENV, api.endpoint)
        yield api


@pytest.fixture
def tpu(fake_tpu: FakeTpuApi) -> TpuApi:
    return TpuApi(deadline=10.0)
