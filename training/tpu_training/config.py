"""The job config: one schema for the stack (`tpu-stack:jobs`) and the node.

Standard library only. The TPU VM runs this module with nothing but the image's
Python and TensorFlow, and the infra side imports the same module to check
`tpu-stack:jobs` at preview time, so the schema lives once (docs/design.md, "The
training package").

A stack job names its data relative to the data bucket (or as a `gs://` URI)
and has no locations; the node's job is the same job with every location
resolved. `JobConfig.from_dict(data, resolved=...)` checks either form and
raises one `JobConfigError` listing every problem with its key.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

# The models the package knows; `tpu_training.models` builds the image models and
# `tpu_training.bert` the BERT encoders (with TensorFlow).
IMAGE_MODELS: tuple[str, ...] = ("mnist_cnn", "resnet18", "resnet50")
# BERT at the sizes google-research/bert publishes (README.md, "BERT-Tiny" ... and the
# BERT-Base and BERT-Large checkpoints): layers L and hidden size H; H / 64 attention
# heads and a 4H feed-forward layer (the README: "all ... have H/64 attention heads"
# and "a feed-forward/filter size of 4H"; modeling.py BertConfig).
BERT_SIZES: dict[str, tuple[int, int]] = {
    "bert_tiny": (2, 128), "bert_mini": (4, 256), "bert_small": (4, 512),
    "bert_medium": (8, 512), "bert_base": (12, 768), "bert_large": (24, 1024),
}
BERT_MODELS: tuple[str, ...] = tuple(BERT_SIZES)
MODEL_NAMES: tuple[str, ...] = (*IMAGE_MODELS, *BERT_MODELS)
# google-research/bert modeling.py BertConfig: max_position_embeddings 512,
# type_vocab_size 2 (bert_config.json of every published checkpoint).
BERT_MAX_POSITIONS = 512
BERT_TYPE_VOCAB = 2
BERT_HEAD_SIZE = 64
# The job keys of BERT and their defaults (run_pretraining.py: max_seq_length 128,
# max_predictions_per_seq 20; the uncased WordPiece vocabulary has 30522 entries).
BERT_DEFAULTS = {"maxSeqLength": 128, "maxPredictionsPerSeq": 20, "vocabSize": 30522}

# The bytes of a checkpoint (float32 weights and SGD momentum, step), so the preview
# can tell whether a stop save fits a node's notice without TensorFlow: the trunk at
# widthMultiplier 1 (it scales about with width squared; the resnets' trunk does not
# depend on imageSize, global pooling precedes the head), and the head's input
# features and default classes (exact: (features + 1) x classes x 8 bytes).
# Measured with TF 2.18; training/tests/test_checkpoint_size.py holds the real
# checkpoints to them.
CHECKPOINT_TRUNK_BYTES = {"mnist_cnn": 307_000_738, "resnet18": 89_485_319,
                          "resnet50": 188_367_263}
HEAD_FEATURES = {"mnist_cnn": 128, "resnet18": 512, "resnet50": 2048}
# Multiply-adds of one forward pass at widthMultiplier 1 (resnets at imageSize 224; both
# scale about with width squared, the resnets' with the image's area), counted over the
# Conv2D and Dense layers of tpu_training.models (TF 2.18); a training step is about
# three forward passes of two FLOPs per multiply-add. The preview's step-time estimate.
FORWARD_MACS = {"mnist_cnn": 379_078_912, "resnet18": 1_814_073_344, "resnet50": 4_089_184_256}
DEFAULT_CLASSES = {"mnist_cnn": 10, "resnet18": 1000, "resnet50": 1000}

# How records are laid out (`tpu_training.data`): `raw`, the package's own uint8 pixels;
# `imagenet`, JPEG Examples as tensorflow/tpu's imagenet_to_gcs.py writes them;
# `bert_pretraining`, google-research/bert create_pretraining_data.py's Examples.
RECORD_FORMATS: tuple[str, ...] = ("raw", "imagenet", "bert_pretraining")
# The models that can read each non-raw format (every model reads raw records).
IMAGENET_MODELS: tuple[str, ...] = ("resnet18", "resnet50")

# Keys the infra side fills in when it resolves a stack job for a node.
LOCATION_KEYS: tuple[str, ...] = ("checkpointDir", "exportDir", "tensorboardDir")
# Keys only a resolved job has: its locations, the node's stop notice, and the slice's
# peak bf16 FLOPs per second (components/catalog.py) for the job's MFU (tpu_training.perf).
NODE_KEYS: tuple[str, ...] = (*LOCATION_KEYS, "noticeSeconds", "peakFlopsPerSecond",
                              "mtbfSeconds")

# The time between two stop checks (one execution) may use this share of the node's
# stop notice (`noticeSeconds`); the stop save may use half of it (components/catalog.py,
# STOP_SAVE_SHARE_OF_NOTICE); the rest is the agent noticing, the exit and the OS.
EXECUTION_SHARE_OF_NOTICE = 0.25
# A save every minute by default: a kill loses about half of it. Saves are asynchronous
# (tpu_training.train), so training waits only for the copy of the weights to the host.
DEFAULT_CHECKPOINT_EVERY_MINUTES = 1.0
# `checkpointEvery: auto`: the time between interval saves that loses least, Young's
# first-order optimum (J. W. Young, "A first order approximation to the optimum
# checkpoint interval", CACM 17(9), 1974; Daly, "A higher order estimate of the optimum
# checkpoint interval for restart dumps", FGCS 22(3), 2006, gives the same first term):
# sqrt(2 x the time a save costs training x the mean time between disruptions). The
# job measures the save's cost (what training waited for an interval save) and takes
# the node's mean time between disruptions from the resolved job (`mtbfSeconds`,
# components/catalog.py); never shorter than one save's write, so a save never waits
# for the last one and a stop waits for at most one write (the stop budget's
# assumption, components/stop_save.py). A new estimate is printed when it moves by
# more than this share.
AUTO_CHECKPOINT = "auto"
AUTO_INTERVAL_CHANGE = 0.25

# Where a location may point: GCS on the VM; local folders and TF's in-memory
# filesystem off it (TF's gs:// filesystem cannot be pointed at an emulator).
REMOTE_SCHEMES: tuple[str, ...] = ("gs://",)
LOCAL_SCHEMES: tuple[str, ...] = ("ram://",)

# With TPU_STACK_STRATEGY=tpu the job retries TPU initialisation this long, then exits 69
# (tpu_training.strategy); it announces the bound on its `started` line, and the node
# agent's deadline for start-up and TPU initialisation is derived from it.
TPU_INIT_SECONDS_ENV = "TPU_STACK_TPU_INIT_SECONDS"
DEFAULT_TPU_INIT_SECONDS = 300.0


class JobConfigError(ValueError):
    """Every problem of one job config, each as (key, what is wrong and allowed)."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{key}: {message}" for key, message in problems))

    @classmethod
    def single(cls, key: str, message: str) -> JobConfigError:
        """The error of one setting, `key`, and what is wrong with it."""
        return cls([(key, message)])


@dataclasses.dataclass(frozen=True)
class JobConfig:
    model: str
    trainData: str
    globalBatchSize: int
    trainSteps: int
    evalData: str | None = None
    stepsPerExecution: int = 100
    checkpointEverySteps: int = 1000
    # Also save when this much time has passed since the last save.
    checkpointEveryMinutes: float = DEFAULT_CHECKPOINT_EVERY_MINUTES
    # `auto`: the time interval is Young/Daly's (checkpoint_interval) once an interval save
    # has been measured; checkpointEveryMinutes until then.
    checkpointEvery: str | None = None
    learningRate: float | None = None
    warmupSteps: int | None = None
    imageSize: int | None = None
    numClasses: int | None = None
    widthMultiplier: float | None = None
    recordFormat: str = "raw"  # bert_pretraining for a BERT model (from_dict sets it)
    maxSeqLength: int | None = None
    maxPredictionsPerSeq: int | None = None
    vocabSize: int | None = None
    # A published BERT checkpoint (google-research/bert TF1 or tensorflow/models TF2
    # encoder) the job starts from when it has no checkpoint of its own (bert_checkpoint).
    initCheckpoint: str | None = None
    checkpointDir: str | None = None
    exportDir: str | None = None
    tensorboardDir: str | None = None
    noticeSeconds: float | None = None  # the node's stop notice; bounds an execution
    peakFlopsPerSecond: float | None = None  # the slice's peak: the perf line's MFU
    mtbfSeconds: float | None = None  # the node's mean time between disruptions (catalog)
    # The node agent's deadline for every phase after TPU initialisation (docs/design.md,
    # "Deadlines"); the job itself does not read it.
    progressDeadlineSeconds: float | None = None
    # Also record the job's phases with ml-goodput-measurement in Cloud Logging
    # (tpu_training.goodput_recording); off by default, optional at run time.
    goodputRecording: bool | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, resolved: bool = True) -> JobConfig:
        """Check `data` and build the config; `resolved=False` for a stack job."""
        problems = _problems(data, resolved=resolved)
        if problems:
            raise JobConfigError(problems)
        # None means "the default" for every key, also for those whose default is not None.
        given = {key: value for key, value in data.items() if value is not None}
        if given["model"] in BERT_MODELS:
            given = {"recordFormat": "bert_pretraining", **BERT_DEFAULTS, **given}
        return cls(**given)

    def to_dict(self) -> dict[str, Any]:
        """Every key, but `goodputRecording` only when set: a job without it keeps the
        release content (and its digest) it had before the key existed."""
        data = dataclasses.asdict(self)
        if data["goodputRecording"] is None:
            del data["goodputRecording"]
        return data

    def resolve(self, *, data_root: str, checkpoint_dir: str, export_dir: str,
                tensorboard_dir: str, notice_seconds: float | None = None,
                peak_flops_per_second: float | None = None,
                mtbf_seconds: float | None = None) -> JobConfig:
        """The node's job: data made absolute under `data_root`, locations, the
        node's stop notice and its slice's peak FLOPs per second set."""
        return dataclasses.replace(
            self,
            trainData=absolute(self.trainData, data_root),
            evalData=None if self.evalData is None else absolute(self.evalData, data_root),
            initCheckpoint=(None if self.initCheckpoint is None
                            else absolute(self.initCheckpoint, data_root)),
            checkpointDir=checkpoint_dir,
            exportDir=export_dir,
            tensorboardDir=tensorboard_dir,
            noticeSeconds=notice_seconds,
            peakFlopsPerSecond=peak_flops_per_second,
            mtbfSeconds=mtbf_seconds,
        )

    @property
    def is_bert(self) -> bool:
        return self.model in BERT_MODELS

    @property
    def max_execution_seconds(self) -> float | None:
        """How long one execution may take, so that it and the stop save fit the notice."""
        if self.noticeSeconds is None:
            return None
        return self.noticeSeconds * EXECUTION_SHARE_OF_NOTICE


@dataclasses.dataclass(frozen=True)
class CheckpointInterval:
    """The time between interval saves `checkpointEvery: auto` chose, and why."""

    seconds: float
    save_cost: float  # seconds training waited for an interval save
    mtbf: float  # the node's mean seconds between disruptions
    reason: str  # young_daly, or write_bound: the save's write took longer

    def line(self) -> str:
        """The job's `checkpoint_interval` line (without the `tpu_training ` prefix)."""
        return (f"checkpoint_interval seconds={self.seconds:.1f} save_cost={self.save_cost:.3f} "
                f"mtbf={self.mtbf:.0f} reason={self.reason}")


def checkpoint_interval(save_cost: float, mtbf: float, write_seconds: float
                        ) -> CheckpointInterval:
    """Young/Daly's interval, sqrt(2 x save_cost x mtbf), at least one save's write."""
    optimal = math.sqrt(2 * max(save_cost, 0.0) * mtbf)
    if optimal < write_seconds:
        return CheckpointInterval(write_seconds, save_cost, mtbf, "write_bound")
    return CheckpointInterval(optimal, save_cost, mtbf, "young_daly")


def checkpoint_bytes(job: JobConfig) -> int:
    """About how many bytes one checkpoint of `job` writes (CHECKPOINT_TRUNK_BYTES; BERT:
    its weights and AdamW's or LAMB's two moments, float32)."""
    if job.is_bert:
        return BERT_CHECKPOINT_BYTES_PER_PARAMETER * bert_parameters(job)
    width = job.widthMultiplier or 1.0
    classes = job.numClasses or DEFAULT_CLASSES[job.model]
    features = max(1, round(HEAD_FEATURES[job.model] * width))
    return round(CHECKPOINT_TRUNK_BYTES[job.model] * width**2) + (features + 1) * classes * 8


def train_flops_per_example(job: JobConfig) -> float:
    """About how many FLOPs one training example of `job` takes (FORWARD_MACS; BERT:
    `bert_forward_macs`)."""
    if job.is_bert:
        return 6 * bert_forward_macs(job)
    width = job.widthMultiplier or 1.0
    area = 1.0 if job.model == "mnist_cnn" else ((job.imageSize or 224) / 224) ** 2
    return 6 * FORWARD_MACS[job.model] * width**2 * area


def tpu_init_seconds(environ: Mapping[str, str]) -> float:
    """How long the job retries TPU initialisation: `TPU_STACK_TPU_INIT_SECONDS`, else
    the default; a bad value is one JobConfigError naming the variable."""
    text = environ.get(TPU_INIT_SECONDS_ENV)
    if text is None:
        return DEFAULT_TPU_INIT_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise JobConfigError.single(
            TPU_INIT_SECONDS_ENV, f"must be a number of seconds, 0 or more, got {text!r}")
    return seconds


# ---- BERT's sizes, in the layout of tpu_training.bert --------------------------------
# A checkpoint holds each weight and the optimizer's two moments, float32 (the step is
# a few bytes); training/tests/test_bert.py holds it to the real checkpoint.
BERT_CHECKPOINT_BYTES_PER_PARAMETER = 12
# Mixed-precision Adam keeps 16 bytes per parameter on the device: float32 weights,
# gradients and two moments (Rajbhandari et al. 2019, "ZeRO", section 3.1: 2 + 2 + 12
# bytes with half-precision weights and gradients; Keras' mixed_bfloat16 keeps float32
# variables and casts them per step).
BERT_DEVICE_BYTES_PER_PARAMETER = 16
# Activations kept for the backward pass, per transformer layer and token, in units of
# the hidden size: 34 bytes with 16-bit activations when the attention scores are
# recomputed (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
# Transformer Models", section 4.1 and 5, "selective activation recomputation":
# sbh(34 + 5as/h) without it, 34sbh with it). The smaller figure, so that a batch refused
# for it cannot fit however XLA rematerialises the scores.
BERT_ACTIVATION_BYTES_PER_TOKEN_AND_HIDDEN = 34
# The masked-LM logits of every prediction (float32) and their gradient.
BERT_LOGIT_BYTES = 8
# google-research/bert trains with AdamW at a global batch of 256 and a peak of 1e-4
# (README: "batch size of 256 ... learning rate of 1e-4"; paper section A.2); it gives no
# rule for other batches, so AdamW keeps that rate (learningRate overrides it). Larger
# batches take LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning:
# Training BERT in 76 minutes", which trains BERT at batches of 512 to 65536); the
# switch point is this package's choice: where the LAMB paper's Table 4 leaves Adam's
# batches behind.
BERT_BASE_LEARNING_RATE = 1e-4
LAMB_MIN_GLOBAL_BATCH = 8192
# LAMB's untuned recipe (the paper's Table 4, "Untuned LAMB for BERT training across
# different batch sizes": the square-root scaling and warm-up from a peak of 5/(2^0 x
# 10^3) = 5e-3 with a warm-up ratio of 1/5 at 32K, halving the batch dividing the rate by
# sqrt(2) and the ratio by 2, down to 5/(2^3 x 10^3) and 1/320 at 512). Unconfirmed:
# the table could not be read through this repository's search tools; the figures are
# the paper's as its authors' recipe is commonly given, to be checked against arXiv
# 1904.00962 v5 before relying on them.
LAMB_REFERENCE_BATCH = 32768
LAMB_REFERENCE_LEARNING_RATE = 5e-3
LAMB_REFERENCE_WARMUP_RATIO = 1 / 5
# run_pretraining.py: num_warmup_steps 10000 of num_train_steps 100000; an AdamW job
# warms up over a tenth of a run that short, up to that many steps.
ADAMW_MAX_WARMUP_STEPS = 10_000
ADAMW_WARMUP_SHARE = 0.1
# optimization.py create_optimizer: gradients clipped to a global norm of 1.0, weight
# decay 0.01 (AdamWeightDecayOptimizer's weight_decay_rate); LAMB takes the same (the
# paper's section 4 defaults, and tensorflow/models' lamb.py).
BERT_CLIP_NORM = 1.0
BERT_WEIGHT_DECAY = 0.01
# Image models: 0.1 per 256 examples (Goyal et al. 2017, "Accurate, Large Minibatch SGD"),
# SGD with Nesterov momentum, a warm-up of a tenth of the run up to 1000 steps and a
# cosine decay; no clipping, no weight decay (tpu_training.models).
IMAGE_BASE_LEARNING_RATE = 0.1
IMAGE_MAX_WARMUP_STEPS = 1000
# The batch a model's base learning rate is given for.
BASE_LEARNING_RATE_BATCH = 256


@dataclasses.dataclass(frozen=True)
class Recipe:
    """The learning rate and optimizer a job trains with, resolved from its keys."""

    optimizer: str  # sgd, adamw or lamb
    peak_learning_rate: float
    warmup_steps: int  # a linear warm-up from 0 over this many steps
    decay: str  # cosine or linear, to 0 at trainSteps
    clip_norm: float | None  # the gradients' global norm is clipped to this
    weight_decay: float | None  # decoupled, not on LayerNorm or biases

    def line(self) -> str:
        """The job's `recipe` line (without the `tpu_training ` prefix)."""
        return (f"recipe optimizer={self.optimizer} "
                f"peak_learning_rate={self.peak_learning_rate:.6g} "
                f"warmup_steps={self.warmup_steps} decay={self.decay} "
                f"clip_norm={_or_none(self.clip_norm)} weight_decay={_or_none(self.weight_decay)}")


def recipe(job: JobConfig) -> Recipe:
    """The recipe of `job` (the job prints it at start; the plan shows it per job).

    Image models: `learningRate` (default 0.1) per 256 examples, scaled linearly with
    globalBatchSize (Goyal et al. 2017). BERT: `learningRate` when set is the peak as is;
    else AdamW's 1e-4 (google-research/bert), or LAMB's Table 4 rate for the batch,
    5e-3 x sqrt(globalBatchSize / 32768), with Table 4's warm-up ratio; `warmupSteps`
    overrides the warm-up.
    """
    name = optimizer_name(job)
    if name == "sgd":
        base = job.learningRate if job.learningRate is not None else IMAGE_BASE_LEARNING_RATE
        warmup = min(IMAGE_MAX_WARMUP_STEPS, job.trainSteps // 10)
        return Recipe(name, scaled_learning_rate(job, base), _warmup(job, warmup), "cosine",
                      None, None)
    if name == "lamb":
        ratio = job.globalBatchSize / LAMB_REFERENCE_BATCH
        peak = LAMB_REFERENCE_LEARNING_RATE * math.sqrt(ratio)
        warmup = round(job.trainSteps * min(1.0, LAMB_REFERENCE_WARMUP_RATIO * ratio))
    else:
        peak = BERT_BASE_LEARNING_RATE
        warmup = min(ADAMW_MAX_WARMUP_STEPS, int(job.trainSteps * ADAMW_WARMUP_SHARE))
    if job.learningRate is not None:
        peak = job.learningRate
    return Recipe(name, peak, _warmup(job, warmup), "linear", BERT_CLIP_NORM, BERT_WEIGHT_DECAY)


def _warmup(job: JobConfig, default: int) -> int:
    return job.warmupSteps if job.warmupSteps is not None else default


def _or_none(value: float | None) -> str:
    return "none" if value is None else f"{value:g}"


def bert_shape(job: JobConfig) -> tuple[int, int, int, int, int, int]:
    """(layers, hidden, heads, sequence, predictions, vocabulary) of a BERT job."""
    layers, hidden = BERT_SIZES[job.model]
    return (layers, hidden, hidden // BERT_HEAD_SIZE,
            job.maxSeqLength or BERT_DEFAULTS["maxSeqLength"],
            job.maxPredictionsPerSeq or BERT_DEFAULTS["maxPredictionsPerSeq"],
            job.vocabSize or BERT_DEFAULTS["vocabSize"])


def bert_parameters(job: JobConfig) -> int:
    """The trainable weights of the encoder and its pre-training heads (tpu_training.bert):
    embeddings, per layer 12H^2 + 13H, the pooler, the masked-LM transform and output
    bias (its weights are the word embeddings), the next-sentence layer."""
    layers, hidden, _, _, _, vocab = bert_shape(job)
    embeddings = (vocab + BERT_MAX_POSITIONS + BERT_TYPE_VOCAB) * hidden + 2 * hidden
    per_layer = 12 * hidden**2 + 13 * hidden
    heads = (hidden**2 + hidden) + (hidden**2 + 3 * hidden + vocab) + (2 * hidden + 2)
    return embeddings + layers * per_layer + heads


def bert_forward_macs(job: JobConfig) -> int:
    """Multiply-adds of one example's forward pass: every token through each layer's
    projections (12H^2) and attention (2SH), the pooler on one token, the masked-LM head
    (H^2 + HV) on each prediction, the next-sentence layer."""
    layers, hidden, _, sequence, predictions, vocab = bert_shape(job)
    encoder = sequence * layers * (12 * hidden**2 + 2 * sequence * hidden)
    return encoder + hidden**2 + predictions * (hidden**2 + hidden * vocab) + 2 * hidden


def train_device_bytes(job: JobConfig, per_replica_batch: int) -> int | None:
    """At least how many bytes of accelerator memory one replica needs to train `job` at
    `per_replica_batch` (None: no estimate for the model; image models have none)."""
    if not job.is_bert:
        return None
    layers, hidden, _, sequence, predictions, vocab = bert_shape(job)
    activations = (layers * sequence * hidden * BERT_ACTIVATION_BYTES_PER_TOKEN_AND_HIDDEN
                   + predictions * vocab * BERT_LOGIT_BYTES)
    return BERT_DEVICE_BYTES_PER_PARAMETER * bert_parameters(job) + per_replica_batch * activations


def scaled_learning_rate(job: JobConfig, base: float) -> float:
    """An image model's peak learning rate for `job`'s globalBatchSize from a `base` given
    for 256: the linear rule (Goyal et al. 2017, "Accurate, Large Minibatch SGD", section
    2.1: "multiply the learning rate by k"), the ResNet recipe."""
    return base * job.globalBatchSize / BASE_LEARNING_RATE_BATCH


def optimizer_name(job: JobConfig) -> str:
    """sgd (momentum, image models), adamw (BERT) or lamb (BERT at large global batches)."""
    if not job.is_bert:
        return "sgd"
    return "lamb" if job.globalBatchSize >= LAMB_MIN_GLOBAL_BATCH else "adamw"


def absolute(path: str, root: str) -> str:
    """`path` as given when it is already absolute, else under `root`."""
    if is_absolute(path):
        return path
    return root.rstrip("/") + "/" + path.lstrip("/")


def is_absolute(path: str) -> bool:
    return path.startswith((*REMOTE_SCHEMES, *LOCAL_SCHEMES, "/"))


_FIELDS = {f.name: f for f in dataclasses.fields(JobConfig)}
_REQUIRED = tuple(name for name, f in _FIELDS.items()
                  if f.default is dataclasses.MISSING)
_INTS = ("globalBatchSize", "trainSteps", "stepsPerExecution", "checkpointEverySteps",
         "warmupSteps", "imageSize", "numClasses", "maxSeqLength", "maxPredictionsPerSeq",
         "vocabSize")
_BOOLS = ("goodputRecording",)
_NUMBERS = ("learningRate", "widthMultiplier", "checkpointEveryMinutes", "noticeSeconds",
            "peakFlopsPerSecond", "progressDeadlineSeconds", "mtbfSeconds")
# Below this a deadline would mostly catch a busy host (a checkpoint write, a pause),
# not a hang; the agent's tests shorten deadlines through its environment instead.
MIN_PROGRESS_DEADLINE_SECONDS = 10.0
# It is also the agent's stop deadline (SIGTERM to SIGKILL), which must end inside the
# unit's TimeoutStopSec (node_agent/bootstrap.sh: 150 s) with room for the agent's own
# exit: the agent's default stop grace, 120 s (docs/design.md, "Deadlines").
MAX_PROGRESS_DEADLINE_SECONDS = 120.0
_MIN_IMAGE_SIZE = 32  # ResNet downsamples by 32 before its pooling layer
_MAX_WIDTH = 4


def _problems(data: Mapping[str, Any], *, resolved: bool) -> list[tuple[str, str]]:
    if not isinstance(data, Mapping):
        return [("", f"must be a mapping of job settings, got {type(data).__name__}")]
    problems: list[tuple[str, str]] = []
    allowed = sorted(_FIELDS) if resolved else sorted(set(_FIELDS) - set(NODE_KEYS))
    for key in data:
        if key not in allowed:
            problems.append((str(key), f"unknown key; allowed: {', '.join(allowed)}"))
    for key in _REQUIRED:
        if data.get(key) is None:
            problems.append((key, "is required"))
    problems += _type_problems(data)
    if problems:
        return problems
    problems += _value_problems(data)
    problems += _scheme_problems(data, resolved=resolved)
    if resolved:
        for key in LOCATION_KEYS:
            if not data.get(key):
                problems.append((key, "is required in a resolved job config"))
    return problems


def _type_problems(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    problems = []
    for key, value in data.items():
        if key not in _FIELDS or value is None:
            continue
        if key in _INTS:
            if isinstance(value, bool) or not isinstance(value, int):
                problems.append((key, f"must be a whole number, got {value!r}"))
        elif key in _NUMBERS:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                problems.append((key, f"must be a number, got {value!r}"))
        elif key in _BOOLS:
            if not isinstance(value, bool):
                problems.append((key, f"must be true or false, got {value!r}"))
        elif not isinstance(value, str) or not value:
            problems.append((key, f"must be a non-empty string, got {value!r}"))
    return problems


def _bert_problems(data: Mapping[str, Any], model: str) -> list[tuple[str, str]]:
    """The BERT keys: only for BERT models, in the ranges the encoder takes."""
    problems = []
    given = [key for key in (*BERT_DEFAULTS, "initCheckpoint") if data.get(key) is not None]
    if model not in BERT_MODELS:
        return [(key, f"applies to BERT models ({', '.join(BERT_MODELS)}), not {model}")
                for key in given if model in MODEL_NAMES]
    for key in ("imageSize", "numClasses", "widthMultiplier"):
        if data.get(key) is not None:
            problems.append((key, f"applies to image models, not {model}"))
    sequence = _setting_or(data, "maxSeqLength")
    if not 2 <= sequence <= BERT_MAX_POSITIONS:
        problems.append(("maxSeqLength", f"must be 2 to {BERT_MAX_POSITIONS} (BERT's position "
                                         f"embeddings), got {sequence}"))
    predictions = _setting_or(data, "maxPredictionsPerSeq")
    if not 1 <= predictions <= max(1, sequence):
        problems.append(("maxPredictionsPerSeq", f"must be 1 to maxSeqLength ({sequence}), "
                                                 f"got {predictions}"))
    vocab = _setting_or(data, "vocabSize")
    if vocab < 2:
        problems.append(("vocabSize", f"must be at least 2, got {vocab}"))
    return problems


def _setting_or(data: Mapping[str, Any], key: str) -> int:
    value = data.get(key)
    return BERT_DEFAULTS[key] if value is None else value


def _value_problems(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    problems = []
    model = data["model"]
    if model not in MODEL_NAMES:
        allowed = ", ".join(MODEL_NAMES)
        problems.append(("model", f"{model!r} is not a known model; allowed: {allowed}"))
    record_format = data.get("recordFormat")
    if record_format is not None and record_format not in RECORD_FORMATS:
        problems.append(("recordFormat", f"{record_format!r} is not a record format; allowed: "
                                         f"{', '.join(RECORD_FORMATS)}"))
    elif record_format == "imagenet" and model in MODEL_NAMES and model not in IMAGENET_MODELS:
        problems.append(("recordFormat", f"imagenet records are RGB photos for "
                                         f"{', '.join(IMAGENET_MODELS)}; {model} reads raw "
                                         "records only"))
    elif model in BERT_MODELS and record_format not in (None, "bert_pretraining"):
        problems.append(("recordFormat", f"{model} reads bert_pretraining records "
                                         "(create_pretraining_data.py's); leave it unset or "
                                         "set bert_pretraining"))
    elif record_format == "bert_pretraining" and model in IMAGE_MODELS:
        problems.append(("recordFormat", f"bert_pretraining records are for "
                                         f"{', '.join(BERT_MODELS)}, not {model}"))
    problems += _bert_problems(data, model)
    for key in ("globalBatchSize", "trainSteps", "stepsPerExecution",
                "checkpointEverySteps", "numClasses"):
        value = data.get(key)
        if value is not None and value < 1:
            problems.append((key, f"must be at least 1, got {value}"))
    warmup = data.get("warmupSteps")
    if warmup is not None and warmup < 0:
        problems.append(("warmupSteps", f"must be 0 or more, got {warmup}"))
    minutes = data.get("checkpointEveryMinutes")
    if minutes is not None and not 0 < minutes < float("inf"):
        problems.append(("checkpointEveryMinutes",
                         f"must be a number of minutes more than 0, got {minutes}"))
    every = data.get("checkpointEvery")
    if every is not None and every != AUTO_CHECKPOINT:
        problems.append(("checkpointEvery", f"must be {AUTO_CHECKPOINT!r} (the interval that "
                                            f"loses least, from the save's cost and the "
                                            f"node's disruptions), got {every!r}; for a fixed "
                                            "interval set checkpointEveryMinutes"))
    mtbf = data.get("mtbfSeconds")
    if mtbf is not None and not 0 < mtbf < float("inf"):
        problems.append(("mtbfSeconds", f"must be a number of seconds more than 0, got {mtbf}"))
    notice = data.get("noticeSeconds")
    if notice is not None and not 0 < notice < float("inf"):
        problems.append(("noticeSeconds", f"must be a number of seconds more than 0, got {notice}"))
    peak = data.get("peakFlopsPerSecond")
    if peak is not None and not 0 < peak < float("inf"):
        problems.append(("peakFlopsPerSecond", f"must be a number of FLOPs per second more "
                                               f"than 0, got {peak}"))
    deadline = data.get("progressDeadlineSeconds")
    if deadline is not None and not (MIN_PROGRESS_DEADLINE_SECONDS <= deadline
                                     <= MAX_PROGRESS_DEADLINE_SECONDS):
        problems.append(("progressDeadlineSeconds",
                         f"must be a number of seconds from {MIN_PROGRESS_DEADLINE_SECONDS:g} "
                         f"to {MAX_PROGRESS_DEADLINE_SECONDS:g} (it also bounds the stop, "
                         f"which must end inside the node's systemd stop timeout; leave it "
                         f"unset for the agent's defaults), got {deadline}"))
    rate = data.get("learningRate")
    if rate is not None and not 0 < rate < 10:
        problems.append(("learningRate", f"must be between 0 and 10 (exclusive), got {rate}"))
    width = data.get("widthMultiplier")
    if width is not None and not 0 < width <= _MAX_WIDTH:
        problems.append(("widthMultiplier", f"must be in (0, {_MAX_WIDTH}], got {width}"))
    image_size = data.get("imageSize")
    if image_size is not None:
        if model == "mnist_cnn":
            problems.append(("imageSize", "applies to resnet models, not mnist_cnn (28x28)"))
        elif image_size < _MIN_IMAGE_SIZE:
            problems.append(("imageSize", f"must be at least {_MIN_IMAGE_SIZE}, got {image_size}"))
    if problems:
        return problems
    steps = data["trainSteps"]
    per_execution = _setting(data, "stepsPerExecution")
    every = _setting(data, "checkpointEverySteps")
    if per_execution > steps:
        problems.append(("stepsPerExecution",
                         f"{per_execution} is more than trainSteps ({steps})"))
    if every % per_execution:
        # Checkpoints are taken between executions, so the interval must be whole ones.
        problems.append(("checkpointEverySteps",
                         f"{every} is not a multiple of stepsPerExecution ({per_execution})"))
    warmup = data.get("warmupSteps")
    if warmup is not None and warmup > steps:
        problems.append(("warmupSteps", f"{warmup} is more than trainSteps ({steps})"))
    return problems


# Keys that name a place to read or write; a stack job has only the data ones.
DATA_KEYS: tuple[str, ...] = ("trainData", "evalData", "initCheckpoint")
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")


def _scheme_problems(data: Mapping[str, Any], *, resolved: bool) -> list[tuple[str, str]]:
    """A location with any scheme but gs:// (s3://, http://, file:, …) is refused:
    it would otherwise be read as a path inside the data bucket. A resolved job
    may also point at the local test schemes (LOCAL_SCHEMES) and plain paths."""
    allowed = (*REMOTE_SCHEMES, *LOCAL_SCHEMES) if resolved else REMOTE_SCHEMES
    problems = []
    for key in (*DATA_KEYS, *LOCATION_KEYS):
        value = data.get(key)
        match = _SCHEME_RE.match(value) if isinstance(value, str) else None
        if match and not value.startswith(allowed):
            where = "gs://bucket/path or a path in the data bucket" if key in DATA_KEYS \
                else "a gs://bucket/path"
            problems.append((key, f"{value!r}: the {match[1]}: scheme is not supported; "
                                  f"give {where} (allowed: {', '.join(allowed)})"))
    return problems


def _setting(data: Mapping[str, Any], key: str) -> Any:
    """`data[key]`, or the field's default when it is absent or None."""
    value = data.get(key)
    return _FIELDS[key].default if value is None else value
