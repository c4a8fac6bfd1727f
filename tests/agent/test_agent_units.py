"""The agent's decisions, one function at a time (no servers, no TensorFlow)."""

from __future__ import annotations

import io
import re
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest

from components.agent import MAX_METADATA_VALUE_BYTES, agent, startup_script
from ops.local.metadata_server import MetadataServer

REPO = Path(__file__).resolve().parents[2]
SHELLCHECK = REPO / ".venv" / "infra" / "bin" / "shellcheck"
SHA = "ab" * 32
GOOD = {agent.PACKAGE_KEY: f"gs://b/packages/tpu_training-{SHA}.tar.gz",
        agent.PACKAGE_SHA256_KEY: SHA, agent.JOB_KEY: '{"model": "mnist_cnn"}',
        agent.WORKERS_KEY: "all"}
WHEELS = ["tf_keras-2.18.0-py3-none-any.whl", "tf_keras-2.19.0-py3-none-any.whl",
          "tf_keras-2.20.1-py3-none-any.whl"]


def test_desired_reads_the_metadata_contract() -> None:
    desired = agent.Desired.from_attributes(GOOD | {agent.PACKAGE_SHA256_KEY: SHA.upper()})
    assert desired.package_sha256 == SHA
    assert desired.workers == "all"
    assert desired.run_key != agent.Desired.from_attributes(
        GOOD | {agent.JOB_KEY: '{"model": "resnet18"}'}).run_key


@pytest.mark.parametrize(("changes", "message"), [
    ({agent.PACKAGE_KEY: None}, "lacks tpu-stack-package"),
    ({agent.PACKAGE_SHA256_KEY: "1234"}, "tpu-stack-package-sha256: '1234' is not a hex sha256"),
    ({agent.WORKERS_KEY: "1"}, "tpu-stack-workers: '1' is not allowed; use 'all'"),
    ({agent.JOB_KEY: "{not json"}, "tpu-stack-job: not valid JSON"),
])
def test_desired_names_the_bad_key(changes: dict[str, str | None], message: str) -> None:
    attributes = {k: v for k, v in (GOOD | changes).items() if v is not None}
    with pytest.raises(agent.AgentError, match=message):
        agent.Desired.from_attributes(attributes)


@pytest.mark.parametrize(("tf_version", "chosen"), [
    ("2.18.1", "tf_keras-2.18.0-py3-none-any.whl"),
    ("2.19.0", "tf_keras-2.19.0-py3-none-any.whl"),
    ("2.20.0rc1", "tf_keras-2.20.1-py3-none-any.whl"),
])
def test_pick_wheels_matches_tensorflow_major_minor(tf_version: str, chosen: str) -> None:
    assert agent.pick_wheels([*WHEELS, "other-1.0-py3-none-any.whl"], tf_version) == [
        "other-1.0-py3-none-any.whl", chosen]


def test_pick_wheels_without_a_match_says_what_is_carried() -> None:
    with pytest.raises(agent.AgentError, match=r"tf-keras for TensorFlow 2\.18, 2\.19, 2\.20; "
                                               r"this image has TensorFlow 2\.17\.0"):
        agent.pick_wheels(WHEELS, "2.17.0")


def test_image_tensorflow_version_is_read_without_importing_it() -> None:
    code = ("import sys; sys.path.insert(0, 'components/agent'); import agent; "
            "print(agent.tensorflow_version(), 'tensorflow' in sys.modules)")
    result = subprocess.run([str(REPO / ".venv/image/bin/python"), "-c", code], cwd=REPO,
                            capture_output=True, text=True, check=True)
    version, imported = result.stdout.split()
    assert version.startswith("2.18.")
    assert imported == "False"


def test_tpu_env_blob_is_parsed() -> None:
    blob = "ACCELERATOR_TYPE: 'v4-16'\nNODE_ID: 'tpu-stack-dev-trainer'\nWORKER_ID: '1'\n"
    assert agent.parse_tpu_env(blob) == {"ACCELERATOR_TYPE": "v4-16",
                                         "NODE_ID": "tpu-stack-dev-trainer", "WORKER_ID": "1"}


def test_pod_slice_client_addresses_the_node_by_name(tmp_path: Path) -> None:
    env = agent.job_environment({"PATH": "/bin"}, tmp_path, "0", "tpu-stack-dev-trainer")
    assert env["TPU_NAME"] == "tpu-stack-dev-trainer"
    assert env["TPU_LOAD_LIBRARY"] == "0"
    assert env["TPU_STACK_STRATEGY"] == "tpu"
    assert env["PYTHONPATH"].split(":") == [str(tmp_path / "site"), str(tmp_path / "src")]


def test_single_host_client_uses_the_local_tpu(tmp_path: Path) -> None:
    env = agent.job_environment({"TPU_STACK_STRATEGY": "cpu"}, tmp_path, "all", "")
    assert "TPU_NAME" not in env
    assert env["TPU_STACK_STRATEGY"] == "cpu"


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
    with pytest.raises(agent.AgentError, match=re.escape("'../escape.py' is not a plain file")):
        agent.extract(archive, tmp_path / "out")
    assert not (tmp_path / "escape.py").exists()


def test_extract_writes_plain_files(tmp_path: Path) -> None:
    archive = tmp_path / "ok.tar.gz"
    archive.write_bytes(_tar_with("tpu_training/x.py"))
    agent.extract(archive, tmp_path / "out")
    assert (tmp_path / "out" / "tpu_training" / "x.py").read_bytes() == b"hi"


def test_retrying_backs_off_exponentially_with_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr(agent.time, "sleep", sleeps.append)
    calls = iter([agent.TransientError("HTTP 503")] * 3 + ["done"])

    def flaky() -> str:
        outcome = next(calls)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert agent.retrying(flaky, "download") == "done"
    bases = [agent.RETRY_BASE_SECONDS * 2 ** i for i in range(3)]
    assert all(base / 2 <= slept <= base for slept, base in zip(sleeps, bases, strict=True))


def test_retrying_gives_up_after_a_bounded_number_of_attempts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent.time, "sleep", lambda _: None)
    attempts = []

    def always_down() -> None:
        attempts.append(1)
        raise agent.TransientError("HTTP 503")

    with pytest.raises(agent.AgentError, match="gave up after 6 attempts: HTTP 503"):
        agent.retrying(always_down, "download")
    assert len(attempts) == agent.RETRY_ATTEMPTS


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
    assert agent.storage_endpoint() == endpoint


def test_stale_pid_file_of_a_reused_pid_kills_nothing(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "job.pid").write_text(f"{sleeper.pid} 1\n")  # another start time
        agent.stop_stale_job(tmp_path)
        assert sleeper.poll() is None
        assert not (tmp_path / "run" / "job.pid").exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_stale_job_is_stopped_by_its_pid(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "run").mkdir()
        started = agent.process_start_time(sleeper.pid)
        (tmp_path / "run" / "job.pid").write_text(f"{sleeper.pid} {started}\n")
        agent.stop_stale_job(tmp_path)
        assert sleeper.wait(5) == -15  # SIGTERM
    finally:
        sleeper.kill()


def test_startup_script_embeds_the_agent_and_fits_in_metadata() -> None:
    script = startup_script()
    assert script.startswith("#!/usr/bin/env bash\n")
    assert (REPO / "components/agent/agent.py").read_text().rstrip("\n") in script
    assert "@AGENT_SOURCE@" not in script
    assert len(script.encode()) < MAX_METADATA_VALUE_BYTES // 4


def test_shell_code_passes_shellcheck(tmp_path: Path) -> None:
    rendered = tmp_path / "startup-script.sh"
    rendered.write_text(startup_script())
    for path in (REPO / "components/agent/bootstrap.sh", rendered):
        result = subprocess.run([str(SHELLCHECK), str(path)], capture_output=True, text=True,
                                check=False)
        assert result.returncode == 0, result.stdout


def test_under_systemd_the_bootstrap_installs_one_service_and_returns(tmp_path: Path) -> None:
    fake_bin, units, root = tmp_path / "bin", tmp_path / "units", tmp_path / "root"
    for folder in (fake_bin, units):
        folder.mkdir()
    calls = tmp_path / "systemctl.calls"
    (fake_bin / "systemctl").write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    (fake_bin / "systemctl").chmod(0o755)
    script = tmp_path / "startup-script.sh"
    script.write_text(startup_script())
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "TPU_STACK_INIT": "systemd",
           "TPU_STACK_UNIT_DIR": str(units), "TPU_STACK_ROOT": str(root),
           "TPU_STACK_PYTHON": str(REPO / ".venv/image/bin/python")}
    for _ in range(2):  # a rerun of the startup script changes nothing
        subprocess.run(["bash", str(script)], env=env, check=True, timeout=30)

    unit = dict(line.split("=", 1) for line in
                (units / "tpu-stack-agent.service").read_text().splitlines() if "=" in line)
    assert unit["ExecStart"] == f"{REPO / '.venv/image/bin/python'} {root}/agent.py run --stay"
    assert unit["Environment"] == f"TPU_STACK_ROOT={root}"
    assert unit["Restart"] == "on-failure"
    assert unit["KillSignal"] == "SIGTERM"
    assert unit["KillMode"] == "mixed"  # SIGTERM to the agent, which stops the job
    assert int(unit["TimeoutStopSec"]) > agent.STOP_GRACE_SECONDS
    assert unit["SuccessExitStatus"] == str(agent.EXIT_PREEMPTED)
    assert calls.read_text().splitlines() == [
        "daemon-reload", "enable --now tpu-stack-agent.service"] * 2
    assert (root / "agent.py").read_text() == (REPO / "components/agent/agent.py").read_text()


def test_an_unknown_init_is_named(tmp_path: Path) -> None:
    script = tmp_path / "startup-script.sh"
    script.write_text(startup_script())
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False,
                            env={"PATH": "/usr/bin:/bin", "TPU_STACK_INIT": "upstart",
                                 "TPU_STACK_ROOT": str(tmp_path / "root")})
    assert result.returncode == 2
    assert result.stderr == ("TPU_STACK_INIT: 'upstart' is not allowed; "
                             "use auto, systemd or foreground\n")


def test_watcher_wakes_on_a_change_and_not_on_a_long_poll_timeout(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent, "WATCH_TIMEOUT_SECONDS", 1)
    with MetadataServer(GOOD) as server:
        metadata = agent.Metadata(server.host)
        _, etag = metadata.attributes()
        wake = threading.Event()
        watcher = agent.Watcher(metadata, etag, wake)
        assert not wake.wait(2.5)  # two timed-out polls, same ETag
        server.set_attributes({agent.JOB_KEY: '{"model": "resnet18"}'})
        assert wake.wait(5)
        watcher.stop()
        changed = watcher.take()
        assert changed is not None
        assert changed[agent.JOB_KEY] == '{"model": "resnet18"}'


class _BrokenStream(io.BytesIO):
    def read(self, size: int | None = -1) -> bytes:
        if self.tell() > 0:
            raise ConnectionResetError("peer went away")
        return super().read(4)


def test_a_transfer_broken_midway_is_retried_not_fatal() -> None:
    with pytest.raises(agent.TransientError, match="transfer interrupted: peer went away"):
        agent.read_body(_BrokenStream(b"0123456789"))
    body, sha = agent.read_body(io.BytesIO(b"0123456789"))
    assert body == b"0123456789"
    assert sha == "84d89877f0d4041efb6bf91a16f0248f2fd573e6af05c19f96bedb9f882f7882"
