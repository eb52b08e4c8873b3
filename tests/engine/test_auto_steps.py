"""`steps_per_loop="auto"`: the choice of k from measured call times, and the Trainer with it."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import compile_args, make_mlp, max_weight_difference

import tftrain
from tftrain.engine import auto_steps
from tftrain.engine.auto_steps import PROBE_CALLS, PROBE_STEPS, StepsPerCall, choose_steps


def test_choose_steps_amortises_the_overhead_of_a_call():
    # 1 ms of overhead, 0.1 ms a step: 49 * 1 / 0.1 = 490 steps keep it at 2%, capped at MAX_STEPS.
    assert choose_steps(0.0011, 0.0011 + 7 * 0.0001) == auto_steps.MAX_STEPS
    # 10 ms of overhead, 10 ms a step: 49 steps keep it at 2% (more than MIN_CALL_S's 20).
    assert abs(choose_steps(0.02, 0.02 + 7 * 0.01) - 49) <= 1
    # 0.1 ms of overhead, 5 ms a step: the overhead needs 10 steps, MIN_CALL_S 40.
    assert choose_steps(0.0051, 0.0051 + 7 * 0.005) == round(auto_steps.MIN_CALL_S / 0.005) == 40
    # The step dominates (20 ms a step, 0.1 ms overhead): calls still run MIN_CALL_S of steps.
    assert choose_steps(0.0201, 0.0201 + 7 * 0.02) == round(auto_steps.MIN_CALL_S / 0.02) == 10
    # A step longer than MIN_CALL_S: one step per call.
    assert choose_steps(0.3001, 0.3001 + 7 * 0.3) == 1
    # A call stays short: 10 ms steps with a large overhead still make calls of at most MAX_CALL_S.
    assert abs(choose_steps(0.5, 0.5 + 7 * 0.01) - auto_steps.MAX_CALL_S / 0.01) <= 1
    # Noise that makes the longer probe faster still gives a valid k.
    assert 1 <= choose_steps(0.002, 0.001) <= auto_steps.MAX_STEPS


def test_steps_per_call_probes_then_keeps_its_choice():
    chooser = StepsPerCall("auto")
    chooser.record(1, 5.0, traced=True)  # the traced call is no sample
    sizes = []
    for _ in range(2 * PROBE_CALLS):
        sizes.append(chooser.next())
        chooser.record(sizes[-1], 0.0002 + (sizes[-1] - 1) * 0.0001 + 0.0001, traced=False)
    assert sizes == [1] * PROBE_CALLS + [PROBE_STEPS] * PROBE_CALLS
    assert chooser.chosen == choose_steps(0.0003, 0.001) == chooser.next()
    chooser.record(3, 10.0, traced=False)  # after the choice, nothing changes it
    assert chooser.next() == chooser.chosen


def test_a_call_cut_short_is_no_sample_and_a_fixed_k_stays_fixed():
    chooser = StepsPerCall("auto")
    for _ in range(10):
        chooser.record(3, 0.01, traced=False)  # a call cut at a boundary: neither probe size
    assert chooser.chosen is None and chooser.next() == 1
    fixed = StepsPerCall(7)
    fixed.record(1, 1.0, traced=False)
    assert fixed.next() == 7


def data(examples=400, batch_size=4):
    rng = np.random.RandomState(0)
    x = rng.rand(examples, 6).astype("float32")
    y = (x[:, 0] * 3).astype("int32").clip(0, 2)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)


def test_auto_trains_as_one_step_per_call_does_and_chooses_k():
    one = tftrain.Trainer(make_mlp(), **compile_args(), steps_per_loop=1)
    one.fit(data(), epochs=1, verbose=0)
    auto = tftrain.Trainer(make_mlp(), **compile_args(), steps_per_loop="auto")
    history = auto.fit(data(), epochs=1, verbose=0)
    assert max_weight_difference(auto.model, one.model) < 1e-5
    assert history.history.keys() == one.model.history.history.keys()
    chooser = auto.engines.auto_steps["train"]
    assert chooser.chosen is not None and 1 <= chooser.chosen <= auto_steps.MAX_STEPS
    assert auto.chosen_steps_per_loop == chooser.chosen and one.chosen_steps_per_loop is None
    assert auto.timing.steps == 100 and auto.timing.trace_count == 1
    # The choice is kept: a second fit runs at the chosen k from its first call.
    auto.fit(data(), epochs=1, verbose=0)
    assert auto.engines.auto_steps["train"] is chooser


def test_auto_keeps_one_step_per_call_for_callbacks_that_count_on_batch_hooks():
    batches = []

    class PerBatch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            batches.append(batch)

    trainer = tftrain.Trainer(make_mlp(), **compile_args(), steps_per_loop="auto")
    trainer.fit(data(examples=80), epochs=1, callbacks=[PerBatch()], verbose=0)
    assert batches == list(range(20))  # every step, as model.fit calls it
    assert "train" not in trainer.engines.auto_steps


def test_auto_evaluates_and_predicts_as_one_step_per_call_does():
    trainer = tftrain.Trainer(make_mlp(), **compile_args(), steps_per_loop="auto")
    reference = tftrain.Trainer(make_mlp(), **compile_args(), steps_per_loop=1)
    np.testing.assert_allclose(
        trainer.predict(data(), verbose=0), reference.predict(data(), verbose=0), rtol=1e-6
    )
    got = trainer.evaluate(data(), verbose=0, return_dict=True)
    expected = reference.evaluate(data(), verbose=0, return_dict=True)
    assert got.keys() == expected.keys()
    for key in got:
        assert got[key] == pytest.approx(expected[key], rel=1e-6)
