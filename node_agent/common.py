"""What every part of the agent shares: its errors, retries with backoff, HTTP, its log."""

# The fault model of every remote call the agent makes (the metadata server, the GCS
# JSON and upload APIs) lives here, in one place:
#
# - transient (retried with backoff, for as long as the node lives): any connection,
#   TLS (`ssl.SSLError`, `SSLEOFError` mid-body included: both are OSError) or timeout
#   failure; a body cut short (`http.client.IncompleteRead`, or fewer bytes than its
#   Content-Length: http.client's `read(amt)` returns short data on an early EOF
#   without raising, Lib/http/client.py `HTTPResponse.readinto`); a body that does not
#   decode or parse (`ValueError`, which `JSONDecodeError` and `UnicodeDecodeError`
#   are); HTTP 408, 429 and every 5xx. Cloud Storage's retry strategy names these
#   (cloud.google.com/storage/docs/retry-strategy: "408 Request Timeout, 429 Too Many
#   Requests, 5xx", plus "socket timeouts and TCP disconnects"); the metadata server
#   "may return 503 for a short time" during maintenance and asks clients to retry
#   (cloud.google.com/compute/docs/metadata/querying-metadata, "Handling metadata
#   server errors", as docs/tpu-facts.md quotes).
# - final (no retry: the caller names the problem): any other 4xx whose error body
#   arrived whole (its Content-Length, 0 included, or chunked to its end). A 4xx whose
#   body was cut short, or is empty with nothing saying where it ends, is not a definite
#   answer (a connection broken mid-answer) and counts as transient.

from __future__ import annotations

import datetime
import hashlib
import http.client
import json
import os
import random
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
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
    """A failure worth retrying (see the fault model above)."""


TRANSIENT_STATUSES = frozenset({408, 429})  # and every 5xx


def transient_status(code: int) -> bool:
    return code in TRANSIENT_STATUSES or code >= 500


def log(message: str) -> None:
    print(f"tpu-stack-agent: {message}", file=sys.stderr, flush=True)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data`: a reader or a crash sees the old file or the new one,
    never half of one (callers writing one path from two threads hold a lock)."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, path)


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
    """urlopen, sorting failures by the fault model: TransientError, or an HTTPError
    (to the caller) for a final 4xx, its whole body in `error.body`."""
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as error:
        if transient_status(error.code):
            raise TransientError(f"HTTP {error.code}") from None
        try:
            error.body = read_body(error)[0]  # type: ignore[attr-defined]
        except TransientError as broken:
            raise TransientError(f"HTTP {error.code} with a broken body: {broken}") from None
        finally:
            error.close()
        framed = error.headers.get("Content-Length") is not None or \
            "chunked" in (error.headers.get("Transfer-Encoding") or "").lower()
        if not error.body and not framed:  # type: ignore[attr-defined]
            raise TransientError(f"HTTP {error.code} without a body") from None
        raise
    except (OSError, http.client.HTTPException, ValueError) as error:
        raise TransientError(str(error) or type(error).__name__) from None


def read_body(response: IO[bytes], out: IO[bytes] | None = None,
              deadline: float | None = None) -> tuple[bytes, str]:
    """The body (or its copy into `out`) and its sha256; a broken transfer, fewer
    bytes than the Content-Length announced, or one still arriving at the monotonic
    `deadline` (a socket timeout bounds each read, not a trickle), is transient."""
    digest, chunks, size = hashlib.sha256(), [], 0
    try:
        while chunk := response.read(CHUNK):
            if deadline is not None and time.monotonic() > deadline:
                raise TransientError(f"transfer still running after its deadline "
                                     f"({size} bytes so far)")
            digest.update(chunk)
            size += len(chunk)
            if out is None:
                chunks.append(chunk)
            else:
                out.write(chunk)
    except (OSError, http.client.HTTPException, ValueError) as error:
        raise TransientError(f"transfer interrupted: {error or type(error).__name__}") \
            from None
    headers = getattr(response, "headers", None)
    announced = headers.get("Content-Length") if headers is not None else None
    if announced is not None and announced.strip().isdigit() and int(announced) != size:
        raise TransientError(f"transfer cut short: {size} of {int(announced)} bytes")
    return b"".join(chunks), digest.hexdigest()


def decode_text(body: bytes, what: str) -> str:
    """UTF-8 text of an answer; one that does not decode is a broken answer (transient)."""
    try:
        return body.decode()
    except UnicodeDecodeError as error:
        raise TransientError(f"{what}: the answer is not UTF-8 text: {error}") from None


def parse_json(body: bytes | str, what: str, kind: type = dict) -> object:
    """A JSON answer of type `kind`; one that does not parse, or is of another type,
    is a broken answer (transient: the next attempt may get it whole)."""
    try:
        value = json.loads(body)
    except ValueError as error:
        raise TransientError(f"{what}: the answer is not JSON: {error}") from None
    if not isinstance(value, kind):
        raise TransientError(f"{what}: the answer is not a JSON {kind.__name__}")
    return value
