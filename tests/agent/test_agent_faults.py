"""The agent's fault model and its supervised loops, unit by unit (issue 27)."""

from __future__ import annotations

import http.client
import io
import itertools
import json
import ssl
import threading
import time
from email.message import Message
from pathlib import Path

import pytest

from node_agent import common, handover, install, metadata, status, storage, supervise, watchers
from ops.local.metadata_server import MetadataServer
from tests.agent.conftest import BUCKET
from tests.fakes.fault_proxy import Chaos, FaultProxy

GOOD = {"tpu-stack-release": f"gs://{BUCKET}/releases/x/", "tpu-stack-workers": "all"}


class _Answer(io.BytesIO):
    """A response body with headers, as urlopen gives one."""

    def __init__(self, data: bytes, length: int | None = None,
                 error: BaseException | None = None):
        super().__init__(data)
        self.headers = Message()
        if length is not None:
            self.headers["Content-Length"] = str(length)
        self.error = error

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        if not chunk and self.error is not None:
            raise self.error
        return chunk


@pytest.mark.parametrize("broken", [
    _Answer(b"0123", error=ssl.SSLEOFError(8, "EOF occurred in violation of protocol")),
    _Answer(b"0123", error=http.client.IncompleteRead(b"0123", 6)),
    _Answer(b"0123", error=TimeoutError("timed out")),
    _Answer(b"0123", length=10),  # http.client returns short data on an early EOF
], ids=["ssl-eof", "incomplete-read", "timeout", "short-content-length"])
def test_a_body_cut_short_in_any_way_is_transient(broken: _Answer) -> None:
    with pytest.raises(common.TransientError):
        common.read_body(broken)


def test_a_whole_body_passes_with_its_sha256() -> None:
    body, sha = common.read_body(_Answer(b"0123456789", length=10))
    assert body == b"0123456789"
    assert sha == "84d89877f0d4041efb6bf91a16f0248f2fd573e6af05c19f96bedb9f882f7882"


@pytest.mark.parametrize("text", ['{"a": ', "[1, 2]", b"\xff\xfe"], ids=["cut", "list", "bytes"])
def test_an_answer_that_does_not_parse_is_transient(text: str | bytes) -> None:
    with pytest.raises(common.TransientError, match="instance attributes"):
        common.parse_json(text, "instance attributes")


@pytest.mark.parametrize(("code", "transient"), [(408, True), (429, True), (500, True),
                                                   (503, True), (403, False), (404, False)])
def test_statuses_follow_the_gcs_retry_strategy(code: int, transient: bool) -> None:
    assert common.transient_status(code) is transient


def test_a_4xx_is_final_only_with_its_whole_body() -> None:
    with MetadataServer(GOOD) as server:
        client = metadata.Metadata(server.host)
        assert client.get("instance/absent") == (None, "")  # 404 with a body: final
        with FaultProxy(server.host, chaos=Chaos(seed=1, rate=1.0, kinds=("cut",))) as proxy:
            cut = metadata.Metadata(proxy.address)
            with pytest.raises(common.TransientError, match="404 with a broken body"):
                cut.get("instance/absent", attempts=1)


def test_metadata_answers_broken_every_way_are_retried_until_whole(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common.time, "sleep", lambda _: None)
    with MetadataServer(GOOD) as server, \
            FaultProxy(server.host, chaos=Chaos(seed=5, rate=0.5)) as proxy:
        client = metadata.Metadata(proxy.address)
        for _ in range(20):
            assert client.attributes() == GOOD
            client._token = None
            assert client.token() == "fake-metadata-token"
    assert sum(proxy.chaos_sent.values()) >= 10


def test_tf_glob_semantics_star_never_crosses_a_slash() -> None:
    # tf.io.gfile.glob on gs:// is fnmatch with FNM_PATHNAME (gcs_file_system.cc).
    matches = storage.gs_glob("d/*.tfrecord")
    assert matches("d/x.tfrecord")
    assert not matches("d/sub/x.tfrecord")  # Python's fnmatch would say yes
    assert storage.gs_glob("d/*/x-?.tfrecord")("d/a/x-1.tfrecord")
    assert not storage.gs_glob("d/*/x-?.tfrecord")("d/a/b/x-1.tfrecord")
    assert not storage.gs_glob("d/[!a]x")("d//x")
    assert storage.gs_glob(r"d/\*")("d/*") and not storage.gs_glob(r"d/\*")("d/x")
    # A folder implied by an object name is a path TF's glob returns too.
    assert storage.object_paths("d/sub/x.tfrecord", "d/") == ["d/sub/x.tfrecord", "d/sub"]


class _Listing:
    """Storage.list of one object name."""

    def __init__(self, names: list[str]):
        self.names = names

    def list(self, bucket: str, prefix: str, setting: str, fields: str) -> list[dict]:
        return [{"name": name} for name in self.names if name.startswith(prefix)]


def test_data_only_in_a_subfolder_does_not_match_one_level() -> None:
    listing = _Listing(["d/sub/x.tfrecord"])
    check = storage.Storage.any_match
    assert not check(listing, f"gs://{BUCKET}/d/*.tfrecord", "trainData")  # type: ignore[arg-type]
    assert check(listing, f"gs://{BUCKET}/d/*/*.tfrecord", "trainData")  # type: ignore[arg-type]


@pytest.mark.parametrize("answer", [
    '{"windowStartTime": "2024-12-01T19:00:01Z", "windowEndTime": "2024-12-01T21:00:01Z", '
    '"type": "SCHEDULED", "maintenanceStatus": "PENDING"}',
    '{"window_start_time": "2024-12-01T19:00:01Z", "window_end_time": "2024-12-01T21:00:01Z", '
    '"type": "SCHEDULED", "maintenance_status": "PENDING"}'], ids=["camelCase", "snake_case"])
def test_maintenance_is_read_in_both_casings(answer: str) -> None:
    assert watchers.parse_maintenance(answer) == {
        "start": "2024-12-01T19:00:01Z", "end": "2024-12-01T21:00:01Z", "type": "SCHEDULED",
        "status": "PENDING"}


class _Clock:
    """A monotonic clock that moves only when a wait asks it to, and a stop event that is
    never set whose wait moves it instead of sleeping: LongPoll's timing, told apart from
    the machine's speed (a sleep of the test and a count of calls was, under load)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.waits: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        self.now += timeout or 0.0
        return False

    def is_set(self) -> bool:
        return False


class _Ignores:
    """A metadata server whose key ignores wait_for_change: it answers at once."""

    def __init__(self, clock: _Clock) -> None:
        self.clock, self.starts = clock, []

    def watch(self, path: str, etag: str | None, params: object = None) -> tuple[str, str]:
        self.starts.append(self.clock.now)
        return "FALSE", "same-etag"


def test_a_key_that_ignores_wait_for_change_is_polled_at_most_once_a_second(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(watchers, "time", clock)
    server = _Ignores(clock)
    poll = watchers.LongPoll(server, "instance/preempted", clock,  # type: ignore[arg-type]
                             lambda _value: None)
    for _ in range(10):
        assert poll.step()
    assert len(server.starts) == 10  # without the floor: as many as the CPU allows
    assert [b - a for a, b in itertools.pairwise(server.starts)] == \
        [watchers.LONG_POLL_FLOOR_SECONDS] * 9


class _Failing:
    def __init__(self) -> None:
        self.calls = 0

    def watch(self, path: str, etag: str | None, params: object = None) -> tuple[str, str]:
        self.calls += 1
        raise common.TransientError("HTTP 503")


def test_a_503_on_upcoming_maintenance_backs_off_without_a_storm(
        monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(watchers, "time", clock)
    server = _Failing()
    poll = watchers.LongPoll(server, watchers.UPCOMING_MAINTENANCE_PATH, clock,  # type: ignore[arg-type]
                             lambda _value: None,
                             retry_cap=watchers.MAINTENANCE_RETRY_CAP_SECONDS)
    delays = [poll.backoff.next_delay() for _ in range(12)]
    assert delays[-1] >= watchers.MAINTENANCE_RETRY_CAP_SECONDS / 2  # minutes apart
    clock.waits.clear()
    assert poll.step()
    assert server.calls == 1  # one request, then a wait of many minutes
    assert clock.waits[-1] >= watchers.MAINTENANCE_RETRY_CAP_SECONDS / 2


def test_a_loop_that_raises_runs_again_and_a_dead_thread_is_restarted() -> None:
    loops, stopped, calls = supervise.Loops(), threading.Event(), []

    def body() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("a bad answer")
        time.sleep(0.05)

    loop = loops.start("flaky", body, stopped)
    deadline = time.monotonic() + 60  # waits only as long as the loop needs
    while len(calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(calls) >= 3 and loops.health()["threadFaults"] == 1
    stopped_thread = threading.Event()
    loop.thread = threading.Thread(target=stopped_thread.set)  # stands in for a dead thread
    loop.thread.start()
    loop.thread.join()
    assert loops.check() == ["flaky"]
    assert loops.health()["threadRestarts"] == 1 and loop.thread.is_alive()
    stopped.set()
    loops.stop()


class _Broken:
    def put_guest_attribute(self, key: str, value: str) -> None:
        raise common.TransientError("HTTP 503")

    def read(self, *args: object, **kwargs: object) -> None:
        raise ValueError("not JSON")

    def upload(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("anything at all")


def test_publishing_a_status_never_raises(tmp_path: Path) -> None:
    published = status.Status(metadata=_Broken(), storage=_Broken(),  # type: ignore[arg-type]
                              root=tmp_path, worker=0)
    published.prefix = f"gs://{BUCKET}/status/never-raises/"
    try:
        published.set(state="running", message="go on")
        published.progress(step=3)
        published.flush()
    finally:
        published.close()
    assert json.loads((tmp_path / "status" / "worker-0" / "status.json").read_text())[
        "state"] == "running"


def test_a_reader_of_the_local_status_never_sees_half_a_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The caller's thread and the publisher's both write status.json; a reader (the agent
    # after a restart, a test) reading between a truncate and its write read "" and failed.
    monkeypatch.setattr(status, "STEP_PUBLISH_SECONDS", 0.0)
    published = status.Status(metadata=_Broken(), storage=_Broken(),  # type: ignore[arg-type]
                              root=tmp_path, worker=0)
    path = tmp_path / "status" / "worker-0" / "status.json"
    done = threading.Event()

    def write() -> None:
        for step in range(3000):
            published.progress(step=step)
        done.set()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        reads = 0
        while not done.is_set():
            if path.exists():
                assert "step" in json.loads(path.read_text())
                reads += 1
    finally:
        writer.join()
        published.close()
    assert reads > 0 and json.loads(path.read_text())["step"] == "2999"


class _Downloads:
    """A package download answering these sha256s in turn."""

    def __init__(self, shas: list[str]):
        self.shas = shas

    def download(self, uri: str, destination: Path, setting: str) -> str:
        return self.shas.pop(0)


def test_a_cut_download_is_fetched_again_and_the_same_wrong_sha_twice_refused(
        tmp_path: Path) -> None:
    good = "a" * 64
    installer = install.Installer(tmp_path, _Downloads(["b" * 64, good]))  # type: ignore[arg-type]
    installer._download("gs://b/p.tar.gz", good, tmp_path / "p")  # the second one is whole
    refused = install.Installer(tmp_path, _Downloads(["c" * 64, "c" * 64]))  # type: ignore[arg-type]
    with pytest.raises(common.AgentError, match="refusing to run it"):
        refused._download("gs://b/p.tar.gz", good, tmp_path / "p")
    broken = install.Installer(tmp_path, _Downloads(["d" * 64, "e" * 64, "f" * 64]))  # type: ignore[arg-type]
    with pytest.raises(common.TransientError, match="3 different sha256s"):
        broken._download("gs://b/p.tar.gz", good, tmp_path / "p")


def test_only_the_running_and_the_previous_package_are_kept(tmp_path: Path) -> None:
    installer = install.Installer(tmp_path, None)
    for name in ("old", "previous", "running", ".partial-one"):
        (tmp_path / "packages" / name).mkdir(parents=True)
    assert installer.prune({"previous", "running"}) == ["old"]
    assert sorted(p.name for p in (tmp_path / "packages").iterdir()) == [
        ".partial-one", "previous", "running"]


def test_the_agent_in_a_startup_script_is_found_and_checked() -> None:
    from node_agent import build

    script = build.startup_script()
    assert handover.zipapp_in_script(script) == build.zipapp()
    assert handover.zipapp_in_script("#!/bin/bash\necho no agent\n") is None
    lines = script.splitlines()
    end = lines.index(handover.HEREDOC)
    cut = "\n".join(lines[:end - 3] + lines[end:])  # the zip's end (its directory) lost
    assert handover.zipapp_in_script(cut) is None


# How long a stalled upload hangs unless the test releases it: recording that waited on
# it would take this long, six times the bound the test allows it.
STALL_SECONDS = 60.0


class _StalledStorage:
    """Uploads that hang until released (a GCS that stopped answering), counted."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.uploads: list[tuple[str, float]] = []

    def upload(self, uri: str, data: bytes, content_type: str, setting: str,
               metadata: object = None) -> None:
        self.uploads.append((uri, time.monotonic()))
        self.release.wait(STALL_SECONDS)


class _Attributes:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def put_guest_attribute(self, key: str, value: str) -> None:
        self.values[key] = value


def test_a_stalled_upload_never_holds_the_job_or_the_guest_attributes(tmp_path: Path) -> None:
    storage, attributes = _StalledStorage(), _Attributes()
    published = status.Status(metadata=attributes, storage=storage,  # type: ignore[arg-type]
                              root=tmp_path, worker=0)
    published.prefix = f"gs://{BUCKET}/status/stalled/"
    try:
        published.set(state="running")
        deadline = time.monotonic() + 30
        while not storage.uploads and time.monotonic() < deadline:
            time.sleep(0.01)
        assert storage.uploads  # the upload now hangs
        began = time.monotonic()
        for step in range(50):  # the job's reader and the main thread only record
            published.progress(step=step)
            published.note(f"line {step}")
        published.set(state="preempted", message="stopped")
        assert time.monotonic() - began < STALL_SECONDS / 6  # not behind the upload
        assert not storage.release.is_set() and len(storage.uploads) == 1  # still hanging
        deadline = time.monotonic() + 30
        while attributes.values.get("state") != "preempted" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert attributes.values["state"] == "preempted"  # not behind the stalled upload
        assert attributes.values["step"] == "49"
        assert not published.flush(timeout=0.5)  # bounded: the upload still hangs
    finally:
        storage.release.set()
        published.close(timeout=5)
    # Coalesced, and never two writes of one object within a second.
    times: dict[str, list[float]] = {}
    for uri, at in storage.uploads:
        times.setdefault(uri, []).append(at)
    assert len(storage.uploads) <= 6, storage.uploads
    for uri, each in times.items():
        assert all(b - a >= status.OBJECT_WRITE_SECONDS - 0.05
                   for a, b in itertools.pairwise(each)), (uri, each)


def test_a_stuck_loop_stops_the_keep_alive_to_systemd_and_shows_in_the_health(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    address = tmp_path / "notify"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(address))
    listener.settimeout(0.2)
    monkeypatch.setenv("NOTIFY_SOCKET", str(address))
    monkeypatch.setenv("WATCHDOG_USEC", "60000000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.setattr(supervise, "WATCHDOG_SECONDS", 0.2)

    def pings(seconds: float, enough: int | None = None) -> int:
        """Keep-alives received within `seconds` (or as soon as `enough` came)."""
        count, deadline = 0, time.monotonic() + seconds
        while time.monotonic() < deadline and (enough is None or count < enough):
            try:
                count += listener.recv(64) == b"WATCHDOG=1"
            except TimeoutError:
                continue
        return count

    loops, stopped, release = supervise.Loops(), threading.Event(), threading.Event()
    try:
        loops.beat()
        assert pings(30, enough=2) == 2  # every loop within its bound: systemd is fed
        stuck = loops.start("stuck", lambda: release.wait(60) and False, stopped, bound=0.3)
        deadline = time.monotonic() + 30  # past its 0.3 s bound, however slow the machine
        while loops.health().get("stuck") != ["stuck"] and time.monotonic() < deadline:
            loops.beat()  # the main thread waits here, alive
            time.sleep(0.05)
        assert loops.health().get("stuck") == ["stuck"]
        pings(1.0)  # those already on their way (the watchdog ticks every 0.2 s)
        assert pings(1.0) == 0  # no keep-alive: systemd restarts the agent (WatchdogSec=)
        release.set()
        assert stuck.done.wait(5)
        loops.main_beat = time.monotonic() - supervise.MAIN_BOUND_SECONDS - 1
        assert loops.stuck() == ["main"]  # a main thread that stopped beating, too
    finally:
        release.set()
        stopped.set()
        loops.stop()
        listener.close()
