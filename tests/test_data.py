"""Tests for `tftrain.data`: `as_dataset` and `EpochPlan`."""

import warnings

import numpy as np
import pytest
import tensorflow as tf

from tftrain import data


def batch_sizes(dataset):
    return [int(tf.nest.flatten(batch)[0].shape[0]) for batch in dataset]


def values(iterator, count):
    return [int(next(iterator).numpy()[0]) for _ in range(count)]


# --------------------------------------------------------------------- as_dataset


def test_dataset_passes_through():
    dataset = tf.data.Dataset.range(5).batch(2)
    assert data.as_dataset(dataset, argument="train_data") is dataset


def test_batch_size_with_a_dataset_is_an_error():
    dataset = tf.data.Dataset.range(5).batch(2)
    with pytest.raises(ValueError, match="`batch_size`") as info:
        data.as_dataset(dataset, argument="train_data", batch_size=4)
    assert "batch_size=4" in str(info.value)
    assert "train_data" in str(info.value)


def test_arrays_are_batched_by_32_by_default():
    x = np.arange(70, dtype="float32").reshape(70, 1)
    y = np.arange(70, dtype="int32")
    dataset = data.as_dataset((x, y), argument="train_data")
    assert data.DEFAULT_BATCH_SIZE == 32
    assert batch_sizes(dataset) == [32, 32, 6]
    xs, ys = zip(*[(bx.numpy(), by.numpy()) for bx, by in dataset], strict=True)
    np.testing.assert_array_equal(np.concatenate(xs), x)
    np.testing.assert_array_equal(np.concatenate(ys), y)


def test_arrays_are_batched_by_batch_size():
    x = np.zeros((10, 3), "float32")
    dataset = data.as_dataset((x, np.zeros(10)), argument="train_data", batch_size=4)
    assert batch_sizes(dataset) == [4, 4, 2]
    assert dataset.element_spec[0].shape.as_list() == [None, 3]


@pytest.mark.parametrize(
    "make",
    [
        lambda x, y, w: x,
        lambda x, y, w: (x,),
        lambda x, y, w: (x, y),
        lambda x, y, w: [x, y],
        lambda x, y, w: (x, y, w),
        lambda x, y, w: [x, y, w],
        lambda x, y, w: ({"a": x, "b": x * 2}, y),
        lambda x, y, w: (tf.constant(x), tf.constant(y)),
    ],
    ids=["x", "tuple_x", "x_y", "list_x_y", "x_y_w", "list_x_y_w", "dict_x", "tensors"],
)
def test_accepted_array_structures(make):
    x = np.arange(5, dtype="float32").reshape(5, 1)
    y = np.arange(5, dtype="int32")
    w = np.ones(5, "float32")
    given = make(x, y, w)
    dataset = data.as_dataset(given, argument="train_data", batch_size=2)
    assert batch_sizes(dataset) == [2, 2, 1]
    first = next(iter(dataset))
    expected = tuple(given) if isinstance(given, (list, tuple)) and len(given) > 1 else given
    if isinstance(expected, tuple) and len(expected) == 1:
        expected = expected[0]
    tf.nest.assert_same_structure(first, expected)
    np.testing.assert_array_equal(tf.nest.flatten(first)[0].numpy(), tf.nest.flatten(expected)[0][:2])


def test_mismatched_lengths_list_the_lengths():
    with pytest.raises(ValueError, match="train_data") as info:
        data.as_dataset((np.zeros((10, 2)), np.zeros(9)), argument="train_data")
    assert "[9, 10]" in str(info.value)


def test_scalar_array_is_an_error():
    with pytest.raises(ValueError, match="train_data"):
        data.as_dataset((np.zeros(3), np.zeros(())), argument="train_data")


@pytest.mark.parametrize(
    "value",
    ["abc", {"x": "abc"}, None, 3, [1, 2, 3], (np.zeros(2),) * 4, ()],
    ids=["string", "dict_of_strings", "none", "int", "list_of_numbers", "four_parts", "empty"],
)
def test_unsupported_data_is_a_type_error(value):
    with pytest.raises(TypeError, match="`validation_data`"):
        data.as_dataset(value, argument="validation_data")


@pytest.mark.parametrize("batch_size", [0, -1, True, 2.0])
def test_bad_batch_size_for_arrays(batch_size):
    with pytest.raises(ValueError, match="`batch_size`"):
        data.as_dataset(np.zeros((4, 1)), argument="train_data", batch_size=batch_size)


def test_shuffle_reshuffles_each_pass_and_keeps_pairs():
    x = np.arange(64, dtype="int64")
    dataset = data.as_dataset((x, x * 10), argument="train_data", batch_size=64, shuffle=True)
    passes = []
    for _ in range(3):
        (bx, by) = next(iter(dataset))
        np.testing.assert_array_equal(by.numpy(), bx.numpy() * 10)
        assert sorted(bx.numpy().tolist()) == x.tolist()
        passes.append(bx.numpy().tolist())
    assert passes[0] != x.tolist() or passes[1] != x.tolist()
    assert len({tuple(p) for p in passes}) > 1


def test_no_shuffle_keeps_order():
    x = np.arange(10, dtype="int64")
    dataset = data.as_dataset(x, argument="train_data", batch_size=10)
    assert next(iter(dataset)).numpy().tolist() == x.tolist()


def test_count_batches():
    assert data.count_batches(tf.data.Dataset.range(10).batch(3)) == 4
    assert data.count_batches(tf.data.Dataset.range(10).repeat()) is None
    assert data.count_batches(tf.data.Dataset.range(10).filter(lambda v: v > 3)) is None


# ---------------------------------------------------------------------- EpochPlan


def test_empty_dataset_is_an_error():
    with pytest.raises(ValueError, match="`train_data`.*empty"):
        data.EpochPlan(tf.data.Dataset.range(0).batch(2), None)


def test_infinite_dataset_needs_steps():
    with pytest.raises(ValueError, match="steps_per_epoch=None"):
        data.EpochPlan(tf.data.Dataset.range(4).batch(2).repeat(), None)
    plan = data.EpochPlan(tf.data.Dataset.range(4).batch(2).repeat(), 5)
    assert plan.steps == 5


def test_steps_past_a_finite_dataset_is_an_error():
    with pytest.raises(ValueError, match="steps_per_epoch") as info:
        data.EpochPlan(tf.data.Dataset.range(10).batch(2), 6)
    message = str(info.value)
    assert "steps_per_epoch=6" in message
    assert "only 5 batches" in message


def test_custom_argument_names_in_errors():
    with pytest.raises(ValueError, match="validation_steps=3") as info:
        data.EpochPlan(tf.data.Dataset.range(4).batch(2), 3, "validation_data", "validation_steps")
    assert "`validation_data`" in str(info.value)


@pytest.mark.parametrize("steps", [0, -1, True, 2.5])
def test_bad_steps_per_epoch(steps):
    with pytest.raises(ValueError, match="`steps_per_epoch`"):
        data.EpochPlan(tf.data.Dataset.range(10).batch(2), steps)


def test_steps_is_the_cardinality_without_steps_per_epoch():
    plan = data.EpochPlan(tf.data.Dataset.range(10).batch(3), None)
    assert plan.steps == 4
    plan = data.EpochPlan(tf.data.Dataset.range(10).batch(3), 2)
    assert plan.steps == 2


def test_unknown_cardinality_empty_dataset_fails_at_end_of_epoch():
    dataset = tf.data.Dataset.range(5).filter(lambda v: v > 10).batch(2)
    plan = data.EpochPlan(dataset, None)  # cannot be known before reading
    assert plan.steps is None
    iterator = plan.begin_epoch()
    with pytest.raises(StopIteration):
        next(iterator)
    with pytest.raises(ValueError, match="`train_data`.*no batches"):
        plan.end_epoch(0, data_ended=True)


def test_unknown_cardinality_is_learned_after_a_pass():
    dataset = tf.data.Dataset.range(10).filter(lambda v: v < 5).batch(2)
    plan = data.EpochPlan(dataset, None)
    assert plan.steps is None
    iterator = plan.begin_epoch()
    assert len(list(iterator)) == 3
    plan.end_epoch(3, data_ended=True)
    assert plan.steps == 3


def test_without_steps_each_epoch_is_a_fresh_pass():
    plan = data.EpochPlan(tf.data.Dataset.range(6).batch(1), None)
    first = plan.begin_epoch()
    assert values(first, 2) == [0, 1]
    plan.end_epoch(2, data_ended=False)  # e.g. stopped early
    second = plan.begin_epoch()
    assert second is not first
    assert values(second, 6) == [0, 1, 2, 3, 4, 5]
    plan.end_epoch(6, data_ended=False)


def test_with_steps_the_iterator_persists_and_restarts_after_a_full_pass():
    made = []

    def make_iterator(dataset):
        made.append(iter(dataset))
        return made[-1]

    plan = data.EpochPlan(tf.data.Dataset.range(6).batch(1), 2, make_iterator=make_iterator)
    seen = []
    for _ in range(3):
        iterator = plan.begin_epoch()
        seen.append(values(iterator, 2))
        plan.end_epoch(2, data_ended=False)
    assert seen == [[0, 1], [2, 3], [4, 5]]
    assert len(made) == 1
    # All 6 batches were seen: the next epoch starts a new pass without hitting the end.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        iterator = plan.begin_epoch()
        assert values(iterator, 2) == [0, 1]
        plan.end_epoch(2, data_ended=False)
    assert len(made) == 2


def test_epoch_cut_short_by_the_data_warns_and_restarts():
    plan = data.EpochPlan(tf.data.Dataset.range(6).batch(1), 4)
    iterator = plan.begin_epoch()
    assert values(iterator, 4) == [0, 1, 2, 3]
    plan.end_epoch(4, data_ended=False)
    iterator = plan.begin_epoch()
    assert values(iterator, 2) == [4, 5]
    with pytest.raises(StopIteration):
        next(iterator)
    with pytest.warns(UserWarning, match=r"`train_data` ran out of data after 2 of 4 steps"):
        plan.end_epoch(2, data_ended=True)
    iterator = plan.begin_epoch()
    assert values(iterator, 4) == [0, 1, 2, 3]


def test_unknown_cardinality_with_steps_warns_and_learns_the_pass_length():
    dataset = tf.data.Dataset.range(10).filter(lambda v: v < 3).batch(1)  # 3 batches, unknown
    plan = data.EpochPlan(dataset, 3, argument="data", steps_argument="steps")
    iterator = plan.begin_epoch()
    assert values(iterator, 3) == [0, 1, 2]
    plan.end_epoch(3, data_ended=False)  # the end is not known yet: the iterator continues
    assert plan.begin_epoch() is iterator
    with pytest.raises(StopIteration):
        next(iterator)
    with pytest.warns(UserWarning, match=r"`data` ran out of data after 0 of 3 steps"):
        plan.end_epoch(0, data_ended=True)
    iterator = plan.begin_epoch()
    assert values(iterator, 3) == [0, 1, 2]
    # The pass length is known now: the next epoch starts a new pass without a short epoch.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan.end_epoch(3, data_ended=False)
    assert plan.begin_epoch() is not iterator


def test_infinite_dataset_with_steps_never_restarts():
    plan = data.EpochPlan(tf.data.Dataset.range(3).repeat().batch(1), 2)
    seen = []
    for _ in range(3):
        seen += values(plan.begin_epoch(), 2)
        plan.end_epoch(2, data_ended=False)
    assert seen == [0, 1, 2, 0, 1, 2]
