"""The training package archive: deterministic bytes, named by their sha256.

Pure logic, no Pulumi: `package.py` uploads what this builds, the agent tests
and `tpuctl rehearse` build the very same bytes.

Layout of the archive (the agent's contract, docs/design.md):

    pyproject.toml, wheels.lock      from training/
    tpu_training/**.py               the job
    wheels/<wheel files>             pinned in training/wheels.lock (tf-keras per TF minor)

Same sources give the same bytes on any machine: entries sorted, owners,
times and modes normalised, and the gzip stream written here, not by zlib.
Deflate output is not specified bit for bit: zlib-ng (the system zlib on recent
Fedora) compresses the same tar to other bytes than zlib (zlib-ng issue 2216,
docs/tpu-facts.md), which would make every machine's package a new object and
restart every job. The archive is a gzip member of *stored* deflate blocks
(RFC 1951 section 3.2.4, RFC 1952): fixed framing, CRC-32 and length, bytes that
depend on the tar alone. The wheels inside are zip files, compressed already;
any gzip reader (the agent's `tarfile.open(..., "r:gz")`) reads it.
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
import subprocess
import sys
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TRAINING_DIR = REPO_ROOT / "training"
WHEEL_LOCK = TRAINING_DIR / "wheels.lock"
DEFAULT_WHEEL_CACHE = REPO_ROOT / ".cache" / "wheels"
ARCHIVE_PREFIX = "tpu_training-"
ARCHIVE_SUFFIX = ".tar.gz"


class PackageError(RuntimeError):
    """The archive cannot be built (a wheel cannot be fetched or does not verify)."""


@dataclass(frozen=True)
class PinnedWheel:
    requirement: str  # name==version
    sha256: str

    @property
    def filename_prefix(self) -> str:
        name, version = self.requirement.split("==")
        return f"{name.replace('-', '_')}-{version}-"


@dataclass(frozen=True)
class Archive:
    data: bytes
    sha256: str

    @property
    def filename(self) -> str:
        return f"{ARCHIVE_PREFIX}{self.sha256}{ARCHIVE_SUFFIX}"


def read_lock(lock: Path = WHEEL_LOCK) -> list[PinnedWheel]:
    pins = []
    for line in lock.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement, sha256 = line.split()
            pins.append(PinnedWheel(requirement, sha256))
    return pins


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ensure_wheels(pins: list[PinnedWheel], cache: Path) -> list[Path]:
    """The pinned wheels, from `cache` or fetched into it once, each verified."""
    cache.mkdir(parents=True, exist_ok=True)
    paths = []
    for pin in pins:
        path = _cached_wheel(pin, cache) or _download_wheel(pin, cache)
        paths.append(path)
    return paths


def _cached_wheel(pin: PinnedWheel, cache: Path) -> Path | None:
    for path in sorted(cache.glob(pin.filename_prefix + "*.whl")):
        if sha256_of(path.read_bytes()) == pin.sha256:
            return path
    return None


def _download_wheel(pin: PinnedWheel, cache: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--only-binary=:all:", "--dest", str(cache), pin.requirement]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    path = _cached_wheel(pin, cache)
    if path is None:
        raise PackageError(
            f"training/wheels.lock: could not fetch {pin.requirement} with sha256 "
            f"{pin.sha256} into {cache} (pip said: {result.stderr.strip()[-300:]})")
    return path


def _source_files(training_dir: Path) -> list[tuple[str, Path]]:
    files = [("pyproject.toml", training_dir / "pyproject.toml"),
             ("wheels.lock", training_dir / "wheels.lock")]
    package = training_dir / "tpu_training"
    for path in sorted(package.rglob("*.py")):
        if "__pycache__" not in path.parts:
            files.append((path.relative_to(training_dir).as_posix(), path))
    return files


def build_archive(training_dir: Path = TRAINING_DIR, wheel_cache: Path | None = None,
                  lock: Path | None = None) -> Archive:
    """Build the archive of `training_dir` with its pinned wheels."""
    cache = wheel_cache or Path(os.environ.get("TPU_STACK_WHEEL_CACHE", DEFAULT_WHEEL_CACHE))
    wheels = ensure_wheels(read_lock(lock or training_dir / "wheels.lock"), cache)
    entries = _source_files(training_dir) + [(f"wheels/{w.name}", w) for w in wheels]
    return pack(entries)


def sources_digest(training_dir: Path = TRAINING_DIR) -> str:
    """A digest of what the package is built from (the sources, and the lock that pins
    its wheels): the same digest, the same package. Reads no wheel."""
    return _inputs_digest(_source_files(training_dir))


def _inputs_digest(entries: list[tuple[str, Path]]) -> str:
    digest = hashlib.sha256()
    for name, path in sorted(entries):
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


# Archives packed in this process, by the digest of what went in: a plan of
# many stacks (or a plan diff) packs the same sources once.
_PACKED: dict[str, Archive] = {}


def pack(entries: list[tuple[str, Path]]) -> Archive:
    """A gzipped tar of (name in archive, file) pairs, identical for identical input."""
    key = _inputs_digest(entries)
    if key not in _PACKED:
        _PACKED[key] = _pack(entries)
    return _PACKED[key]


def _pack(entries: list[tuple[str, Path]]) -> Archive:
    tar_bytes = io.BytesIO()
    with tarfile.open(fileobj=tar_bytes, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path in sorted(entries):
            data = path.read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    data = stored_gzip(tar_bytes.getvalue())
    return Archive(data=data, sha256=sha256_of(data))


# RFC 1952 section 2.3: ID1 ID2, CM=8 (deflate), FLG=0 (no name, no comment),
# MTIME=0, XFL=0, OS=255 (unknown): nothing of the machine or the time.
GZIP_HEADER = b"\x1f\x8b\x08\x00" + b"\x00\x00\x00\x00" + b"\x00\xff"
STORED_BLOCK_MAX = 0xFFFF  # RFC 1951 section 3.2.4: LEN is 16 bits


def stored_gzip(payload: bytes) -> bytes:
    """`payload` as one gzip member of stored (uncompressed) deflate blocks.

    Every block is 65535 bytes but the last; each starts with BFINAL and
    BTYPE=00 in one byte, then LEN and its complement NLEN, little-endian.
    CRC-32 is a function of the bytes only, the same from zlib or zlib-ng."""
    out = io.BytesIO()
    out.write(GZIP_HEADER)
    chunks = [payload[i:i + STORED_BLOCK_MAX]
              for i in range(0, len(payload), STORED_BLOCK_MAX)] or [b""]
    for index, chunk in enumerate(chunks):
        final = 1 if index == len(chunks) - 1 else 0
        out.write(struct.pack("<BHH", final, len(chunk), len(chunk) ^ 0xFFFF))
        out.write(chunk)
    out.write(struct.pack("<II", zlib.crc32(payload) & 0xFFFFFFFF, len(payload) & 0xFFFFFFFF))
    return out.getvalue()
