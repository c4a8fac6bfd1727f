"""The agent's decisions, one function at a time (no servers, no TensorFlow)."""

from __future__ import annotations

import ast
import base64
import hashlib
import io
import re
import shutil
import subprocess
import sys
import tarfile
import threading
import time
import tokenize
import zipfile
from pathlib import Path

import pytest

from node_agent import (
    build,
    common,
    contract,
    desired,
    devices,
    environment,
    goodput,
    install,
    job,
    job_lines,
    metadata,
    status,
    storage,
    watchers,
)
from ops.local.metadata_server import MetadataServer
from ops.local.storage_emulator import StorageEmulator
from tests.agent.conftest import BUCKET

REPO = Path(__file__).resolve().parents[2]
SHELLCHECK = REPO / ".venv" / "infra" / "bin" / "shellcheck"
SHA = "ab" * 32
PACKAGE = f"gs://b/packages/tpu_training-{SHA}.tar.gz"
GOOD = {contract.RELEASE_KEY: "gs://b/releases/dev-trainer/", contract.WORKERS_KEY: "all"}
WHEELS = ["tf_keras-2.18.0-py3-none-any.whl", "tf_keras-2.19.0-py3-none-any.whl",
          "tf_keras-2.20.1-py3-none-any.whl"]


class FakeStorage:
    """objects.list and reads of a release prefix, as the JSON API answers them."""

    def __init__(self, objects: dict[str, tuple[str, bytes]] | None = None,
                 failure: Exception | None = None):
        self.objects = objects or {}  # name -> (timeCreated, content)
        self.failure = failure
        self.listed: list[tuple[str, str]] = []

    def list(self, bucket: str, prefix: str, setting: str, fields: str) -> list[dict[str, str]]:
        self.listed.append((bucket, prefix))
        if self.failure:
            raise self.failure
        return [{"name": name, "timeCreated": created}
                for name, (created, _) in self.objects.items() if name.startswith(prefix)]

    def read(self, uri: str, setting: str) -> bytes | None:
        name = uri.split("/", 3)[3]
        return self.objects[name][1] if name in self.objects else None


def _release(job: dict[str, object], created: str) -> tuple[str, tuple[str, bytes]]:
    content = desired.release_content(job, PACKAGE, SHA)
    return f"releases/dev-trainer/{desired.release_name(content)}", (created, content)


def test_a_release_object_is_compact_sorted_json_named_by_its_content() -> None:
    content = desired.release_content({"trainSteps": 5, "model": "m"}, PACKAGE, SHA)
    assert content == (b'{"job":{"model":"m","trainSteps":5},"package":"' + PACKAGE.encode()
                       + b'","sha256":"' + SHA.encode() + b'"}')
    name = desired.release_name(content)
    assert re.fullmatch(r"release-[0-9a-f]{16}\.json", name)
    assert name[8:24] == hashlib.sha256(content).hexdigest()[:16]


def test_the_current_release_is_the_latest_created_ties_by_the_greatest_name() -> None:
    old = _release({"model": "old"}, "2026-01-01T00:00:00.000Z")
    new = _release({"model": "new"}, "2026-01-02T00:00:00.000Z")
    tie = _release({"model": "tie"}, "2026-01-02T00:00:00.000Z")
    other = ("releases/dev-trainer/notes.txt", ("2026-02-01T00:00:00.000Z", b"x"))
    storage = FakeStorage(dict([old, new, other]))
    current = desired.current_release(storage, "gs://b/releases/dev-trainer/")
    assert current is not None and '"new"' in current.job_json
    assert storage.listed == [("b", "releases/dev-trainer/")]
    storage.objects = dict([old, new, tie])
    latest = max(new[0], tie[0])
    current = desired.current_release(storage, "gs://b/releases/dev-trainer/")
    assert current is not None and current.uri == f"gs://b/{latest}"
    assert desired.current_release(FakeStorage(), "gs://b/releases/dev-trainer/") is None


def test_a_release_that_is_not_one_is_named() -> None:
    with pytest.raises(common.AgentError, match="tpu-stack-release: gs://b/r/x is not a release"):
        desired.Release.parse("gs://b/r/x", b'{"job": {}}')
    with pytest.raises(common.AgentError, match="sha256 '12' is not a hex sha256"):
        desired.Release.parse("gs://b/r/x", b'{"job": {}, "package": "gs://b/p", "sha256": "12"}')


def test_run_key_tells_jobs_and_packages_apart() -> None:
    first = desired.Release.parse("gs://b/r/1", desired.release_content({"m": 1}, PACKAGE, SHA))
    second = desired.Release.parse("gs://b/r/2", desired.release_content({"m": 2}, PACKAGE, SHA))
    assert desired.Desired(first, "all").run_key != desired.Desired(second, "all").run_key
    assert desired.Desired(first, "all").package_sha256 == SHA


@pytest.mark.parametrize(("changes", "message"), [
    ({contract.RELEASE_KEY: None}, "lacks tpu-stack-release"),
    ({contract.RELEASE_KEY: "releases/x"}, "tpu-stack-release: 'releases/x' is not a gs://"),
    ({contract.WORKERS_KEY: "1"}, "tpu-stack-workers: '1' is not allowed; use 'all'"),
])
def test_node_settings_name_the_bad_key(changes: dict[str, str | None], message: str) -> None:
    attributes = {k: v for k, v in (GOOD | changes).items() if v is not None}
    with pytest.raises(common.AgentError, match=message):
        desired.node_settings(attributes)


def test_release_watcher_offers_each_new_release_once_and_survives_a_failed_list(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPU_STACK_RELEASE_POLL_SECONDS", "0.1")
    storage = FakeStorage(failure=common.TransientError("HTTP 503"))
    wake, notes = threading.Event(), []
    watcher = watchers.ReleaseWatcher(storage, "gs://b/releases/dev-trainer/", wake,
                                      notes.append)  # type: ignore[arg-type]
    try:
        assert wake.wait(5)
        assert watcher.take() is None
        assert "release listing failed: HTTP 503" in watcher.problem
        storage.failure = None
        storage.objects = dict([_release({"model": "a"}, "2026-01-01T00:00:00Z")])
        deadline = time.monotonic() + 10
        while (first := watcher.take()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert first is not None and '"a"' in first.job_json
        storage.failure = common.TransientError("HTTP 503")  # what runs keeps running
        time.sleep(0.5)
        assert watcher.take() is None
        storage.failure = None
        time.sleep(0.5)
        assert watcher.take() is None  # the same release is not offered twice
        storage.objects |= dict([_release({"model": "b"}, "2026-01-02T00:00:00Z")])
        deadline = time.monotonic() + 10
        while (second := watcher.take()) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert second is not None and '"b"' in second.job_json
    finally:
        watcher.stop()
    assert any("release listing failed" in note for note in notes)


@pytest.mark.parametrize(("tf_version", "chosen"), [
    ("2.18.1", "tf_keras-2.18.0-py3-none-any.whl"),
    ("2.19.0", "tf_keras-2.19.0-py3-none-any.whl"),
    ("2.20.0rc1", "tf_keras-2.20.1-py3-none-any.whl"),
])
def test_pick_wheels_matches_tensorflow_major_minor(tf_version: str, chosen: str) -> None:
    assert install.pick_wheels([*WHEELS, "other-1.0-py3-none-any.whl"], tf_version) == [
        "other-1.0-py3-none-any.whl", chosen]


def test_pick_wheels_without_a_match_says_what_is_carried() -> None:
    with pytest.raises(common.AgentError, match=r"tf-keras for TensorFlow 2\.18, 2\.19, 2\.20; "
                                               r"this image has TensorFlow 2\.17\.0"):
        install.pick_wheels(WHEELS, "2.17.0")


def test_image_tensorflow_version_is_read_without_importing_it() -> None:
    code = ("import sys; from node_agent import install; "
            "print(install.tensorflow_version(), 'tensorflow' in sys.modules)")
    result = subprocess.run([str(REPO / ".venv/image/bin/python"), "-c", code], cwd=REPO,
                            capture_output=True, text=True, check=True)
    version, imported = result.stdout.split()
    assert version.startswith("2.18.")
    assert imported == "False"


def test_tpu_env_blob_is_parsed() -> None:
    blob = "ACCELERATOR_TYPE: 'v4-16'\nNODE_ID: 'tpu-stack-dev-trainer'\nWORKER_ID: '1'\n"
    assert metadata.parse_tpu_env(blob) == {"ACCELERATOR_TYPE": "v4-16",
                                         "NODE_ID": "tpu-stack-dev-trainer", "WORKER_ID": "1"}


def test_pod_slice_client_addresses_the_node_by_name(tmp_path: Path) -> None:
    env = environment.job_environment({"PATH": "/bin"}, tmp_path, "0",
                                      tpu_name="tpu-stack-dev-trainer")
    assert env["TPU_NAME"] == "tpu-stack-dev-trainer"
    assert env["TPU_LOAD_LIBRARY"] == "0"
    assert env["TPU_STACK_STRATEGY"] == "tpu"
    assert env["PYTHONPATH"].split(":") == [str(tmp_path / "site"), str(tmp_path / "src")]


def test_single_host_client_uses_the_local_tpu(tmp_path: Path) -> None:
    env = environment.job_environment({"TPU_STACK_STRATEGY": "cpu"}, tmp_path, "all")
    assert "TPU_NAME" not in env
    assert env["TPU_STACK_STRATEGY"] == "cpu"
    assert not set(environment.PJRT_KEYS) & set(env)  # no runtime version: not a PJRT runtime


@pytest.mark.parametrize(("runtime", "pjrt"), [
    ("tpu-vm-tf-2.18.0-pjrt", True), ("tpu-vm-tf-2.19.0-pod-pjrt", True),
    ("tpu-vm-tf-2.18.0-pjrt-v5e-and-v6", True), ("tpu-vm-tf-2.16.1-se", False),
    ("tpu-vm-tf-2.16.1-pod-se", False), ("tpu-ubuntu2204-base", False), ("", False)])
def test_pjrt_runtimes_are_told_apart(runtime: str, pjrt: bool) -> None:
    assert environment.is_pjrt(runtime) is pjrt


def test_pjrt_single_host_loads_libtpu_as_a_plugin(tmp_path: Path) -> None:
    env = environment.job_environment({}, tmp_path, "all", runtime_version="tpu-vm-tf-2.18.0-pjrt",
                                libtpu=lambda: "/lib/libtpu.so")
    assert env["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] == "/lib/libtpu.so"
    assert env["NEXT_PLUGGABLE_DEVICE_USE_C_API"] == "true"
    assert "TPU_LOAD_LIBRARY" not in env


def test_what_the_image_sets_wins_over_the_pjrt_defaults(tmp_path: Path) -> None:
    etc = tmp_path / "environment"
    etc.write_text('PATH="/usr/bin"\nTF_PLUGGABLE_DEVICE_LIBRARY_PATH="/opt/libtpu.so"\n')
    image = environment.read_environment_file(etc)
    env = environment.job_environment({"NEXT_PLUGGABLE_DEVICE_USE_C_API": "false"}, tmp_path, "all",
                                runtime_version="tpu-vm-tf-2.18.0-pjrt", image_env=image,
                                libtpu=lambda: "/lib/libtpu.so")
    assert env["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] == "/opt/libtpu.so"
    assert env["NEXT_PLUGGABLE_DEVICE_USE_C_API"] == "false"
    assert "PATH" not in env  # only the keys the agent would set come from the image


def test_pjrt_pod_client_loads_no_libtpu(tmp_path: Path) -> None:
    env = environment.job_environment({}, tmp_path, "0", tpu_name="grpc://10.0.0.2:8470",
                                runtime_version="tpu-vm-tf-2.19.0-pod-pjrt")
    assert env["TPU_LOAD_LIBRARY"] == "0"
    assert not set(environment.PJRT_KEYS) & set(env)


def test_libtpu_is_found_where_the_image_keeps_it(tmp_path: Path) -> None:
    (tmp_path / "libtpu.so").write_bytes(b"")
    assert environment.libtpu_path((str(tmp_path / "absent.so"), str(tmp_path / "libtpu.so"))) == \
        str(tmp_path / "libtpu.so")
    assert environment.libtpu_path((str(tmp_path / "absent.so"),)) is None  # no libtpu package here


def test_without_libtpu_no_plugin_variable_is_set(tmp_path: Path) -> None:
    # TensorFlow's import raises OSError on a plugin path that is not a file.
    env = environment.job_environment({}, tmp_path, "all", runtime_version="tpu-vm-tf-2.18.0-pjrt",
                                libtpu=lambda: None)
    assert not set(environment.PJRT_KEYS) & set(env)


def test_pod_tpu_name_lists_every_worker_in_order() -> None:
    endpoints = "unknown:unknown:10.130.0.4,unknown:unknown:10.130.0.2,x:y:10.130.0.9"
    assert environment.grpc_tpu_name(endpoints) == (
        "grpc://10.130.0.4:8470,grpc://10.130.0.2:8470,grpc://10.130.0.9:8470")
    bad = re.escape("worker-network-endpoints: entry '10.0.0.1'")
    with pytest.raises(common.AgentError, match=bad):
        environment.grpc_tpu_name("10.0.0.1")


def test_node_id_comes_from_the_contract_key_first() -> None:
    with MetadataServer({}, instance_name="t1v-n-abc-w-0") as server:
        client = metadata.Metadata(server.host)
        assert metadata.node_id({contract.NODE_KEY: "dev-trainer",
                              contract.TPU_ENV_KEY: "NODE_ID: 'other'"}, client) == "dev-trainer"
        assert metadata.node_id({contract.TPU_ENV_KEY: "NODE_ID: 'other'\n"}, client) == "other"
        assert metadata.node_id({}, client) == "t1v-n-abc-w-0"


def _tar_with(name: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    return buffer.getvalue()


def test_extract_refuses_entries_outside_the_package(tmp_path: Path) -> None:
    archive = tmp_path / "evil.tar.gz"
    archive.write_bytes(_tar_with("../escape.py"))
    with pytest.raises(common.AgentError, match=re.escape("'../escape.py' is not a plain file")):
        install.extract(archive, tmp_path / "out")
    assert not (tmp_path / "escape.py").exists()


def test_extract_writes_plain_files(tmp_path: Path) -> None:
    archive = tmp_path / "ok.tar.gz"
    archive.write_bytes(_tar_with("tpu_training/x.py"))
    install.extract(archive, tmp_path / "out")
    assert (tmp_path / "out" / "tpu_training" / "x.py").read_bytes() == b"hi"


def test_retrying_backs_off_exponentially_with_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr(common.time, "sleep", sleeps.append)
    calls = iter([common.TransientError("HTTP 503")] * 3 + ["done"])

    def flaky() -> str:
        outcome = next(calls)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert common.retrying(flaky, "download") == "done"
    bases = [common.RETRY_BASE_SECONDS * 2 ** i for i in range(3)]
    assert all(base / 2 <= slept <= base for slept, base in zip(sleeps, bases, strict=True))


def test_retrying_gives_up_after_a_bounded_number_of_attempts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common.time, "sleep", lambda _: None)
    attempts = []

    def always_down() -> None:
        attempts.append(1)
        raise common.TransientError("HTTP 503")

    with pytest.raises(common.TransientError, match="gave up after 6 attempts: HTTP 503"):
        common.retrying(always_down, "download")
    assert len(attempts) == common.RETRY_ATTEMPTS


@pytest.mark.parametrize(("value", "endpoint"), [
    (None, "https://storage.googleapis.com"),
    ("127.0.0.1:9023", "http://127.0.0.1:9023"),
    ("http://127.0.0.1:9023/", "http://127.0.0.1:9023"),
])
def test_storage_endpoint_follows_storage_emulator_host(
        monkeypatch: pytest.MonkeyPatch, value: str | None, endpoint: str) -> None:
    if value is None:
        monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    else:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", value)
    assert storage.storage_endpoint() == endpoint


def test_stale_pid_file_of_a_reused_pid_kills_nothing(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "job.pid").write_text(f"{sleeper.pid} 1\n")  # another start time
        job.stop_stale_job(tmp_path)
        assert sleeper.poll() is None
        assert not (tmp_path / "run" / "job.pid").exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_stale_job_is_stopped_by_its_pid(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "run").mkdir()
        started = job.process_start_time(sleeper.pid)
        (tmp_path / "run" / "job.pid").write_text(f"{sleeper.pid} {started}\n")
        job.stop_stale_job(tmp_path)
        assert sleeper.wait(5) == -15  # SIGTERM
    finally:
        sleeper.kill()


def test_startup_script_embeds_the_agent_and_fits_in_metadata() -> None:
    script = build.startup_script()
    assert script.startswith("#!/usr/bin/env bash\n")
    assert base64.b64encode(build.zipapp()).decode()[:76] in script
    assert "@AGENT_ZIPAPP_BASE64@" not in script
    # The metadata value limit (contract.MAX_METADATA_VALUE_BYTES, docs/tpu-facts.md),
    # with room for the agent to grow (89% with the hang deadlines and the hand-over as
    # written, 71% lean; 80% with the hand-over transaction and the run-time limits,
    # until docstrings went too).
    assert len(script.encode()) < 0.8 * contract.MAX_METADATA_VALUE_BYTES


def _shape(source: str) -> tuple[str, list[tuple[int, int]]]:
    """The program without its docstrings (emptied where one is its body's only
    statement; a module reading `__doc__` keeps its own), and where each of its other
    nodes starts (line, column)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module) and "__doc__" in source:
            continue
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef,
                             ast.ClassDef)) and node.body and \
                isinstance(first := node.body[0], ast.Expr) and \
                isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            if len(node.body) > 1:
                node.body.remove(first)
            else:
                first.value.value = ""
    places = [(node.lineno, node.col_offset) for node in ast.walk(tree)
              if isinstance(node, (ast.stmt, ast.expr))]
    return ast.dump(tree), places


@pytest.mark.parametrize("path", build.modules(), ids=lambda path: path.name)
def test_the_zipapp_carries_each_module_lean_with_its_code_where_it_was(path: Path) -> None:
    source = path.read_text()
    lean = build.lean(source)
    assert len(lean) <= len(source)
    assert lean.count("\n") == source.count("\n")
    assert _shape(lean) == _shape(source)  # a traceback names the same lines
    assert not [token for token in tokenize.generate_tokens(io.StringIO(lean).readline)
                if token.type == tokenize.COMMENT]
    with zipfile.ZipFile(io.BytesIO(build.zipapp())) as archive:
        assert archive.read(f"node_agent/{path.name}").decode() == lean


def test_the_zipapp_is_the_same_bytes_from_the_same_sources(tmp_path: Path) -> None:
    first = build.zipapp()
    assert build.zipapp() == first
    with zipfile.ZipFile(io.BytesIO(first)) as archive:
        names = archive.namelist()
        assert names == sorted(names)
        assert {info.date_time for info in archive.infolist()} == {build.FIXED_DATE}
    assert "__main__.py" in names and "node_agent/agent.py" in names
    assert "node_agent/build.py" not in names


def test_the_zipapp_runs_on_the_image_python(tmp_path: Path) -> None:
    agent = tmp_path / "agent.pyz"
    agent.write_bytes(build.zipapp())
    result = subprocess.run([str(REPO / ".venv/image/bin/python"), str(agent), "help"],
                            capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 2
    assert "python3 agent.pyz run --stay" in result.stderr


def test_shell_code_passes_shellcheck(tmp_path: Path) -> None:
    rendered = tmp_path / "startup-script.sh"
    rendered.write_text(build.startup_script())
    for path in (REPO / "node_agent/bootstrap.sh", rendered):
        result = subprocess.run([str(SHELLCHECK), str(path)], capture_output=True, text=True,
                                check=False)
        assert result.returncode == 0, result.stdout


def _install_unit(tmp_path: Path, runs: int = 1) -> tuple[dict[str, dict[str, str]], Path, Path]:
    """Run the bootstrap with a fake systemctl: (unit sections, calls file, root)."""
    fake_bin, units, root = tmp_path / "bin", tmp_path / "units", tmp_path / "root"
    for folder in (fake_bin, units):
        folder.mkdir()
    calls = tmp_path / "systemctl.calls"
    # An inactive unit (a first boot): `is-active` answers 3, as systemctl does.
    (fake_bin / "systemctl").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n'
                                        '[ "$1" != is-active ] || exit 3\n')
    (fake_bin / "systemctl").chmod(0o755)
    script = tmp_path / "startup-script.sh"
    script.write_text(build.startup_script())
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "TPU_STACK_INIT": "systemd",
           "TPU_STACK_UNIT_DIR": str(units), "TPU_STACK_ROOT": str(root),
           "TPU_STACK_PYTHON": str(REPO / ".venv/image/bin/python")}
    for _ in range(runs):
        subprocess.run(["bash", str(script)], env=env, check=True, timeout=30)
    sections: dict[str, dict[str, str]] = {}
    section = ""
    for line in (units / "tpu-stack-agent.service").read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
            sections[section] = {}
        elif "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            sections[section][key] = value
    return sections, calls, root


def test_under_systemd_the_bootstrap_installs_one_service_and_returns(tmp_path: Path) -> None:
    sections, calls, root = _install_unit(tmp_path, runs=2)  # a rerun changes nothing
    unit = sections["Service"]
    assert unit["ExecStart"] == f"{REPO / '.venv/image/bin/python'} {root}/agent.pyz run --stay"
    assert unit["Environment"] == f"TPU_STACK_ROOT={root}"
    assert unit["Restart"] == "on-failure"
    assert unit["KillSignal"] == "SIGTERM"
    assert unit["KillMode"] == "mixed"  # SIGTERM to the agent, which stops the job
    assert int(unit["TimeoutStopSec"]) > job.STOP_GRACE_SECONDS
    assert unit["SuccessExitStatus"].split() == [str(contract.EXIT_PREEMPTED),
                                                 str(contract.EXIT_STOP_SAVE_FAILED)]
    assert unit["ExecReload"] == "/bin/kill -HUP $MAINPID"  # the agent execs a new agent.pyz
    assert calls.read_text().splitlines() == [
        "is-active --quiet tpu-stack-agent.service", "daemon-reload",
        "enable --now tpu-stack-agent.service"] * 2
    assert (root / "agent.pyz").read_bytes() == build.zipapp()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is not installed (Debian: package systemd)")
def test_systemd_itself_parses_every_line_of_the_unit(tmp_path: Path) -> None:
    _install_unit(tmp_path)
    # systemd-analyze(1) verify loads the unit with systemd's own parser; it exits 0 on a
    # key it does not know or a value it cannot parse, but names the line on stderr.
    result = subprocess.run(["systemd-analyze", "verify", "tpu-stack-agent.service"],
                            cwd=tmp_path / "units", capture_output=True, text=True, check=False,
                            env={"SYSTEMD_UNIT_PATH": f"{tmp_path / 'units'}:",
                                 "PATH": "/usr/bin:/bin"})
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def stop_order(units: dict[str, dict[str, dict[str, str]]]) -> list[set[str]]:
    """The order systemd stops `units` in at shutdown, as groups stopped in parallel,
    after systemd.unit(5): the inverse of the start-up order that After= and Before=
    define; units with no ordering between them start, and stop, in parallel."""
    after = {name: set(unit["Unit"].get("After", "").split()) for name, unit in units.items()}
    for name, unit in units.items():
        for later in unit["Unit"].get("Before", "").split():
            after.setdefault(later, set()).add(name)
    started: list[set[str]] = []
    while sum(map(len, started)) < len(units):
        done = set().union(*started)
        started.append({name for name in units if name not in done
                        and not (after[name] & set(units)) - done})
    return started[::-1]


def test_at_shutdown_the_agent_stops_before_the_tpu_runtime(tmp_path: Path) -> None:
    sections, _, _ = _install_unit(tmp_path)
    # The image's runtime unit orders itself against nothing of ours (ml-auto-solutions
    # dags/solutions_team/configs/tensorflow/common.py shows only its [Service]).
    runtime = {"Unit": {"Description": "TPU runtime"}, "Service": {}}
    order = stop_order({"tpu-stack-agent.service": sections, "tpu-runtime.service": runtime})
    assert order == [{"tpu-stack-agent.service"}, {"tpu-runtime.service"}]
    assert "tpu-runtime.service" not in sections["Unit"].get("Wants", "")


# systemd's defaults when a unit sets nothing (systemd-system.conf(5):
# DefaultStartLimitIntervalSec=10s, DefaultStartLimitBurst=5).
DEFAULT_START_LIMIT = ("10", "5")


def starts_refused(unit: dict[str, dict[str, str]], failures: int) -> int:
    """How many of `failures` back-to-back restarts systemd refuses, after systemd.unit(5):
    more than StartLimitBurst starts within StartLimitIntervalSec are refused for good
    (until a manual start); an interval of 0 disables rate limiting. The limit is read
    from [Unit] (systemd >= 230; Ubuntu 22.04 ships 249)."""
    interval_text = unit["Unit"].get("StartLimitIntervalSec", DEFAULT_START_LIMIT[0])
    interval = float(interval_text.rstrip("s"))
    burst = int(unit["Unit"].get("StartLimitBurst", DEFAULT_START_LIMIT[1]))
    step = float(unit["Service"].get("RestartSec", "0.1").rstrip("s"))
    starts: list[float] = []
    for attempt in range(failures):
        now = attempt * step
        if interval > 0 and len([t for t in starts if now - t < interval]) >= burst:
            return failures - attempt
        starts.append(now)
    return 0


def test_the_unit_never_gives_up_on_a_crashing_agent(tmp_path: Path) -> None:
    sections, _, _ = _install_unit(tmp_path)
    assert "StartLimitBurst" not in sections["Service"] | sections["Unit"]
    assert sections["Unit"]["StartLimitIntervalSec"] == "0"
    assert sections["Service"]["Restart"] == "on-failure"
    assert starts_refused(sections, failures=1000) == 0
    # The model does refuse what the unit used to say (5 starts an hour).
    old = {"Unit": {"StartLimitIntervalSec": "3600", "StartLimitBurst": "5"},
           "Service": sections["Service"]}
    assert starts_refused(old, failures=1000) == 995


def test_an_unknown_init_is_named(tmp_path: Path) -> None:
    script = tmp_path / "startup-script.sh"
    script.write_text(build.startup_script())
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False,
                            env={"PATH": "/usr/bin:/bin", "TPU_STACK_INIT": "upstart",
                                 "TPU_STACK_ROOT": str(tmp_path / "root")})
    assert result.returncode == 2
    assert result.stderr == ("TPU_STACK_INIT: 'upstart' is not allowed; "
                             "use auto, systemd or foreground\n")


class _BrokenStream(io.BytesIO):
    def read(self, size: int | None = -1) -> bytes:
        if self.tell() > 0:
            raise ConnectionResetError("peer went away")
        return super().read(4)


def test_a_transfer_broken_midway_is_retried_not_fatal() -> None:
    with pytest.raises(common.TransientError, match="transfer interrupted: peer went away"):
        common.read_body(_BrokenStream(b"0123456789"))
    body, sha = common.read_body(io.BytesIO(b"0123456789"))
    assert body == b"0123456789"
    assert sha == "84d89877f0d4041efb6bf91a16f0248f2fd573e6af05c19f96bedb9f882f7882"


def test_backoff_doubles_to_its_cap_and_never_runs_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common.random, "uniform", lambda _low, high: high)  # no jitter
    backoff = common.Backoff(base=2, cap=300)
    delays = [backoff.next_delay() for _ in range(1000)]
    assert delays[:5] == [2, 4, 8, 16, 32]
    assert delays[-1] == 300  # still retrying after a thousand failures
    backoff.reset()
    assert backoff.next_delay() == 2


JOB_OUTPUT = (
    "tpu_training resumed_from=100\n"
    "tpu_training step=120 loss=0.5\n"
    "tpu_training saved step=120 seconds=1.25 bytes=4096 reason=steps\n"
    "tpu_training step=140 loss=0.4\n"
    "tpu_training goodput step=140 productive=40 tpu_init=5 program_startup=3 "
    "checkpoint_save=1.25 checkpoint_restore=2\n"
    "tpu_training: error: trainData: no files match 'gs://d/x-*'\n")


def test_job_lines_are_read_into_the_run() -> None:
    run = job_lines.JobRun()
    kinds = [run.read(line) for line in JOB_OUTPUT.splitlines(keepends=True)]
    assert kinds == ["step", "step", "save", "step", "goodput", None]
    assert (run.start_step, run.step, run.saved_step) == (100, 140, 120)
    assert run.last_save == {"step": 120, "seconds": 1.25, "bytes": 4096, "reason": "steps"}
    assert run.stop_save is None
    assert run.reported == {"productive": 40.0, "tpu_init": 5.0, "program_startup": 3.0,
                            "checkpoint_save": 1.25, "checkpoint_restore": 2.0}
    assert run.error == "trainData: no files match 'gs://d/x-*'"
    run.read("tpu_training saved step=150 seconds=2 bytes=4096 reason=stop\n")
    run.read("tpu_training waiting_for_data pattern=gs://d/train-*.tfrecord\n")
    assert run.stop_save == {"step": 150, "seconds": 2.0, "bytes": 4096}
    assert run.waiting_pattern == "gs://d/train-*.tfrecord"


def _run_from(output: str) -> job_lines.JobRun:
    run = job_lines.JobRun()
    for line in output.splitlines():
        run.read(line)
    return run


def test_a_clean_stop_loses_nothing_and_the_rest_is_start_up() -> None:
    added = goodput.settle_run(_run_from(JOB_OUTPUT), contract.EXIT_PREEMPTED, wall=60)
    assert added["productive"] == 40
    assert added["program_startup"] == 3 + (60 - 51.25)
    assert "lost_progress" not in added


def test_a_killed_run_loses_the_steps_after_its_last_save() -> None:
    # 40 productive seconds for steps 100..140; saved at 120: 20 steps (20 s) are lost,
    # and so are the 8.75 s the job never reported.
    added = goodput.settle_run(_run_from(JOB_OUTPUT), -9, wall=60)
    assert added["productive"] == 20
    assert added["lost_progress"] == 20 + (60 - 51.25)
    assert sum(added.values()) == 60


def test_goodput_totals_carry_over_for_the_same_job_only() -> None:
    totals = goodput.Goodput("job-a")
    totals.merge({"productive": 90, "tpu_init": 5})
    totals.add("waiting_for_data", 5)
    view = totals.view()
    assert view["percent"] == 90.0
    assert view["total"] == 100
    assert goodput.Goodput.resume("job-a", {"goodput": view}).totals["productive"] == 90
    assert goodput.Goodput.resume("job-b", {"goodput": view}).totals["productive"] == 0
    live = totals.view({"productive": 10})
    assert live["productive"] == 100
    assert live["percent"] == round(100 * 100 / 110, 1)
    assert goodput.Goodput("job-c").view()["percent"] is None


def test_the_uploaded_log_is_a_bounded_tail_across_a_roll(tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    (tmp_path / "job.log.1").write_text("".join(f"old {i}\n" for i in range(100)))
    log.write_text("new 1\nnew 2\n")
    tail = status.log_tail(log, 40)
    assert len(tail) <= 40
    assert tail.endswith(b"new 1\nnew 2\n")
    assert tail.startswith(b"old ")  # reaches back into the rolled file, from a line start
    assert status.log_tail(tmp_path / "elsewhere" / "job.log", 40) == b""


def test_notice_watcher_long_polls_and_wakes_on_preemption(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metadata, "WATCH_TIMEOUT_SECONDS", 1)
    with MetadataServer(GOOD) as server:
        wake = threading.Event()
        watcher = watchers.NoticeWatcher(metadata.Metadata(server.host), wake)
        try:
            deadline = time.monotonic() + 5
            while len(server.long_polls("instance/preempted")) < 2 and \
                    time.monotonic() < deadline:
                time.sleep(0.05)
            wake.clear()
            assert watcher.reason() is None
            server.preempt()
            assert wake.wait(2)
            assert watcher.reason() == "instance/preempted=TRUE"
            polls = server.long_polls("instance/preempted")
            assert all(q["last_etag"] and q["timeout_sec"] == "1" for q in polls)
        finally:
            watcher.stop()


def test_notice_watcher_stops_on_terminating_maintenance_only(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(metadata, "WATCH_TIMEOUT_SECONDS", 1)
    with MetadataServer(GOOD) as server:
        wake = threading.Event()
        watcher = watchers.NoticeWatcher(metadata.Metadata(server.host), wake)
        try:
            server.set_maintenance_event("MIGRATE_ON_HOST_MAINTENANCE")
            assert wake.wait(2)
            time.sleep(0.2)
            assert watcher.reason() is None  # a live migration keeps the VM running
            wake.clear()
            server.set_maintenance_event(watchers.TERMINATE_EVENT)
            assert wake.wait(2)
            time.sleep(0.2)
            assert watcher.reason() == "instance/maintenance-event=TERMINATE_ON_HOST_MAINTENANCE"
        finally:
            watcher.stop()


def test_metadata_server_long_poll_behaves_like_compute_engine() -> None:
    with MetadataServer(GOOD) as server:
        client = metadata.Metadata(server.host)
        value, etag = client.get("instance/preempted")
        assert value == "FALSE"
        started = time.monotonic()
        same = client.get("instance/preempted", {"wait_for_change": "true", "last_etag": etag,
                                                   "timeout_sec": "1"})
        assert same == (value, etag)  # a timed-out poll: same value, same ETag
        assert time.monotonic() - started >= 0.9
        stale = client.get("instance/preempted", {"wait_for_change": "true",
                                                    "last_etag": "stale"})
        assert stale == (value, etag)  # an ETag that already differs answers at once
        threading.Timer(0.3, server.preempt).start()
        changed = client.get("instance/preempted", {"wait_for_change": "true",
                                                      "timeout_sec": "5"})
        assert changed[0] == "TRUE"  # no last_etag: waits for the next change
        assert changed[1] != etag


def test_data_is_found_through_a_bucket_listing(gcs: StorageEmulator) -> None:
    with MetadataServer(GOOD) as server:
        bucket = storage.Storage(metadata.Metadata(server.host), gcs.host)
        pattern = f"gs://{BUCKET}/units-data/train-*.tfrecord"
        assert not bucket.any_match(pattern, "trainData")
        gcs.upload(f"gs://{BUCKET}/units-data/train-other.txt", b"x")
        assert not bucket.any_match(pattern, "trainData")
        gcs.upload(f"gs://{BUCKET}/units-data/train-00000-of-00001.tfrecord", b"x")
        assert bucket.any_match(pattern, "trainData")
        assert bucket.read(f"gs://{BUCKET}/units-data/absent", "s") is None
        assert bucket.read(f"gs://{BUCKET}/units-data/train-other.txt", "s") == b"x"


HOLD_TPU = ("import fcntl, os, sys, time\ndevice = open(sys.argv[1])\n"
            "fd = os.open(sys.argv[2], os.O_CREAT | os.O_RDWR)\n"
            "fcntl.lockf(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(120)\n")


def hold_tpu(tmp: Path, device: Path, lock: Path) -> subprocess.Popen[str]:
    """A user's process holding the TPU as libtpu does: the device open, the lock taken."""
    script = tmp / "user_notebook.py"
    script.write_text(HOLD_TPU)
    user = subprocess.Popen([sys.executable, str(script), str(device), str(lock)],
                            stdout=subprocess.PIPE, text=True)
    assert user.stdout is not None and user.stdout.readline() == "held\n"
    return user


def test_holders_of_the_tpu_devices_are_found_with_their_command_line(tmp_path: Path) -> None:
    device, lock = tmp_path / "accel0", tmp_path / "libtpu_lockfile"
    device.write_text("")
    user = hold_tpu(tmp_path, device, lock)
    try:
        found = devices.holders([str(device)])
        assert [holder.pid for holder in found] == [user.pid]
        assert f"python {tmp_path / 'user_notebook.py'}" in found[0].command
        assert not devices.remove_stale_lockfile(lock)  # its lock is held: not stale
        assert lock.exists()
    finally:
        user.kill()
        user.wait()
    assert devices.holders([str(device)]) == []
    assert devices.remove_stale_lockfile(lock)  # nobody holds it now
    assert not lock.exists()
    assert not devices.remove_stale_lockfile(lock)


def test_device_and_lockfile_paths_can_be_overridden(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    for name in ("accel0", "accel1", "other"):
        (tmp_path / name).write_text("")
    monkeypatch.setenv("TPU_STACK_TPU_DEVICES", f"{tmp_path}/accel*:{tmp_path}/vfio/*")
    monkeypatch.setenv("TPU_STACK_LIBTPU_LOCKFILE", str(tmp_path / "lock"))
    assert devices.device_paths() == {str(tmp_path / "accel0"), str(tmp_path / "accel1")}
    assert devices.lockfile_path() == tmp_path / "lock"


@pytest.mark.parametrize(("answer", "window"), [
    ("NONE", None),
    ('{ "error": "no notifications have been received yet, try again later" }', None),
    ('{"can_reschedule": "true", "latest_window_start_time": "2024-12-01T19:00:01Z", '
     '"maintenance_status": "PENDING", "type": "SCHEDULED", '
     '"window_end_time": "2024-12-01T21:00:01Z", "window_start_time": "2024-12-01T19:00:01Z"}',
     {"start": "2024-12-01T19:00:01Z", "end": "2024-12-01T21:00:01Z", "type": "SCHEDULED",
      "status": "PENDING"}),
])
def test_upcoming_maintenance_is_read_as_documented(answer: str,
                                                    window: dict[str, str] | None) -> None:
    # The answers Compute Engine documents (monitor-plan-host-maintenance-event).
    assert watchers.parse_maintenance(answer) == window


class _NoStatusYet:
    """A Storage whose status object does not exist (a node's first boot)."""

    def read(self, uri: str, setting: str, attempts: int = 5) -> bytes | None:
        return None

    def upload(self, uri: str, data: bytes, content_type: str, setting: str,
               metadata: object = None) -> None:
        pass


def test_a_first_boot_finds_no_earlier_status_and_says_nothing_of_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    published = status.Status(metadata=None, storage=_NoStatusYet(),  # type: ignore[arg-type]
                              root=tmp_path, worker=0)
    published.prefix = f"gs://{BUCKET}/status/first-boot/"
    try:
        assert published.previous() == {}
    finally:
        published.close()
    assert "earlier status unreadable" not in capsys.readouterr().err
