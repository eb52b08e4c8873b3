"""A training job with poisoned batches and `on_nonfinite="rollback"`: `python rollback_job.py MODEL_DIR [--kill-after=N]`.

Trains an MLP with Dropout under op determinism on a shuffled, repeating
dataset whose targets are NaN in the batches of global steps 5 and 11 (and
a spike of 1e4 at step 17), with checkpoints every 3 steps and
`steps_per_loop="auto"` (states kept every 4 steps, whatever k it measures),
for 3 epochs of 8 steps. Step 5 rolls back to the state kept at step 4 (no
checkpoint), 11 to 9, 17 to 16. Writes the final weights, the optimizer's
variables, the global step, the rollbacks and the last epoch's logs to
MODEL_DIR/final.npz. `--kill-after=N` SIGKILLs the process after global step N.
"""

import argparse
import json
import os
import signal

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tftrain  # noqa: E402
from tftrain.checkpoint.state import SERVICE_STATES_KEY  # noqa: E402

BATCH, STEPS_PER_EPOCH, EPOCHS = 4, 8, 3
POISONED_STEPS = (5, 11)  # the batch each of these global steps reads has a NaN target
SPIKE_STEP = 17  # ... and this one a target of 1e4 (above loss_spike_threshold)


def dataset():
    """Batches in global-step order: a repeating, shuffled pipeline with the poison at fixed steps."""
    rng = np.random.RandomState(0)
    x = rng.rand(STEPS_PER_EPOCH * BATCH, 6).astype("float32")
    y = rng.rand(STEPS_PER_EPOCH * BATCH, 3).astype("float32")
    batches = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(32, seed=1).batch(BATCH).repeat()

    def poison(step, batch):
        features, targets = batch
        step = step + 1  # the global step that reads this batch
        targets = tf.where(tf.reduce_any(tf.equal(step, POISONED_STEPS)), np.nan, targets)
        targets = tf.where(tf.equal(step, SPIKE_STEP), 1e4, targets)
        return features, targets

    return batches.enumerate().map(poison)


class KillAfter(keras.callbacks.Callback):
    def __init__(self, trainer, step):
        super().__init__()
        self.trainer, self.step = trainer, step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.trainer.global_step.numpy()) >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("--kill-after", type=int, default=None)
    args = parser.parse_args()
    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(3),
        ]
    )
    trainer = tftrain.Trainer(
        model,
        keras.optimizers.Adam(0.01),
        "mse",
        model_dir=args.model_dir,
        checkpoint_every_steps=3,
        steps_per_loop="auto",
        on_nonfinite="rollback",
        loss_spike_threshold=1e3,
        rollback_lr_factor=0.5,
        max_rollbacks=5,
    )
    callbacks = [] if args.kill_after is None else [KillAfter(trainer, args.kill_after)]
    history = trainer.fit(
        dataset(), epochs=EPOCHS, steps_per_epoch=STEPS_PER_EPOCH, verbose=0, callbacks=callbacks
    )
    checkpoint = tf.train.latest_checkpoint(os.path.join(args.model_dir, "checkpoints"))
    states = json.loads(tf.train.load_checkpoint(checkpoint).get_tensor(SERVICE_STATES_KEY))
    arrays = {f"weight_{i}": weight for i, weight in enumerate(model.get_weights())}
    arrays.update({f"optimizer_{i}": np.asarray(v) for i, v in enumerate(model.optimizer.variables)})
    np.savez(
        os.path.join(args.model_dir, "final.npz"),
        steps=int(trainer.global_step.numpy()),
        rollbacks=json.dumps(states["loss_recovery"]["rollbacks"]),
        last_epoch_loss=history.history["loss"][-1],
        **arrays,
    )


if __name__ == "__main__":
    main()
