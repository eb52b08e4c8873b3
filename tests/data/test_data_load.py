"""Tests for `tftrain.data.load` and `tftrain.data.info`: tfds (mocked), generated sets, offline errors."""

import pickle
import socket
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tftrain import data
from tftrain.data import shapes, tfds_loading

TFDS_NAMES = ["cifar10", "cifar100", "stl10", "fashion_mnist", "mnist", "imagenet2012"]
CHANNELS = {"mnist": 1, "fashion_mnist": 1}


def spec(height, width, channels):
    return (tf.TensorSpec((height, width, channels), tf.uint8), tf.TensorSpec((), tf.int64))


def as_numpy(dataset):
    return [(image, int(label)) for image, label in dataset.as_numpy_iterator()]


@pytest.fixture
def closed_port():
    """A local TCP port that nothing listens on: connecting to it is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def no_network(monkeypatch, closed_port):
    """Downloads go through a proxy that refuses connections, whatever this machine's network."""
    for variable in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.setenv(variable, f"http://127.0.0.1:{closed_port}")
    for variable in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(variable, raising=False)


def pattern_source(calls, count=4):
    """A `tfds.testing.mock_data(as_dataset_fn=...)` reader: image i is filled with 50 * i.

    Records (dataset name, split, shuffle_files) of each read in `calls`.
    """

    def as_dataset(builder, split, **kwargs):
        calls.append((builder.name, str(split), kwargs.get("shuffle_files")))
        height, width, channels = builder.info.features["image"].shape
        labels = np.arange(count, dtype=np.int64)
        images = np.zeros((count, height or 20, width or 30, channels), np.uint8)
        images += (50 * labels).astype(np.uint8)[:, None, None, None]
        return tf.data.Dataset.from_tensor_slices({"image": images, "label": labels})

    return as_dataset


# ------------------------------------------------------------ tfds (mock_data)


@pytest.mark.parametrize(
    "name, shape, num_classes",
    [("cifar10", (32, 32, 3), 10), ("mnist", (28, 28, 1), 10), ("fashion_mnist", (28, 28, 1), 10)],
)
def test_tfds_dataset_through_mock(tmp_path, name, shape, num_classes):
    with tfds.testing.mock_data(num_examples=7):
        dataset = data.load(name, "train", data_dir=str(tmp_path))
        assert dataset.element_spec == spec(*shape)
        examples = as_numpy(dataset)
    assert len(examples) == 7
    assert all(image.shape == shape and image.dtype == np.uint8 for image, _ in examples)
    assert all(0 <= label < num_classes for _, label in examples)


def test_test_split_and_stl10_unlabelled(tmp_path):
    with tfds.testing.mock_data(num_examples=3):
        assert data.load("cifar10", "test", data_dir=str(tmp_path)).element_spec == spec(32, 32, 3)
        unlabelled = data.load("stl10", "unlabelled", data_dir=str(tmp_path))
        assert unlabelled.element_spec == spec(96, 96, 3)
        assert len(as_numpy(unlabelled)) == 3


def test_image_size_resizes_and_keeps_uint8_values(tmp_path):
    with tfds.testing.mock_data(as_dataset_fn=pattern_source([])):
        dataset = data.load("mnist", data_dir=str(tmp_path), image_size=13)
        assert dataset.element_spec == spec(13, 13, 1)
        examples = as_numpy(dataset)
    # A constant image stays the same constant: values are not rescaled to [0, 1].
    for image, label in examples:
        assert image.dtype == np.uint8 and image.shape == (13, 13, 1)
        np.testing.assert_array_equal(image, 50 * label)
    assert [label for _, label in examples] == [0, 1, 2, 3]


def test_image_size_fixes_the_shape_of_variable_size_images(tmp_path):
    with tfds.testing.mock_data(num_examples=3):
        assert data.load("imagenet2012", data_dir=str(tmp_path)).element_spec == spec(None, None, 3)
        dataset = data.load("imagenet2012", "validation", data_dir=str(tmp_path), image_size=24)
        assert dataset.element_spec == spec(24, 24, 3)
        assert [image.shape for image, _ in as_numpy(dataset)] == [(24, 24, 3)] * 3


def test_num_examples_takes_the_first_examples(tmp_path):
    with tfds.testing.mock_data(num_examples=9):
        everything = as_numpy(data.load("cifar10", data_dir=str(tmp_path)))
        first = as_numpy(data.load("cifar10", data_dir=str(tmp_path), num_examples=4))
    assert len(everything) == 9 and len(first) == 4
    for (image, label), (expected_image, expected_label) in zip(first, everything, strict=False):
        np.testing.assert_array_equal(image, expected_image)
        assert label == expected_label


def test_tfds_split_names_passed_to_tfds(tmp_path):
    calls = []
    with tfds.testing.mock_data(as_dataset_fn=pattern_source(calls)):
        data.load("imagenet2012", "test", data_dir=str(tmp_path), num_examples=3)
        data.load("cifar10", "train", data_dir=str(tmp_path), shuffle_files=True)
    # imagenet2012 "test" reads the labelled "validation" split; num_examples slices the split.
    assert calls == [("imagenet2012", "validation[:3]", False), ("cifar10", "train", True)]


# ---------------------------------------------------------------- bad arguments


def test_unknown_name_suggests_close_tfds_names():
    with pytest.raises(ValueError, match="Invalid value for argument `name`") as error:
        data.load("imagenet")
    message = str(error.value)
    assert "name='imagenet'" in message and "tfds.list_builders()" in message
    assert "Did you mean" in message and "'imagenet2012'" in message
    assert "'shapes' or 'synthetic'" in message and "Traceback" not in message
    with pytest.raises(ValueError, match="`name`.*'cifar10'"):
        data.info("cifar")


@pytest.mark.parametrize(
    "name, split, valid",
    [
        ("cifar10", "validation", "train, test"),
        ("imagenet2012", "unlabelled", "train, validation, test"),
        ("stl10", "validation", "train, test, unlabelled"),
        ("shapes", "unlabelled", "train, test"),
        ("synthetic", "train[:10]", "train, test"),
    ],
)
def test_unknown_split_lists_the_valid_ones(name, split, valid):
    with pytest.raises(ValueError, match="Invalid value for argument `split`") as error:
        data.load(name, split)
    assert repr(split) in str(error.value) and valid in str(error.value)


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(image_size=0), "image_size"),
        (dict(image_size=8.5), "image_size"),
        (dict(num_examples=0), "num_examples"),
        (dict(num_examples=True), "num_examples"),
    ],
)
def test_bad_sizes_and_counts(kwargs, argument):
    for name in ("cifar10", "synthetic"):
        with pytest.raises(ValueError, match=f"Invalid value for argument `{argument}`"):
            data.load(name, **kwargs)


# ----------------------------------------------------------------- offline errors


@pytest.mark.usefixtures("no_network")
@pytest.mark.parametrize("name", ["cifar10", "mnist", "stl10"])
def test_missing_dataset_without_network_fails_fast_and_says_what_to_do(tmp_path, name):
    start = time.perf_counter()
    with pytest.raises(data.DatasetUnavailableError) as error:
        data.load(name, data_dir=str(tmp_path))
    elapsed = time.perf_counter() - start
    assert elapsed < 10, f"took {elapsed:.1f} s; tfds alone retries for minutes"
    assert isinstance(error.value, RuntimeError)
    message = str(error.value)
    assert f"not in data_dir={tmp_path}" in message
    assert "could not be downloaded" in message and "cannot connect to 127.0.0.1" in message
    assert 'dataset="shapes"' in message and 'dataset="synthetic"' in message
    assert f"tfds build {name}" in message and "data_dir" in message
    assert "Traceback" not in message and len(message) < 1000
    assert error.value.name == name and error.value.data_dir == str(tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing half-downloaded left behind


@pytest.mark.usefixtures("no_network")
def test_default_data_dir_is_named(monkeypatch, tmp_path):
    # tensorflow-datasets' own default (~/tensorflow_datasets or $TFDS_DATA_DIR, read at import).
    default = tmp_path / "tensorflow_datasets"
    monkeypatch.setattr(tfds.core.constants, "DATA_DIR", str(default))
    with pytest.raises(data.DatasetUnavailableError) as error:
        data.load("cifar10")
    assert error.value.data_dir == str(default)
    assert f"not in data_dir={default} " in str(error.value)


def test_failed_download_is_one_clear_line(monkeypatch, tmp_path):
    # The servers answer, but the download fails inside tensorflow-datasets.
    monkeypatch.setattr(tfds_loading, "_connection_problem", lambda urls, timeout: None)

    def fail(self, **kwargs):
        raise ConnectionError("Max retries exceeded with url: /cifar.tar.gz\n  deep tfds internals\n  more")

    monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", fail)
    with pytest.raises(data.DatasetUnavailableError) as error:
        data.load("cifar10", data_dir=str(tmp_path))
    message = str(error.value)
    assert "ConnectionError: Max retries exceeded with url: /cifar.tar.gz" in message
    assert "internals" not in message and 'dataset="shapes"' in message
    assert error.value.__suppress_context__
    # It survives pickling (e.g. from a tf.data or multiprocessing worker) with its attributes.
    copy = pickle.loads(pickle.dumps(error.value))
    assert (str(copy), copy.name, copy.data_dir) == (message, "cifar10", str(tmp_path))


def test_imagenet_without_manual_files(tmp_path):
    manual = tmp_path / "manual"
    start = time.perf_counter()
    with pytest.raises(data.DatasetUnavailableError) as error:
        data.load("imagenet2012", data_dir=str(tmp_path / "tfds"), manual_dir=str(manual))
    assert time.perf_counter() - start < 10
    message = str(error.value)
    assert f"manual_dir={manual}" in message and "ILSVRC2012_img_train.tar" in message
    assert 'dataset="shapes"' in message
    assert not (tmp_path / "tfds").exists()


# ------------------------------------------------------------------------- info


@pytest.mark.parametrize(
    "name, num_classes, image_shape, splits",
    [
        ("cifar10", 10, (32, 32, 3), {"train": 50_000, "test": 10_000}),
        ("cifar100", 100, (32, 32, 3), {"train": 50_000, "test": 10_000}),
        ("stl10", 10, (96, 96, 3), {"train": 5_000, "test": 8_000, "unlabelled": 100_000}),
        ("fashion_mnist", 10, (28, 28, 1), {"train": 60_000, "test": 10_000}),
        ("mnist", 10, (28, 28, 1), {"train": 60_000, "test": 10_000}),
        (
            "imagenet2012",
            1000,
            (None, None, 3),
            {"train": 1_281_167, "validation": 50_000, "test": 50_000},
        ),
    ],
)
def test_info_for_tfds_names_offline(tmp_path, name, num_classes, image_shape, splits):
    start = time.perf_counter()
    described = data.info(name, data_dir=str(tmp_path))
    assert time.perf_counter() - start < 5
    assert described == data.DatasetInfo(name, num_classes, image_shape, splits)
    assert set(described.splits) == set(data.SPLITS[name])
    resized = data.info(name, data_dir=str(tmp_path), image_size=40)
    assert resized.image_shape == (40, 40, CHANNELS.get(name, 3))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", TFDS_NAMES)
@pytest.mark.parametrize("image_size", [None, 20])
def test_info_matches_what_load_gives(tmp_path, name, image_size):
    described = data.info(name, data_dir=str(tmp_path), image_size=image_size)
    with tfds.testing.mock_data(num_examples=2):
        dataset = data.load(name, data_dir=str(tmp_path), image_size=image_size)
        labels = [label for _, label in as_numpy(dataset)]
    assert dataset.element_spec[0].shape.as_list() == list(described.image_shape)
    assert all(0 <= label < described.num_classes for label in labels)


def test_info_is_frozen():
    described = data.info("shapes")
    with pytest.raises(AttributeError):
        described.num_classes = 3


@pytest.mark.parametrize("image_size", [None, 16, 40])
def test_info_for_generated_datasets(image_size):
    size = image_size or 32
    shapes_info = data.info("shapes", image_size=image_size)
    assert shapes_info == data.DatasetInfo(
        "shapes", len(shapes.CLASS_NAMES), (size, size, 3), {"train": 10_000, "test": 2_000}
    )
    synthetic_info = data.info("synthetic", image_size=image_size)
    assert synthetic_info == data.DatasetInfo(
        "synthetic", 10, (size, size, 3), {"train": 10_000, "test": 2_000}
    )
    for described in (shapes_info, synthetic_info):
        dataset = data.load(described.name, "test", image_size=image_size)
        assert dataset.element_spec == spec(*described.image_shape)
        assert int(dataset.cardinality()) == described.splits["test"]


# ------------------------------------------------------------- generated datasets


def test_load_shapes_is_the_generated_set():
    dataset = data.load("shapes", "test", image_size=16, num_examples=10)
    images, labels = shapes.generate("test", 10, image_size=16)
    examples = as_numpy(dataset)
    np.testing.assert_array_equal(np.stack([image for image, _ in examples]), images)
    assert [label for _, label in examples] == labels.tolist()


def test_load_synthetic():
    dataset = data.load("synthetic", "train", image_size=8, num_examples=6)
    assert dataset.element_spec == spec(8, 8, 3)
    examples = as_numpy(dataset)
    assert len(examples) == 6 and all(0 <= label < 10 for _, label in examples)
    again = as_numpy(data.load("synthetic", "train", image_size=8, num_examples=6))
    assert all(np.array_equal(a, b) for (a, _), (b, _) in zip(examples, again, strict=True))


def test_generated_sets_ignore_data_dir(tmp_path):
    dataset = data.load("shapes", "test", data_dir=str(tmp_path / "nowhere"), num_examples=8)
    assert len(as_numpy(dataset)) == 8
    assert not (tmp_path / "nowhere").exists()
