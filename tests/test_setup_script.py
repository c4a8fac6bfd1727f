"""scripts/setup.sh picks a Python each environment supports, or refuses in one line
that names what to install (README.md, "Two commands", states the same ranges)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from model.archive import REPO_ROOT

# What runs before a build.
TOOLS = ("bash", "dirname", "find", "sort", "sha256sum", "cut", "cat", "sed")


def fake_python(path: Path, version: tuple[int, int, int]) -> Path:
    """A python that reports `version` (and runs everything else with this one)."""
    dotted = ".".join(map(str, version))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nif [ "$1" = --version ]; then echo "Python {dotted}"; exit 0; fi\n'
                    f'exec {sys.executable} -c "import sys; sys.version_info = {version}; $2"\n')
    path.chmod(0o755)
    return path


def setup_sh(tmp_path: Path, *args: str, python: Path | None,
             others: tuple[Path, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run a copy of setup.sh where the only Pythons are `python` (as PYTHON) and `others`
    (python3.X on PATH, or a pyenv's versions/3.X.Y/bin/python under tmp_path/pyenv)."""
    (tmp_path / "scripts").mkdir(exist_ok=True)
    shutil.copy(REPO_ROOT / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    tools = tmp_path / "bin"
    tools.mkdir(exist_ok=True)
    for tool in TOOLS:
        (tools / tool).unlink(missing_ok=True)
        (tools / tool).symlink_to(shutil.which(tool))
    env = {"PATH": str(tools), "HOME": str(tmp_path), "PYENV_ROOT": str(tmp_path / "pyenv")}
    if python is not None:
        env["PYTHON"] = str(python)
    assert all(other.is_relative_to(tmp_path) for other in others)
    return subprocess.run([str(tmp_path / "scripts" / "setup.sh"), *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize(("env", "version", "expected"), [
    ("infra", (3, 10, 13), "Python 3.11 or newer ({python} is Python 3.10)"),
    ("image", (3, 9, 18), "Python 3.10-3.12 ({python} is Python 3.9)"),
    ("tf218", (3, 13, 0), "Python 3.10-3.12 (TensorFlow 2.18 has no wheels for 3.13)"),
    ("image", (3, 13, 0), "Python 3.10-3.12 (TensorFlow 2.18 has no wheels for 3.13)"),
    ("tf220", (3, 14, 0), "Python 3.10-3.13 (TensorFlow 2.20 has no wheels for 3.14)"),
])
def test_no_supported_python_is_refused_in_one_line_before_anything_is_built(
        tmp_path: Path, env: str, version: tuple[int, int, int], expected: str) -> None:
    python = fake_python(tmp_path / "python-fake", version)
    result = setup_sh(tmp_path, env, python=python)
    assert result.returncode == 2
    assert result.stderr == (f"setup.sh: .venv/{env} needs {expected.format(python=python)}; "
                             "install one or set PYTHON\n")
    assert not (tmp_path / ".venv" / env).exists()


def test_a_supported_python_on_path_or_in_pyenv_is_picked(tmp_path: Path) -> None:
    python = fake_python(tmp_path / "python-fake", (3, 13, 0))
    on_path = fake_python(tmp_path / "bin" / "python3.11", (3, 11, 7))
    in_pyenv = fake_python(tmp_path / "pyenv" / "versions" / "3.12.1" / "bin" / "python",
                           (3, 12, 1))
    result = setup_sh(tmp_path, "--which", "infra", "tf218", "tf220", "image", python=python,
                      others=(on_path, in_pyenv))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"infra {python}", f"tf218 {on_path}", f"tf220 {python}", f"image {on_path}"]


def test_the_ranges_are_the_ones_readme_states() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    script = (REPO_ROOT / "scripts" / "setup.sh").read_text()
    ranges = dict(re.findall(r"^\s+(\w+)(?:\|\w+)?\) echo \"(3\.\d+ (?:3\.\d+|-))", script, re.M))
    assert ranges == {"infra": "3.11 -", "tf218": "3.10 3.12", "tf220": "3.10 3.13"}
    assert "Python 3.11 or newer for the infra side" in readme
    assert "Python 3.10 to 3.12 for TensorFlow 2.18" in readme
    assert "3.10 to 3.13 for TensorFlow 2.20" in readme


def test_the_progress_lines_name_packages_never_the_requirements_file() -> None:
    script = (REPO_ROOT / "scripts" / "setup.sh").read_text()
    progress = re.search(r"^progress\(\) \{.*?^\}", script, re.M | re.S)[0]
    pip_output = ("Collecting rich>=13 (from -r requirements.txt (line 10))\n"
                  "Processing /opt/wheels/pulumi-3.200.0-py3-none-any.whl (from -r "
                  "/work/requirements.txt (line 3))\n"
                  "Processing ./training\n"
                  "Installing collected packages: rich, pulumi\n")
    result = subprocess.run(["bash", "-c", f"{progress}\nprogress infra"], input=pip_output,
                            capture_output=True, text=True, check=True)
    assert result.stdout.splitlines() == [
        "  .venv/infra: collecting rich>=13",
        "  .venv/infra: collecting pulumi-3.200.0-py3-none-any.whl",
        "  .venv/infra: collecting training",
        "  .venv/infra: installing (this takes a while)"]


def test_the_image_takes_the_tpu_images_python_when_there_is_one(tmp_path: Path) -> None:
    """README calls .venv/image the Python 3.10 stand-in for the TPU image: with python3
    a 3.11 and a python3.10 on the PATH, image takes 3.10, the others keep python3."""
    python3 = fake_python(tmp_path / "bin" / "python3", (3, 11, 7))
    py310 = fake_python(tmp_path / "bin" / "python3.10", (3, 10, 14))
    result = setup_sh(tmp_path, "--which", python=None, others=(python3, py310))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "infra python3", "tf218 python3", "tf220 python3", f"image {py310}"]


def test_the_image_takes_pyenvs_3_10_and_an_explicit_python_wins(tmp_path: Path) -> None:
    python3 = fake_python(tmp_path / "bin" / "python3", (3, 12, 1))
    in_pyenv = fake_python(tmp_path / "pyenv" / "versions" / "3.10.14" / "bin" / "python",
                           (3, 10, 14))
    chosen = fake_python(tmp_path / "python-fake", (3, 11, 7))
    found = setup_sh(tmp_path, "--which", "image", python=None, others=(python3, in_pyenv))
    explicit = setup_sh(tmp_path, "--which", "image", python=chosen, others=(python3, in_pyenv))
    assert found.stdout.splitlines() == [f"image {in_pyenv}"]
    assert explicit.stdout.splitlines() == [f"image {chosen}"]


def test_which_without_arguments_shows_every_environments_pick_or_why_not(
        tmp_path: Path) -> None:
    python = fake_python(tmp_path / "python-fake", (3, 13, 0))
    result = setup_sh(tmp_path, "--which", python=python)
    assert result.returncode == 2  # tf218 and image have no Python in range here
    assert result.stdout.splitlines() == [f"infra {python}", f"tf220 {python}"]
    assert [line.split(" needs ")[0] for line in result.stderr.splitlines()] == [
        "setup.sh: .venv/tf218", "setup.sh: .venv/image"]


def test_a_changed_requirements_file_changes_the_stamp_so_the_environment_is_rebuilt(
        tmp_path: Path) -> None:
    """The stamp (.venv/ENV/.installed) holds the requirement files' contents, not only
    setup.sh's arguments: before, a changed requirements file never rebuilt anything."""
    for name in ("requirements.txt", "requirements-dev.txt", "training/pyproject.toml"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / name, tmp_path / name)

    def stamps() -> dict[str, str]:
        result = setup_sh(tmp_path, "--stamp", "infra", "tf218", "image", python=None)
        assert result.returncode == 0, result.stderr
        return dict(line.split() for line in result.stdout.splitlines())

    before = stamps()
    assert set(before) == {"infra", "tf218", "image"}
    with (tmp_path / "requirements.txt").open("a") as file:  # included by -dev's `-r`
        file.write("example-package>=1\n")
    after_requirements = stamps()
    assert after_requirements["infra"] != before["infra"]
    assert after_requirements["tf218"] == before["tf218"]
    pyproject = tmp_path / "training" / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"pytest>=8"', '"pytest>=9"'))
    after_pyproject = stamps()
    assert after_pyproject["tf218"] != before["tf218"]
    assert after_pyproject["infra"] != after_requirements["infra"]  # -e ./training
    assert after_pyproject["image"] == before["image"]  # names no file


def built_env(tmp_path: Path, env: str) -> None:
    """.venv/ENV as setup.sh left it (its stamp current, so nothing is rebuilt), whose
    Python is this one: the infra side's, where no test reference is installed."""
    stamp = setup_sh(tmp_path, "--stamp", env, python=None)
    assert stamp.returncode == 0, stamp.stderr
    venv = tmp_path / ".venv" / env
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    (venv / ".installed").write_text(stamp.stdout.split()[1] + "\n")


def test_setup_of_a_training_environment_missing_a_reference_stops_naming_it(
        tmp_path: Path) -> None:
    """The BERT tests' references are installed --no-deps; one that does not import
    (here: none is installed) stops setup, and so the test command, naming the package,
    on every run, not only when the environment is built."""
    built_env(tmp_path, "tf218")
    result = setup_sh(tmp_path, "tf218", python=None)
    assert result.returncode == 2
    assert result.stderr.startswith(
        "setup.sh: .venv/tf218: tensorflow-hub does not import (tensorflow_hub: "
        "ModuleNotFoundError: No module named 'tensorflow_hub')")
    named = [line.split(" does not import")[0] for line in result.stderr.splitlines()]
    assert named[:5] == [f"setup.sh: .venv/tf218: {package}" for package in (
        "tensorflow-hub", "tf-models-official", "tf-models-official", "tf-models-official",
        "gin-config")]  # scipy, the last, is on the infra side too


def test_the_reference_check_names_a_module_that_does_not_import_and_passes_others(
        tmp_path: Path) -> None:
    built_env(tmp_path, "tf220")
    missing = setup_sh(tmp_path, "--check-references", "tf220", "json=stdlib",
                       "no_such_reference.tools=bogus-package", python=None)
    assert missing.returncode == 2
    assert missing.stderr.splitlines() == [
        "setup.sh: .venv/tf220: bogus-package does not import (no_such_reference.tools: "
        "ModuleNotFoundError: No module named 'no_such_reference'); reinstall it, or what "
        "it names, with scripts/setup.sh after rm -r .venv/tf220"]
    present = setup_sh(tmp_path, "--check-references", "tf220", "json=stdlib", python=None)
    assert (present.returncode, present.stderr) == (0, "")


def test_the_references_checked_are_the_ones_the_bert_tests_import() -> None:
    script = (REPO_ROOT / "scripts" / "setup.sh").read_text()
    listed = re.search(r"^REFERENCE_IMPORTS=\((.*?)\)$", script, re.MULTILINE | re.DOTALL)
    assert listed
    modules = {pair.split("=")[0] for pair in listed.group(1).split()}
    tests = "".join((REPO_ROOT / "training" / "tests" / name).read_text()
                    for name in ("test_bert_checkpoint.py", "test_bert_hub.py"))
    imported = set(re.findall(r"(?:import|from) (official[\w.]*)", tests))
    imported |= set(re.findall(r'import_module\("(\w+)"\)', tests))
    assert imported == {"official.nlp.modeling", "official.legacy.bert",
                        "official.nlp.tools", "tensorflow_hub"}
    assert all(any(module == name or module.startswith(name + ".") for module in modules)
               for name in imported)
    assert "importorskip" not in tests
