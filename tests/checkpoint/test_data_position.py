"""`tftrain.checkpoint.data_position`: how a checkpoint keeps the data position, checked against tf.data itself."""

import warnings

import numpy as np
import pytest
import tensorflow as tf

from tftrain.checkpoint import data_position
from tftrain.compat import tf_internals

X = np.random.RandomState(0).rand(60, 4).astype("float32")


def slices():
    return tf.data.Dataset.from_tensor_slices(X)


def examples():
    yield from X


SUPPORTED = {
    "batch": lambda: slices().batch(6),
    "map_prefetch": lambda: slices().map(lambda v: v * 2).batch(6).prefetch(2),
    "shuffle_repeat": lambda: slices().shuffle(60, seed=1).batch(6).repeat(),
    "interleave": lambda: tf.data.Dataset.range(3).interleave(lambda i: slices(), cycle_length=2).batch(6),
    "filter_zip": lambda: tf.data.Dataset.zip((slices(), slices())).filter(lambda a, b: a[0] > 0.2).batch(6),
    "padded_take_skip": lambda: slices().skip(2).take(40).padded_batch(6),
}
UNSUPPORTED = {
    "cache": lambda: slices().batch(6).cache(),
    "window": lambda: slices().window(6).flat_map(lambda w: w.batch(6)),
    "group_by_window": lambda: tf.data.Dataset.range(60).group_by_window(
        lambda v: v % 2, lambda key, w: w.batch(4), window_size=4
    ),
    "ignore_errors": lambda: slices().ignore_errors().batch(6),
    "rebatch": lambda: slices().batch(6).rebatch(3),
    "generator": lambda: tf.data.Dataset.from_generator(
        examples, output_signature=tf.TensorSpec((4,), tf.float32)
    ).batch(6),
}


def nodes(dataset):
    return tf_internals.dataset_graph_nodes(dataset)


def symbolic_round_trip(dataset, tmp_path):
    """TensorFlow's own answer: save a started iterator symbolically, restore, compare the next batch."""
    dataset = data_position.with_symbolic_checkpoint(dataset)
    iterator = iter(dataset)
    for _ in range(3):
        next(iterator)
    path = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "ckpt"))
    expected = tf.nest.flatten(next(iterator))
    restored = iter(dataset)
    tf.train.Checkpoint(iterator=restored).read(path)
    got = tf.nest.flatten(next(restored))
    return all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(got, expected, strict=True))


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_pipelines_said_to_save_symbolically_do(name, tmp_path):
    dataset = SUPPORTED[name]()
    assert data_position.supports_symbolic_checkpoint(nodes(dataset))
    assert symbolic_round_trip(dataset, tmp_path)


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_pipelines_said_not_to_save_symbolically_cannot(name, tmp_path):
    dataset = UNSUPPORTED[name]()
    assert not data_position.supports_symbolic_checkpoint(nodes(dataset))
    with pytest.raises((tf.errors.UnimplementedError, tf.errors.FailedPreconditionError)):
        symbolic_round_trip(dataset, tmp_path)


@pytest.mark.parametrize(
    "make, fixed",
    [
        (lambda: slices().batch(6).cache(), True),
        (lambda: slices().map(lambda v: v + 1).batch(6).cache().prefetch(2), True),
        (lambda: slices().shuffle(60, seed=1).batch(6).cache(), False),
        (lambda: slices().map(lambda v: v + tf.random.uniform(())).batch(6).cache(), False),
        (
            lambda: slices().map(lambda v: tf.py_function(lambda t: t, [v], tf.float32)).batch(6).cache(),
            False,
        ),
        (
            lambda: slices().map(lambda v: v, num_parallel_calls=2, deterministic=False).batch(6).cache(),
            False,
        ),
        (UNSUPPORTED["generator"], False),
    ],
    ids=[
        "cache",
        "map_cache",
        "shuffle_cache",
        "random_map",
        "py_function",
        "nondeterministic_map",
        "generator",
    ],
)
def test_a_fixed_order_is_recognised_conservatively(make, fixed):
    dataset = make()
    assert data_position.reads_in_a_fixed_order(nodes(dataset), dataset.options()) is fixed


def test_prepare_chooses_the_cheapest_exact_mode_and_keeps_a_saved_one():
    batched = slices().batch(6)
    mode, dataset = data_position.prepare(batched, None)
    assert mode == "symbolic" and dataset.options().experimental_symbolic_checkpoint
    assert data_position.prepare(batched.cache(), None)[0] == "position"
    assert data_position.prepare(slices().shuffle(60).batch(6).cache(), None)[0] == "full"
    # A resumed run reads its iterator the way its checkpoint saved it.
    mode, dataset = data_position.prepare(batched, "full")
    assert mode == "full" and not dataset.options().experimental_symbolic_checkpoint
    assert data_position.saved_mode({"data": {"checkpoint": "position"}}) == "position"
    assert data_position.saved_mode({"timing": {}}) == "full"  # written before the modes existed
    assert data_position.saved_mode(None) is None


def test_a_pipeline_whose_buffers_are_saved_says_so_once_and_why():
    with pytest.warns(
        UserWarning, match=r"cannot checkpoint symbolically \(CacheDatasetV2\).*ShuffleDataset"
    ):
        assert data_position.prepare(slices().shuffle(60).batch(6).cache(), None)[0] == "full"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the cheap modes, a resumed run and a generator say nothing here
        data_position.prepare(slices().batch(6), None)
        data_position.prepare(slices().batch(6).cache(), None)
        data_position.prepare(slices().shuffle(60).batch(6).cache(), "full")
        data_position.prepare(UNSUPPORTED["generator"](), None)
