"""Boot time of a TPU worker, against a floor measured in the same run.

    .venv/infra/bin/python bench/boot.py [--rounds N]

Everything on loopback (GCS emulator, metadata server), the real package archive
and the real job (mnist_cnn on CPU) run by `.venv/image/bin/python`.

- first boot: bootstrap start -> the job's first step line. Floor: download the
  same bytes from the same emulator, then start the same Python on the same
  installed package and run the same job to its first step (so the floor holds
  TensorFlow's import and the first step; the difference is the agent's cost:
  metadata, verify, extract, pip, status). Target: <= 1.5x.
- reboot: bootstrap start -> "job launched" with the package already installed,
  and -> "decided not to rerun" for a job that already finished, each against the
  first boot's bootstrap start -> "job launched". Target: <= 10%.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model.archive import Archive, build_archive
from ops.local.local_node import IMAGE_PYTHON, LocalNode, node_attributes
from ops.local.metadata_server import MetadataServer
from ops.local.storage_emulator import StorageEmulator

REPO = Path(__file__).resolve().parents[1]
TRAINING_PYTHON = REPO / ".venv" / "tf218" / "bin" / "python"
BUCKET = "bench"
LAUNCHED = "starting job"
DECIDED_NOT_TO_RERUN = "finished earlier; not rerun"
FIRST_STEP = "tpu_training step="
POLL_SECONDS = 0.01


def job_json(dataset: str, work: Path) -> str:
    return json.dumps({
        "model": "mnist_cnn", "trainData": dataset, "globalBatchSize": 16, "trainSteps": 8,
        "stepsPerExecution": 4, "checkpointEverySteps": 4, "checkpointDir": str(work / "ckpt"),
        "exportDir": str(work / "export"), "tensorboardDir": str(work / "tb")})


def size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def wait_for_line(path: Path, marker: str, since: float, process: subprocess.Popen[str],
                  offset: int, timeout: float = 300) -> float:
    """Seconds from `since` until `marker` appears in `path` after byte `offset`."""
    while time.monotonic() - since < timeout:
        exited = process.poll() is not None
        if path.exists() and marker.encode() in path.read_bytes()[offset:]:
            return time.monotonic() - since
        if exited:
            raise RuntimeError(f"exited ({process.returncode}) before {marker!r}")
        time.sleep(POLL_SECONDS)
    raise TimeoutError(marker)


def terminate(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(180)


class Bench:
    def __init__(self, work: Path, gcs: StorageEmulator, archive: Archive, uri: str,
                 dataset: str):
        self.work, self.gcs, self.archive, self.uri, self.dataset = work, gcs, archive, uri, dataset
        self.runs = 0

    def node(self, root: Path) -> tuple[LocalNode, MetadataServer]:
        self.runs += 1
        job = job_json(self.dataset, self.work / f"job-{self.runs}")
        server = MetadataServer(node_attributes(self.uri, self.archive.sha256, job,
                                                f"gs://{BUCKET}/status/{self.runs}/"))
        node = LocalNode(server, root, self.gcs.host)
        node.script  # noqa: B018 (writes the script before the clock starts)
        return node, server

    def first_boot(self, root: Path) -> tuple[float, float]:
        """(seconds to job launched, seconds to first step) of a fresh node."""
        node, server = self.node(root)
        log = node.job_log_path()
        offset = size(log)
        started = time.monotonic()
        boot = node.start(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            launched = wait_for_line(log, LAUNCHED, started, boot, offset)
            first_step = wait_for_line(log, FIRST_STEP, started, boot, offset)
        finally:
            terminate(boot)
            server.close()
        return launched, first_step

    def reboot(self, root: Path, *, finished: bool) -> float:
        """Seconds to 'job launched' (an unfinished job) or to 'not rerun' (a finished one)."""
        node, server = self.node(root)
        if finished:
            node.boot()  # run the job to its end once
        offset = size(node.job_log_path())
        started = time.monotonic()
        boot = node.start(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            marker = DECIDED_NOT_TO_RERUN if finished else LAUNCHED
            return wait_for_line(node.job_log_path(), marker, started, boot, offset)
        finally:
            if boot.poll() is None:
                terminate(boot)
            server.close()

    def floor(self, package_dir: Path) -> tuple[float, float]:
        """Download plus (the same Python importing TensorFlow, the job to its first step)."""
        started = time.monotonic()
        self.download()
        fetched = time.monotonic() - started
        started = time.monotonic()
        subprocess.run([str(IMAGE_PYTHON), "-c", "import tensorflow"], check=True,
                       capture_output=True)
        tf_imported = time.monotonic() - started
        self.runs += 1
        job_config = self.work / f"floor-{self.runs}.json"
        job_config.write_text(job_json(self.dataset, self.work / f"job-{self.runs}"))
        env = os.environ | {"PYTHONPATH": f"{package_dir / 'site'}:{package_dir / 'src'}",
                            "TPU_STACK_STRATEGY": "cpu", "PYTHONUNBUFFERED": "1",
                            "CUDA_VISIBLE_DEVICES": ""}
        started = time.monotonic()
        job = subprocess.Popen([str(IMAGE_PYTHON), "-m", "tpu_training", "run", "--config",
                                str(job_config)], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert job.stdout is not None
        for line in job.stdout:
            if line.startswith(FIRST_STEP):
                break
        first_step = time.monotonic() - started
        job.kill()
        job.wait()
        return fetched + tf_imported, fetched + first_step

    def download(self) -> None:
        bucket, name = self.uri.removeprefix("gs://").split("/", 1)
        url = (f"{self.gcs.host}/storage/v1/b/{bucket}/o/"
               f"{urllib.request.quote(name, safe='')}?alt=media")
        with urllib.request.urlopen(url) as answer:
            assert hashlib.sha256(answer.read()).hexdigest() == self.archive.sha256


def measure(rounds: int, work: Path) -> dict[str, list[float]]:
    archive = build_archive()
    dataset_dir = work / "data"
    subprocess.run([str(TRAINING_PYTHON), "-m", "tpu_training", "synth", "--model", "mnist_cnn",
                    "--out", str(dataset_dir), "--examples", "256", "--shards", "1"],
                   check=True, capture_output=True)
    results: dict[str, list[float]] = {name: [] for name in (
        "floor_tf_import", "floor_first_step", "boot_launched", "boot_first_step",
        "reboot_launched", "reboot_finished")}
    with StorageEmulator() as gcs:
        gcs.create_bucket(BUCKET)
        uri = f"gs://{BUCKET}/packages/{archive.filename}"
        gcs.upload(uri, archive.data)
        bench = Bench(work, gcs, archive, uri, str(dataset_dir / "*.tfrecord"))
        warm = work / "warm"
        bench.first_boot(warm)  # warms caches for every run below, installs the floor's package
        for i in range(rounds):
            floor_tf, floor_step = bench.floor(warm / "packages" / archive.sha256)
            launched, first_step = bench.first_boot(work / f"node-{i}")
            results["floor_tf_import"].append(floor_tf)
            results["floor_first_step"].append(floor_step)
            results["boot_launched"].append(launched)
            results["boot_first_step"].append(first_step)
            results["reboot_launched"].append(bench.reboot(work / f"node-{i}", finished=False))
            results["reboot_finished"].append(bench.reboot(work / f"node-{i}", finished=True))
    return results


def report(results: dict[str, list[float]]) -> None:
    m = {name: statistics.median(values) for name, values in results.items()}
    print(f"medians over {len(results['boot_first_step'])} rounds (seconds):")
    for name, value in m.items():
        print(f"  {name:18} {value:7.2f}   samples {[round(v, 2) for v in results[name]]}")
    print("ratios:")
    print(f"  first boot -> first step / floor (download + job to first step): "
          f"{m['boot_first_step'] / m['floor_first_step']:.2f}x   (target <= 1.5x)")
    print(f"  first boot -> first step / (download + python importing tensorflow): "
          f"{m['boot_first_step'] / m['floor_tf_import']:.2f}x")
    print(f"  reboot -> job launched / first boot -> job launched: "
          f"{m['reboot_launched'] / m['boot_launched']:.1%}   (target <= 10%)")
    print(f"  reboot of a finished job -> decided / first boot -> job launched: "
          f"{m['reboot_finished'] / m['boot_launched']:.1%}   (target <= 10%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tpu-stack-bench-") as tmp:
        report(measure(args.rounds, Path(tmp)))


if __name__ == "__main__":
    main()
