"""The job's output: each line in one write(2), and output that outlives its reader.

Standard library only (`__main__` prints its first line before TensorFlow loads).

One write per line. The node agent reads the job's stdout and stderr from one pipe
(stderr=STDOUT), where TensorFlow's own log lines arrive too. `print` writes the text
and the newline in two calls, and under PYTHONUNBUFFERED (which the agent sets) each
is its own write(2): a log line written between them corrupts the contract line. So
every line goes through `say` (stdout) or `tell` (stderr), which encode the whole line
and hand it to os.write at once; a pipe write of at most PIPE_BUF (4,096) bytes is
atomic (pipe(7), "PIPE_BUF"), and every contract line is far shorter.

Outliving the reader (docs/design.md, "The job outlives its agent"). When the agent
dies (a crash, an OOM kill, a bad update) the pipe has no reader: a write fails with
EPIPE (Python ignores SIGPIPE at start-up, so it is BrokenPipeError, not a signal;
docs.python.org/3/library/signal.html, "SIGPIPE is ignored"). The job then moves fds 1
and 2 onto its own log, `$TPU_STACK_JOB_LOG` (the agent names a file in its run/
folder), appending, says `tpu_training output_orphaned log=<path>` there and trains on.
`follow_reader` does the same as soon as the reader goes (poll(2) reports POLLERR on a
pipe's write end that has no reader: Linux fs/pipe.c, `pipe_poll`), so TensorFlow's
own stderr lines land in the log as well instead of failing unseen.
"""

from __future__ import annotations

import os
import select
import stat
import sys
import threading
from typing import TextIO

PREFIX = "tpu_training"
LOG_ENV = "TPU_STACK_JOB_LOG"

_lock = threading.Lock()
_orphaned_to: str | None = None  # the log fds 1 and 2 were moved to, once


def say(text: str, out: TextIO | None = None) -> None:
    """Write the contract line `tpu_training <text>` to `out` (stdout) in one write."""
    _write_line(out or sys.stdout, f"{PREFIX} {text}\n")


def tell(message: str) -> None:
    """Write `tpu_training: <message>` to stderr in one write (errors and notes)."""
    _write_line(sys.stderr, f"{PREFIX}: {message}\n")


def default_log_path(pid: int | None = None) -> str:
    """Where orphaned output goes when the agent named no file."""
    return f"/tmp/tpu_training-{pid or os.getpid()}.log"


def orphan() -> str:
    """Move fds 1 and 2 onto the job's own log (once) and say so there; its path."""
    global _orphaned_to
    with _lock:
        if _orphaned_to is None:
            path, fd = _open_log()
            # Said before fds 1 and 2 move: a thread writing a line without the lock
            # (every `say`) writes to the log from the moment they do, after this line.
            _write_all(fd, f"{PREFIX} output_orphaned log={path}\n".encode())
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            if fd > 2:
                os.close(fd)
            _orphaned_to = path
        return _orphaned_to


def follow_reader() -> None:
    """Orphan the output as soon as a pipe on fd 1 or 2 loses its reader (a daemon
    thread blocked in poll(2); nothing for a file or a terminal)."""
    pipes = [fd for fd in (1, 2) if _is_pipe(fd)]
    if pipes:
        threading.Thread(target=_wait_for_no_reader, args=(pipes,), name="output-reader",
                         daemon=True).start()


def _wait_for_no_reader(fds: list[int]) -> None:
    poller = select.poll()
    for fd in fds:
        poller.register(fd, 0)  # no events asked: POLLERR and POLLHUP always come
    if any(mask & select.POLLERR for _, mask in poller.poll()):
        orphan()  # else a descriptor closed under it (POLLNVAL): nothing to follow


def _write_line(stream: TextIO, line: str) -> None:
    fd = _fileno(stream)
    if fd is None:  # not a file (a test's StringIO): the stream's own write
        stream.write(line)
        stream.flush()
        return
    data = line.encode(getattr(stream, "encoding", None) or "utf-8", "backslashreplace")
    try:
        stream.flush()  # anything the stream still holds goes first, in order
        _write_all(fd, data)
    except BrokenPipeError:
        if fd not in (1, 2):
            raise
        orphan()
        _write_all(fd, data)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _open_log() -> tuple[str, int]:
    """The agent's log file, else the default one, else /dev/null (training goes on)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    for path in (os.environ.get(LOG_ENV), default_log_path()):
        if path:
            try:
                return path, os.open(path, flags, 0o644)
            except OSError:
                continue
    return os.devnull, os.open(os.devnull, os.O_WRONLY)


def _fileno(stream: TextIO) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _is_pipe(fd: int) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False
