"""SimCLR's warmup + cosine learning-rate schedule."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from tftrain.examples.simclr.schedule import WarmUpAndCosineDecay, train_steps_of


def values(schedule, steps):
    return [
        float(schedule(tf.constant(step, tf.int64 if isinstance(step, int) else tf.float32)))
        for step in steps
    ]


def test_warmup_then_cosine_to_zero():
    # 1000 examples, batch 100: 10 steps per epoch; 2 warmup epochs = 20 steps; 10 epochs = 101 steps.
    schedule = WarmUpAndCosineDecay(
        0.3, num_examples=1000, train_batch_size=100, train_epochs=10, warmup_epochs=2
    )
    peak = 0.3 * 100 / 256
    assert schedule.warmup_steps == 20 and schedule.total_steps == 101
    start, mid_warmup, end_warmup, half, end, after = values(schedule, [0, 10, 20, 20 + 81 / 2, 101, 150])
    assert start == 0.0
    assert mid_warmup == pytest.approx(peak / 2, rel=1e-6)
    assert end_warmup == pytest.approx(peak, rel=1e-6)
    assert half == pytest.approx(peak / 2, rel=1e-5)
    assert end == pytest.approx(0.0, abs=1e-7)
    assert after == pytest.approx(0.0, abs=1e-7)
    quarter = values(schedule, [20 + 81 / 4])[0]
    assert quarter == pytest.approx(peak * 0.5 * (1 + math.cos(math.pi / 4)), rel=1e-5)
    curve = values(schedule, range(0, 102))
    assert np.argmax(curve) == 20
    assert all(np.diff(curve[:21]) > 0) and all(np.diff(curve[20:]) < 0)


def test_sqrt_scaling_and_no_warmup():
    schedule = WarmUpAndCosineDecay(
        0.075,
        num_examples=50,
        train_batch_size=16,
        train_steps=40,
        warmup_epochs=0,
        learning_rate_scaling="sqrt",
    )
    assert schedule.warmup_steps == 0
    assert values(schedule, [0])[0] == pytest.approx(0.075 * 4.0, rel=1e-6)
    assert values(schedule, [20])[0] == pytest.approx(0.15, rel=1e-5)


def test_train_steps_win_over_epochs():
    assert train_steps_of(1000, 7, 10, 100) == 7
    assert train_steps_of(1000, None, 10, 100) == 101
    assert train_steps_of(1000, 0, 3, 128) == 1000 * 3 // 128 + 1  # 0 means not given, as SimCLR's flag
    schedule = WarmUpAndCosineDecay(
        1.0, num_examples=1000, train_batch_size=100, train_steps=30, train_epochs=10, warmup_epochs=1
    )
    assert schedule.total_steps == 30
    assert values(schedule, [30])[0] == pytest.approx(0.0, abs=1e-7)
    assert values(schedule, [20])[0] > 0.0


def test_warmup_steps_use_the_reference_rounding():
    schedule = WarmUpAndCosineDecay(
        1.0, num_examples=1050, train_batch_size=100, train_epochs=5, warmup_epochs=1.5
    )
    assert schedule.warmup_steps == int(round(1.5 * 1050 // 100))  # 15


def test_get_config_round_trips():
    schedule = WarmUpAndCosineDecay(
        0.5,
        num_examples=500,
        train_batch_size=64,
        train_epochs=3,
        warmup_epochs=0.5,
        learning_rate_scaling="sqrt",
    )
    restored = WarmUpAndCosineDecay.from_config(schedule.get_config())
    assert restored.get_config() == schedule.get_config()
    steps = [0, 1, 3, 10, 20, 24]
    assert values(restored, steps) == values(schedule, steps)
    revived = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert isinstance(revived, WarmUpAndCosineDecay) and values(revived, steps) == values(schedule, steps)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="Invalid value for argument `learning_rate_scaling`"):
        WarmUpAndCosineDecay(0.1, 100, 10, train_epochs=1, learning_rate_scaling="log")
    with pytest.raises(ValueError, match="Invalid value for argument `train_epochs`"):
        WarmUpAndCosineDecay(0.1, 100, 10)
    with pytest.raises(ValueError, match="Invalid value for argument `train_batch_size`"):
        train_steps_of(100, None, 1, 0)


def test_drives_an_optimizer_inside_a_tf_function():
    schedule = WarmUpAndCosineDecay(
        2.56, num_examples=40, train_batch_size=10, train_steps=12, warmup_epochs=1
    )  # peak 0.1 at step 4
    optimizer = keras.optimizers.SGD(learning_rate=schedule)
    variable = keras.Variable(0.0)

    @tf.function
    def step():
        optimizer.apply([tf.constant(-1.0)], [variable])
        return optimizer.learning_rate

    rates = [float(step()) for _ in range(6)]
    expected = values(schedule, range(1, 7))  # the rate after each step is the one for the next
    np.testing.assert_allclose(rates, expected, rtol=1e-5)
    # The update of step t used the rate at t: 0, 0.025, 0.05, 0.075, 0.1, then the cosine.
    np.testing.assert_allclose(float(variable.numpy()), sum(values(schedule, range(6))), rtol=1e-5)
