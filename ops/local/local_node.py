"""One TPU worker booted on this machine: the startup script against loopback servers.

Shared by the agent tests, bench/boot.py and `tpuctl rehearse`: a metadata server
serving a node's attributes, a root folder standing in for the VM's disk, and
the environment that points the bootstrap at loopback (docs/design.md: the bootstrap
honours GCE_METADATA_HOST, STORAGE_EMULATOR_HOST, TPU_STACK_ROOT, TPU_STACK_PYTHON).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from node_agent import (
    RELEASE_KEY,
    STARTUP_SCRIPT_KEY,
    STATUS_KEY,
    WORKER_NUMBER_KEY,
    WORKERS_KEY,
    startup_script,
)
from node_agent.desired import release_content, release_name
from ops.local.metadata_server import MetadataServer
from ops.local.storage_emulator import StorageEmulator

REPO = Path(__file__).resolve().parents[2]
IMAGE_PYTHON = REPO / ".venv" / "image" / "bin" / "python"  # TensorFlow only, like a TPU image


def publish_release(gcs: StorageEmulator, prefix: str, package_uri: str, sha256: str,
                    job: Mapping[str, object]) -> str:
    """Upload a release object under the node's release prefix, as the stack's
    BucketObject does (contract C1); its gs:// URI. The emulator stamps timeCreated,
    so the latest upload is the current release."""
    content = release_content(job, package_uri, sha256)
    uri = f"{prefix.rstrip('/')}/{release_name(content)}"
    gcs.upload(uri, content)
    return uri


def node_attributes(release_prefix: str, status_prefix: str, *, workers: str = "all",
                    worker: int = 0, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The metadata a TpuNode declares, plus what the TPU runtime adds per worker
    (`extra`: more of either, e.g. tpu-stack-runtime-version, worker-network-endpoints)."""
    return {STARTUP_SCRIPT_KEY: startup_script(), RELEASE_KEY: release_prefix,
            WORKERS_KEY: workers, STATUS_KEY: status_prefix,
            WORKER_NUMBER_KEY: str(worker)} | dict(extra or {})


@dataclass
class LocalNode:
    metadata: MetadataServer
    root: Path
    storage_host: str
    env_extra: dict[str, str] = field(default_factory=dict)

    @property
    def script(self) -> Path:
        """The `startup-script` attribute, written out as the guest agent would."""
        path = self.root.parent / f"{self.root.name}-startup-script.sh"
        path.write_text(self.metadata.attributes()[STARTUP_SCRIPT_KEY])
        return path

    @property
    def env(self) -> dict[str, str]:
        return os.environ | {
            "GCE_METADATA_HOST": self.metadata.host, "STORAGE_EMULATOR_HOST": self.storage_host,
            "TPU_STACK_ROOT": str(self.root), "TPU_STACK_PYTHON": str(IMAGE_PYTHON),
            # CPU here, and never a systemd unit on the machine running this.
            "TPU_STACK_STRATEGY": "cpu", "TPU_STACK_INIT": "foreground", "CUDA_VISIBLE_DEVICES": "",
        } | self.env_extra

    def start(self, **popen: object) -> subprocess.Popen[str]:
        """Boot in the background (output piped, stderr into stdout, unless told otherwise)."""
        options: dict[str, object] = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
        return subprocess.Popen(["bash", str(self.script)], env=self.env, text=True,
                                **(options | popen))  # type: ignore[call-overload]

    def boot(self, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(self.script)], env=self.env, text=True,
                              capture_output=True, timeout=timeout, check=False)

    @property
    def guest(self) -> dict[str, str]:
        return self.metadata.guest("tpu-stack")

    def job_log_path(self, worker: int = 0) -> Path:
        return self.root / "status" / f"worker-{worker}" / "job.log"

    def installed_packages(self) -> list[str]:
        packages = self.root / "packages"
        return sorted(p.name for p in packages.iterdir()) if packages.is_dir() else []

