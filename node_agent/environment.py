"""The job's environment: the package's paths, and how TensorFlow finds the TPU."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from node_agent.common import AgentError, log
from node_agent.contract import NETWORK_ENDPOINTS_KEY

LIBTPU_PATHS = ("/lib/libtpu.so",)  # where TPU VM images keep libtpu (ml-auto-solutions)
PJRT_KEYS = ("TF_PLUGGABLE_DEVICE_LIBRARY_PATH", "NEXT_PLUGGABLE_DEVICE_USE_C_API")


def grpc_tpu_name(endpoints: str) -> str:
    """TPU_NAME for a pod slice's one TF client: `grpc://<ip>:8470,...` in worker order.

    `worker-network-endpoints` lists `<a>:<b>:<ip>` per worker, worker 0 first (JAX
    jax/_src/clusters/cloud_tpu_cluster.py takes the third field, the first entry
    being the coordinator). A `grpc://` name makes TensorFlow's Cloud TPU client skip
    the TPU API (tensorflow/python/tpu/client/client.py: `_use_api` is false and
    `_environment_var_to_network_endpoints` splits the list; default port 8470),
    which needs googleapiclient and oauth2client, absent on the node.
    """
    names = []
    for entry in endpoints.split(","):
        parts = entry.strip().split(":")
        if len(parts) < 3 or not parts[2]:
            raise AgentError(f"{NETWORK_ENDPOINTS_KEY}: entry {entry.strip()!r} is not "
                             "'<a>:<b>:<ip>'; cannot address the pod slice's workers")
        names.append(f"grpc://{parts[2]}:8470")
    return ",".join(names)


def is_pjrt(runtime_version: str) -> bool:
    """`tpu-vm-tf-2.18.0-pjrt`, `tpu-vm-tf-2.19.0-pod-pjrt`, `...-pjrt-v5e-and-v6`."""
    return "pjrt" in runtime_version.strip().lower().split("-")


def libtpu_path(candidates: tuple[str, ...] = LIBTPU_PATHS) -> str | None:
    """Where this image keeps libtpu: /lib/libtpu.so on TPU VM images; where TensorFlow
    came from pip (tensorflow-tpu), the `libtpu` package's own copy (ml-auto-solutions
    moved its PJRT path there in a96327ca when it switched to pip). None when neither
    exists: TensorFlow's import raises on a plugin path that is not a file
    (tensorflow/__init__.py, load_pluggable_device_library), so none is set then."""
    for path in candidates:
        if Path(path).is_file():
            return path
    import importlib.util  # here: only a PJRT single host needs it

    spec = importlib.util.find_spec("libtpu")  # finds the package without importing it
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / "libtpu.so").is_file():
            return str(Path(folder) / "libtpu.so")
    return None


def read_environment_file(path: Path) -> dict[str, str]:
    """`KEY=value` lines of /etc/environment (pam_env's format; systemd units never
    read it, so the agent looks there for what the image sets)."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    pairs = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            pairs[key.strip()] = value.strip().strip("'\"")
    return pairs


def job_environment(base: Mapping[str, str], package_dir: Path, workers: str, *,
                    tpu_name: str = "", runtime_version: str = "",
                    image_env: Mapping[str, str] | None = None,
                    libtpu: Callable[[], str | None] = libtpu_path) -> dict[str, str]:
    """The job's environment: the package beside the image's TensorFlow.

    `site/` holds the wheels pip installed with --target and `src/` the job's own
    modules; PYTHONPATH puts them in front of the image's site-packages. A venv
    (even with system site packages) would not do: where the image's Python is
    itself a venv, a venv made from it does not see the parent's packages.

    TensorFlow follows Google's own TF-on-TPU CI (ml-auto-solutions
    dags/solutions_team/configs/tensorflow/common.py, export_env_variables): a
    single host on a `-pjrt` runtime loads libtpu as a PJRT plugin with
    TF_PLUGGABLE_DEVICE_LIBRARY_PATH and NEXT_PLUGGABLE_DEVICE_USE_C_API=true; a
    pod slice's client sets TPU_NAME and TPU_LOAD_LIBRARY=0 and loads no libtpu
    itself (the workers' TPU runtime serves it). A value already in the agent's
    environment or the image's /etc/environment wins over these.
    """
    env = dict(base)
    paths = [str(package_dir / "site"), str(package_dir / "src")]
    env["PYTHONPATH"] = os.pathsep.join(paths + [p for p in [base.get("PYTHONPATH")] if p])
    # On the VM the job must use the TPU, never fall back to CPU (docs/tpu-facts.md);
    # an explicit setting (tests, `tpuctl rehearse` on CPU) wins.
    env.setdefault("TPU_STACK_STRATEGY", "tpu")
    env["PYTHONUNBUFFERED"] = "1"  # step lines reach the status as they are printed
    image = image_env or {}
    if workers == "0":
        env.setdefault("TPU_NAME", image.get("TPU_NAME") or tpu_name)
        env.setdefault("TPU_LOAD_LIBRARY", image.get("TPU_LOAD_LIBRARY") or "0")
    elif is_pjrt(runtime_version):
        for key in PJRT_KEYS:
            if key not in env and key in image:
                env[key] = image[key]
        if "TF_PLUGGABLE_DEVICE_LIBRARY_PATH" not in env and (found := libtpu()):
            env["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] = found
        if "TF_PLUGGABLE_DEVICE_LIBRARY_PATH" in env:
            env.setdefault("NEXT_PLUGGABLE_DEVICE_USE_C_API", "true")
        else:
            log("a -pjrt runtime without libtpu.so (looked in /lib and the libtpu package): "
                "the job starts without the PJRT plugin variables")
    return env
