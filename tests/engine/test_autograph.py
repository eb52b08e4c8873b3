"""AutoGraph converts user steps only: the library's graph code around them never is.

Keras marks its step and loop functions `do_not_convert`; the Trainer's
engine builds every `tf.function` with `autograph=False` and converts the
user's step alone (`make_runner(..., autograph=True)`), once. Converting the
library's own functions at every trace cost about a second of a tutorial
run's first step.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import ENGINES
from tensorflow.python.autograph.impl import api as autograph_api

import tftrain


@pytest.fixture
def converted(monkeypatch):
    """The functions AutoGraph converts while the test runs, as 'module.qualname' (TF's transpiler, patched)."""
    names = []
    transpiler = autograph_api._TRANSPILER
    original = transpiler.transform

    def transform(function, user_context):
        names.append(f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', function)}")
        return original(function, user_context)

    monkeypatch.setattr(transpiler, "transform", transform)
    return names


def data():
    rng = np.random.RandomState(0)
    return rng.rand(64, 6).astype("float32"), rng.randint(0, 3, 64)


def compiled_mlp():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]
    )
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


@pytest.mark.parametrize("engine", ["graph", "loop3", "xla"])
def test_a_default_fit_evaluate_and_predict_convert_no_function(converted, engine):
    x, y = data()
    trainer = tftrain.Trainer(compiled_mlp(), **ENGINES[engine])
    trainer.fit(x, y, batch_size=16, epochs=2, validation_split=0.25, verbose=0)
    trainer.evaluate(x, y, batch_size=16, verbose=0)
    trainer.predict(x, batch_size=16, verbose=0)
    assert converted == []


class BranchingTrainer(tftrain.Trainer):
    """A custom-loop step with Python control flow on tensors (AutoGraph turns it into `tf.cond`)."""

    def train_step(self, batch):
        x, y = batch
        with tf.GradientTape() as tape:
            logits = self.model(x, training=True)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        if loss > 100.0:
            scale = 0.0
        else:
            scale = 1.0
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply([g * scale for g in grads], self.model.trainable_variables)
        return {"loss": loss}


@pytest.mark.parametrize("engine", ["graph", "loop3", "xla"])
def test_a_user_step_with_python_control_flow_on_tensors_is_converted_and_runs(converted, engine):
    x, y = data()
    trainer = BranchingTrainer(compiled_mlp(), **ENGINES[engine])
    history = trainer.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert converted and all(name.startswith(__name__) for name in converted), converted


class BranchingModel(keras.Model):
    """A model whose own `train_step` branches on a tensor in Python."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(3)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(
                keras.losses.sparse_categorical_crossentropy(y, self(x, training=True), from_logits=True)
            )
            while loss > 1e6:  # never true: still a tf.while_loop once converted
                loss = loss / 2.0
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        return {"loss": loss}


def test_a_model_train_step_override_is_converted(converted):
    x, y = data()
    model = BranchingModel()
    model.compile(keras.optimizers.SGD(0.1))
    history = tftrain.Trainer(model, steps_per_loop=2).fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert f"{__name__}.BranchingModel.train_step" in converted


class PlainTrainer(tftrain.Trainer):
    @tf.autograph.experimental.do_not_convert
    def train_step(self, batch):
        x, y = batch
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(
                keras.losses.sparse_categorical_crossentropy(
                    y, self.model(x, training=True), from_logits=True
                )
            )
        self.optimizer.apply(
            tape.gradient(loss, self.model.trainable_variables), self.model.trainable_variables
        )
        return {"loss": loss}


def test_a_user_step_marked_do_not_convert_is_not_converted(converted):
    x, y = data()
    PlainTrainer(compiled_mlp()).fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert converted == []


def test_an_eager_trainer_converts_nothing(converted):
    x, y = data()
    BranchingTrainer(compiled_mlp(), use_tf_function=False).fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert converted == []


def test_a_user_step_without_readable_source_runs_as_is_with_a_warning():
    namespace = {"tf": tf, "keras": keras}
    exec(  # noqa: S102 (a step defined where AutoGraph cannot read its source, as in `python -c`)
        "def train_step(self, batch):\n"
        "    x, y = batch\n"
        "    with tf.GradientTape() as tape:\n"
        "        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, self.model(x), from_logits=True))\n"
        "    self.optimizer.apply(tape.gradient(loss, self.model.trainable_variables), self.model.trainable_variables)\n"
        "    return {'loss': loss}\n",
        namespace,
    )
    trainer_class = type("SourcelessTrainer", (tftrain.Trainer,), {"train_step": namespace["train_step"]})
    x, y = data()
    with pytest.warns(UserWarning, match="AutoGraph could not transform"):
        history = trainer_class(compiled_mlp()).fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def compiled_custom_model(model_class=tftrain.CustomModel):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    model = model_class(inputs, keras.layers.Dense(3)(keras.layers.Dense(8, activation="relu")(inputs)))
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


class PlainSubclass(tftrain.CustomModel):
    """A CustomModel subclass that changes no piece of the step."""


@pytest.mark.parametrize("model_class", [tftrain.CustomModel, PlainSubclass])
def test_an_unchanged_custom_model_converts_no_function(converted, model_class):
    x, y = data()
    trainer = tftrain.Trainer(compiled_custom_model(model_class))
    trainer.fit(x, y, batch_size=16, epochs=1, validation_split=0.25, verbose=0)
    trainer.evaluate(x, y, batch_size=16, verbose=0)
    assert converted == []


class BranchingForward(tftrain.CustomModel):
    """Overrides one piece of CustomModel's step with Python control flow on a tensor."""

    def forward(self, x, training):
        y_pred = self(x, training=training)
        if tf.reduce_max(y_pred) > 1e6:  # never true; a tf.cond once converted
            y_pred = y_pred * 0.0
        return y_pred


def test_a_custom_model_piece_with_python_control_flow_is_converted_and_runs(converted):
    x, y = data()
    history = tftrain.Trainer(compiled_custom_model(BranchingForward)).fit(
        x, y, batch_size=16, epochs=1, validation_split=0.25, verbose=0
    )
    assert np.isfinite(history.history["val_loss"][0])
    assert f"{__name__}.BranchingForward.forward" in converted


class TracedStepTrainer(tftrain.Trainer):
    """A step already wrapped in `tf.function` (it converts itself)."""

    @tf.function
    def train_step(self, batch):
        return PlainTrainer.train_step(self, batch)


def test_a_step_that_is_a_tf_function_runs_without_a_conversion_warning(recwarn):
    x, y = data()
    TracedStepTrainer(compiled_mlp()).fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert not [w for w in recwarn if "AutoGraph" in str(w.message)]


def test_a_step_set_on_the_instance_runs(converted):
    x, y = data()
    trainer = tftrain.Trainer(compiled_mlp())
    calls = []

    def train_step(batch):
        calls.append("traced")
        return tftrain.Trainer.train_step(trainer, batch)

    trainer.train_step = train_step
    trainer.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert calls  # traced (twice: the first trace creates the optimizer's variables)
    assert any(name.endswith("train_step") for name in converted)
