"""`Trainer(ema_decay=...)`: evaluation, prediction, validation, the best checkpoint and export use the averages.

The average is checked against one computed by hand from the raw weights
after each step (Keras's rule: the first step's weights, then
`decay * average + (1 - decay) * weights`), and the raw weights must come
back bit for bit after every use of the averages.
"""

import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import ENGINES, TWO_CPU_MIRRORED_SETUP, run_result_script

import tftrain
from tftrain import ema

DECAY = 0.8


def data():
    rng = np.random.RandomState(0)
    x = rng.rand(32, 5).astype("float32")
    return x, (x @ rng.rand(5, 2)).astype("float32")


def make_model():
    keras.utils.set_random_seed(2)
    return keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)]
    )


class RecordWeights(keras.callbacks.Callback):
    """The raw weights after each step (one step per call)."""

    def __init__(self):
        super().__init__()
        self.after_step = []

    def on_train_batch_end(self, batch, logs=None):
        self.after_step.append([weight.copy() for weight in self.model.get_weights()])


def hand_average(per_step):
    average = None
    for weights in per_step:
        average = (
            [weight.copy() for weight in weights]
            if average is None
            else [DECAY * a + (1 - DECAY) * w for a, w in zip(average, weights, strict=True)]
        )
    return average


def copy_with(weights):
    model = make_model()
    model.set_weights(weights)
    model.compile(loss="mse", metrics=["mae"])
    return model


def assert_weights_equal(actual, expected):
    for a, b in zip(actual, expected, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("engine", ["eager", "graph", "xla"])
def test_evaluate_and_predict_use_the_hand_computed_average_and_leave_the_raw_weights(engine):
    x, y = data()
    model = make_model()
    trainer = tftrain.Trainer(
        model,
        keras.optimizers.SGD(0.05),
        "mse",
        metrics=["mae"],
        ema_decay=DECAY,
        steps_per_loop=1,
        **ENGINES[engine],
    )
    recorder = RecordWeights()
    trainer.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[recorder])
    raw = model.get_weights()
    assert_weights_equal(raw, recorder.after_step[-1])  # no EMA weights at the end of fit, unlike use_ema
    expected = hand_average(recorder.after_step)
    with trainer.averaged_weights():
        for a, b in zip(model.get_weights(), expected, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
        averaged = model.get_weights()
    assert_weights_equal(model.get_weights(), raw)

    reference = copy_with(averaged)  # XLA rounds differently from the reference's graph: close, not equal
    logs = trainer.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)
    expected = reference.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)
    assert logs == pytest.approx(expected, rel=1e-6)
    np.testing.assert_allclose(
        trainer.predict(x, batch_size=8, verbose=0),
        reference.predict(x, batch_size=8, verbose=0),
        rtol=1e-5,
        atol=1e-6,
    )
    assert_weights_equal(model.get_weights(), raw)


def test_validation_in_fit_uses_the_averages_and_training_goes_on_with_the_raw_weights():
    x, y = data()
    model = make_model()
    trainer = tftrain.Trainer(
        model, keras.optimizers.SGD(0.05), "mse", metrics=["mae"], ema_decay=DECAY, steps_per_loop=4
    )
    recorder = RecordWeights()
    history = trainer.fit(x, y, batch_size=8, epochs=1, validation_data=(x, y), shuffle=False, verbose=0)
    with trainer.averaged_weights():
        averaged = model.get_weights()
    expected = copy_with(averaged).evaluate(x, y, batch_size=32, verbose=0, return_dict=True)
    assert history.history["val_loss"][0] == pytest.approx(expected["loss"], rel=1e-6)
    del recorder
    # The same run without the average trains to the same raw weights: validation changed nothing.
    plain_model = make_model()
    plain = tftrain.Trainer(plain_model, keras.optimizers.SGD(0.05), "mse", metrics=["mae"], steps_per_loop=4)
    plain.fit(x, y, batch_size=8, epochs=1, validation_data=(x, y), shuffle=False, verbose=0)
    assert_weights_equal(model.get_weights(), plain_model.get_weights())


def test_checkpoints_hold_both_and_a_resume_is_exact(tmp_path):
    x, y = data()
    straight = make_model()
    tftrain.Trainer(straight, keras.optimizers.Adam(0.01), "mse", ema_decay=DECAY).fit(
        x, y, batch_size=8, epochs=2, shuffle=False, verbose=0
    )
    first = make_model()
    tftrain.Trainer(first, keras.optimizers.Adam(0.01), "mse", ema_decay=DECAY, model_dir=str(tmp_path)).fit(
        x, y, batch_size=8, epochs=1, shuffle=False, verbose=0
    )
    resumed = make_model()
    trainer = tftrain.Trainer(
        resumed, keras.optimizers.Adam(0.01), "mse", ema_decay=DECAY, model_dir=str(tmp_path)
    )
    trainer.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    assert_weights_equal(resumed.get_weights(), straight.get_weights())
    for a, b in zip(resumed.optimizer.variables, straight.optimizer.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path / "checkpoints")))
    floats = [key for key, dtype in reader.get_variable_to_dtype_map().items() if dtype == tf.float32]
    saved = [reader.get_tensor(key) for key in floats]
    with trainer.averaged_weights():
        averaged_kernel = resumed.get_weights()[0]
    raw_kernel = resumed.get_weights()[0]
    assert not np.array_equal(averaged_kernel, raw_kernel)
    for kernel in (raw_kernel, averaged_kernel):  # both are in the checkpoint
        assert any(np.array_equal(kernel, tensor) for tensor in saved)


def test_the_best_checkpoint_and_export_hold_the_averaged_weights(tmp_path):
    x, y = data()
    model = make_model()
    trainer = tftrain.Trainer(
        model,
        keras.optimizers.SGD(0.05),
        "mse",
        ema_decay=DECAY,
        model_dir=str(tmp_path / "run"),
        best_checkpoint_monitor="val_loss",
    )
    trainer.fit(x, y, batch_size=8, epochs=1, validation_data=(x, y), shuffle=False, verbose=0)
    with trainer.averaged_weights():
        averaged = model.get_weights()
    best = make_model()  # for serving: the weights alone
    tftrain.checkpoint.restore_model(best, str(tmp_path / "run" / "best"), include_optimizer=False)
    assert_weights_equal(best.get_weights(), averaged)

    trainer.export(str(tmp_path / "served"))
    served = tf.saved_model.load(str(tmp_path / "served"))
    np.testing.assert_allclose(served.serve(x).numpy(), copy_with(averaged).predict(x, verbose=0), rtol=1e-6)
    assert not np.array_equal(model.get_weights()[0], averaged[0])  # the model kept its raw weights


def test_before_any_step_the_weights_are_left_as_they_are():
    x, y = data()
    model = make_model()
    trainer = tftrain.Trainer(model, keras.optimizers.SGD(0.05), "mse", ema_decay=DECAY)
    before = model.get_weights()
    trainer.evaluate(x, y, verbose=0)
    with trainer.averaged_weights():
        assert_weights_equal(model.get_weights(), before)


def test_an_optimizer_made_with_use_ema_and_the_same_momentum_is_taken():
    optimizer = keras.optimizers.SGD(0.05, use_ema=True, ema_momentum=DECAY)
    tftrain.Trainer(make_model(), optimizer, "mse", ema_decay=DECAY)
    assert optimizer.use_ema and optimizer.ema_momentum == DECAY


@pytest.mark.parametrize(
    "decay, optimizer, message",
    [
        (1.0, None, r"ema_decay=1.0\. Expected a number in \(0, 1\)"),
        ("0.9", None, "ema_decay='0.9'"),
        (
            0.9,
            keras.optimizers.SGD(use_ema=True, ema_momentum=0.5),
            "ema_momentum=0.5. Expected the same value",
        ),
        (0.9, keras.optimizers.SGD(use_ema=True, ema_overwrite_frequency=3), "ema_overwrite_frequency=3"),
    ],
)
def test_bad_ema_settings_are_rejected(decay, optimizer, message):
    with pytest.raises(ValueError, match=message):
        tftrain.Trainer(make_model(), optimizer or keras.optimizers.SGD(), "mse", ema_decay=decay)


def test_an_optimizer_built_without_averages_is_rejected():
    model = make_model()
    optimizer = keras.optimizers.SGD()
    optimizer.build(model.trainable_variables)
    with pytest.raises(ValueError, match="already built without averages"):
        tftrain.Trainer(model, optimizer, "mse", ema_decay=DECAY)


def test_averaged_weights_without_averages_is_an_error_and_without_ema_decay_a_no_op():
    model = make_model()
    model.compile(keras.optimizers.SGD(), "mse")
    with pytest.raises(ValueError, match="keeps no moving average"):
        with ema.averaged_weights(model):
            pass
    trainer = tftrain.Trainer(model)
    before = model.get_weights()
    with trainer.averaged_weights():
        assert_weights_equal(model.get_weights(), before)


MIRRORED_SCRIPT = TWO_CPU_MIRRORED_SETUP + textwrap.dedent(
    """
    import logging, os
    y = keras.utils.to_categorical(y, 3)

    def build(strategy_scope):
        with strategy_scope:
            keras.utils.set_random_seed(1)
            return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])

    def batches(nan_steps=(), without=()):
        yy = y.copy()
        for step in nan_steps:
            yy[(step - 1) * 16] = np.nan
        keep = [step for step in range(1, 5) if step not in without]
        rows = np.concatenate([np.arange((s - 1) * 16, s * 16) for s in keep])
        return tf.data.Dataset.from_tensor_slices((x[rows], yy[rows])).batch(16)

    results = {}
    # A rollback under the strategy equals a run that never read the skipped batch.
    model = build(strategy.scope())
    trainer = tftrain.Trainer(model, keras.optimizers.Adam(0.01), "mse", strategy=strategy, ema_decay=0.8,
                              model_dir=tempfile.mkdtemp(), checkpoint_every_steps=1, on_nonfinite="rollback")
    trainer.fit(batches(nan_steps=(3,)), epochs=1, verbose=0)
    reference = build(strategy.scope())
    reference_trainer = tftrain.Trainer(reference, keras.optimizers.Adam(0.01), "mse", strategy=strategy, ema_decay=0.8)
    reference_trainer.fit(batches(without=(3,)), epochs=1, verbose=0)
    results["rollback_diff"] = max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), reference.get_weights()))
    # The averages swap in and out exactly, on every replica.
    raw = [np.stack([v.numpy() for v in w.value.values]) for w in model.trainable_variables]
    with trainer.averaged_weights():
        swapped = [np.stack([v.numpy() for v in w.value.values]) for w in model.trainable_variables]
        evaluated = trainer.evaluate(x, y, verbose=0)
    after = [np.stack([v.numpy() for v in w.value.values]) for w in model.trainable_variables]
    results["restored"] = all(np.array_equal(a, b) for a, b in zip(raw, after))
    results["replicas_agree"] = all(np.array_equal(s[0], s[1]) for s in swapped)
    results["swapped"] = any(not np.array_equal(a, b) for a, b in zip(raw, swapped))
    results["evaluate_uses_average"] = abs(trainer.evaluate(x, y, verbose=0) - evaluated) < 1e-6
    print("RESULT" + json.dumps(results))
    """
)


def test_rollback_and_averages_under_a_mirrored_strategy():
    results = run_result_script(MIRRORED_SCRIPT, timeout=300)
    assert results["rollback_diff"] == 0.0, results
    assert results["restored"] and results["replicas_agree"] and results["swapped"], results
    assert results["evaluate_uses_average"], results
