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
import re
from collections.abc import Mapping
from typing import Any

# The models the package knows; `tpu_training.models` builds them (with TensorFlow).
MODEL_NAMES: tuple[str, ...] = ("mnist_cnn", "resnet18", "resnet50")

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
# `imagenet`, JPEG Examples as tensorflow/tpu's imagenet_to_gcs.py writes them.
RECORD_FORMATS: tuple[str, ...] = ("raw", "imagenet")
# The models that can read each non-raw format (every model reads raw records).
IMAGENET_MODELS: tuple[str, ...] = ("resnet18", "resnet50")

# Keys the infra side fills in when it resolves a stack job for a node.
LOCATION_KEYS: tuple[str, ...] = ("checkpointDir", "exportDir", "tensorboardDir")
# Keys only a resolved job has: its locations, the node's stop notice, and the slice's
# peak bf16 FLOPs per second (components/catalog.py) for the job's MFU (tpu_training.perf).
NODE_KEYS: tuple[str, ...] = (*LOCATION_KEYS, "noticeSeconds", "peakFlopsPerSecond")

# The time between two stop checks (one execution) may use this share of the node's
# stop notice (`noticeSeconds`); the stop save may use half of it (components/catalog.py,
# STOP_SAVE_SHARE_OF_NOTICE); the rest is the agent noticing, the exit and the OS.
EXECUTION_SHARE_OF_NOTICE = 0.25
# A save every minute by default: a kill loses about half of it. Saves are asynchronous
# (tpu_training.train), so training waits only for the copy of the weights to the host.
DEFAULT_CHECKPOINT_EVERY_MINUTES = 1.0

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
    learningRate: float | None = None
    warmupSteps: int | None = None
    imageSize: int | None = None
    numClasses: int | None = None
    widthMultiplier: float | None = None
    recordFormat: str = "raw"
    checkpointDir: str | None = None
    exportDir: str | None = None
    tensorboardDir: str | None = None
    noticeSeconds: float | None = None  # the node's stop notice; bounds an execution
    peakFlopsPerSecond: float | None = None  # the slice's peak: the perf line's MFU
    # The node agent's deadline for every phase after TPU initialisation (docs/design.md,
    # "Deadlines"); the job itself does not read it.
    progressDeadlineSeconds: float | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, resolved: bool = True) -> JobConfig:
        """Check `data` and build the config; `resolved=False` for a stack job."""
        problems = _problems(data, resolved=resolved)
        if problems:
            raise JobConfigError(problems)
        # None means "the default" for every key, also for those whose default is not None.
        return cls(**{key: value for key, value in data.items() if value is not None})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def resolve(self, *, data_root: str, checkpoint_dir: str, export_dir: str,
                tensorboard_dir: str, notice_seconds: float | None = None,
                peak_flops_per_second: float | None = None) -> JobConfig:
        """The node's job: data made absolute under `data_root`, locations, the
        node's stop notice and its slice's peak FLOPs per second set."""
        return dataclasses.replace(
            self,
            trainData=absolute(self.trainData, data_root),
            evalData=None if self.evalData is None else absolute(self.evalData, data_root),
            checkpointDir=checkpoint_dir,
            exportDir=export_dir,
            tensorboardDir=tensorboard_dir,
            noticeSeconds=notice_seconds,
            peakFlopsPerSecond=peak_flops_per_second,
        )

    @property
    def max_execution_seconds(self) -> float | None:
        """How long one execution may take, so that it and the stop save fit the notice."""
        if self.noticeSeconds is None:
            return None
        return self.noticeSeconds * EXECUTION_SHARE_OF_NOTICE


def checkpoint_bytes(job: JobConfig) -> int:
    """About how many bytes one checkpoint of `job` writes (CHECKPOINT_TRUNK_BYTES)."""
    width = job.widthMultiplier or 1.0
    classes = job.numClasses or DEFAULT_CLASSES[job.model]
    features = max(1, round(HEAD_FEATURES[job.model] * width))
    return round(CHECKPOINT_TRUNK_BYTES[job.model] * width**2) + (features + 1) * classes * 8


def train_flops_per_example(job: JobConfig) -> float:
    """About how many FLOPs one training example of `job` takes (FORWARD_MACS)."""
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
         "warmupSteps", "imageSize", "numClasses")
_NUMBERS = ("learningRate", "widthMultiplier", "checkpointEveryMinutes", "noticeSeconds",
            "peakFlopsPerSecond", "progressDeadlineSeconds")
# Below this a deadline would mostly catch a busy host (a checkpoint write, a pause),
# not a hang; the agent's tests shorten deadlines through its environment instead.
MIN_PROGRESS_DEADLINE_SECONDS = 10.0
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
        elif not isinstance(value, str) or not value:
            problems.append((key, f"must be a non-empty string, got {value!r}"))
    return problems


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
    notice = data.get("noticeSeconds")
    if notice is not None and not 0 < notice < float("inf"):
        problems.append(("noticeSeconds", f"must be a number of seconds more than 0, got {notice}"))
    peak = data.get("peakFlopsPerSecond")
    if peak is not None and not 0 < peak < float("inf"):
        problems.append(("peakFlopsPerSecond", f"must be a number of FLOPs per second more "
                                               f"than 0, got {peak}"))
    deadline = data.get("progressDeadlineSeconds")
    if deadline is not None and not MIN_PROGRESS_DEADLINE_SECONDS <= deadline < float("inf"):
        problems.append(("progressDeadlineSeconds",
                         f"must be a number of seconds of at least "
                         f"{MIN_PROGRESS_DEADLINE_SECONDS:g}, got {deadline}"))
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
DATA_KEYS: tuple[str, ...] = ("trainData", "evalData")
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
