"""scripts/setup.sh refuses a Python older than what README.md claims, with one clear line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from components.archive import REPO_ROOT


def fake_python(folder: Path, version: tuple[int, int, int]) -> Path:
    """A python that reports `version` (and runs everything else with this one)."""
    path = folder / "python-fake"
    dotted = ".".join(map(str, version))
    path.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "Python {dotted}"; exit 0; fi\n'
                    f'exec {sys.executable} -c "import sys; sys.version_info = {version}; $2"\n')
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(("env", "version", "minimum"), [
    ("infra", (3, 10, 13), "3.11"),
    ("image", (3, 9, 18), "3.10"),
])
def test_too_old_a_python_is_refused_before_anything_is_built(
        tmp_path: Path, env: str, version: tuple[int, int, int], minimum: str) -> None:
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO_ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    python = fake_python(tmp_path, version)
    result = subprocess.run([str(tmp_path / "scripts" / "setup.sh"), env],
                            env={"PATH": "/usr/bin:/bin", "PYTHON": str(python)},
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr == (f"setup.sh: .venv/{env} needs Python {minimum} or newer; {python} is "
                             f"Python {'.'.join(map(str, version))}. Set PYTHON to a newer one.\n")
    assert not (tmp_path / ".venv" / env).exists()
