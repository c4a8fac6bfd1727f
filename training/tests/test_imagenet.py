"""recordFormat imagenet: JPEG records in imagenet_to_gcs.py's schema, ResNet preprocessing."""

from __future__ import annotations

import io

import numpy as np
import pytest

from tpu_training import data, models, synth, train
from tpu_training.__main__ import main
from tpu_training.config import JobConfig, JobConfigError
from tpu_training.tf_env import tf

CLASSES = 10
SPEC = models.ModelSpec("resnet18", (32, 32, 3), CLASSES, 0.1)
# What tensorflow/tpu imagenet_to_gcs.py's _convert_to_example writes, and the bounding
# box fields tensorflow/models' parse_example_proto reads.
SCHEMA = {"image/height", "image/width", "image/colorspace", "image/channels",
          "image/class/label", "image/class/synset", "image/format", "image/filename",
          "image/encoded", "image/object/bbox/xmin", "image/object/bbox/xmax",
          "image/object/bbox/ymin", "image/object/bbox/ymax", "image/object/bbox/label"}
SMALL_RESNET_JOB = {"model": "resnet18", "recordFormat": "imagenet", "imageSize": 32,
                    "numClasses": CLASSES, "widthMultiplier": 0.125, "globalBatchSize": 32,
                    "trainSteps": 30, "stepsPerExecution": 5, "checkpointEverySteps": 10,
                    "learningRate": 0.4}


@pytest.fixture(scope="module")
def imagenet_data(strategy, tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("imagenet")
    return synth.write_dataset(str(out), SPEC, examples=512, shards=4,
                               record_format="imagenet").pattern


def examples_of(pattern: str) -> list[tf.train.Example]:
    return [tf.train.Example.FromString(record.numpy())
            for record in tf.data.TFRecordDataset(data.list_files(pattern))]


def test_synth_writes_jpeg_records_of_varied_sizes_in_the_imagenet_schema(imagenet_data):
    examples = examples_of(imagenet_data)
    assert len(examples) == 512
    sizes, labels = set(), []
    for example in examples:
        feature = example.features.feature
        assert set(feature) == SCHEMA
        jpeg = feature["image/encoded"].bytes_list.value[0]
        shape = tuple(tf.io.decode_jpeg(jpeg).shape)
        assert shape == (feature["image/height"].int64_list.value[0],
                         feature["image/width"].int64_list.value[0], 3)
        assert feature["image/format"].bytes_list.value == [b"JPEG"]
        assert feature["image/colorspace"].bytes_list.value == [b"RGB"]
        box = [feature[f"image/object/bbox/{side}"].float_list.value[0]
               for side in ("ymin", "xmin", "ymax", "xmax")]
        assert 0 <= box[0] <= box[2] <= 1 and 0 <= box[1] <= box[3] <= 1
        sizes.add(shape)
        labels.append(feature["image/class/label"].int64_list.value[0])
    assert len(sizes) > 100  # varied, as real photos are
    assert set(labels) == set(range(1, CLASSES + 1))  # the schema's labels start at 1


def test_labels_leave_the_pipeline_from_zero_and_images_at_image_size(imagenet_data):
    files = data.list_files(imagenet_data)
    stored = [example.features.feature["image/class/label"].int64_list.value[0]
              for example in examples_of(files[0])]
    context = tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                         num_replicas_in_sync=1)
    evaluation = data.make_dataset_fn(files[:1], SPEC, 16, training=False,
                                      record_format="imagenet")(context)
    read = np.concatenate([labels.numpy() for _, labels in evaluation])
    assert list(read) == [label - 1 for label in stored[:len(read)]]
    training = data.make_dataset_fn(files, SPEC, 16, record_format="imagenet")(context)
    images, labels = training.element_spec
    assert (images.shape, images.dtype) == ((16, 32 * 32 * 3 // 4), tf.int32)  # packed
    assert (labels.shape, labels.dtype) == ((16,), tf.int32)
    seen = np.concatenate([labels.numpy() for _, labels in training.take(32)])
    assert seen.min() == 0 and seen.max() == CLASSES - 1


def test_training_crops_at_random_and_evaluation_takes_the_centre(imagenet_data):
    record = next(iter(tf.data.TFRecordDataset(data.list_files(imagenet_data))))
    crops = [data.parse_imagenet(record, SPEC, training=True)[0].numpy() for _ in range(4)]
    assert all(crop.shape == (32, 32, 3) and crop.dtype == np.uint8 for crop in crops)
    assert any((crop != crops[0]).any() for crop in crops[1:])
    centres = [data.parse_imagenet(record, SPEC, training=False)[0].numpy() for _ in range(2)]
    assert (centres[0] == centres[1]).all()


def test_the_centre_crop_is_of_the_short_side_resized_to_256_over_224():
    # A 40 x 80 photo: left half black, right half white. Resized to 37 x 74 (32 * 256 /
    # 224 = 36.6, rounded: the short side), the centre 32 x 32 straddles the edge.
    image = np.zeros((40, 80, 3), np.uint8)
    image[:, 40:] = 255
    jpeg = tf.io.encode_jpeg(image, quality=100).numpy()
    record = synth.imagenet_example_bytes(jpeg, 1, 40, 80, np.array([[0, 1], [0, 1]]), "x")
    centre = data.parse_imagenet(tf.constant(record), SPEC, training=False)[0].numpy()
    assert centre.shape == (32, 32, 3)
    assert centre[:, :12].max() < 40 and centre[:, -12:].min() > 215


def test_a_record_without_image_encoded_is_one_clear_error(tmp_path):
    path = str(tmp_path / "train-00000-of-00001.tfrecord")
    example = tf.train.Example.FromString(synth.imagenet_example_bytes(
        b"jpeg", 3, 4, 4, np.array([[0, 1], [0, 1]]), "x"))
    del example.features.feature["image/encoded"]
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(example.SerializeToString())
    with pytest.raises(JobConfigError) as caught:
        data.check_records([path], SPEC, record_format="imagenet")
    assert caught.value.problems == [(
        "trainData", f"records in {path} have no 'image/encoded' feature (bytes_list, one "
                     "value); recordFormat imagenet reads 'image/encoded' (JPEG bytes) and "
                     "'image/class/label' (1 to numClasses)")]


def test_the_wrong_record_format_says_which_to_set(imagenet_data, mnist_data, tmp_path):
    mnist = models.ModelSpec("resnet18", (28, 28, 1), 10, 0.1)
    with pytest.raises(JobConfigError, match="these are imagenet records: set recordFormat: "
                                             "imagenet"):
        data.check_records(data.list_files(imagenet_data), mnist)
    with pytest.raises(JobConfigError, match="these are raw records: leave recordFormat raw"):
        data.check_records(data.list_files(mnist_data), SPEC, record_format="imagenet")


def test_labels_beyond_num_classes_are_one_clear_error(imagenet_data):
    fewer = models.ModelSpec("resnet18", (32, 32, 3), 2, 0.1)
    with pytest.raises(JobConfigError, match=r"imagenet labels run from 1 to numClasses \(2\)"):
        data.check_records(data.list_files(imagenet_data), fewer, record_format="imagenet")


def test_synth_cli_writes_imagenet_for_resnets_only(capsys, tmp_path):
    code = main(["synth", "--out", str(tmp_path), "--model", "resnet18", "--format", "imagenet",
                 "--image-size", "32", "--examples", "8", "--shards", "2"])
    assert code == 0
    assert len(examples_of(f"{tmp_path}/train-*.tfrecord")) == 8
    assert main(["synth", "--out", str(tmp_path), "--model", "mnist_cnn",
                 "--format", "imagenet"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "tpu_training: error: --format: imagenet records are RGB photos for resnet18, "
        "resnet50; mnist_cnn reads raw records only"]


def replica_statistics(job: train.Job) -> list[tuple[np.ndarray, ...]]:
    """Each BatchNorm moving statistic's copies, one per replica (sync-on-read)."""
    return [tuple(copy.numpy() for copy in variable.values)
            for variable in job.model.non_trainable_variables
            if variable.synchronization == tf.VariableSynchronization.ON_READ]


def test_a_resnet18_job_on_imagenet_records_trains_exports_and_predicts(strategy,
                                                                       imagenet_data,
                                                                       monkeypatch):
    root = "ram://imagenet-job"
    config = JobConfig.from_dict({
        **SMALL_RESNET_JOB, "trainData": imagenet_data, "evalData": imagenet_data,
        "checkpointDir": f"{root}/ckpt", "exportDir": f"{root}/export",
        "tensorboardDir": f"{root}/tb"})
    evaluated_with, evaluate = [], train.Job.evaluate
    monkeypatch.setattr(train.Job, "evaluate", lambda job, dataset_fn: (
        evaluated_with.extend(replica_statistics(job)), evaluate(job, dataset_fn))[1])
    result = train.run(config, strategy=strategy, out=io.StringIO())
    assert result.outcome is train.Outcome.FINISHED and len(result.losses) == 6
    assert result.losses[0] > 2.0  # about ln(10): chance on 10 classes
    assert np.mean(result.losses[-2:]) < 0.6 * result.losses[0]
    # The export, fed decoded and centre-cropped JPEGs, reproduces the job's own
    # evaluation of the same records (every one: 512 is a whole number of batches).
    serve = tf.saved_model.load(config.exportDir).signatures["serving_default"]
    records = list(tf.data.TFRecordDataset(data.list_files(imagenet_data)))
    images, labels = zip(*(data.parse_imagenet(record, SPEC, training=False)
                           for record in records), strict=True)
    predicted = serve(images=tf.cast(tf.stack(images), tf.float32))
    assert predicted["probabilities"].shape == (512, CLASSES)
    np.testing.assert_allclose(tf.reduce_sum(predicted["probabilities"], axis=1), 1, rtol=1e-5)
    accuracy = np.mean(predicted["classes"].numpy() == np.array(labels))
    marker = train.read_marker(config.exportDir)
    # The export holds exactly the weights of the job's last checkpoint (no interval
    # save's snapshot: interval saves are asynchronous).
    final = tf.train.latest_checkpoint(config.checkpointDir)
    assert final.endswith(f"ckpt-{config.trainSteps}")
    exported_path = f"{config.exportDir}/variables/variables"
    # Readers of the checkpoint files themselves (load_checkpoint takes a ram:// file
    # prefix for a directory).
    saved = tf.compat.v1.train.NewCheckpointReader(final)
    exported = tf.compat.v1.train.NewCheckpointReader(exported_path)
    weights = [name for name in exported.get_variable_to_shape_map()
               if name.endswith("VARIABLE_VALUE")]
    assert len(weights) > 50
    for name in weights:
        np.testing.assert_array_equal(exported.get_tensor(name), saved.get_tensor(f"model/{name}"))
    # Inference-mode accuracy itself is no test here: after 30 steps a resnet's
    # BatchNorm moving statistics still lag its weights (training loss is what falls).
    # Each replica updates its own copy of them (sync-on-read); the checkpoint and the
    # export hold their mean, and the job evaluates with that mean on every replica.
    # Before it did, the two evaluations differed by 3 to 18 of 512 images.
    assert len(evaluated_with) > 20
    assert {len(copies) for copies in evaluated_with} == {strategy.num_replicas_in_sync}
    for copies in evaluated_with:
        for copy in copies[1:]:
            np.testing.assert_array_equal(copy, copies[0])
    # Left: the images within 0.05 of a tie (1 to 4), which the replicas' batches and
    # the export's single batch may round either way.
    assert abs(accuracy - marker["eval_accuracy"]) <= 4 / 512
