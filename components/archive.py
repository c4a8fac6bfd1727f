"""The training package archive: deterministic bytes, named by their sha256.

Pure logic, no Pulumi: `package.py` uploads what this builds, the agent tests
and `tpuctl rehearse` build the very same bytes.

Layout of the archive (the agent's contract, docs/design.md):

    pyproject.toml, wheels.lock      from training/
    tpu_training/**.py               the job
    wheels/<wheel files>             pinned in training/wheels.lock (tf-keras per TF minor)

Same sources give the same bytes on any machine: entries sorted, owners,
times and modes normalised, gzip header without name or time.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import subprocess
import sys
import tarfile
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
    compressed = io.BytesIO()
    # Level 6: the wheels are zip-compressed already, level 9 only costs time.
    with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, mtime=0,
                       compresslevel=6) as gz:
        gz.write(tar_bytes.getvalue())
    data = compressed.getvalue()
    return Archive(data=data, sha256=sha256_of(data))
