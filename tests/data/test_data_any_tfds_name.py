"""`tftrain.data.load`/`info` take any tfds name and split string, as google-research/simclr does.

A real prepared dataset (tensorflow-datasets' own `dummy_mnist`, generated
offline in a temporary data_dir) gives real split sizes; `tfds.testing.mock_data`
stands in for datasets that cannot be downloaded here.
"""

import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from tftrain import data
from tftrain.compat import tf_internals
from tftrain.data import catalog


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A data_dir holding tfds's `dummy_mnist` (20 train and 20 test examples), prepared offline."""
    data_dir = str(tmp_path_factory.mktemp("tfds"))
    tfds.testing.DummyMnist(data_dir=data_dir).download_and_prepare()
    return data_dir


def images(dataset):
    return np.stack([image for image, _ in dataset.as_numpy_iterator()])


def recorder(calls, count=6):
    def as_dataset(builder, split, **kwargs):
        calls.append((builder.name, str(split)))
        labels = np.arange(count, dtype=np.int64)
        height, width, channels = builder.info.features["image"].shape
        pixels = np.zeros((count, height or 8, width or 8, channels), np.uint8) + labels[:, None, None, None]
        return tf.data.Dataset.from_tensor_slices({"image": pixels.astype(np.uint8), "label": labels})

    return as_dataset


# ------------------------------------------------------------------ names


def test_a_dataset_prepared_in_data_dir_is_found_by_name(prepared):
    assert "dummy_mnist" not in tfds.list_builders(with_community_datasets=False)
    data.check_name("dummy_mnist", data_dir=prepared)
    described = data.info("dummy_mnist", data_dir=prepared)
    assert described.num_classes == 10 and described.image_shape == (28, 28, 1)
    assert described.splits == {"train": 20, "test": 20}
    assert images(data.load("dummy_mnist", "test", data_dir=prepared)).shape == (20, 28, 28, 1)


def test_a_config_name_is_accepted_and_a_wrong_config_lists_the_configs(tmp_path):
    described = data.info("imagenet2012_subset/1pct", data_dir=str(tmp_path))
    assert described.num_classes == 1000 and described.image_shape == (None, None, 3)
    with pytest.raises(ValueError, match="Invalid value for argument `name`") as error:
        data.info("imagenet2012_subset/2pct", data_dir=str(tmp_path))
    assert "name='imagenet2012_subset/2pct'" in str(error.value)
    assert "1pct, 10pct" in str(error.value) and "'imagenet2012_subset/1pct'" in str(error.value)


def test_an_unknown_name_suggests_close_ones():
    with pytest.raises(ValueError) as error:
        data.check_name("cifar")
    message = str(error.value)
    assert "'cifar10'" in message and "'cifar100'" in message and "Did you mean" in message


def test_a_dataset_that_is_not_image_classification_is_refused():
    with pytest.raises(ValueError, match="expected an 'image' feature and a class 'label' feature"):
        data.info("imdb_reviews")


def test_generated_and_known_names_do_not_import_tensorflow_datasets():
    code = (
        "import sys\n"
        "from tftrain import data\n"
        "data.check_name('shapes'); data.check_name('cifar10'); data.info('synthetic')\n"
        "assert len(list(data.load('shapes', 'test', num_examples=2))) == 2\n"
        "assert 'tensorflow_datasets' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={"TF_CPP_MIN_LOG_LEVEL": "3"})


# ----------------------------------------------------------------- splits


@pytest.mark.parametrize(
    "split, count",
    [
        ("train[:25%]", 5),
        ("train[5:]", 15),
        ("test[-3:]", 3),
        ("train+test", 40),
        ("train[:50%]+test[:1]", 11),
    ],
)
def test_split_strings_read_and_count_as_tfds_does(prepared, split, count):
    builder = tfds.builder("dummy_mnist", data_dir=prepared)
    described = data.info("dummy_mnist", data_dir=prepared)
    assert described.splits[split] == builder.info.splits[split].num_examples == count
    assert split in described.splits and list(described.splits) == ["train", "test"]
    assert len(images(data.load("dummy_mnist", split, data_dir=prepared))) == count


def test_load_leaves_out_tfds_automatic_cache(prepared, tmp_path):
    # tensorflow-datasets caches a small dataset (as dummy_mnist) in memory unless told not to: a cached
    # iterator cannot be checkpointed symbolically, so every checkpoint would hold the decoded split.
    def ops(dataset):
        return {node.op for node in tf_internals.dataset_graph_nodes(dataset)}

    assert any(
        op.startswith("CacheDataset") for op in ops(tfds.load("dummy_mnist", data_dir=prepared)["train"])
    )
    dataset = data.load("dummy_mnist", "train", data_dir=prepared)
    assert not any(op.startswith("CacheDataset") for op in ops(dataset))
    iterator = iter(dataset.repeat().with_options(symbolic_options()))
    for _ in range(25):  # into the second pass
        next(iterator)
    path = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "data"))
    saved = sum(file.stat().st_size for file in tmp_path.iterdir() if file.name.startswith("data"))
    assert saved < 20 * 28 * 28  # positions, not the split's 20 images
    resumed = iter(dataset.repeat().with_options(symbolic_options()))
    tf.train.Checkpoint(iterator=resumed).read(path).assert_consumed()
    np.testing.assert_array_equal(next(resumed)[0], images(dataset)[5])
    # A cache where the caller asks for one.
    assert any(op.startswith("CacheDataset") for op in ops(dataset.cache()))


def symbolic_options():
    options = tf.data.Options()
    options.experimental_symbolic_checkpoint = True
    return options


def test_num_examples_of_a_sliced_split_are_its_first_examples(prepared):
    train = images(data.load("dummy_mnist", "train", data_dir=prepared))
    np.testing.assert_array_equal(
        images(data.load("dummy_mnist", "train[:50%]", data_dir=prepared)), train[:10]
    )
    first = images(data.load("dummy_mnist", "train[50%:]", data_dir=prepared, num_examples=3))
    np.testing.assert_array_equal(first, train[10:13])
    both = data.load("dummy_mnist", "train[:2]+test", data_dir=prepared, num_examples=5)
    assert len(images(both)) == 5
    np.testing.assert_array_equal(
        images(data.load("dummy_mnist", data_dir=prepared, num_examples=4)), train[:4]
    )


@pytest.mark.parametrize(
    "split, reason",
    [
        ("validation", "It has no split 'validation'"),
        ("train[:10%]+valid", "It has no split 'valid'"),
        ("train[:200%]", "percent slice boundaries should be in [-100, 100]"),
        ("train[", "Unrecognized split format"),
    ],
)
def test_a_split_the_dataset_lacks_names_its_splits(prepared, split, reason):
    for attempt in (
        lambda: data.load("dummy_mnist", split, data_dir=prepared),
        lambda: data.info("dummy_mnist", data_dir=prepared).splits[split],
    ):
        with pytest.raises(data.UnknownSplitError) as error:
            attempt()
        message = str(error.value)
        assert isinstance(error.value, ValueError) and isinstance(error.value, KeyError)
        assert message.startswith("Invalid value for argument `split`. Received: split=")
        assert repr(split) in message and "'dummy_mnist'" in message and reason in message
        assert "Expected one of train, test, or a tensorflow-datasets split string" in message
    assert split not in data.info("dummy_mnist", data_dir=prepared).splits


def test_published_sizes_count_slices_of_datasets_not_prepared(tmp_path):
    cifar10 = data.info("cifar10", data_dir=str(tmp_path)).splits
    assert cifar10["train[:10%]"] == 5_000 and cifar10["test[-3:]"] == 3 and cifar10["train+test"] == 60_000
    imagenet = data.info("imagenet2012", data_dir=str(tmp_path)).splits
    assert imagenet["test[:10%]"] == imagenet["validation[:10%]"] == 5_000  # "test" reads "validation"
    with pytest.raises(data.UnknownSplitError, match="It has no split 'validation'"):
        cifar10["validation"]
    assert list(tmp_path.iterdir()) == []


def test_a_dataset_not_prepared_says_how_to_prepare_it(tmp_path):
    start = time.perf_counter()
    splits = data.info("imagenet2012_subset/1pct", data_dir=str(tmp_path)).splits
    with pytest.raises(data.DatasetUnavailableError) as error:
        splits["train"]
    message = str(error.value)
    assert f"'imagenet2012_subset/1pct' is not prepared in data_dir={tmp_path}" in message
    assert "tfds build imagenet2012_subset/1pct --data_dir=DIR" in message and 'dataset="shapes"' in message
    assert "train" not in splits and len(splits) == 0
    with pytest.raises(data.DatasetUnavailableError, match="manual_dir="):
        data.load("imagenet2012_subset/1pct", "train[:10%]", data_dir=str(tmp_path / "tfds"))
    assert time.perf_counter() - start < 10


def test_a_known_dataset_refuses_a_split_it_lacks_before_any_download(tmp_path):
    with pytest.raises(data.UnknownSplitError, match="It has no split 'validation'") as error:
        data.load("cifar10", "validation[:10%]", data_dir=str(tmp_path))
    assert "Expected one of train, test" in str(error.value)
    with pytest.raises(data.UnknownSplitError, match="Unrecognized split format"):
        data.load("imagenet2012_subset/1pct", "train[:", data_dir=str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_split_strings_reach_tfds_with_aliases_and_counts(tmp_path):
    calls = []
    with tfds.testing.mock_data(as_dataset_fn=recorder(calls)):
        subset = data.load("imagenet2012_subset/1pct", "train[:10%]", data_dir=str(tmp_path))
        validation = data.load("imagenet2012", "test[50%:]", data_dir=str(tmp_path), num_examples=2)
        first = data.load("cifar10", "train", data_dir=str(tmp_path), num_examples=3)
        assert [len(images(d)) for d in (subset, validation, first)] == [6, 2, 3]
    assert calls == [
        ("imagenet2012_subset", "train[:10%]"),
        ("imagenet2012", "validation[50%:]"),  # a slice is read whole, then cut to num_examples
        ("cifar10", "train[:3]"),
    ]


def test_split_string_helpers():
    assert catalog.split_names("train[:10%]+test") == ["train", "test"]
    assert catalog.alias_split("imagenet2012", "test[:1%]+train") == "validation[:1%]+train"
    assert catalog.alias_split("imagenet2012:5.1.0", "test") == "validation"
    assert catalog.alias_split("cifar10", "test[:1%]") == "test[:1%]"
    assert catalog.base_name("imagenet2012_subset/1pct:5.0.0") == "imagenet2012_subset"
    assert catalog.is_plain_split("train") and not catalog.is_plain_split("train[:1]")


def test_generated_datasets_keep_their_fixed_splits():
    with pytest.raises(data.UnknownSplitError, match='no slices or "\\+"; pass num_examples'):
        data.load("shapes", "train[:10%]")
    splits = data.info("shapes").splits
    assert splits["test"] == 2_000 and "train[:1]" not in splits
    with pytest.raises(KeyError, match="'train\\[:1\\]' for dataset 'shapes'"):
        splits["train[:1]"]
