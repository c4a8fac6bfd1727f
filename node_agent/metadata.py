"""The GCE metadata server: attributes, long-polls, the token, guest attributes."""

from __future__ import annotations

import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import TypeVar

from node_agent.common import (
    RETRY_ATTEMPTS,
    AgentError,
    TransientError,
    decode_text,
    open_url,
    parse_json,
    read_body,
    retrying,
)
from node_agent.contract import GUEST_NAMESPACE, NODE_KEY, TPU_ENV_KEY, WORKER_NUMBER_KEY

DEFAULT_METADATA_HOST = "metadata.google.internal"
WATCH_TIMEOUT_SECONDS = 60
T = TypeVar("T")


class Metadata:
    """The GCE metadata server (cloud.google.com/compute/docs/metadata/querying-metadata).

    It answers 503 for moments during maintenance events, hence retries everywhere.
    """

    def __init__(self, host: str):
        self.base = f"http://{host}/computeMetadata/v1/"
        self._token: tuple[str, float] | None = None

    def get(self, path: str, query: Mapping[str, str] | None = None,
            timeout: float = 10.0, attempts: int = RETRY_ATTEMPTS) -> tuple[str | None, str]:
        """(value or None when absent, ETag)."""
        return self.get_parsed(path, lambda text: text, query, timeout, attempts)

    def get_parsed(self, path: str, parse: Callable[[str], T],
                   query: Mapping[str, str] | None = None, timeout: float = 10.0,
                   attempts: int = RETRY_ATTEMPTS) -> tuple[T | None, str]:
        """(parse(value) or None when absent, ETag). The parse runs inside the retried
        call: an answer that does not parse is transient (common's fault model)."""
        url = self.base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        request = urllib.request.Request(url, headers={"Metadata-Flavor": "Google"})

        def fetch() -> tuple[T | None, str]:
            try:
                with open_url(request, timeout) as response:
                    text = decode_text(read_body(response)[0], f"metadata {path}")
                    return parse(text), response.headers.get("ETag", "")
            except urllib.error.HTTPError as error:
                if error.code == 404:
                    return None, ""
                raise AgentError(f"metadata {path}: HTTP {error.code}") from None

        return retrying(fetch, f"metadata {path}", attempts)

    def attributes(self) -> dict[str, str]:
        """Every instance attribute, in one request."""
        value, _ = self.get_parsed("instance/attributes/",
                                   lambda text: parse_json(text, "instance attributes"),
                                   {"recursive": "true"})
        return {str(k): str(v) for k, v in (value or {}).items()}  # type: ignore[union-attr]

    def watch(self, path: str, last_etag: str | None,
              query: Mapping[str, str] | None = None) -> tuple[str | None, str]:
        """`path` now (no `last_etag`), or once its ETag differs from `last_etag`; a
        long-poll that times out answers the same value and ETag. One attempt: the
        watcher backs off itself (watchers.LongPoll)."""
        query = dict(query or {})
        timeout = 10.0
        if last_etag is not None:
            query |= {"wait_for_change": "true", "last_etag": last_etag,
                      "timeout_sec": str(WATCH_TIMEOUT_SECONDS)}
            timeout += WATCH_TIMEOUT_SECONDS
        return self.get(path, query, timeout, attempts=1)

    def token(self) -> str:
        if self._token is None or self._token[1] < time.monotonic():
            answer, _ = self.get_parsed("instance/service-accounts/default/token", _token)
            if answer is None:
                raise AgentError("the metadata server has no token for the node's "
                                 "service account (is one attached to the TPU node?)")
            self._token = (answer[0], time.monotonic() + answer[1] - 60)
        return self._token[0]

    def put_guest_attribute(self, key: str, value: str) -> None:
        url = f"{self.base}instance/guest-attributes/{GUEST_NAMESPACE}/{key}"
        request = urllib.request.Request(url, data=value.encode(), method="PUT",
                                         headers={"Metadata-Flavor": "Google"})
        with open_url(request, timeout=5) as response:
            read_body(response)


def _token(text: str) -> tuple[str, float]:
    """(access token, seconds it lasts) of the token endpoint's JSON answer."""
    answer = parse_json(text, "metadata token")
    token = answer.get("access_token")  # type: ignore[union-attr]
    if not isinstance(token, str) or not token:
        raise TransientError("metadata token: the answer has no access_token")
    try:
        lasts = float(answer.get("expires_in", 300))  # type: ignore[union-attr]
    except (TypeError, ValueError):
        lasts = 300.0
    return token, lasts


def parse_tpu_env(text: str) -> dict[str, str]:
    """The `tpu-env` attribute: lines of `KEY: 'value'` (MaxText multihost_job.py)."""
    pairs = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            pairs[key.strip()] = value.strip().strip("'\"")
    return pairs


def worker_number(attributes: Mapping[str, str]) -> int:
    value = attributes.get(WORKER_NUMBER_KEY)
    if value is None:
        value = parse_tpu_env(attributes.get(TPU_ENV_KEY, "")).get("WORKER_ID", "0")
    try:
        return int(value)
    except ValueError:
        raise AgentError(f"{WORKER_NUMBER_KEY}: {value!r} is not a worker number") from None


def node_id(attributes: Mapping[str, str], metadata: Metadata) -> str:
    """The TPU node's own id: `tpu-stack-node` (set by the TpuNode component), else
    tpu-env's NODE_ID, else the VM's name (on a pod, a worker's name, not the node's)."""
    return (attributes.get(NODE_KEY, "").strip()
            or parse_tpu_env(attributes.get(TPU_ENV_KEY, "")).get("NODE_ID")
            or metadata.get("instance/name")[0] or "")
