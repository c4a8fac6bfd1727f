"""The package archive is staged whole or not at all: plans running at once (pytest-xdist
workers, two `pulumi preview`s) never read a half-written archive."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.package import stage
from model.archive import Archive


def test_the_archive_is_written_beside_its_name_and_renamed_into_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    archive = Archive(b"x" * 1000, "ab" * 32)
    final = tmp_path / archive.filename
    written = []
    real_write = Path.write_bytes

    def write_bytes(path: Path, data: bytes) -> int:
        written.append((path, final.exists()))
        return real_write(path, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    assert stage(archive, tmp_path) == final
    [(path, final_existed)] = written
    assert path != final and path.parent == tmp_path and not final_existed
    assert final.read_bytes() == archive.data
    assert sorted(p.name for p in tmp_path.iterdir()) == [archive.filename]  # nothing left
    assert stage(archive, tmp_path) == final and len(written) == 1  # once per digest
