"""How tpuctl talks to people: one error line on stderr, text printed as it is, no wrapping
off a terminal, and paths as the caller typed them."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console

PROG = "tpuctl"
# The tpuctl wrapper runs in the repo root; it passes the directory it was called from here.
CALLER_DIR_ENV = "TPUCTL_CALLER_DIR"
# Wide enough that rich never wraps a table row or a path when the output is a file or a pipe.
UNWRAPPED_WIDTH = 10_000


def print_error(message: object) -> None:
    """`tpuctl: error: <message>` on stderr, verbatim (no markup: YAML errors carry [ ])."""
    sys.stderr.write(f"{PROG}: error: {message}\n")
    sys.stderr.flush()


def fail(message: object, code: int = 2) -> NoReturn:
    """End the command with its one error line and exit `code`."""
    print_error(message)
    raise typer.Exit(code)


def console(*, stderr: bool = False) -> Console:
    """A rich console that wraps only on a terminal (rich otherwise wraps at 80 columns)."""
    tty = (sys.stderr if stderr else sys.stdout).isatty()
    return Console(stderr=stderr, soft_wrap=not tty, width=None if tty else UNWRAPPED_WIDTH,
                   highlight=False)


def from_caller(path: Path | None) -> Path | None:
    """A path option relative to the directory tpuctl was called from, not the repo root."""
    if path is None or path.is_absolute():
        return path
    return Path(os.environ.get(CALLER_DIR_ENV) or Path.cwd()) / path
