"""The command line: `python -m tpu_training run|synth` (docs/design.md, "The training package").

Exit codes: 0 finished (or already finished); 75 stopped on SIGTERM after saving
a checkpoint; 2 a bad setting or usage, one message on stderr naming it; 1 any
other failure (no TPU with TPU_STACK_STRATEGY=tpu, a TensorFlow error).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from tpu_training.config import MODEL_NAMES, JobConfig, JobConfigError
from tpu_training.stopping import EXIT_STOPPED, StopFlag

EXIT_FAILED = 1
EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    stop = StopFlag().install()  # before TensorFlow loads: a SIGTERM then still saves
    try:
        return args.command(args, stop)
    except JobConfigError as error:
        for key, message in error.problems:
            _error(f"{key}: {message}" if key else message)
        return EXIT_USAGE
    except _OneLineError as error:
        _error(str(error))
        return EXIT_FAILED
    finally:
        stop.uninstall()


class _OneLineError(Exception):
    """A failure worth one line, not a traceback."""


def _run(args: argparse.Namespace, stop: StopFlag) -> int:
    config = JobConfig.from_dict(_load_json(args.config), resolved=True)
    from tpu_training import strategy, train  # TensorFlow loads here, not for --help

    try:
        result = train.run(config, stop=stop)
    except strategy.StrategyError as error:
        raise _OneLineError(str(error)) from error
    return EXIT_STOPPED if result.outcome is train.Outcome.STOPPED else 0


_SYNTH_FLAGS = {"imageSize": "--image-size", "numClasses": "--num-classes"}


def _synth(args: argparse.Namespace, _stop: StopFlag) -> int:
    try:  # the job schema's rules for the model's shape, reported as the flags
        config = JobConfig.from_dict(
            {"model": args.model, "trainData": args.out, "globalBatchSize": 1, "trainSteps": 1,
             "stepsPerExecution": 1, "checkpointEverySteps": 1, "imageSize": args.image_size,
             "numClasses": args.num_classes}, resolved=False)
    except JobConfigError as error:
        raise JobConfigError([(_SYNTH_FLAGS.get(key, key), message)
                              for key, message in error.problems]) from error
    if args.examples < args.shards:
        raise JobConfigError.single(
            "--examples", f"{args.examples} is fewer than --shards ({args.shards}); "
                          "every shard needs a record")
    from tpu_training import models, synth

    result = synth.write_dataset(args.out, models.model_spec(config), examples=args.examples,
                                 shards=args.shards, prefix=args.prefix, seed=args.seed)
    print(f"tpu_training synth wrote {result.examples} examples in {len(result.files)} "
          f"shards: {result.pattern}", flush=True)
    return 0


def _load_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except OSError as error:
        raise JobConfigError.single("--config", f"cannot read {path}: {error.strerror}") from error
    except json.JSONDecodeError as error:
        raise JobConfigError.single("--config", f"{path} is not valid JSON: {error}") from error


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tpu_training", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run a job: train, checkpoint, resume, export")
    run.add_argument("--config", required=True, help="the job config, a JSON file")
    run.set_defaults(command=_run)
    synth = commands.add_parser("synth", help="write a learnable synthetic TFRecord dataset")
    synth.add_argument("--out", required=True, help="directory (local, gs:// or ram://)")
    synth.add_argument("--model", required=True, choices=MODEL_NAMES)
    synth.add_argument("--examples", type=_positive, default=4096)
    synth.add_argument("--shards", type=_positive, default=16)
    synth.add_argument("--image-size", type=_positive, help="resnet models (default 224)")
    synth.add_argument("--num-classes", type=_positive, help="default: the model's")
    synth.add_argument("--prefix", default="train", help="file names: PREFIX-00000-of-00016")
    synth.add_argument("--seed", type=int, default=0)
    synth.set_defaults(command=_synth)
    return parser


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return int(text)


def _error(message: str) -> None:
    print(f"tpu_training: error: {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
