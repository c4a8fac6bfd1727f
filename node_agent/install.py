"""Installing a training package beside the image's TensorFlow."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
from pathlib import Path

from node_agent.common import AgentError, TransientError, log
from node_agent.storage import Storage

# How messages name a release's fields (contract C1: {job, package, sha256}).
PACKAGE_SETTING = "the release's package"
SHA256_SETTING = "the release's sha256"
# pip installs a package's few wheels from local files in seconds; one still running
# after this is stuck (a hung filesystem, a wedged subprocess) and is killed: the
# install counts as transient and is tried again. The agent installs in the
# background (agent.Updater), so this bounds how long an update waits, never a stop.
PIP_TIMEOUT_SECONDS = 600.0
# A download whose sha256 differs is tried again: a body cut short without a
# Content-Length looks whole. The same wrong sha256 twice is the object's real
# content, and refused.
SHA256_ATTEMPTS = 3
TF_KERAS_WHEEL = re.compile(r"^tf_keras-(\d+)\.(\d+)(?:\.[^-]*)?-.*\.whl$")


def tensorflow_version() -> str:
    """The image's TensorFlow version, from its installed distribution's metadata.

    Reading metadata costs milliseconds where `import tensorflow` costs seconds;
    an import in a child process is the fallback for unusual installs.
    """
    import importlib.metadata  # here, not at the top: only an install needs it

    for dist in importlib.metadata.packages_distributions().get("tensorflow", []):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    code = "import tensorflow; print(tensorflow.__version__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        raise AgentError(f"the image's Python ({sys.executable}) cannot import tensorflow")
    return result.stdout.strip()


def pick_wheels(names: list[str], tf_version: str) -> list[str]:
    """Every wheel in the archive, with the tf-keras one matching TensorFlow's major.minor."""
    tf_minor = ".".join(tf_version.split(".")[:2])
    keras = {f"{m[1]}.{m[2]}": name for name in names if (m := TF_KERAS_WHEEL.match(name))}
    if keras and tf_minor not in keras:
        raise AgentError(f"the package carries tf-keras for TensorFlow {', '.join(sorted(keras))}; "
                         f"this image has TensorFlow {tf_version}: pick a runtimeVersion "
                         "with one of those or add its tf-keras to training/wheels.lock")
    others = [name for name in names if not TF_KERAS_WHEEL.match(name)]
    return others + ([keras[tf_minor]] if keras else [])


def extract(archive: Path, destination: Path) -> None:
    """Regular files and folders only, every name inside `destination`."""
    import tarfile  # here, not at the top: only an install needs it

    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            parts = Path(member.name).parts
            plain = member.isfile() or member.isdir()
            if member.name.startswith("/") or ".." in parts or not plain:
                raise AgentError(f"{PACKAGE_SETTING}: archive entry {member.name!r} is not a plain "
                                 "file inside the package; refusing it")
            target = destination.joinpath(*parts)
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            with target.open("wb") as out:
                shutil.copyfileobj(source or io.BytesIO(), out)


class Installer:
    """Packages live in `<root>/packages/<sha256>`; the folder exists only once complete."""

    def __init__(self, root: Path, storage: Storage | None):
        self.root = root
        self.storage = storage

    def package_dir(self, sha256: str) -> Path:
        return self.root / "packages" / sha256

    def ensure(self, package_uri: str, sha256: str) -> Path:
        final = self.package_dir(sha256)
        if final.is_dir():
            return final
        work = final.with_name(f".{sha256}.partial")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        try:
            archive = work / "package.tar.gz"
            self._download(package_uri, sha256, archive)
            extract(archive, work / "src")
            archive.unlink()
            install_wheels(work)
            work.rename(final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return final

    def _download(self, package_uri: str, sha256: str, archive: Path) -> None:
        assert self.storage is not None
        seen: set[str] = set()
        for _ in range(SHA256_ATTEMPTS):
            got = self.storage.download(package_uri, archive, PACKAGE_SETTING)
            if got == sha256:
                return
            if got in seen:  # the same bytes twice: the object's real content
                raise AgentError(f"{SHA256_SETTING}: {package_uri} has sha256 {got}, "
                                 f"not {sha256}; refusing to run it")
            seen.add(got)
            log(f"download {package_uri}: sha256 {got}, not {sha256}; downloading again "
                "(a transfer cut short looks whole without a Content-Length)")
        raise TransientError(f"download {package_uri}: {len(seen)} different sha256s, "
                             f"none {sha256}: transfers keep breaking")

    def prune(self, keep: set[str]) -> list[str]:
        """Remove every installed package but `keep` (the running one and the one
        before it): one folder per release would fill the disk without bound."""
        removed = []
        folder = self.root / "packages"
        for path in sorted(folder.iterdir()) if folder.is_dir() else []:
            if path.name not in keep and not path.name.startswith("."):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path.name)
        return removed


def install_wheels(work: Path) -> None:
    """pip-install the wheels under `work/src/wheels` into `work/site`."""
    wheel_dir = work / "src" / "wheels"
    names = sorted(p.name for p in wheel_dir.glob("*.whl")) if wheel_dir.is_dir() else []
    wheels = [str(wheel_dir / name) for name in pick_wheels(names, tensorflow_version())]
    if not wheels:
        return
    # --no-index --no-deps: the node has no route to PyPI, and nothing may
    # replace the image's TensorFlow. --no-compile: byte-compiling all of
    # tf-keras costs more than the job compiling what it imports, once
    # (bench/boot.py).
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
               "--disable-pip-version-check", "--no-cache-dir", "--no-compile", "--target",
               str(work / "site"), *wheels]
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False,
                                timeout=PIP_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        raise TransientError(f"pip did not finish installing within "
                             f"{PIP_TIMEOUT_SECONDS:.0f}s; killed it") from None
    if result.returncode != 0:
        raise AgentError(f"pip could not install {', '.join(Path(w).name for w in wheels)}: "
                         f"{result.stderr.strip()[-400:]}")
