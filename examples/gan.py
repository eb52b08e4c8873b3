"""Template: a GAN as a `tftrain.CustomModel` with two optimizers and its own `train_step`.

The data is a ring of 8 Gaussians in 2-D (made in memory, CPU-fast). The
generator maps noise to points; the discriminator tells real points from
generated ones. The same step trains under `tftrain.Trainer` (default) and
`keras.Model.fit`. Copy this file and replace the data, the two networks and
`train_step`. Run:

    python examples/gan.py                       # Trainer, tf.function
    python examples/gan.py --loop=fit            # keras model.fit
    python examples/gan.py --use_tf_function=false --epochs=1   # eager, for debugging

Build both optimizers in `compile`. The Trainer and `model.fit` build only
`model.optimizer` before the first trace (a GAN has none); an optimizer that
is still unbuilt creates its variables inside the first traced step, so
`tf.function` traces the step twice (measured: 2 traces instead of 1, also with
`--steps_per_loop` > 1, where the step runs inside a `tf.while_loop`), the
variables do not exist yet when a checkpoint is set up, and under a
distribution strategy they would be created outside `strategy.scope()`.
"""

import keras
import numpy as np
import tensorflow as tf
from absl import app, flags

import tftrain

FLAGS = flags.FLAGS

NUM_MODES = 8
RADIUS = 2.0
STDDEV = 0.05
NEAR = 5 * STDDEV  # a generated point this close to a mode's centre counts as good


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """Defines the flags (only when run as a program, so importing defines nothing)."""
    flags.DEFINE_integer("epochs", 10, "Epochs to train.", flag_values=flag_values)
    flags.DEFINE_integer("steps_per_epoch", 200, "Training steps per epoch.", flag_values=flag_values)
    flags.DEFINE_integer("batch_size", 256, "Batch size.", flag_values=flag_values)
    flags.DEFINE_enum(
        "loop", "trainer", ["trainer", "fit"], "tftrain.Trainer or keras fit.", flag_values=flag_values
    )
    flags.DEFINE_bool("use_tf_function", True, "False runs the step eagerly.", flag_values=flag_values)
    flags.DEFINE_integer(
        "steps_per_loop", 1, "Steps per host call (steps_per_execution under fit).", flag_values=flag_values
    )


class GAN(tftrain.CustomModel):
    """A generator and a discriminator trained against each other, one optimizer each.

    Args:
        latent_dim: Size of the generator's noise input.
        hidden: Width of the hidden layers of both networks.
        seed: Seed of the step's noise.
    """

    def __init__(self, latent_dim: int = 8, hidden: int = 64, seed: int = 0, **kwargs):
        super().__init__(**kwargs)
        self.latent_dim = latent_dim
        dense = keras.layers.Dense
        self.generator = keras.Sequential(
            [keras.Input((latent_dim,)), dense(hidden, "relu"), dense(hidden, "relu"), dense(2)],
            name="generator",
        )
        self.discriminator = keras.Sequential(
            [keras.Input((2,)), dense(hidden, "relu"), dense(hidden, "relu"), dense(1)],
            name="discriminator",
        )
        self.noise_seed = keras.random.SeedGenerator(seed)
        self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
        self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

    def compile(self, d_optimizer, g_optimizer, loss_fn, **kwargs):
        """Sets the two optimizers and the loss, and builds both optimizers.

        Args:
            d_optimizer: The discriminator's optimizer.
            g_optimizer: The generator's optimizer.
            loss_fn: `loss_fn(labels, logits)`, e.g. binary cross-entropy on logits.
            **kwargs: Passed to `keras.Model.compile` (e.g. `steps_per_execution`).
        """
        super().compile(optimizer=None, **kwargs)
        self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn
        d_optimizer.build(self.discriminator.trainable_variables)
        g_optimizer.build(self.generator.trainable_variables)

    @property
    def metrics(self):
        # Listed here, the trackers are reset at each epoch start by both loops.
        return [self.d_loss_tracker, self.g_loss_tracker]

    def call(self, noise, training=False):
        return self.generator(noise, training=training)

    def train_step(self, real):
        batch_size = tf.shape(real)[0]
        fake = self.generator(self._noise(batch_size), training=True)
        with tf.GradientTape() as tape:
            real_logits = self.discriminator(real, training=True)
            fake_logits = self.discriminator(fake, training=True)
            d_loss = self.loss_fn(tf.ones_like(real_logits), real_logits)
            d_loss += self.loss_fn(tf.zeros_like(fake_logits), fake_logits)
        d_weights = self.discriminator.trainable_weights
        self.d_optimizer.apply(tape.gradient(d_loss, d_weights), d_weights)

        with tf.GradientTape() as tape:
            fake_logits = self.discriminator(
                self.generator(self._noise(batch_size), training=True), training=True
            )
            g_loss = self.loss_fn(tf.ones_like(fake_logits), fake_logits)  # fool the discriminator
        g_weights = self.generator.trainable_weights
        self.g_optimizer.apply(tape.gradient(g_loss, g_weights), g_weights)

        self.d_loss_tracker.update_state(d_loss)
        self.g_loss_tracker.update_state(g_loss)
        return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}

    def _noise(self, batch_size):
        return keras.random.normal((batch_size, self.latent_dim), seed=self.noise_seed)


def mode_centres() -> np.ndarray:
    angles = 2 * np.pi * np.arange(NUM_MODES) / NUM_MODES
    return RADIUS * np.stack([np.cos(angles), np.sin(angles)], axis=1)


def make_data(batch_size: int, num_examples: int = 8192, seed: int = 0) -> tf.data.Dataset:
    """Points from the ring of Gaussians, shuffled, batched, repeated forever."""
    rng = np.random.default_rng(seed)
    points = mode_centres()[rng.integers(0, NUM_MODES, num_examples)]
    points = (points + STDDEV * rng.standard_normal(points.shape)).astype("float32")
    dataset = tf.data.Dataset.from_tensor_slices(points).shuffle(num_examples, seed=seed)
    return dataset.batch(batch_size, drop_remainder=True).repeat()


def sample_quality(model: GAN, num_samples: int = 2000) -> tuple[float, int]:
    """(fraction of generated points within `NEAR` of a mode, modes those points cover)."""
    noise = np.random.default_rng(123).standard_normal((num_samples, model.latent_dim)).astype("float32")
    points = model.generator(noise, training=False).numpy()
    distances = np.linalg.norm(points[:, None, :] - mode_centres()[None], axis=-1)
    near = distances.min(axis=1) < NEAR
    return float(near.mean()), len(set(distances.argmin(axis=1)[near]))


def train(
    epochs: int,
    steps_per_epoch: int,
    batch_size: int,
    loop: str,
    use_tf_function: bool,
    steps_per_loop: int = 1,
) -> dict:
    """Trains the GAN and returns final losses, optimizer steps and sample quality."""
    if loop not in ("trainer", "fit"):
        raise ValueError(
            f"Invalid value for argument `loop`. Received: loop={loop!r}. Expected 'trainer' or 'fit'."
        )
    keras.utils.set_random_seed(0)
    model = GAN()
    model.compile(
        d_optimizer=keras.optimizers.Adam(1e-3, beta_1=0.5),
        g_optimizer=keras.optimizers.Adam(1e-3, beta_1=0.5),
        loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
        steps_per_execution=steps_per_loop,
        run_eagerly=not use_tf_function,
    )
    near_before, _ = sample_quality(model)
    data = make_data(batch_size)
    if loop == "trainer":
        trainer = tftrain.Trainer(model, use_tf_function=use_tf_function, steps_per_loop=steps_per_loop)
        history = trainer.fit(data, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=2)
        trace_count = trainer.timing.trace_count
    else:
        timing = tftrain.callbacks.Timing(verbose=True)
        history = model.fit(
            data, epochs=epochs, steps_per_epoch=steps_per_epoch, callbacks=[timing], verbose=2
        )
        trace_count = timing.report.trace_count
    near_after, modes = sample_quality(model)
    return {
        "d_loss": history.history["d_loss"][-1],
        "g_loss": history.history["g_loss"][-1],
        "d_steps": int(model.d_optimizer.iterations.numpy()),
        "g_steps": int(model.g_optimizer.iterations.numpy()),
        "near_mode_before": near_before,
        "near_mode_after": near_after,
        "modes_covered": modes,
        "trace_count": trace_count,
    }


def main(argv):
    del argv
    result = train(
        FLAGS.epochs,
        FLAGS.steps_per_epoch,
        FLAGS.batch_size,
        FLAGS.loop,
        FLAGS.use_tf_function,
        FLAGS.steps_per_loop,
    )
    print(f"final d_loss={result['d_loss']:.4f} g_loss={result['g_loss']:.4f}")
    print(f"optimizer steps: discriminator={result['d_steps']} generator={result['g_steps']}")
    print(
        f"samples within {NEAR:g} of a mode: {result['near_mode_before']:.1%} at init -> "
        f"{result['near_mode_after']:.1%} trained ({result['modes_covered']}/{NUM_MODES} modes covered)"
    )


if __name__ == "__main__":
    define_flags()
    app.run(main)
