"""The agent replacing itself with a newer agent without losing the job.

A new agent.pyz arrives two ways: the startup script writes it at boot (after systemd
may already have started the old one from the disk), or the node's `startup-script`
metadata changes while the agent runs (a metadata change does not rerun the script;
the agent long-polls the attribute, `AGENT_CODE_PATH`). Either way the running
agent execs the new file in place (execve(2)), after writing what the new agent needs
to adopt the job: its pid, the read end of its output pipe (made inheritable) and
what the agent had read so far.

Why exec, not a restart of the unit: the agent is the unit's main process, and under
`KillMode=mixed` stopping it SIGKILLs the rest of the cgroup, the job too
(systemd.kill(5), KillMode=); a restart would cost the job a stop and a restore. An
exec keeps the pid, so systemd's MAINPID and the cgroup stay the same, the job stays
this process's child (waitpid works) and its pipe stays open (execve(2): the pid is
kept, file descriptors without close-on-exec stay open). The unit's `ExecReload=`
sends SIGHUP (systemd.service(5), ExecReload=, whose documented example is
`kill -HUP $MAINPID`), which asks for the exec; the bootstrap reloads the unit when
it wrote a different agent.pyz.

Signals: the old agent blocks SIGTERM, SIGINT and SIGHUP before the exec; the mask
and any signal pending survive execve (signal(7), "Signal mask and pending
signals"), and the new agent unblocks them once its handlers are installed, so a
stop arriving during the hand-over reaches the new agent instead of killing it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

from node_agent.common import log

AGENT_CODE_PATH = "instance/attributes/startup-script"
HEREDOC = "TPU_STACK_AGENT_ZIPAPP"  # the bootstrap's heredoc around the zipapp's base64
HANDOVER_FILE = Path("run") / "handover.json"
HANDOVER_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
# Present while an agent that can take a hand-over runs: the bootstrap reloads such
# an agent (SIGHUP) and restarts an older one (it stops the job with a checkpoint).
CAPABLE_MARKER = Path("run") / "agent-handover"


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


def write_agent(path: Path, data: bytes) -> None:
    """Replace `path` with `data` atomically (a crash never leaves half an agent)."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


def save(root: Path, state: Mapping[str, object]) -> None:
    path = root / HANDOVER_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(state) | {"agentPid": os.getpid()}))


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


def exec_agent(path: Path) -> None:
    """Become the agent in `path` (same pid), with the stop signals blocked until the
    new agent has its handlers; returns only if the exec failed."""
    signal.pthread_sigmask(signal.SIG_BLOCK, HANDOVER_SIGNALS)
    try:
        os.execv(sys.executable, [sys.executable, str(path), *sys.argv[1:]])
    except OSError as error:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDOVER_SIGNALS)
        log(f"exec of {path} failed: {error}")


def unblock_signals() -> None:
    """After the handlers are installed: a signal that came during the hand-over now
    reaches them."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDOVER_SIGNALS)
