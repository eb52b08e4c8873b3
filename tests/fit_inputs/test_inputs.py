"""Tests for `tftrain.fit_inputs.inputs`: `adapt` (Keras's adapters), `split_validation`, `EpochPlan`."""

import types
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from tftrain.fit_inputs import inputs
from tftrain.fit_inputs.distributed_data import DistributedData
from tftrain.fit_inputs.epoch_plan import EpochPlan


def batch_sizes(dataset):
    return [int(tf.nest.flatten(batch)[0].shape[0]) for batch in dataset]


def values(iterator, count):
    return [int(next(iterator).numpy()[0]) for _ in range(count)]


def plan_of(dataset, steps=None, argument="x", steps_argument="steps_per_epoch", make_iterator=iter):
    data = inputs.AdaptedInput(
        dataset=dataset,
        adapter=None,
        kind="dataset",
        steps=steps,
        argument=argument,
        steps_argument=steps_argument,
    )
    return EpochPlan(data, make_iterator=make_iterator)


# -------------------------------------------------------------------------- adapt


def test_dataset_passes_through():
    dataset = tf.data.Dataset.range(5).batch(2)
    adapted = inputs.adapt(dataset)
    assert adapted.dataset is dataset and adapted.kind == "dataset"


def test_batch_size_with_a_dataset_warns_and_is_ignored():
    dataset = tf.data.Dataset.range(5).batch(2)
    with pytest.warns(UserWarning, match="batch_size=4. is ignored"):
        adapted = inputs.adapt(dataset, batch_size=4)
    assert batch_sizes(adapted.dataset) == [2, 2, 1]


def test_arrays_are_batched_by_32_by_default_in_order():
    x = np.arange(70, dtype="float32").reshape(70, 1)
    y = np.arange(70, dtype="int32")
    dataset = inputs.adapt(x, y).dataset
    assert batch_sizes(dataset) == [32, 32, 6]
    xs, ys = zip(*[(bx.numpy(), by.numpy()) for bx, by in dataset], strict=True)
    np.testing.assert_array_equal(np.concatenate(xs), x)
    np.testing.assert_array_equal(np.concatenate(ys), y)


def test_steps_without_batch_size_sets_the_batch_size_as_keras_does():
    x = np.zeros((10, 3), "float32")
    assert batch_sizes(inputs.adapt(x, np.zeros(10), steps=2).dataset) == [5, 5]


@pytest.mark.parametrize(
    "make",
    [
        lambda x, y: dict(x=x, y=y),
        lambda x, y: dict(x=[x, x], y=y),
        lambda x, y: dict(x={"a": x, "b": x * 2}, y=[y, y]),
        lambda x, y: dict(x=tf.constant(x), y=tf.constant(y), sample_weight=np.ones(5, "float32")),
        lambda x, y: dict(x=tf.ragged.constant([[1.0]] * 3 + [[1.0, 2.0]] * 2), y=y),
        lambda x, y: dict(x=tf.sparse.from_dense(x), y=y),
    ],
    ids=["x_y", "list_x", "dict_x_list_y", "tensors_weights", "ragged", "sparse"],
)
def test_array_structures_keras_takes(make):
    x = np.arange(5, dtype="float32").reshape(5, 1)
    y = np.arange(5, dtype="int32")
    adapted = inputs.adapt(**make(x, y), batch_size=2)
    assert adapted.kind == "arrays"
    assert len(list(adapted.dataset)) == 3


def test_class_weight_becomes_sample_weight():
    x = np.zeros((4, 1), "float32")
    y = np.array([0, 1, 1, 2])
    (_, _, weights) = next(iter(inputs.adapt(x, y, batch_size=4, class_weight={1: 5.0}).dataset))
    assert weights.numpy().tolist() == [1.0, 5.0, 5.0, 1.0]


class Batches(keras.utils.PyDataset):
    def __init__(self, count=3, fail_at=None, **kwargs):
        super().__init__(**kwargs)
        self.count, self.fail_at = count, fail_at

    def __len__(self):
        return self.count

    def __getitem__(self, index):
        if index == self.fail_at:
            raise KeyError(f"no batch {index}")
        return np.full((2, 1), index, "float32"), np.full((2,), index, "float32")


def test_py_dataset_and_generator_inputs():
    adapted = inputs.adapt(Batches())
    assert adapted.kind == "py_dataset"
    assert [int(x[0, 0]) for x, _ in adapted.dataset] == [0, 1, 2]

    def generate():
        for index in range(3):
            yield np.full((2, 1), index, "float32"), np.zeros(2, "float32")

    generated = inputs.adapt(generate())
    assert generated.kind == "generator"
    assert isinstance(generate(), types.GeneratorType)
    assert [int(x[0, 0]) for x, _ in generated.dataset] == [0, 1, 2]


def test_py_dataset_whose_getitem_raises_names_the_index():
    with pytest.raises(ValueError, match=r"Batches.__getitem__\(1\)` raised KeyError"):
        inputs.adapt(Batches(fail_at=1))


def test_unbatched_dataset_says_batch_it():
    dataset = tf.data.Dataset.from_tensor_slices((np.zeros((4, 3), "float32"), np.zeros(4)))
    with pytest.raises(ValueError, match=r"single examples.*dataset.batch"):
        inputs.adapt(dataset)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(x=tf.data.Dataset.range(3).batch(1), y=np.zeros(3)), "`y` should not be passed"),
        (dict(x=tf.data.Dataset.range(3).batch(1), sample_weight=np.zeros(3)), "sample_weights"),
        (
            dict(x=np.zeros((3, 1)), y=np.zeros((3, 2)), sample_weight=np.ones(3), class_weight={0: 1.0}),
            "class_weight",
        ),
        (dict(x=np.zeros((3, 1)), y=[np.zeros(3), np.zeros(3)], class_weight={0: 1.0}), "single output"),
    ],
    ids=["dataset_with_y", "dataset_with_sample_weight", "both_weights", "class_weight_multi_output"],
)
def test_what_keras_rejects_is_rejected(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        inputs.adapt(**kwargs)


@pytest.mark.parametrize("value", ["abc", 3, object()], ids=["string", "int", "object"])
def test_unsupported_data_is_a_type_error(value):
    with pytest.raises(TypeError, match="`validation_data`.*Expected NumPy arrays"):
        inputs.adapt(value, argument="validation_data")


def test_none_is_a_type_error():
    with pytest.raises(TypeError, match="x=None"):
        inputs.adapt(None)


@pytest.mark.parametrize("batch_size", [0, -1, True, 2.0])
def test_bad_batch_size(batch_size):
    with pytest.raises(ValueError, match="`batch_size`"):
        inputs.adapt(np.zeros((4, 1)), batch_size=batch_size)


@pytest.mark.parametrize("steps", [0, -1, True, 2.5])
def test_bad_steps(steps):
    with pytest.raises(ValueError, match="`steps_per_epoch`"):
        inputs.adapt(tf.data.Dataset.range(10).batch(2), steps=steps)


def test_shuffle_permutes_and_keeps_pairs():
    x = np.arange(64, dtype="int64")
    dataset = inputs.adapt(x, x * 10, batch_size=64, shuffle=True).dataset
    passes = []
    for _ in range(3):
        (bx, by) = next(iter(dataset))
        np.testing.assert_array_equal(by.numpy(), bx.numpy() * 10)
        assert sorted(bx.numpy().tolist()) == x.tolist()
        passes.append(bx.numpy().tolist())
    assert all(order != x.tolist() for order in passes)


def test_keras_config_step_limit(monkeypatch):
    if not hasattr(keras.config, "max_steps_per_epoch"):
        pytest.skip("keras.config.set_max_steps_per_epoch needs Keras >= 3.10")
    keras.config.set_max_steps_per_epoch(2)
    try:
        with pytest.warns(UserWarning, match="Limiting steps_per_epoch to 2"):
            assert inputs.adapt(tf.data.Dataset.range(10).batch(2)).steps == 2
    finally:
        keras.config.set_max_steps_per_epoch(None)


def test_split_validation_takes_the_last_examples():
    x = np.arange(10, dtype="float32")
    (train_x, train_y, _), (val_x, val_y, _) = inputs.split_validation(x, x * 2, None, 0.2)
    assert train_x.tolist() == list(range(8)) and val_x.tolist() == [8.0, 9.0]
    assert val_y.tolist() == [16.0, 18.0]
    with pytest.raises(ValueError, match="validation_split=0.2 with `x` a .*Dataset"):
        inputs.split_validation(tf.data.Dataset.range(3).batch(1), None, None, 0.2)


def test_optionals_become_none():
    batch = (tf.constant([1.0]), tf.experimental.Optional.empty(None))
    converted = inputs.optionals_to_none(batch)
    assert converted[1] is None and converted[0] is batch[0]


def test_examples_in_batch_for_dense_ragged_sparse():
    assert int(inputs.examples_in_batch((tf.zeros((3, 2)),))) == 3
    assert int(inputs.examples_in_batch(tf.ragged.constant([[1], [1, 2]]))) == 2
    assert int(inputs.examples_in_batch(tf.sparse.from_dense(tf.zeros((4, 2))))) == 4


# ---------------------------------------------------------------------- EpochPlan


def test_empty_dataset_is_an_error():
    with pytest.raises(ValueError, match="`x`.*empty"):
        plan_of(tf.data.Dataset.range(0).batch(2))


def test_infinite_dataset_without_steps_is_one_endless_epoch_with_a_warning():
    with pytest.warns(UserWarning, match="never ends.*steps_per_epoch=None.*stop_training"):
        plan = plan_of(tf.data.Dataset.range(4).batch(2).repeat())
    assert plan.steps is None and not plan.may_end_unannounced
    plan = plan_of(tf.data.Dataset.range(4).batch(2).repeat(), 5)
    assert plan.steps == 5


def test_steps_past_a_finite_dataset_is_taken_as_keras_takes_it():
    plan = plan_of(tf.data.Dataset.range(10).batch(2), 6)  # 5 batches: the epoch ends with the data
    assert plan.steps == 6


def test_custom_argument_names_in_warnings_and_errors():
    with pytest.warns(UserWarning, match="validation_steps=None") as record:
        plan_of(tf.data.Dataset.range(4).repeat().batch(2), None, "validation_data", "validation_steps")
    assert "`validation_data`" in str(record[0].message)
    with pytest.raises(ValueError, match="`validation_data`.*empty"):
        plan_of(tf.data.Dataset.range(4).take(0).batch(2), None, "validation_data", "validation_steps")


def test_steps_is_the_cardinality_without_steps_per_epoch():
    plan = plan_of(tf.data.Dataset.range(10).batch(3))
    assert plan.steps == 4
    plan = plan_of(tf.data.Dataset.range(10).batch(3), 2)
    assert plan.steps == 2


def test_unknown_cardinality_empty_dataset_fails_at_end_of_epoch():
    dataset = tf.data.Dataset.range(5).filter(lambda v: v > 10).batch(2)
    plan = plan_of(dataset)  # cannot be known before reading
    assert plan.steps is None
    iterator = plan.begin_epoch()
    with pytest.raises(StopIteration):
        next(iterator)
    with pytest.raises(ValueError, match="`x`.*no batches"):
        plan.end_epoch(0, data_ended=True)


def test_unknown_cardinality_stays_unknown_after_a_pass():
    # As Keras's epoch iterator, later passes look for the end themselves (their calls do not
    # stop at a length learned from the first pass).
    dataset = tf.data.Dataset.range(10).filter(lambda v: v < 5).batch(2)
    plan = plan_of(dataset)
    assert plan.steps is None
    iterator = plan.begin_epoch()
    assert len(list(iterator)) == 3
    plan.end_epoch(3, data_ended=True)
    assert plan.steps is None and plan.batches_left(0) is None


def test_without_steps_each_epoch_is_a_fresh_pass():
    plan = plan_of(tf.data.Dataset.range(6).batch(1))
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

    plan = plan_of(tf.data.Dataset.range(6).batch(1), 2, make_iterator=make_iterator)
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
    plan = plan_of(tf.data.Dataset.range(6).batch(1), 4)
    iterator = plan.begin_epoch()
    assert values(iterator, 4) == [0, 1, 2, 3]
    plan.end_epoch(4, data_ended=False)
    iterator = plan.begin_epoch()
    assert values(iterator, 2) == [4, 5]
    with pytest.raises(StopIteration):
        next(iterator)
    with pytest.warns(UserWarning, match=r"`x` ran out of data after 2 of 4 steps"):
        plan.end_epoch(2, data_ended=True)
    iterator = plan.begin_epoch()
    assert values(iterator, 4) == [0, 1, 2, 3]


def test_unknown_cardinality_with_steps_warns_and_learns_the_pass_length():
    dataset = tf.data.Dataset.range(10).filter(lambda v: v < 3).batch(1)  # 3 batches, unknown
    plan = plan_of(dataset, 3, argument="data", steps_argument="steps")
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
    plan = plan_of(tf.data.Dataset.range(3).repeat().batch(1), 2)
    seen = []
    for _ in range(3):
        seen += values(plan.begin_epoch(), 2)
        plan.end_epoch(2, data_ended=False)
    assert seen == [0, 1, 2, 0, 1, 2]


def test_an_already_distributed_dataset_is_read_as_it_is():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    dataset = tf.data.Dataset.range(6).map(lambda i: (tf.cast(i, tf.float32), i)).batch(2)
    distributed = strategy.experimental_distribute_dataset(dataset)
    adapted = inputs.adapt(distributed)
    assert adapted.kind == "distributed" and inputs.input_kind(distributed) == "distributed"
    data = adapted.dataset
    assert isinstance(data, DistributedData) and data.distributed is distributed and data.strategy is strategy
    assert data.cardinality() == 3 and data.skip(1).cardinality() == 2
    assert [spec.shape.as_list() for spec in data.element_spec] == [[None], [None]]
    assert [int(x[0]) for x, _ in data.skip(1)] == [2, 4]  # a resumed pass skips what was read
    with pytest.raises(ValueError, match="`y` should not be passed"):  # Keras's check, in its words
        inputs.adapt(distributed, y=np.zeros(6))
    with pytest.raises(ValueError, match="`sample_weight` should not be passed"):
        inputs.adapt(distributed, sample_weight=np.ones(6))
    with pytest.raises(ValueError, match="class_weight .* cannot be mapped once distributed"):
        inputs.adapt(distributed, class_weight={0: 1.0})


def test_an_unbatched_distributed_dataset_says_batch_it():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    distributed = strategy.distribute_datasets_from_function(lambda _: tf.data.Dataset.range(4))
    with pytest.raises(ValueError, match="single examples, not batches"):
        inputs.adapt(distributed)
