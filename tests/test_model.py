"""Tests for `tftrain.CustomModel`: the default step matches Keras, and its pieces can be overridden."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import compile_args, make_mlp, max_weight_difference

import tftrain
from tftrain import CustomModel

EPOCHS = 2


def make_custom(cls=CustomModel, seed=1):
    """A functional `cls` with the architecture and initial weights of `make_mlp(seed)`."""
    reference = make_mlp(seed)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    model = cls(inputs, keras.layers.Dense(3)(hidden))
    model.set_weights(reference.get_weights())
    return model


class SubclassedCustom(CustomModel):
    """A subclassed (not functional) CustomModel: 6 -> 8 -> 3 logits."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.logits = keras.layers.Dense(3)

    def call(self, x, training=False):
        return self.logits(self.hidden(x))


def make_subclassed(seed=1):
    model = SubclassedCustom()
    model(np.zeros((1, 6), "float32"))  # creates the weights
    model.set_weights(make_mlp(seed).get_weights())
    return model


def tiny_arrays():
    rng = np.random.RandomState(0)
    x = rng.rand(50, 6).astype("float32")
    y = (x[:, 0] * 3).astype("int32").clip(0, 2)
    weights = np.linspace(0.2, 2.0, len(x)).astype("float32")
    return x, y, weights


def make_dataset(sample_weights=False):
    """50 examples in batches of 8 (the last has 2), optionally with sample weights."""
    x, y, weights = tiny_arrays()
    return tf.data.Dataset.from_tensor_slices((x, y, weights) if sample_weights else (x, y)).batch(8)


def fit(model, dataset, epochs=EPOCHS, **compile_kwargs):
    model.compile(**{**compile_args(), **compile_kwargs})
    return model.fit(dataset, epochs=epochs, verbose=0, shuffle=False).history


def sgd_args():
    """Plain SGD and the loss, no metrics: cheaper to trace where Adam and metrics add nothing."""
    return dict(optimizer=keras.optimizers.SGD(0.1), loss=compile_args()["loss"], metrics=None)


_FITTED = {}


def fitted(kind):
    """A "keras" or "custom" model trained by `model.fit` on the weighted data, with Adam
    and metrics (cached: several tests compare against it)."""
    if kind not in _FITTED:
        model = {"keras": make_mlp, "custom": make_custom}[kind]()
        history = fit(model, make_dataset(sample_weights=True), weighted_metrics=["accuracy"])
        _FITTED[kind] = model, history
    return _FITTED[kind]


def assert_same_weights(a, b, atol=1e-6):
    assert max_weight_difference(a, b) <= atol


def assert_same_history(a, b, rtol=1e-5):
    assert set(a) == set(b)
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=rtol, atol=1e-7, err_msg=key)


# ----------------------------------------------------------- default train_step


def test_default_train_step_matches_keras():
    """With sample weights, Adam and metrics (weighted and not), as Keras's own train_step."""
    assert_same_weights(make_mlp(), make_custom(), atol=0)
    reference, reference_history = fitted("keras")
    custom, custom_history = fitted("custom")
    assert set(custom_history) == {"loss", "accuracy", "weighted_accuracy"}
    assert_same_history(reference_history, custom_history)
    assert_same_weights(reference, custom)
    # Training did happen, the step ran once per batch, and the sample weights mattered.
    assert max_weight_difference(custom, make_mlp()) > 1e-3
    assert int(custom.optimizer.iterations) == 7 * EPOCHS
    assert custom_history["accuracy"] != custom_history["weighted_accuracy"]


def test_subclassed_custom_model_matches_keras():
    """Also after functional CustomModels were built (Keras once rewrote CustomModel's bases)."""
    reference, reference_history = fitted("keras")
    custom = make_subclassed()
    assert_same_history(reference_history, fit(custom, make_dataset(True), weighted_metrics=["accuracy"]))
    assert_same_weights(reference, custom)


def test_run_eagerly_matches_graph():
    graph, _ = fitted("custom")
    eager = make_custom()
    fit(eager, make_dataset(True), weighted_metrics=["accuracy"], run_eagerly=True)
    assert_same_weights(graph, eager)


# --------------------------------------------------------------- overridden pieces


class FrozenGradients(CustomModel):
    def compute_gradients(self, tape, loss):
        return [tf.zeros_like(g) for g in super().compute_gradients(tape, loss)]


class DoubledLoss(CustomModel):
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return 2.0 * super().compute_loss(x, y, y_pred, sample_weight, training=training)


class DictBatches(CustomModel):
    def unpack_batch(self, data):
        return data["image"], data["label"], data["weight"]


class ZeroLogits(CustomModel):
    def forward(self, x, training):
        return 0.0 * super().forward(x, training)


def test_zero_gradients_leave_the_weights_unchanged():
    model = make_custom(FrozenGradients)
    history = fit(model, make_dataset(), **sgd_args())
    assert_same_weights(model, make_mlp(), atol=0)
    assert int(model.optimizer.iterations) == 7 * EPOCHS  # the steps did run
    assert history["loss"][0] == pytest.approx(history["loss"][-1])


def test_compute_loss_override_changes_training_and_logs():
    """A doubled loss with SGD(lr) trains like SGD(2 * lr), and logs a doubled loss."""
    doubled = make_custom(DoubledLoss)
    doubled_history = fit(doubled, make_dataset(), **{**sgd_args(), "optimizer": keras.optimizers.SGD(0.05)})
    reference = make_mlp()
    reference_history = fit(reference, make_dataset(), **sgd_args())
    assert_same_weights(doubled, reference, atol=1e-5)
    assert max_weight_difference(doubled, make_mlp()) > 1e-3
    np.testing.assert_allclose(doubled_history["loss"], 2 * np.array(reference_history["loss"]), rtol=1e-4)


def test_unpack_batch_override():
    """Dict batches unpacked by an override train like (x, y, w) batches in plain Keras."""
    x, y, weights = tiny_arrays()
    dict_dataset = tf.data.Dataset.from_tensor_slices({"image": x, "label": y, "weight": weights}).batch(8)
    custom = make_custom(DictBatches)
    fit(custom, dict_dataset, weighted_metrics=["accuracy"])
    reference, _ = fitted("keras")
    assert_same_weights(custom, reference)


def test_forward_override_is_used_by_both_steps():
    """With `forward` giving zero logits, the loss is log(3) and nothing can train."""
    x, y, _ = tiny_arrays()
    model = make_custom(ZeroLogits)
    model.compile(**compile_args())
    batch = (tf.constant(x[:8]), tf.constant(y[:8]))
    logs = model.test_step(batch)
    assert float(logs["loss"]) == pytest.approx(np.log(3.0), rel=1e-6)
    model.reset_metrics()
    logs = model.train_step(batch)
    assert float(logs["loss"]) == pytest.approx(np.log(3.0), rel=1e-6)
    assert int(model.optimizer.iterations) == 1
    assert_same_weights(model, make_mlp(), atol=0)


def test_apply_gradients_compiled_without_optimizer_is_an_error():
    model = make_custom()
    model.compile(optimizer=None, loss="mse")
    with pytest.raises(ValueError, match="no optimizer"):
        model.apply_gradients([tf.zeros_like(w) for w in model.trainable_weights])


class OwnLoss(CustomModel):
    """A loss that needs no `compile`, so only the missing optimizer stops training."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return tf.reduce_mean(tf.square(y_pred))


@pytest.mark.parametrize("method", ["apply_gradients", "train_step"])
def test_uncompiled_model_fails_clearly_without_optimizer(method):
    model = make_custom(OwnLoss)
    with pytest.raises(ValueError, match="optimizer"):
        if method == "apply_gradients":
            model.apply_gradients([tf.zeros_like(w) for w in model.trainable_weights])
        else:
            model.train_step((tf.zeros((4, 6)), tf.zeros((4,), tf.int32)))


def test_apply_gradients_uses_the_optimizer():
    model = make_custom()
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss="mse")
    before = [w.numpy() for w in model.trainable_weights]
    model.apply_gradients([tf.ones_like(w) for w in model.trainable_weights])
    for old, weight in zip(before, model.trainable_weights, strict=True):
        np.testing.assert_allclose(weight.numpy(), old - 1.0, atol=1e-6)


def test_no_trainable_weights_warns():
    x, y, _ = tiny_arrays()
    model = make_custom()
    model.trainable = False
    model.compile(**compile_args())
    with pytest.warns(UserWarning, match="no trainable weights"):
        logs = model.train_step((tf.constant(x[:8]), tf.constant(y[:8])))
    assert "loss" in logs
    assert_same_weights(model, make_mlp(), atol=0)


# ------------------------------------------------------------------------ test_step


def test_evaluate_gives_the_weighted_loss_and_metrics():
    x, y, weights = tiny_arrays()
    model = make_custom()
    model.compile(**compile_args(), weighted_metrics=["accuracy"])
    results = model.evaluate(make_dataset(True), verbose=0, return_dict=True)
    assert set(results) == {"loss", "accuracy", "weighted_accuracy"}
    logits = make_mlp()(x).numpy()
    losses = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)(y, logits).numpy()
    correct = (np.argmax(logits, axis=-1) == y).astype("float64")
    assert results["loss"] == pytest.approx(np.sum(weights * losses) / len(x), rel=1e-5)
    assert results["accuracy"] == pytest.approx(correct.mean(), rel=1e-6)
    assert results["weighted_accuracy"] == pytest.approx(np.sum(weights * correct) / weights.sum(), rel=1e-6)
    assert_same_weights(model, make_mlp(), atol=0)  # evaluation does not train


def test_test_step_returns_loss_and_metrics():
    x, y, _ = tiny_arrays()
    model = make_custom()
    model.compile(**compile_args())
    logs = model.test_step((tf.constant(x[:8]), tf.constant(y[:8])))
    assert set(logs) == {"loss", "accuracy"}
    logits = make_mlp()(x[:8])
    expected_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(y[:8], logits)
    assert float(logs["loss"]) == pytest.approx(float(expected_loss), rel=1e-5)
    expected_accuracy = float(np.mean(np.argmax(logits, axis=-1) == y[:8]))
    assert float(logs["accuracy"]) == pytest.approx(expected_accuracy)


# --------------------------------------------------------- Trainer and model.fit


class ClippedModel(CustomModel):
    def compute_gradients(self, tape, loss):
        return [tf.clip_by_norm(g, 0.05) for g in super().compute_gradients(tape, loss)]


@pytest.mark.parametrize("engine_kwargs", [dict(), dict(steps_per_loop=3)], ids=["graph", "loop3"])
def test_custom_model_subclass_same_under_trainer_and_fit(engine_kwargs):
    if "clipped" not in _FITTED:
        model = make_custom(ClippedModel)
        _FITTED["clipped"] = model, fit(model, make_dataset(True), **sgd_args())
    by_fit, fit_history = _FITTED["clipped"]
    by_trainer = make_custom(ClippedModel)
    trainer = tftrain.Trainer(by_trainer, **sgd_args(), **engine_kwargs)
    trainer_history = trainer.fit(make_dataset(True), epochs=EPOCHS, verbose=0).history
    assert_same_weights(by_fit, by_trainer)
    np.testing.assert_allclose(trainer_history["loss"], fit_history["loss"], rtol=1e-5)


def test_clipping_override_matters():
    """The override in the test above is active: one step with and without it differs."""
    x, y, _ = tiny_arrays()
    batch = (tf.constant(x[:8]), tf.constant(y[:8]))
    clipped, plain = make_custom(ClippedModel), make_custom()
    for model in (clipped, plain):
        model.compile(**sgd_args())
        model.train_step(batch)
    assert max_weight_difference(clipped, plain) > 1e-4
    assert max_weight_difference(clipped, make_mlp()) > 0


def test_functional_construction_leaves_custom_model_bases_alone():
    class FunctionalStyle(CustomModel):
        pass

    inputs = keras.Input((6,))
    functional = FunctionalStyle(inputs, keras.layers.Dense(3)(inputs))
    direct = CustomModel(inputs, keras.layers.Dense(2)(inputs))
    assert CustomModel.__bases__ == (keras.Model,)
    assert isinstance(functional, CustomModel) and isinstance(direct, CustomModel)
    assert len(functional.layers) == 2

    class Subclassed(CustomModel):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, x):
            return self.dense(x)

    assert Subclassed()(tf.zeros((2, 6))).shape == (2, 3)
