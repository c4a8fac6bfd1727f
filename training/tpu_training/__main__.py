"""The command line: `python -m tpu_training run|synth|convert-checkpoint` (docs/design.md,
"The training package").

Exit codes (tpu_training.exits; docs/design.md, "Exit codes"): 0 finished (or
already finished); 75 stopped on SIGTERM after saving a checkpoint; 76 stopped on
SIGTERM but the stop save failed; 2 a bad setting or usage; 65 records that do not
fit the model, or a published checkpoint that does not (`initCheckpoint`,
`convert-checkpoint`); 66 the training data matches no file yet; 69 no TPU initialised
within the job's retries, at once when another process holds it (after a
`tpu_training tpu_busy holders=<pids or unknown>` line), or storage unavailable; 1 any
other failure. Every
failure is one line on stderr, `tpu_training: error: <message>`.
"""

from __future__ import annotations

from tpu_training.stopping import StopFlag

# Run as `python -m tpu_training`: the stop handler first, before any other import (a
# SIGTERM from the agent during start-up then asks for a save instead of killing the
# process); imported (tests), main() installs it.
_EARLY_STOP = StopFlag().install() if __name__ == "__main__" else None

import argparse  # noqa: E402 (after the stop handler, on purpose)
import faulthandler  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from collections.abc import Sequence  # noqa: E402

from tpu_training import exits, goodput_recording, output  # noqa: E402
from tpu_training.config import (  # noqa: E402
    BERT_MODELS,
    MODEL_NAMES,
    RECORD_FORMATS,
    JobConfig,
    JobConfigError,
    tpu_init_seconds,
)
from tpu_training.goodput import Goodput  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    stop = _EARLY_STOP or StopFlag().install()  # before TensorFlow loads: it still saves
    args = _parser().parse_args(argv)
    try:
        return args.command(args, stop)
    except JobConfigError as error:
        if isinstance(error, exits.NoDataError):
            output.say(f"waiting_for_data pattern={error.pattern}")
        for key, message in error.problems:
            _error(f"{key}: {message}" if key else message)
        return _CONFIG_EXITS.get(type(error), exits.EXIT_USAGE)
    except exits.StopSaveError as error:
        _error(str(error))
        return exits.EXIT_STOP_SAVE_FAILED
    except exits.UnavailableError as error:
        if isinstance(error, exits.TpuBusyError):
            output.say(error.line)
        _error(str(error))
        return exits.EXIT_UNAVAILABLE
    except _OneLineError as error:
        _error(str(error))
        return exits.EXIT_FAILED
    finally:
        stop.uninstall()


_CONFIG_EXITS = {exits.RecordsError: exits.EXIT_DATA, exits.CheckpointError: exits.EXIT_DATA,
                 exits.NoDataError: exits.EXIT_NO_INPUT}


class _OneLineError(Exception):
    """A failure worth one line, not a traceback."""


# The node agent sends this when the job passed a deadline (docs/design.md, "Deadlines"):
# every thread's Python stack goes to stderr, which the agent keeps in job.log.
STACKS_SIGNAL = signal.SIGUSR1


def announce_start(stop: StopFlag) -> None:
    """Dump every thread's stack on STACKS_SIGNAL, from now on, and say so with the bound
    on TPU initialisation (`started`, the job's first line); `stop.guard` keeps that
    handler and SIGPIPE's "ignore" (train.py puts them back when TensorFlow or libtpu
    replaced them: a default SIGPIPE would kill the job at a write to a pipe without a
    reader, tpu_training.output). faulthandler's handler is C
    code that writes without the GIL, so it answers while the main thread is blocked in
    TensorFlow (a read that never returns); docs.python.org/3/library/faulthandler.html,
    `register(signum, file, all_threads=True)`. It writes to the process's own stderr
    (file descriptor 2), which the agent keeps in job.log; with none, `stacks` is left
    out and the agent sends no signal; without a valid bound, `tpu_init_seconds` is left
    out and the agent assumes the default."""
    stacks = ""
    try:
        _register_stacks(STACKS_SIGNAL)
        stop.guard.keep(STACKS_SIGNAL, _register_stacks_again)
        stacks = f" stacks={STACKS_SIGNAL.name}"
    except (AttributeError, OSError, RuntimeError, ValueError):
        pass  # no stderr with a file descriptor (sys.__stderr__ is None or has no fileno)
    if signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN:  # as Python sets it at start
        stop.guard.keep(signal.SIGPIPE, lambda signum: signal.signal(signum, signal.SIG_IGN),
                        python_handler=signal.SIG_IGN)
    try:  # a bad value is the strategy's error to report, where it is used
        bound = f" tpu_init_seconds={tpu_init_seconds(os.environ):g}"
    except JobConfigError:
        bound = ""
    output.say(f"started{stacks}{bound}")


def _register_stacks(signum: int) -> None:
    faulthandler.register(signum, file=sys.__stderr__, all_threads=True)


def _register_stacks_again(signum: int) -> None:
    """Install faulthandler's handler again (unregister first: register alone keeps a
    registration it thinks in place, tpu_training.stopping), the signal blocked between
    the two so that it cannot meet the default action (which ends the process)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
    try:
        faulthandler.unregister(signum)
        _register_stacks(signum)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})


def _run(args: argparse.Namespace, stop: StopFlag) -> int:
    goodput = Goodput()  # TensorFlow's import is program start-up
    announce_start(stop)
    config = JobConfig.from_dict(_load_json(args.config), resolved=True)
    goodput_recording.start_recording(config, goodput)  # Google's goodput, if asked for
    # Its uploaders are processes forked here, before TensorFlow loads and starts threads.
    monitor = goodput_recording.start_monitoring(config)  # and its upload to Monitoring
    from tpu_training import strategy, train  # TensorFlow loads here, not for --help
    from tpu_training.tf_env import tf

    try:
        result = train.run(config, stop=stop, goodput=goodput)
    except strategy.TpuUnavailableError:
        raise
    except strategy.StrategyError as error:
        raise _OneLineError(str(error)) from error
    except tf.errors.UnavailableError as error:
        # TF's GCS filesystem answers a 5xx (after its own retries) as UNAVAILABLE
        # (tsl/platform/cloud/curl_http_request.cc, CurlHttpRequest::Send).
        raise exits.UnavailableError(f"storage unavailable: {error.message}") from error
    finally:
        # The last upload (at most 10 s an uploader), not on a stop: the notice is the save's.
        goodput_recording.stop_monitoring(monitor, final=not stop.requested)
    if result.outcome is train.Outcome.STOPPED:
        return exits.EXIT_STOPPED
    return exits.EXIT_FINISHED


_SYNTH_FLAGS = {"imageSize": "--image-size", "numClasses": "--num-classes",
                "recordFormat": "--format", "maxSeqLength": "--max-seq-length",
                "maxPredictionsPerSeq": "--max-predictions-per-seq", "vocabSize": "--vocab-size"}


def _synth(args: argparse.Namespace, _stop: StopFlag) -> int:
    try:  # the job schema's rules for the model's shape, reported as the flags
        config = JobConfig.from_dict(
            {"model": args.model, "trainData": args.out, "globalBatchSize": 1, "trainSteps": 1,
             "stepsPerExecution": 1, "checkpointEverySteps": 1, "imageSize": args.image_size,
             "numClasses": args.num_classes, "recordFormat": args.format,
             "maxSeqLength": args.max_seq_length,
             "maxPredictionsPerSeq": args.max_predictions_per_seq,
             "vocabSize": args.vocab_size}, resolved=False)
    except JobConfigError as error:
        raise JobConfigError([(_SYNTH_FLAGS.get(key, key), message)
                              for key, message in error.problems]) from error
    if args.examples < args.shards:
        raise JobConfigError.single(
            "--examples", f"{args.examples} is fewer than --shards ({args.shards}); "
                          "every shard needs a record")
    from tpu_training import models, synth

    if config.is_bert and config.vocabSize < synth.MIN_BERT_VOCAB:
        raise JobConfigError.single("--vocab-size", f"{config.vocabSize} is fewer than the "
                                                    f"{synth.MIN_BERT_VOCAB} synth needs (BERT's "
                                                    "special tokens are ids 0 to 103)")

    result = synth.write_dataset(args.out, models.model_spec(config), examples=args.examples,
                                 shards=args.shards, prefix=args.prefix, seed=args.seed,
                                 record_format=config.recordFormat)
    output.say(f"synth wrote {result.examples} examples in {len(result.files)} shards: "
               f"{result.pattern}")
    return 0


def _convert(args: argparse.Namespace, _stop: StopFlag) -> int:
    """Write the TF Hub encoder export of a published BERT checkpoint, without training."""
    from tpu_training import bert

    spec = bert.published_spec(args.src, args.model, source="SRC")
    bert.export_published(args.src, spec, args.out, source="SRC")
    output.say(f"converted model={args.model} vocab={spec.vocab_size} "
               f"export={args.out}")
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
    synth.add_argument("--format", choices=RECORD_FORMATS,
                       help="raw pixels (image models' default), imagenet (JPEG, "
                            "imagenet_to_gcs.py's schema), or bert_pretraining (BERT models' "
                            "default and only format: create_pretraining_data.py's schema)")
    synth.add_argument("--examples", type=_positive, default=4096)
    synth.add_argument("--shards", type=_positive, default=16)
    synth.add_argument("--image-size", type=_positive, help="resnet models (default 224)")
    synth.add_argument("--num-classes", type=_positive, help="default: the model's")
    synth.add_argument("--max-seq-length", type=_positive, help="BERT (default 128)")
    synth.add_argument("--max-predictions-per-seq", type=_positive, help="BERT (default 20)")
    synth.add_argument("--vocab-size", type=_positive, help="BERT (default 30522)")
    synth.add_argument("--prefix", default="train", help="file names: PREFIX-00000-of-00016")
    synth.add_argument("--seed", type=int, default=0)
    synth.set_defaults(command=_synth)
    convert = commands.add_parser(
        "convert-checkpoint", help="write the TF Hub encoder export of a google-research/bert "
                                   "(TF1) or tensorflow/models (TF2) BERT checkpoint")
    convert.add_argument("src", metavar="SRC", help="the checkpoint's prefix, e.g. "
                                                    "uncased_L-12_H-768_A-12/bert_model.ckpt")
    convert.add_argument("--model", required=True, choices=BERT_MODELS,
                         help="the size the checkpoint has (its vocabulary is read from it)")
    convert.add_argument("--out", required=True, help="the export directory (local or gs://)")
    convert.set_defaults(command=_convert)
    return parser


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return int(text)


def _error(message: str) -> None:
    output.tell(f"error: {message}")


if __name__ == "__main__":
    output.follow_reader()  # the job outlives its agent (tpu_training.output)
    sys.exit(main())
