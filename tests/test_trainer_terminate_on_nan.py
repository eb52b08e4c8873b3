"""A `fit` whose callbacks hold Keras's `TerminateOnNaN`: that callback decides, as under `model.fit`.

The Trainer's NaN guard steps aside (no `NonFiniteLossError`, no call cut at
the NaN), so weights, History and every hook match `model.fit`; with a
`model_dir`, no checkpoint holds a step whose loss was not finite.
"""

import inspect

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import BAD_STEP, STEPS_PER_EPOCH, assert_checkpoints_finite, regression_data
from parity import ENGINE_TRAINER, Recorder, compile_for, same_events, weights_close

import tftrain


def regression_model():
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])


def regression_compile():
    return dict(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])


def fit_side(side, engine, make_callbacks, epochs=2):
    """One fit of a fresh model on data whose step 4 (batch 3) has a NaN target; returns its outcome."""
    model, recorder = regression_model(), Recorder()
    callbacks = [recorder, *make_callbacks()]
    history, error = None, None
    try:
        if side == "keras":
            compile_for(model, engine, regression_compile())
            history = model.fit(regression_data(), epochs=epochs, callbacks=callbacks, verbose=0)
        else:
            model.compile(**regression_compile(), jit_compile=False)
            trainer = tftrain.Trainer(model, **ENGINE_TRAINER[engine])
            history = trainer.fit(regression_data(), epochs=epochs, callbacks=callbacks, verbose=0)
    except RuntimeError as raised:
        error = str(raised)
    return model, history, recorder, error


@pytest.mark.parametrize("raise_error", [False, True], ids=["stop", "raise"])
@pytest.mark.parametrize("engine", ["eager", "graph", "xla", "loop3"])  # loop3: steps_per_loop=3
def test_terminate_on_nan_acts_as_under_fit(engine, raise_error):
    if raise_error and "raise_error" not in inspect.signature(keras.callbacks.TerminateOnNaN).parameters:
        pytest.skip("this Keras's TerminateOnNaN has no raise_error")

    def make_callbacks():
        # Keras before 3.11's TerminateOnNaN has no `raise_error` (it only stops).
        return [
            keras.callbacks.TerminateOnNaN(raise_error=True)
            if raise_error
            else keras.callbacks.TerminateOnNaN()
        ]

    keras_model, keras_history, keras_recorder, keras_error = fit_side("keras", engine, make_callbacks)
    model, history, recorder, error = fit_side("trainer", engine, make_callbacks)

    assert error == keras_error
    assert (error is not None) == raise_error
    # Under loop3 the NaN is the first step of the second call: that call runs its 3 steps, as fit's does.
    steps = 6 if engine == "loop3" else BAD_STEP
    assert int(model.optimizer.iterations) == int(keras_model.optimizer.iterations) == steps
    weights_close(keras_model, model)  # NaN where Keras has NaN
    assert not np.isfinite(model.get_weights()[0]).all()
    same_events(keras_recorder, recorder)  # every hook, index and log, on_train_end only without raising
    if not raise_error:
        assert np.isnan(history.history["loss"]).all() and len(history.history["loss"]) == 1
        for key, values in keras_history.history.items():
            np.testing.assert_allclose(history.history[key], values, rtol=1e-5)


class PerStepLoss(tftrain.Trainer):
    """Reports each step's own loss (no running mean), and trains nothing: only the logs see the NaN."""

    def train_step(self, batch):
        _, y = batch
        return {"loss": tf.reduce_mean(y)}


@pytest.mark.parametrize("steps_per_loop", [1, 3])
def test_no_checkpoint_holds_a_nonfinite_step(tmp_path, steps_per_loop):
    model = regression_model()
    trainer = tftrain.Trainer(
        model,
        **regression_compile(),
        steps_per_loop=steps_per_loop,
        model_dir=str(tmp_path),
        checkpoint_every_steps=2,
        best_checkpoint_monitor="loss",
    )
    with pytest.warns(UserWarning, match="no checkpoint is written for the rest of this fit call.*ckpt-2"):
        trainer.fit(regression_data(), epochs=2, callbacks=[keras.callbacks.TerminateOnNaN()], verbose=0)
    assert model.stop_training and not np.isfinite(model.get_weights()[0]).all()
    latest = assert_checkpoints_finite(tmp_path, BAD_STEP)
    assert latest.endswith("ckpt-2")
    assert tf.train.get_checkpoint_state(str(tmp_path / "best")) is None  # the only epoch end had the NaN


def test_a_nonfinite_step_inside_a_call_keeps_checkpoints_out(tmp_path):
    # The NaN (step 4) is inside the call of steps 4 to 6, whose last loss is finite: TerminateOnNaN does not
    # stop, the weights stay finite, and yet no checkpoint is written from step 4 on.
    trainer = PerStepLoss(
        regression_model(),
        optimizer="sgd",
        steps_per_loop=3,
        model_dir=str(tmp_path),
        checkpoint_every_steps=3,
    )
    with pytest.warns(UserWarning, match=r"steps 4 to 6\): no checkpoint"):
        history = trainer.fit(
            regression_data(), epochs=1, callbacks=[keras.callbacks.TerminateOnNaN()], verbose=0
        )
    assert int(trainer.global_step.numpy()) == STEPS_PER_EPOCH and np.isfinite(history.history["loss"]).all()
    assert assert_checkpoints_finite(tmp_path, BAD_STEP).endswith("ckpt-3")


def test_without_terminate_on_nan_the_guard_stays_and_nothing_more_is_traced():
    trainer = tftrain.Trainer(regression_model(), **regression_compile(), steps_per_loop=3)
    with pytest.raises(tftrain.NonFiniteLossError, match=rf"step {BAD_STEP}\b"):
        trainer.fit(regression_data(), epochs=1, verbose=0)
    assert trainer.engines._past_nonfinite is None  # built only for a fit that needs it
    trainer.fit(
        regression_data(nan_batch=None), epochs=1, callbacks=[keras.callbacks.TerminateOnNaN()], verbose=0
    )
    assert trainer.engines._past_nonfinite is not None
    assert trainer.engines.runner("train").trace_counter.count == 1  # one trace of the step for both
