"""Cloud Storage through its JSON API, with the metadata server's token."""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from node_agent.common import AgentError, open_url, parse_json, read_body, retrying
from node_agent.metadata import Metadata

DEFAULT_STORAGE_ENDPOINT = "https://storage.googleapis.com"
# One download attempt may take this long (a package is a few MB to a few hundred):
# every step of a background install is bounded (node_agent/updates.py).
DOWNLOAD_DEADLINE_SECONDS = 900.0


def split_gs_uri(uri: str, setting: str) -> tuple[str, str]:
    """("bucket", "object/name") of a gs:// URI; a bad one is an AgentError naming `setting`."""
    if not uri.startswith("gs://") or "/" not in uri[5:]:
        raise AgentError(f"{setting}: {uri!r} is not a gs://bucket/object URI")
    bucket, name = uri[5:].split("/", 1)
    return bucket, name


def storage_endpoint() -> str:
    host = os.environ.get("STORAGE_EMULATOR_HOST")
    if not host:
        return DEFAULT_STORAGE_ENDPOINT
    return host.rstrip("/") if "://" in host else f"http://{host}"


class Storage:
    """Download, list and upload objects."""

    def __init__(self, metadata: Metadata, endpoint: str):
        self.metadata = metadata
        self.endpoint = endpoint

    def _request(self, url: str, data: bytes | None = None,
                 content_type: str | None = None) -> urllib.request.Request:
        headers = {"Authorization": f"Bearer {self.metadata.token()}"}
        if content_type:
            headers["Content-Type"] = content_type
        return urllib.request.Request(url, data=data, headers=headers,
                                      method="POST" if data is not None else "GET")

    def _media_url(self, uri: str, setting: str) -> str:
        bucket, name = split_gs_uri(uri, setting)
        return (f"{self.endpoint}/storage/v1/b/{bucket}/o/"
                f"{urllib.parse.quote(name, safe='')}?alt=media")

    def download(self, uri: str, destination: Path, setting: str) -> str:
        """Stream `uri` into `destination`; returns the sha256 of what arrived."""
        url = self._media_url(uri, setting)

        def fetch() -> str:
            try:
                with open_url(self._request(url), timeout=60) as response, \
                        destination.open("wb") as out:
                    return read_body(response, out,
                                     time.monotonic() + DOWNLOAD_DEADLINE_SECONDS)[1]
            except urllib.error.HTTPError as error:
                raise AgentError(_download_refusal(uri, setting, error.code)) from None

        return retrying(fetch, f"download {uri}")

    def read(self, uri: str, setting: str, attempts: int = 3) -> bytes | None:
        """The object's bytes, or None when it does not exist."""
        url = self._media_url(uri, setting)

        def fetch() -> bytes | None:
            try:
                with open_url(self._request(url), timeout=30) as response:
                    return read_body(response)[0]
            except urllib.error.HTTPError as error:
                if error.code == 404:
                    return None
                raise AgentError(_download_refusal(uri, setting, error.code)) from None

        return retrying(fetch, f"read {uri}", attempts=attempts)

    def list(self, bucket: str, prefix: str, setting: str, fields: str,
             attempts: int = 3) -> Iterator[dict]:
        """Every object resource under `prefix` (objects.list, page by page)."""
        token = ""
        while True:
            query = {"prefix": prefix, "fields": f"items({fields}),nextPageToken"}
            if token:
                query["pageToken"] = token
            url = f"{self.endpoint}/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}"

            def fetch(url: str = url) -> dict:
                try:
                    with open_url(self._request(url), timeout=30) as response:
                        return parse_json(read_body(response)[0], f"list gs://{bucket}/{prefix}")
                except urllib.error.HTTPError as error:
                    raise AgentError(f"{setting}: listing gs://{bucket}/{prefix} failed with "
                                     f"HTTP {error.code}") from None

            page = retrying(fetch, f"list gs://{bucket}/{prefix}", attempts=attempts)
            items = page.get("items") or []
            yield from (item for item in items if isinstance(item, dict)) \
                if isinstance(items, list) else []
            token = page.get("nextPageToken") or ""
            if not token:
                return

    def any_match(self, pattern: str, setting: str) -> bool:
        """Does `tf.io.gfile.glob(pattern)` find anything? One listing of the prefix
        before the first wildcard, in pages, stopping at the first match (`gs_glob`)."""
        bucket, name_glob = split_gs_uri(pattern, setting)
        prefix = re.split(r"[*?\[\\]", name_glob, maxsplit=1)[0]
        matches = gs_glob(name_glob)
        return any(matches(path) for item in self.list(bucket, prefix, setting, "name")
                   for path in object_paths(str(item.get("name", "")), prefix))

    def upload(self, uri: str, data: bytes, content_type: str, setting: str,
               metadata: Mapping[str, str] | None = None) -> None:
        """A multipart upload: the object gets its content type and custom `metadata`,
        and may be empty (JSON API objects.insert, uploadType=multipart)."""
        bucket, name = split_gs_uri(uri, setting)
        boundary = uuid.uuid4().hex
        resource: dict[str, object] = {"name": name, "contentType": content_type}
        if metadata:
            resource["metadata"] = dict(metadata)
        meta = json.dumps(resource)
        body = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n"
                f"{meta}\r\n--{boundary}\r\nContent-Type: {content_type}\r\n\r\n").encode()
        body += data + f"\r\n--{boundary}--\r\n".encode()
        url = f"{self.endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=multipart"
        request = self._request(url, body, f"multipart/related; boundary={boundary}")

        def send() -> None:
            try:
                with open_url(request, timeout=30) as response:
                    read_body(response)
            except urllib.error.HTTPError as error:
                raise AgentError(f"{setting}: uploading {uri} failed with HTTP {error.code}") \
                    from None

        retrying(send, f"upload {uri}", attempts=3)


def _download_refusal(uri: str, setting: str, code: int) -> str:
    if code == 404:
        return f"{setting}: {uri} does not exist (HTTP 404)"
    if code in (401, 403):
        return (f"{setting}: the node's service account may not read {uri} "
                f"(HTTP {code}); it needs storage.objects.get on the bucket")
    return f"{setting}: downloading {uri} failed with HTTP {code}"


def gs_glob(pattern: str) -> Callable[[str], bool]:
    """Whether an object name matches `pattern` as TensorFlow's GCS file system
    matches it: `*` and `?` never match `/` (nor does a `[...]` class), `\\` escapes.

    GcsFileSystem::GetMatchingPaths lists every object under the pattern's fixed
    prefix and keeps each path (objects and the folders their names imply) for which
    FileSystem::Match holds, which is `fnmatch(pattern, path, FNM_PATHNAME)`
    (tensorflow/tsl/platform/cloud/gcs_file_system.cc, GetMatchingPaths;
    xla/tsl/platform/file_system.cc, FileSystem::Match). Python's fnmatch lets `*`
    cross `/`, so it would find `d/sub/x.tfrecord` for `d/*.tfrecord` where TF does not.
    """
    parts, i = [], 0
    while i < len(pattern):
        char = pattern[i]
        i += 1
        if char == "*":
            parts.append("[^/]*")
        elif char == "?":
            parts.append("[^/]")
        elif char == "\\" and i < len(pattern):
            parts.append(re.escape(pattern[i]))
            i += 1
        elif char == "[" and (end := _class_end(pattern, i)) is not None:
            body = pattern[i:end]
            negate = body[:1] in ("!", "^")
            body = body[1:] if negate else body
            parts.append(f"[{'^' if negate else ''}{_class_text(body)}{'/' if negate else ''}]"
                         if negate else f"(?!/)[{_class_text(body)}]")
            i = end + 1
        else:
            parts.append(re.escape(char))
    compiled = re.compile("".join(parts) + r"\Z", re.DOTALL)
    return lambda name: compiled.match(name) is not None


def _class_end(pattern: str, start: int) -> int | None:
    """The index of the `]` closing a class opened before `start` (a `]` first, or
    after `!`/`^`, is a member), or None when it is not closed (then `[` is literal)."""
    i = start + (1 if pattern[start:start + 1] in ("!", "^") else 0)
    i += 1 if pattern[i:i + 1] == "]" else 0
    end = pattern.find("]", i)
    return None if end < 0 else end


def _class_text(body: str) -> str:
    return "".join("\\" + c if c in "\\^]" else c for c in body)


def object_paths(name: str, prefix: str) -> list[str]:
    """The paths TF's GCS glob considers for one object: its name and every folder its
    name implies below the listed prefix's folder (gcs_file_system.cc, AddAllSubpaths)."""
    paths = [name]
    folder = prefix.rsplit("/", 1)[0] + "/" if "/" in prefix else ""
    rest = name[len(folder):].split("/")[:-1]
    for depth in range(1, len(rest) + 1):
        paths.append(folder + "/".join(rest[:depth]))
    return paths
