"""Optimizer features `fit` users rely on, under the Trainer as under `model.fit`, and resumed exactly.

Keras optimizers' `gradient_accumulation_steps` and `use_ema` (with
`keras.callbacks.SwapEMAWeights`) under every engine, k steps per call
included (k=4 against a 3-step accumulation cycle, which also crosses the
5-step epochs), under a `MirroredStrategy` of 2 CPUs (EMA; accumulation fails
there under `fit` itself, and the Trainer fails alike), and resumed from a
checkpoint written in the middle of an accumulation cycle.
"""

import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import TWO_CPU_MIRRORED_SETUP, run_result_script
from parity import fit_both
from test_trainer_parity import check_all, regression_data, regression_model

import tftrain
from tftrain.checkpoint import restore_model

OPTIMIZERS = {
    "accumulate_sgd": lambda: keras.optimizers.SGD(0.05, momentum=0.5, gradient_accumulation_steps=3),
    "ema_sgd": lambda: keras.optimizers.SGD(0.05, use_ema=True, ema_momentum=0.5),
    "accumulate_ema_adam": lambda: keras.optimizers.Adam(
        0.01, gradient_accumulation_steps=3, use_ema=True, ema_momentum=0.5
    ),
}
ENGINES = ["eager", "graph", "xla", "loop4", "xla_loop4"]


def assert_same_optimizer_state(
    expected: keras.optimizers.Optimizer, got: keras.optimizers.Optimizer, **tolerance
):
    """Every optimizer variable (iterations, slots, accumulators, moving averages) agrees."""
    assert [tuple(v.shape) for v in got.variables] == [tuple(v.shape) for v in expected.variables]
    for left, right in zip(expected.variables, got.variables, strict=True):
        if tolerance:
            np.testing.assert_allclose(right.numpy(), left.numpy(), err_msg=left.path, **tolerance)
        else:
            np.testing.assert_array_equal(right.numpy(), left.numpy(), err_msg=left.path)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_accumulation_and_ema_train_as_under_fit(optimizer, engine):
    x, y = regression_data(40)  # 5 steps an epoch: the 3-step cycles and 4-step calls cross epoch ends
    uses_ema = "ema" in optimizer
    result = fit_both(
        regression_model,
        lambda: dict(optimizer=OPTIMIZERS[optimizer](), loss="mse", metrics=["mae"]),
        engine,
        data_args=(x, y),
        fit_kwargs=dict(batch_size=8, epochs=2, shuffle=False, validation_data=(x[:16], y[:16])),
        callbacks=(lambda: [keras.callbacks.SwapEMAWeights()]) if uses_ema else None,
    )
    check_all(result)  # weights (EMA finalized), History, every hook's logs
    keras_model, model = result[0], result[3]
    assert_same_optimizer_state(keras_model.optimizer, model.optimizer, atol=1e-6, rtol=1e-5)
    assert int(model.optimizer.iterations) == int(keras_model.optimizer.iterations)


MIRRORED_SCRIPT = TWO_CPU_MIRRORED_SETUP + textwrap.dedent(
    """

    def train(side, accumulation, k=1):
        with strategy.scope():
            keras.utils.set_random_seed(1)
            model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                      keras.layers.Dense(3)])
            optimizer = keras.optimizers.Adam(0.01, gradient_accumulation_steps=accumulation, use_ema=True,
                                              ema_momentum=0.5)
            model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          metrics=["accuracy"])
        arguments = dict(epochs=2, verbose=0, validation_data=dataset,
                         callbacks=[keras.callbacks.SwapEMAWeights()])
        try:
            if side == "fit":
                history = model.fit(dataset, **arguments)
            else:
                history = tftrain.Trainer(model, strategy=strategy, steps_per_loop=k).fit(dataset, **arguments)
        except Exception as error:
            return f"{type(error).__name__}: {'merge_call' in str(error)}"
        return model, history.history

    def compare(expected, got):
        if isinstance(expected, str) or isinstance(got, str):
            return {"errors": [run if isinstance(run, str) else "trained" for run in (expected, got)]}
        (expected_model, expected_history), (model, history) = expected, got
        return {
            "weights": max(float(np.abs(a - b).max())
                           for a, b in zip(expected_model.get_weights(), model.get_weights())),
            "optimizer": max(float(np.abs(a.numpy() - b.numpy()).max())
                             for a, b in zip(expected_model.optimizer.variables, model.optimizer.variables)),
            "history": max(abs(a - b) for key in expected_history
                           for a, b in zip(expected_history[key], history[key])),
            "same_keys": sorted(expected_history) == sorted(history),
            "iterations": int(model.optimizer.iterations.numpy()),
        }

    # 4 steps an epoch, 2 epochs. Keras's fit cannot run steps_per_execution > 1 under this strategy
    # (an InvalidArgumentError in its loop, any optimizer), so 2-step calls are compared with fit's 1-step.
    ema_fit = train("fit", None)
    results = {
        "ema": compare(ema_fit, train("trainer", None)),
        "ema_loop2": compare(ema_fit, train("trainer", None, k=2)),
        "accumulate": compare(train("fit", 3), train("trainer", 3)),
        "accumulate_loop2": compare(train("fit", 3), train("trainer", 3, k=2)),
    }
    print("RESULT" + json.dumps(results))
    """
)


def test_ema_and_accumulation_under_a_mirrored_strategy_behave_as_under_fit():
    results = run_result_script(MIRRORED_SCRIPT, timeout=300)
    for name in ("ema", "ema_loop2"):
        result = results[name]
        assert result["same_keys"], name
        assert max(result["weights"], result["optimizer"], result["history"]) < 1e-5, (name, result)
        assert result["iterations"] == 8, name
    # Keras's gradient accumulation cannot run under a tf.distribute strategy (its update is a `cond`
    # around a cross-replica sum: keras-team/keras#20582, Keras 3.7 to 3.15): the Trainer raises what fit
    # raises. Should Keras fix it, the two must train alike.
    for name in ("accumulate", "accumulate_loop2"):
        result = results[name]
        if "errors" in result:
            assert result["errors"] == ["RuntimeError: True", "RuntimeError: True"], name
        else:
            assert max(result["weights"], result["optimizer"], result["history"]) < 1e-5, (name, result)
            assert result["iterations"] == 2, name  # 8 steps: 2 updates of 3 accumulated gradients


# ------------------------------------------------------------------ resume mid-accumulation


class _Killed(Exception):
    pass


class _KillAfter(keras.callbacks.Callback):
    """Raises after the host call that passes global step `step`.

    Steps are `trainer.global_step`: under gradient accumulation the
    optimizer's `iterations` count applied updates, not steps.
    """

    def __init__(self, trainer, step):
        super().__init__()
        self.trainer, self.step = trainer, step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.trainer.global_step.numpy()) > self.step:
            raise _Killed()


ENGINE_KWARGS = {
    "eager": dict(use_tf_function=False),
    "graph": dict(steps_per_loop=1),
    "xla": dict(jit_compile=True),
    "loop4": dict(steps_per_loop=4),
}


def _dataset():
    x, y = regression_data(40)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8)  # 5 steps an epoch


def _fit(engine, model_dir=None, kill_after=None, **fit_kwargs):
    model = regression_model()
    optimizer = keras.optimizers.Adam(0.01, gradient_accumulation_steps=3, use_ema=True, ema_momentum=0.5)
    directory = dict(model_dir=str(model_dir), checkpoint_every_steps=4) if model_dir else {}
    trainer = tftrain.Trainer(model, optimizer, "mse", metrics=["mae"], **ENGINE_KWARGS[engine], **directory)
    callbacks = [_KillAfter(trainer, kill_after)] if kill_after else []
    fit_kwargs.setdefault("epochs", 2)
    history = trainer.fit(_dataset(), verbose=0, shuffle=False, callbacks=callbacks, **fit_kwargs)
    return model, history.history


def _assert_identical(expected, got):
    for left, right in zip(expected.weights, got.weights, strict=True):
        np.testing.assert_array_equal(right.numpy(), left.numpy(), err_msg=left.path)
    assert_same_optimizer_state(expected.optimizer, got.optimizer)


@pytest.mark.parametrize("engine", sorted(ENGINE_KWARGS))
def test_a_run_killed_mid_accumulation_resumes_bit_identical(engine, tmp_path, deterministic):
    reference, reference_history = _fit(engine)
    with pytest.raises(_Killed):
        _fit(engine, tmp_path, kill_after=4)  # the last checkpoint: step 4, one gradient into a 3-step cycle
    checkpoint = tf.train.latest_checkpoint(str(tmp_path / "checkpoints"))
    assert checkpoint.endswith("ckpt-4")
    saved = regression_model()
    saved.compile(keras.optimizers.Adam(0.01, gradient_accumulation_steps=3, use_ema=True), "mse")
    restore_model(saved, checkpoint)
    assert int(saved.optimizer._iterations.numpy()) == 4
    accumulated = [v.numpy() for v in saved.optimizer._accumulated_gradients]
    assert all(np.any(value != 0) for value in accumulated)  # the checkpoint holds the pending gradients

    resumed, history = _fit(engine, tmp_path)
    _assert_identical(reference, resumed)  # weights (EMA finalized), slots, accumulators, moving averages
    assert history == reference_history


def test_a_budget_stopped_mid_accumulation_extends_bit_identical(tmp_path, deterministic):
    # The first call ends at step 4 and writes the EMA into the model (finalize_variable_values); its
    # checkpoint holds the raw weights, so the extended run continues them.
    reference, _ = _fit("graph", total_steps=10, epochs=1)
    _fit("graph", tmp_path, total_steps=4, epochs=1)
    extended, _ = _fit("graph", tmp_path, total_steps=10, epochs=1)
    _assert_identical(reference, extended)
