"""`Trainer(mixed_precision=...)`: low-precision compute, float32 variables, loss scaling for float16."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import make_mlp

import tftrain


@pytest.fixture(autouse=True)
def restore_global_policy():
    policy = keras.mixed_precision.global_policy()
    yield
    keras.mixed_precision.set_global_policy(policy)


def repeated(tiny_data):
    return tf.data.Dataset.from_tensor_slices(tiny_data).batch(10).repeat()


def loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@pytest.mark.parametrize("engine", ["graph", "loop3", "eager"], indirect=True)
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_trains_with_float32_variables(policy, engine, tiny_data):
    model = make_mlp()
    trainer = tftrain.Trainer(model, keras.optimizers.SGD(0.5), loss(), mixed_precision=policy, **engine)
    history = trainer.fit(repeated(tiny_data), epochs=4, steps_per_epoch=6, verbose=0)
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert model.layers[0].compute_dtype == policy.split("_")[1]
    assert {v.dtype for v in model.trainable_variables} == {"float32"}
    wrapped = isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert wrapped == (policy == "mixed_float16")


def test_float16_loss_scale_skips_an_overflowing_step(tiny_data):
    calls = tf.Variable(0)

    class Overflow(tftrain.Trainer):
        """A hand-written step: scales the loss as the docs say; step 2's loss overflows float16."""

        def train_step(self, batch):
            x, y = batch
            call = calls.assign_add(1)
            with tf.GradientTape() as tape:
                logits = keras.ops.cast(self.model(x, training=True), "float32")
                value = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, True))
                factor = tf.where(tf.equal(call, 2), 1e30, 1.0)
                scaled = self.optimizer.scale_loss(value * factor)
            grads = tape.gradient(scaled, self.model.trainable_variables)
            self.optimizer.apply(grads, self.model.trainable_variables)
            return {"loss": value}

    model = make_mlp()
    trainer = Overflow(model, keras.optimizers.SGD(0.1), mixed_precision="mixed_float16")
    optimizer = model.optimizer
    initial_scale = float(optimizer.initial_scale)
    trainer.fit(repeated(tiny_data), epochs=1, steps_per_epoch=3, verbose=0)
    assert float(optimizer.dynamic_scale.numpy()) == initial_scale / 2  # halved once, at the overflow
    assert int(optimizer.iterations.numpy()) == 2  # the overflowing step was skipped
    assert np.all([np.all(np.isfinite(w)) for w in model.get_weights()])


def test_mixed_precision_must_be_a_known_policy():
    with pytest.raises(ValueError, match="mixed_precision=.*mixed_float16"):
        tftrain.Trainer(make_mlp(), "sgd", loss(), mixed_precision="float16")
