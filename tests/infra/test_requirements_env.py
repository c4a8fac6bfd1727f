"""`requirements.txt` alone gives a working program environment (issue 19 item 6).

`pulumi install` with `toolchain: pip` builds the venv with `python -m venv`, then
`pip install -r requirements.txt` in the project directory, and nothing else
(pulumi/pulumi sdk/python/toolchain/pip.go, InstallDependencies). This test does
the same in a temporary copy (the editable install writes its egg-info beside the
package) and imports the program there, without this suite's PYTHONPATH.
It downloads or takes from pip's cache every infra dependency: about a minute
on a warm cache, the one slow test of the infra suite."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from model.archive import REPO_ROOT

PROGRAM_IMPORTS = (
    "import components.platform, components.queued_tpu, model.settings, "
    "policy, tpu_training.config"
)


def run(*args: str | Path, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_a_venv_from_requirements_txt_alone_runs_the_program(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(REPO_ROOT / "requirements.txt", project)
    shutil.copytree(REPO_ROOT / "training", project / "training",
                    ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "tests"))
    venv = tmp_path / "venv"
    # The base interpreter, as `pulumi install` would find python3 (not this venv's).
    base = getattr(sys, "_base_executable", sys.executable)
    made = run(base, "-m", "venv", venv, cwd=project)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    # --no-compile: bytecode is an import-time cache, not part of what is tested.
    installed = run(python, "-m", "pip", "install", "--quiet", "--no-compile",
                    "-r", "requirements.txt", cwd=project)
    assert installed.returncode == 0, installed.stderr[-3000:]
    imported = run(python, "-c", f"{PROGRAM_IMPORTS}; import tpu_training; "
                   "print(tpu_training.__file__)", cwd=REPO_ROOT)
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert imported.stdout.strip().startswith(str(project / "training"))
