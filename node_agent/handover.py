"""The agent replacing itself with a newer agent without losing the job."""

# A new agent.pyz arrives two ways: the startup script writes it at boot (after systemd
# may already have started the old one from the disk), or the node's `startup-script`
# metadata changes while the agent runs (a metadata change does not rerun the script;
# the agent long-polls the attribute, `AGENT_CODE_PATH`). Either way the running
# agent execs the new file in place (execve(2)), after writing what the new agent needs
# to adopt the job: its pid, the read end of its output pipe (made inheritable) and
# what the agent had read so far.
#
# Why exec, not a restart of the unit: the agent is the unit's main process, and under
# `KillMode=mixed` stopping it SIGKILLs the rest of the cgroup, the job too
# (systemd.kill(5), KillMode=); a restart would cost the job a stop and a restore. An
# exec keeps the pid, so systemd's MAINPID and the cgroup stay the same, the job stays
# this process's child (waitpid works) and its pipe stays open (execve(2): the pid is
# kept, file descriptors without close-on-exec stay open). The unit's `ExecReload=`
# sends SIGHUP (systemd.service(5), ExecReload=, whose documented example is
# `kill -HUP $MAINPID`), which asks for the exec; the bootstrap reloads the unit when
# it wrote a different agent.pyz.
#
# A hand-over is a transaction (issue 39):
#
# 1. Proven first: the new file runs as a child, `agent.pyz check <state>`, which imports
#    every module and reads the hand-over state the old agent is about to leave (a field
#    it does not know is refused); only a child that prints `ready <version>` within
#    CHECK_SECONDS is exec'd. One that fails is refused: the old agent restores its own
#    bytes to the file, records the version in `run/agent-refused` (never tried again, so
#    no loop on the same file) and keeps the job.
# 2. The stop is never lost: every thread but the main one blocks the stop signals for
#    its whole life (`block_in_this_thread`, called by every supervised loop), so a
#    signal is handled by the main thread or stays pending. The main thread blocks them
#    before its last look at the stop flag; the mask and any signal pending survive
#    execve (signal(7), "Signal mask and pending signals"), and a stop the old agent had
#    already taken in is written into the state (`stopPending`). The new agent builds
#    itself even with a stop pending (a stop must end in the job's save, not in an agent
#    exiting before it adopted the job) and then stops the job as on any SIGTERM.
# 3. The previous agent is kept (`agent.previous.pyz` beside the file): a new agent that
#    still fails at start (an import error, an AgentError, a state it cannot read) execs
#    the previous one with the state as it was, the job untouched, and records its own
#    version as refused.

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import os
import signal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

from node_agent.common import log, write_atomically

AGENT_CODE_PATH = "instance/attributes/startup-script"
HEREDOC = "TPU_STACK_AGENT_ZIPAPP"  # the bootstrap's heredoc around the zipapp's base64
HANDOVER_FILE = Path("run") / "handover.json"
HANDOVER_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
# Present while an agent that can take a hand-over runs: the bootstrap reloads such
# an agent (SIGHUP) and restarts an older one (it stops the job with a checkpoint).
CAPABLE_MARKER = Path("run") / "agent-handover"
REFUSED_FILE = Path("run") / "agent-refused"  # versions that failed their check or start
PREVIOUS_NAME = "agent.previous.pyz"
CHECK_SECONDS = 60.0  # the new agent's check: an import and a JSON read take a second
READY = "ready"
# Every field of run/handover.json; a new agent refuses a state with any other (it
# would not know what the old agent meant by it).
FIELDS = frozenset({"from", "worker", "agentPid", "job", "release", "workers", "goodput",
                    "goodputJob", "launchedAgo", "stopSent", "windows", "stopPending"})


def version_of(data: bytes) -> str:
    """An agent's version: the first 12 hex of its zipapp's sha256 (the zipapp is the
    same bytes for the same sources, node_agent/build.py)."""
    return hashlib.sha256(data).hexdigest()[:12]


def running_file() -> Path | None:
    """The zipapp this agent runs from (`python3 agent.pyz ...`), else None."""
    path = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    return path if path is not None and path.suffix == ".pyz" and path.is_file() else None


def file_version(path: Path | None) -> str:
    try:
        return version_of(path.read_bytes()) if path else "source"
    except OSError:
        return "unknown"


def zipapp_in_script(script: str) -> bytes | None:
    """The agent zipapp a startup script carries (between the heredoc lines), or None
    when it carries none or it is not a zip with the agent's entry point."""
    import zipfile  # here, not at the top: only an agent update needs it

    lines = script.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.rstrip().endswith(f"<<'{HEREDOC}'"))
        end = lines.index(HEREDOC, start + 1)
        data = base64.b64decode("".join(lines[start + 1:end]), validate=True)
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = set(archive.namelist())
    except (StopIteration, ValueError, binascii.Error, zipfile.BadZipFile):
        return None
    return data if {"__main__.py", "node_agent/agent.py"} <= names else None


def previous_file(path: Path) -> Path:
    return path.with_name(PREVIOUS_NAME)


def install_agent(path: Path, data: bytes, running: bytes) -> None:
    """Write a new agent over `path`, keeping the running one's bytes as the previous."""
    write_atomically(previous_file(path), running)  # a crash never leaves half an agent
    write_atomically(path, data)


def refused(root: Path) -> set[str]:
    try:
        return set((root / REFUSED_FILE).read_text().split())
    except OSError:
        return set()


def refuse(root: Path, version: str) -> None:
    """Never hand over to `version` again (it failed its check or its start)."""
    try:
        (root / REFUSED_FILE).parent.mkdir(parents=True, exist_ok=True)
        with (root / REFUSED_FILE).open("a") as out:
            out.write(f"{version}\n")
    except OSError as error:
        log(f"{REFUSED_FILE}: {error}")


def state_json(state: Mapping[str, object]) -> str:
    return json.dumps(dict(state) | {"agentPid": os.getpid()})


def save(root: Path, state: Mapping[str, object]) -> None:
    """Write the state atomically: a full disk leaves the old file (or none), never half
    of one; the caller goes on reading the job when this raises."""
    path = root / HANDOVER_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, state_json(state).encode())


def unknown_fields(state: Mapping[str, object]) -> list[str]:
    return sorted(set(state) - FIELDS)


def check(path: Path, state: Mapping[str, object], root: Path) -> str | None:
    """Run `path` as `agent.pyz check <state file>` and wait for its `ready` line; None
    when it is ready, else why not (its last output lines)."""
    import subprocess  # here, not at the top: only a hand-over needs it

    probe = root / "run" / "handover.check.json"
    try:
        probe.write_text(state_json(state))
        result = subprocess.run([sys.executable, str(path), "check", str(probe)],
                                capture_output=True, text=True, timeout=CHECK_SECONDS,
                                stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.SubprocessError) as error:
        return f"{type(error).__name__}: {error}"
    finally:
        probe.unlink(missing_ok=True)
    if result.returncode == 0 and f"{READY} {file_version(path)}" in result.stdout:
        return None
    said = (result.stdout + result.stderr).strip().splitlines()[-3:]
    return f"exit code {result.returncode}: {' | '.join(said) or 'no output'}"


def run_check(state_file: str) -> int:
    """`agent.pyz check FILE`: this agent's modules import (the caller imported them)
    and it knows every field of the state in FILE; prints `ready <version>`."""
    try:
        state = json.loads(Path(state_file).read_text())
    except (OSError, ValueError) as error:
        print(f"hand-over state unreadable: {error}", file=sys.stderr)
        return 1
    if not isinstance(state, dict) or (unknown := unknown_fields(state)):
        print(f"hand-over state has fields this agent does not know: {unknown}",
              file=sys.stderr)
        return 1
    print(f"{READY} {file_version(running_file())}", flush=True)
    return 0


def take(root: Path) -> dict[str, object] | None:
    """The hand-over an earlier agent of this same process left (exec keeps the pid),
    removed once read; None otherwise (a file left by a crashed agent is stale)."""
    path = root / HANDOVER_FILE
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    finally:
        path.unlink(missing_ok=True)
    return state if isinstance(state, dict) and state.get("agentPid") == os.getpid() else None


def mark_capable(root: Path) -> None:
    try:
        (root / CAPABLE_MARKER).parent.mkdir(parents=True, exist_ok=True)
        (root / CAPABLE_MARKER).write_text(f"{os.getpid()}\n")
    except OSError as error:
        log(f"{CAPABLE_MARKER}: {error}")


def block_signals() -> None:
    """The stop signals stay pending (this thread); the main thread before its last look
    at the stop flag, and every other thread for its life (`block_in_this_thread`)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, HANDOVER_SIGNALS)


def block_in_this_thread() -> None:
    """A thread other than the main one never takes a stop signal: the kernel gives a
    process-directed signal to a thread that does not block it (signal(7)), and one
    taken by another thread during a hand-over would be lost at the exec."""
    if threading.current_thread() is not threading.main_thread():
        block_signals()


def exec_agent(path: Path) -> None:
    """Become the agent in `path` (same pid), with the stop signals blocked until the
    new agent has its handlers (the caller blocked them); returns only if the exec
    failed, with them unblocked."""
    block_signals()
    try:
        os.execv(sys.executable, [sys.executable, str(path), *sys.argv[1:]])
    except OSError as error:
        unblock_signals()
        log(f"exec of {path} failed: {error}")


def fall_back(root: Path, state: Mapping[str, object], why: str) -> None:
    """This agent failed at start: exec the previous agent with the hand-over state
    as it was (the job untouched), restoring its bytes to this file first, and never
    take this version again. Returns only when there is no previous agent to run."""
    path = running_file()
    previous = previous_file(path) if path is not None else None
    if path is None or previous is None or not previous.is_file() or \
            file_version(previous) in (file_version(path), "unknown"):
        log(f"starting failed ({why}) and no previous agent to fall back to")
        return
    version = file_version(path)
    log(f"agent {version} failed at start ({why}); falling back to agent "
        f"{file_version(previous)}")
    refuse(root, version)
    try:
        write_atomically(path, previous.read_bytes())
        save(root, {k: v for k, v in state.items() if k in FIELDS})
    except OSError as error:
        log(f"falling back: {error}")
        return
    exec_agent(path)


def unblock_signals() -> None:
    """After the handlers are installed: a signal that came during the hand-over now
    reaches them."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDOVER_SIGNALS)
