"""Template: the classic custom training loop as a `tftrain.Trainer` subclass.

Copy this file and replace the model, the data and `train_step`. Run:

    python examples/custom_training_loop.py --epochs=3 --use_tf_function=false
"""

import keras
import numpy as np
import tensorflow as tf
from absl import app, flags

import tftrain

FLAGS = flags.FLAGS
flags.DEFINE_integer("epochs", 3, "Epochs to train.")
flags.DEFINE_integer("num_examples", 2048, "Synthetic examples to train on.")
flags.DEFINE_bool("use_tf_function", True, "False runs the step eagerly (print/pdb work).")
flags.DEFINE_integer("steps_per_loop", 1, "Training steps per host call.")


class RegressionTrainer(tftrain.Trainer):
    """Mean squared error with an L2 penalty, written by hand."""

    def __init__(self, model: keras.Model, l2: float = 1e-4, **kwargs):
        super().__init__(model, optimizer=keras.optimizers.Adam(1e-2), **kwargs)
        self.l2 = l2
        self.train_loss = keras.metrics.Mean(name="loss")
        self.mae = keras.metrics.MeanAbsoluteError(name="mae")

    def train_step(self, batch):
        x, y = batch
        with tf.GradientTape() as tape:
            prediction = self.model(x, training=True)
            loss = tf.reduce_mean(tf.square(prediction - y))
            loss += self.l2 * tf.add_n([tf.nn.l2_loss(w) for w in self.model.trainable_weights])
        gradients = tape.gradient(loss, self.model.trainable_weights)
        self.optimizer.apply(gradients, self.model.trainable_weights)
        self.train_loss.update_state(loss)
        self.mae.update_state(y, prediction)
        return {"loss": self.train_loss.result(), "mae": self.mae.result()}

    def eval_step(self, batch):
        x, y = batch
        self.mae.update_state(y, self.model(x, training=False))
        return {"mae": self.mae.result()}


def make_data(num_examples: int, seed: int = 0) -> tf.data.Dataset:
    """y = sum of the features plus noise, in batches of 64."""
    rng = np.random.RandomState(seed)
    x = rng.rand(num_examples, 8).astype("float32")
    y = (x.sum(axis=1, keepdims=True) + 0.05 * rng.randn(num_examples, 1)).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(num_examples, seed=seed).batch(64)


def main(argv):
    del argv
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)]
    )
    trainer = RegressionTrainer(
        model, use_tf_function=FLAGS.use_tf_function, steps_per_loop=FLAGS.steps_per_loop
    )
    history = trainer.fit(
        make_data(FLAGS.num_examples),
        epochs=FLAGS.epochs,
        validation_data=make_data(512, seed=1),
        verbose=2,
    )
    print(f"final val_mae={history.history['val_mae'][-1]:.4f}")


if __name__ == "__main__":
    app.run(main)
