"""`StateSnapshot`: the training state kept in memory, restored exactly, never a non-finite one."""

import keras
import numpy as np
import tensorflow as tf

from tftrain.checkpoint import training_state
from tftrain.checkpoint.memory_snapshot import StateSnapshot


def make_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dropout(0.5), keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.Adam(0.1), "mse", metrics=["mae"])
    x = np.random.RandomState(0).rand(8, 3).astype("float32")
    model.fit(x, x[:, :1], epochs=1, verbose=0)
    return model, x


def values(model, extra=()):
    state = [v.numpy() for v in model.variables + model.optimizer.variables + model.metrics_variables]
    return state + [v.numpy() for v in extra]


def test_restore_brings_back_every_value_exactly_after_more_training():
    model, x = make_model()
    counter = tf.Variable(3.0)
    snapshot = StateSnapshot(lambda: training_state(model, {"owner_counter": counter}))
    assert not snapshot.taken
    assert snapshot.take() and snapshot.taken
    kept = values(model, [counter])
    model.fit(x, x[:, :1], epochs=2, verbose=0)  # updates weights, slots, metrics and seeds in place
    counter.assign_add(1.0)
    assert any(not np.array_equal(a, b) for a, b in zip(kept, values(model, [counter]), strict=True))
    snapshot.restore()
    for a, b in zip(kept, values(model, [counter]), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_non_finite_state_is_not_kept():
    model, _ = make_model()
    snapshot = StateSnapshot(lambda: training_state(model))
    assert snapshot.take()
    kept = values(model)
    model.layers[0].kernel.assign(np.full((3, 4), np.nan, "float32"))
    assert not snapshot.take()
    snapshot.restore()
    for a, b in zip(kept, values(model), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_variable_made_after_the_first_snapshot_is_kept_too():
    model, _ = make_model()
    extra = {}
    snapshot = StateSnapshot(lambda: training_state(model, extra))
    snapshot.take()
    extra["owner_late"] = tf.Variable([1.0, 2.0])
    snapshot.take()
    extra["owner_late"].assign([5.0, 6.0])
    snapshot.restore()
    np.testing.assert_array_equal(extra["owner_late"].numpy(), [1.0, 2.0])
