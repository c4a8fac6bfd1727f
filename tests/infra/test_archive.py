"""The package archive: the same bytes for the same sources, on any machine."""

from __future__ import annotations

import gzip
import io
import os
import re
import shutil
import tarfile
import zlib
from pathlib import Path

import pytest

from model import archive as archive_module
from model.archive import (
    TRAINING_DIR,
    PackageError,
    PinnedWheel,
    build_archive,
    ensure_wheels,
    read_lock,
    stored_gzip,
)


def members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m for m in tar.getmembers()}


@pytest.fixture(scope="module")
def archive():
    return build_archive()


def test_archive_holds_the_job_and_one_tf_keras_wheel_per_tf(archive) -> None:
    names = members(archive.data)
    assert {"pyproject.toml", "wheels.lock", "tpu_training/__init__.py",
            "tpu_training/config.py"} <= names.keys()
    wheels = sorted(n for n in names if n.startswith("wheels/"))
    assert [w.split("-")[1] for w in wheels] == [p.requirement.split("==")[1]
                                                  for p in read_lock()]
    assert not any("__pycache__" in n or n.startswith("tests/") for n in names)
    assert all(m.mtime == 0 and m.uid == 0 and m.mode == 0o644 for m in names.values())


def other_deflate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Deflate as another zlib would: same format, other bytes (zlib-ng is not
    bitwise compatible with zlib, docs/tpu-facts.md)."""
    real = zlib.compressobj

    def compressobj(level: int = -1, *args: object, **kwargs: object) -> object:
        return real(1 if level != 1 else 9, *args, **kwargs)

    monkeypatch.setattr(zlib, "compressobj", compressobj)
    monkeypatch.setattr(gzip.zlib, "compressobj", compressobj)
    monkeypatch.setattr(archive_module, "_PACKED", {})  # no cache: pack again for real


def test_same_tree_elsewhere_gives_the_same_sha(archive, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Other mtimes, umask, owner and compression settings: the same sha256."""
    old_umask = os.umask(0o077)
    try:
        copy = tmp_path / "training"
        shutil.copytree(TRAINING_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"),
                        copy_function=shutil.copyfile)  # new files: modes from the umask
    finally:
        os.umask(old_umask)
    for path in copy.rglob("*"):
        os.utime(path, (1_000_000, 1_000_000))
        if os.geteuid() == 0:
            os.chown(path, 4321, 4321)
    (copy / "tpu_training" / "__pycache__").mkdir(exist_ok=True)
    (copy / "tpu_training" / "__pycache__" / "x.pyc").write_bytes(b"junk")
    other_deflate(monkeypatch)
    assert build_archive(copy).sha256 == archive.sha256


def test_the_archive_is_a_gzip_any_reader_opens(archive) -> None:
    tar_bytes = gzip.decompress(archive.data)
    with tarfile.open(fileobj=io.BytesIO(archive.data), mode="r:gz") as tar:
        assert "tpu_training/config.py" in tar.getnames()
    assert stored_gzip(tar_bytes) == archive.data
    for size in (0, 1, 0xFFFF, 0xFFFF + 1, 3 * 0xFFFF + 7):
        payload = os.urandom(size)
        assert gzip.decompress(stored_gzip(payload)) == payload
        assert zlib.decompress(stored_gzip(payload), wbits=31) == payload


def test_a_source_change_changes_the_digest(archive, tmp_path: Path) -> None:
    copy = tmp_path / "training"
    shutil.copytree(TRAINING_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / "tpu_training" / "config.py").open("a") as f:
        f.write("\n# changed\n")
    changed = build_archive(copy)
    assert changed.sha256 != archive.sha256
    assert changed.filename == f"tpu_training-{changed.sha256}.tar.gz"


def test_a_wheel_that_does_not_verify_is_never_packed(tmp_path: Path) -> None:
    pin = PinnedWheel("tpu-stack-no-such-package==0.0.0", "0" * 64)
    (tmp_path / "tpu_stack_no_such_package-0.0.0-py3-none-any.whl").write_bytes(b"tampered")
    expected = re.escape("could not fetch tpu-stack-no-such-package==0.0.0")
    with pytest.raises(PackageError, match=expected):
        ensure_wheels([pin], tmp_path)
