"""`python -m tpu_training run --config FILE`, standing in for the real job.

TensorFlow loads `TF_PLUGGABLE_DEVICE_LIBRARY_PATH` at import and raises when it
is not a loadable plugin (tensorflow/__init__.py, load_pluggable_device_library),
and a CPU never fails TPU initialisation transiently, so the agent's tests use
this job for those two cases. The config's `standIn` picks the behaviour:

- `environment`: write the job's environment as JSON to `out`, then finish.
- `flaky`: exit 69 (TPU initialisation failed) the first `failures` runs, counting
  runs in `out`, then train to step 8 and finish.
"""

import json
import os
import sys
from pathlib import Path


def main() -> int:
    config = json.loads(Path(sys.argv[sys.argv.index("--config") + 1]).read_text())
    out = Path(config["out"])
    if config["standIn"] == "environment":
        out.write_text(json.dumps(dict(os.environ)))
        print("tpu_training step=1 loss=0.5", flush=True)
        return 0
    runs = int(out.read_text()) if out.exists() else 0
    out.write_text(str(runs + 1))
    if runs < config["failures"]:
        print("tpu_training: error: TPU 'local' did not initialise: UnavailableError: "
              "TPU in use", file=sys.stderr, flush=True)
        return 69
    print("tpu_training step=8 loss=0.1", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
