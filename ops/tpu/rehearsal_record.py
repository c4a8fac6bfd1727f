"""What `tpuctl rehearse` leaves for `tpuctl status --offline` and `logs --offline`.

Each node's rehearsal has a folder of its own, `.cache/rehearse/<stack>/<node>/`
(`<node>`: its TpuNode's name, e.g. `node-trainer`), kept until that node is rehearsed
again: the status objects the agents left (`status-objects/worker-<n>/status.json`,
`job.log`) and `rehearsal.json`, the digests of what was rehearsed: the stack files
and the training sources. A later change to either shows as a stale rehearsal.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from model.archive import REPO_ROOT, sources_digest

RECORD = "rehearsal.json"
FAILURE = "failed.txt"  # in the stack's folder: the last rehearsal's error, if it failed
STATUS_OBJECTS = "status-objects"
WORKER0_STATUS = "worker-0/status.json"
TRAINING = "training/"


def stack_files(stack: str, root: Path = REPO_ROOT) -> list[Path]:
    """The files a stack's config comes from (Pulumi.yaml's defaults under the stack's)."""
    return [root / "Pulumi.yaml", root / f"Pulumi.{stack}.yaml"]


def fingerprint(stack: str, root: Path = REPO_ROOT) -> dict[str, str]:
    """sha256 of each stack file, and the training sources' digest (the package)."""
    digests = {path.name: hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file()
               else "" for path in stack_files(stack, root)}
    return digests | {TRAINING: sources_digest()}


def write_record(folder: Path, stack: str, node: str, planned_release: str,
                 rehearsed_release: str) -> None:
    record = {"stack": stack, "node": node, "started": datetime.now(timezone.utc).isoformat(
        timespec="seconds"), "plannedRelease": planned_release,
        "rehearsedRelease": rehearsed_release, "digests": fingerprint(stack)}
    (folder / RECORD).write_text(json.dumps(record, indent=2) + "\n")


def write_failure(stack_dir: Path, message: str) -> None:
    """Why the stack's last rehearsal stopped before a node booted (its error line)."""
    stack_dir.mkdir(parents=True, exist_ok=True)
    (stack_dir / FAILURE).write_text(message + "\n")


def read_failure(stack_dir: Path) -> str | None:
    try:
        return (stack_dir / FAILURE).read_text().strip() or None
    except OSError:
        return None


def clear_failure(stack_dir: Path) -> None:
    (stack_dir / FAILURE).unlink(missing_ok=True)


def read_record(folder: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def changed_since(folder: Path, stack: str) -> list[str]:
    """What changed since the node's rehearsal: stack file names and/or `training/`;
    ["what was rehearsed is unknown"] for a rehearsal without a record."""
    record = read_record(folder)
    if record is None or not isinstance(record.get("digests"), dict):
        return ["what was rehearsed is unknown"]
    then = record["digests"]
    return [name for name, digest in fingerprint(stack).items() if then.get(name) != digest]


def node_folders(stack_dir: Path) -> list[Path]:
    """The stack's rehearsed nodes' folders, each holding worker 0's status."""
    if not stack_dir.is_dir():
        return []
    return sorted(folder for folder in stack_dir.iterdir()
                  if (folder / STATUS_OBJECTS / WORKER0_STATUS).is_file())


def worker0_status(folder: Path) -> dict[str, Any]:
    try:
        fields = json.loads((folder / STATUS_OBJECTS / WORKER0_STATUS).read_text())
    except (OSError, ValueError):
        return {}
    return fields if isinstance(fields, dict) else {}


def job_log(folder: Path, worker: int) -> Path:
    return folder / STATUS_OBJECTS / f"worker-{worker}" / "job.log"
