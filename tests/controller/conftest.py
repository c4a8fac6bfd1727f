"""The controller's world: the fake TPU API and the GCS emulator (tests/controller/world.py)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest

from cloud.tpu import ENDPOINT_ENV
from ops.controller.store import Store
from ops.local.storage_emulator import StorageEmulator
from tests.controller.world import BUCKET, PROJECT, QUOTA, TAKES, WAITS, World
from tests.fakes.gcs_preconditions import CreateOnlyProxy
from tests.fakes.tpu_api import FakeTpuApi, running

warnings.filterwarnings("ignore", category=FutureWarning, module="google.api_core")


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    from google.cloud import storage

    fake = FakeTpuApi(project=PROJECT, accelerator_types={
        z: ["v6e-8"] for z in (WAITS, QUOTA, TAKES)})
    with StorageEmulator() as emulator, CreateOnlyProxy(emulator.host) as proxy, running(fake):
        emulator.create_bucket(BUCKET)
        monkeypatch.setenv(ENDPOINT_ENV, fake.endpoint)
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.host)
        client = storage.Client(project=PROJECT)
        yield World(fake, Store(client, BUCKET), proxy.host)
