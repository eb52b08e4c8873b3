"""A step that returns something else than a dict of logs (or None as predictions) is named, once, with what it returned.

Keras's `fit` fails on the same steps at the first batch's end with an error
about the value (`'tuple' object has no attribute 'items'`), and on None
deep in TensorFlow; the Trainer says which step, what it returned and what
is expected, when the step traces or at its first eager call.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import tftrain
from tftrain.engine import step_outputs

X = np.ones((16, 3), "float32")
Y = np.ones((16, 1), "float32")

RETURNS = {
    "tensor": (lambda loss: loss, r"a tf\.Tensor of shape \(\) and dtype float32"),
    "tuple": (lambda loss: (loss, loss), "a tuple of 2 items"),
    "none": (lambda loss: None, "None"),
    "list": (lambda loss: [loss], "a list of 1 items"),
}


def model():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])


def loss_of(network, batch):
    x, y = batch
    return tf.reduce_mean(tf.square(network(x) - y))


@pytest.mark.parametrize("returned", sorted(RETURNS))
def test_a_custom_loop_train_step_that_returns_no_dict_is_named(engine, returned):
    make, received = RETURNS[returned]

    class BadTrainer(tftrain.Trainer):
        def train_step(self, batch):
            with tf.GradientTape() as tape:
                loss = loss_of(self.model, batch)
            gradients = tape.gradient(loss, self.model.trainable_variables)
            self.optimizer.apply(gradients, self.model.trainable_variables)
            return make(loss)

    trainer = BadTrainer(model(), "sgd", **engine)
    with pytest.raises(TypeError, match=rf"step `BadTrainer\.train_step`\. Received: {received}\. Expected a dict"):
        trainer.fit(X, Y, batch_size=4, verbose=0)
    assert int(trainer.global_step.numpy()) <= 1  # raised at the trace, or the first eager step


def test_a_custom_loop_eval_step_that_returns_a_tensor_is_named(engine):
    class BadTrainer(tftrain.Trainer):
        def eval_step(self, batch):
            return loss_of(self.model, batch)

    with pytest.raises(TypeError, match=r"`BadTrainer\.eval_step`\. Received: a tf\.Tensor"):
        BadTrainer(model(), "sgd", "mse", **engine).evaluate(X, Y, batch_size=4, verbose=0)


class OneDense(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, x):
        return self.dense(x)


class TupleModel(OneDense):
    """A model whose own `train_step` returns a tuple, which Keras's fit fails on too."""

    def train_step(self, data):
        loss = loss_of(self, data)
        return loss, loss


def test_a_models_own_train_step_that_returns_a_tuple_is_named_where_keras_fails_too(engine):
    keras_model = TupleModel()
    keras_model.compile("sgd", "mse")
    with pytest.raises(AttributeError, match="'tuple' object has no attribute 'items'"):  # Keras's fit
        keras_model.fit(X, Y, batch_size=4, verbose=0)
    trainer = tftrain.Trainer(TupleModel(), "sgd", "mse", **engine)
    with pytest.raises(TypeError, match=r"`TupleModel\.train_step`\. Received: a tuple of 2 items"):
        trainer.fit(X, Y, batch_size=4, verbose=0)


class NonePredictions(OneDense):
    def predict_step(self, data):
        return {"scores": self(data[0] if isinstance(data, tuple) else data), "extra": None}


def test_predictions_with_none_are_named_and_any_other_structure_is_taken(engine):
    trainer = tftrain.Trainer(NonePredictions(), **engine)
    with pytest.raises(TypeError, match=r"`NonePredictions\.predict_step`\. Received: None at outputs\['extra'\]"):
        trainer.predict(X, batch_size=4, verbose=0)
    network = model()
    outputs = tftrain.Trainer(network, **engine).predict(X, batch_size=4, verbose=0)
    np.testing.assert_allclose(outputs, network.predict(X, batch_size=4, verbose=0), rtol=1e-6)


def test_the_check_runs_once_under_the_eager_engine_not_per_step(monkeypatch):
    checks = []
    original = step_outputs._check_logs
    monkeypatch.setattr(step_outputs, "_check_logs", lambda logs, label: checks.append(label) or original(logs, label))
    tftrain.Trainer(model(), "sgd", "mse", use_tf_function=False).fit(X, Y, batch_size=4, epochs=2, verbose=0)
    assert checks == ["Sequential.train_step"]  # 8 steps, one check


def test_describe_names_the_type_and_shape():
    assert step_outputs.describe(None) == "None"
    assert step_outputs.describe(np.zeros((2, 3), "float32")) == "a NumPy value of shape (2, 3) and dtype float32"
    assert step_outputs.describe({"a"}) == "an object of type set"
