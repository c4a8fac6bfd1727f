"""A real gcp-storage-emulator process on loopback, with a tiny JSON-API client.

Reusable: `StorageEmulator()` starts one (in memory, on a free port) and
`.host` is the `STORAGE_EMULATOR_HOST` value for clients under test. The helpers
speak the JSON API with the standard library, minding the emulator's quirks
(docs/tpu-facts.md, "Test tools"): media uploads go as application/octet-stream.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Self

EMULATOR = Path(sys.executable).with_name("gcp-storage-emulator")
START_TIMEOUT_SECONDS = 20.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class StorageEmulator:
    def __init__(self) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [str(EMULATOR), "start", "--host", "127.0.0.1", "--port", str(self.port),
             "--in-memory", "--quiet"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_until_up()

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_until_up(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gcp-storage-emulator exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(self.host + "/", timeout=1) as answer:
                    answer.read()
                return
            except OSError:
                time.sleep(0.1)
        self.close()
        raise RuntimeError(f"gcp-storage-emulator did not answer on {self.host}")

    def _call(self, method: str, path: str, body: bytes | None = None,
              content_type: str = "application/octet-stream") -> bytes:
        request = urllib.request.Request(self.host + path, data=body, method=method,
                                         headers={"Content-Type": content_type})
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.read()

    def create_bucket(self, bucket: str) -> None:
        self._call("POST", "/storage/v1/b?project=test", json.dumps({"name": bucket}).encode(),
                   "application/json")

    def upload(self, uri: str, data: bytes) -> None:
        bucket, name = split(uri)
        query = urllib.parse.urlencode({"uploadType": "media", "name": name})
        self._call("POST", f"/upload/storage/v1/b/{bucket}/o?{query}", data)

    def read(self, uri: str) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        bucket, name = split(uri)
        try:
            return self._call("GET", f"/storage/v1/b/{bucket}/o/"
                                     f"{urllib.parse.quote(name, safe='')}?alt=media")
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise

    def names(self, uri_prefix: str) -> list[str]:
        """gs:// URIs of every object under the prefix."""
        bucket, prefix = split(uri_prefix)
        query = urllib.parse.urlencode({"prefix": prefix})
        listing = json.loads(self._call("GET", f"/storage/v1/b/{bucket}/o?{query}"))
        return sorted(f"gs://{bucket}/{item['name']}" for item in listing.get("items") or [])

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def split(uri: str) -> tuple[str, str]:
    bucket, _, name = uri.removeprefix("gs://").partition("/")
    return bucket, name
