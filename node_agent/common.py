"""What every part of the agent shares: its errors, retries with backoff, HTTP, its log."""

from __future__ import annotations

import datetime
import hashlib
import http.client
import random
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import IO, TypeVar

RETRY_ATTEMPTS = 6
RETRY_BASE_SECONDS = 0.5
RETRY_CAP_SECONDS = 20.0
BACKOFF_BASE_SECONDS = 2.0  # between job runs after a transient failure ...
BACKOFF_CAP_SECONDS = 300.0  # ... doubling up to this, for as long as the node lives
CHUNK = 1 << 20

T = TypeVar("T")


class AgentError(Exception):
    """A problem the agent cannot get past; its text becomes the status message."""


class TransientError(Exception):
    """A failure worth retrying (connection trouble, HTTP 429 or 5xx)."""


def log(message: str) -> None:
    print(f"tpu-stack-agent: {message}", file=sys.stderr, flush=True)


def utc_now() -> str:
    # timezone.utc, not datetime.UTC: TPU images on Ubuntu 22.04 run Python 3.10.
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def parse_utc(text: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 timestamp (a trailing Z too), or None."""
    try:
        return datetime.datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class Backoff:
    """Delays that double from `base` up to `cap`, with jitter, and never run out:
    a transient failure is retried for as long as the node lives."""

    def __init__(self, base: float = BACKOFF_BASE_SECONDS, cap: float = BACKOFF_CAP_SECONDS):
        self.base = base
        self.cap = cap
        self.attempts = 0

    def next_delay(self) -> float:
        delay = min(self.cap, self.base * 2 ** min(self.attempts, 32))
        self.attempts += 1
        return delay / 2 + random.uniform(0, delay / 2)

    def reset(self) -> None:
        self.attempts = 0


def retrying(action: Callable[[], T], what: str, attempts: int = RETRY_ATTEMPTS) -> T:
    """`action()`, retried on TransientError with exponential backoff and jitter; after
    `attempts` the TransientError goes to the caller, whose own loop may back off further."""
    backoff = Backoff(RETRY_BASE_SECONDS, RETRY_CAP_SECONDS)
    for attempt in range(attempts):
        try:
            return action()
        except TransientError as error:
            if attempt == attempts - 1:
                raise TransientError(f"{what}: gave up after {attempts} attempts: {error}") \
                    from None
            delay = backoff.next_delay()
            log(f"{what}: {error}; retrying in about {delay:.1f}s")
            time.sleep(delay)
    raise AssertionError("unreachable")


def open_url(request: urllib.request.Request, timeout: float) -> http.client.HTTPResponse:
    """urlopen, sorting failures into TransientError or HTTPError (to the caller)."""
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as error:
        if error.code == 429 or error.code >= 500:
            raise TransientError(f"HTTP {error.code}") from None
        raise
    except (OSError, http.client.HTTPException) as error:
        raise TransientError(str(error)) from None


def read_body(response: IO[bytes], out: IO[bytes] | None = None) -> tuple[bytes, str]:
    """The body (or its copy into `out`) and its sha256; a broken transfer is transient."""
    digest, chunks = hashlib.sha256(), []
    try:
        while chunk := response.read(CHUNK):
            digest.update(chunk)
            if out is None:
                chunks.append(chunk)
            else:
                out.write(chunk)
    except (ConnectionError, TimeoutError, http.client.HTTPException) as error:
        raise TransientError(f"transfer interrupted: {error}") from None
    return b"".join(chunks), digest.hexdigest()
