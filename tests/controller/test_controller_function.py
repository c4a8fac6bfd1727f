"""The controller's function runs its real archive (components/controller.py
controller_source) under functions-framework, in a process that has nothing else of the
repo on its path, against the fake TPU API and the GCS emulator."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

from components.controller import ENTRY_POINT, controller_source
from components.fallback_tpu import FallbackTpuProvider
from tests.controller.world import (
    BUCKET,
    NODE,
    PROJECT,
    TAKES,
    WAITS,
    World,
    fallback_node,
    provider_props,
    stack,
)

SERVE_ONCE = """
import json, sys
sys.path.insert(0, sys.argv[1])
import functions_framework, ops.controller as controller
app = functions_framework.create_app(sys.argv[2], sys.argv[1] + "/main.py", "http")
answer = app.test_client().post("/", data=b"{}")
print(json.dumps({"status": answer.status_code, "body": answer.get_json(),
                  "controller": controller.__file__}))
"""


def serve_once(source: Path, world: World) -> dict:
    env = {**os.environ, "TPU_STACK_CONTROLLER_BUCKET": BUCKET,
           "TPU_STACK_CONTROLLER_INTERVAL_SECONDS": "300"}
    done = subprocess.run([sys.executable, "-I", "-c", SERVE_ONCE, str(source), ENTRY_POINT],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_function_archive_runs_a_controller_run_under_functions_framework(
        world: World, tmp_path: Path) -> None:
    with zipfile.ZipFile(io.BytesIO(controller_source())) as archive:
        archive.extractall(tmp_path / "source")
    world.publish(stack(replace(fallback_node(WAITS, TAKES), max_wait_seconds=0)))
    world.tpu.script_queued(NODE, "WAITING_FOR_RESOURCES", zone=WAITS)
    FallbackTpuProvider().create(provider_props(WAITS, TAKES))

    answer = serve_once(tmp_path / "source", world)

    assert answer["controller"].startswith(str(tmp_path / "source"))
    assert answer["status"] == 200 and answer["body"]["leased"] is True
    assert answer["body"]["steps"] == 1
    assert world.requests_of() == [
        f"projects/{PROJECT}/locations/{TAKES}/queuedResources/{NODE}-c2"]
    audit = world.store.last_run()
    assert audit is not None and audit["steps"][0]["verb"] == "move-queued"
    assert audit["steps"][0]["result"] == "done"


def test_the_archive_is_the_same_bytes_for_the_same_sources() -> None:
    assert controller_source() == controller_source()
    with zipfile.ZipFile(io.BytesIO(controller_source())) as archive:
        names = archive.namelist()
    assert {"main.py", "requirements.txt", "ops/controller/run.py"} <= set(names)
    assert not [n for n in names if n.startswith("tests/")]
