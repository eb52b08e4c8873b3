"""One worker of a two-process MultiWorkerMirroredStrategy job (run by test_trainer_multiworker.py).

Usage (TF_CONFIG=..., or the SLURM variables `srun` sets):
    TF_CONFIG=... python multiworker_job.py OUTPUT_DIR
    TF_CONFIG=... python multiworker_job.py OUTPUT_DIR MODEL_DIR [KILL_AT_STEP | sigterm:STEP]

The first form trains each configuration below under the strategy that
`setup_strategy` picks from TF_CONFIG, then the same on one device in this
process, and writes `OUTPUT_DIR/<config>.npz` (the worker's weights and the
reference's) and `OUTPUT_DIR/logs.json` (each configuration's final logs).

The second form trains the "keras_model" configuration with checkpoints in
MODEL_DIR every 3 steps; with KILL_AT_STEP the process dies (`os._exit`, no
cleanup) right after that step, else it writes `OUTPUT_DIR/resumed.npz` (with the
weights of an uninterrupted two-worker run, `two_workers`); in a SLURM step it
trains with `slurm_requeue=True`. With `sigterm:STEP`
the non-chief worker sends itself SIGTERM after that step; each worker catches
`tftrain.PreemptedError`, trains a second fit to the end (on `MODEL_DIR_again`),
writes `OUTPUT_DIR/preempted.json` and exits with 4.
"""

import json
import logging
import os
import signal
import sys
import time

import keras
import numpy as np
import tensorflow as tf

import tftrain
from tftrain import distribute

BATCH = 16  # global batch: 8 examples per worker


def make_dataset():
    rng = np.random.RandomState(0)
    x = rng.rand(64, 6).astype("float32")
    y = (x[:, 0] * 3).astype("int32").clip(0, 2)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)


class ClippedModel(tftrain.CustomModel):
    """A CustomModel with its own piece of the step: clipped gradients."""

    def compute_gradients(self, tape, loss):
        return [tf.clip_by_norm(g, 0.5) for g in super().compute_gradients(tape, loss)]


class HandWritten(tftrain.Trainer):
    """The classic custom loop: a hand-written loss averaged over the global batch."""

    def train_step(self, batch):
        x, y = batch
        with tf.GradientTape() as tape:
            logits = self.model(x, training=True)
            per_example = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=BATCH)
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply(grads, self.model.trainable_variables)
        # Logs are averaged over the replicas: log this replica's mean loss.
        return {"loss": tf.reduce_mean(per_example)}


def build(config):
    keras.utils.set_random_seed(1)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    cls = ClippedModel if config == "custom_model" else keras.Model
    model = cls(inputs, keras.layers.Dense(3)(hidden))
    if config != "outside_optimizer":  # compiled by the Trainer, with an optimizer made outside the scope
        model.compile(**compile_args())
    return model


def compile_args():
    return dict(
        optimizer=keras.optimizers.SGD(0.1),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


CONFIGS = {
    "keras_model": (tftrain.Trainer, {}),
    "steps_per_loop": (tftrain.Trainer, {"steps_per_loop": 3}),
    "custom_model": (tftrain.Trainer, {}),
    "hand_written": (HandWritten, {}),
    "outside_optimizer": (tftrain.Trainer, {}),
}


def train(config, strategy):
    trainer_class, kwargs = CONFIGS[config]
    with strategy.scope():
        model = build(config)
    if config == "outside_optimizer":
        kwargs = dict(kwargs, **compile_args())  # the SGD instance is created here, outside the scope
    history = trainer_class(model, strategy=strategy, **kwargs).fit(make_dataset(), epochs=2, verbose=0)
    return model, {key: values[-1] for key, values in history.history.items()}


class AtStep(keras.callbacks.Callback):
    """Calls `action()` right after a global step."""

    def __init__(self, step, action):
        super().__init__()
        self.step, self.action = step, action

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.step:
            self.action()


def sigterm_and_wait():
    """Sends this worker SIGTERM, then waits until the cluster has the notice."""
    from tensorflow.python.eager import context  # the coordination service's key-value store

    os.kill(os.getpid(), signal.SIGTERM)
    context.context().get_config_key_value("TERMINATED_WORKER", 60_000)  # set by TF's handler
    time.sleep(0.2)  # the handler marks the notice right after publishing it


def flat_weights(model):
    return np.concatenate([w.ravel() for w in model.get_weights()])


def train_with_model_dir(output_dir, model_dir, action, strategy):
    with strategy.scope():
        model = build("keras_model")
    trainer = tftrain.Trainer(
        model,
        strategy=strategy,
        model_dir=model_dir,
        checkpoint_every_steps=3,
        preemption_signals=("SIGTERM", "SIGUSR1"),
        slurm_requeue="SLURM_JOB_ID" in os.environ,  # in a SLURM step: the chief requeues after a preemption
    )
    callbacks = []
    if action and action.startswith("sigterm:"):
        if not distribute.worker_role(strategy)[0]:
            callbacks = [AtStep(int(action.split(":")[1]), sigterm_and_wait)]
    elif action:
        callbacks = [AtStep(int(action), lambda: os._exit(3))]
    try:
        trainer.fit(make_dataset(), epochs=2, verbose=1, callbacks=callbacks)
    except tftrain.PreemptedError as error:
        # A later fit in the same job must not take the first one's notice as its own.
        with strategy.scope():
            again = build("keras_model")
        tftrain.Trainer(again, strategy=strategy, model_dir=model_dir + "_again").fit(
            make_dataset(), epochs=2, verbose=0
        )
        with open(os.path.join(output_dir, "preempted.json"), "w") as file:
            json.dump(
                {
                    "step": error.step,
                    "checkpoint": error.checkpoint,
                    "signal_number": error.signal_number,
                    "message": str(error),
                    "later_fit_steps": int(again.optimizer.iterations.numpy()),
                    "handlers_restored": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
                    and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL,
                },
                file,
            )
        sys.exit(4)
    with strategy.scope():  # the same job, never interrupted
        uninterrupted = build("keras_model")
    tftrain.Trainer(uninterrupted, strategy=strategy).fit(make_dataset(), epochs=2, verbose=0)
    reference, _ = train("keras_model", tf.distribute.get_strategy())
    np.savez(
        os.path.join(output_dir, "resumed.npz"),
        worker=flat_weights(model),
        two_workers=flat_weights(uninterrupted),
        reference=flat_weights(reference),
        steps=int(model.optimizer.iterations.numpy()),
    )


def main():
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # tftrain's log lines: the strategy it built
    output_dir = sys.argv[1]
    strategy = distribute.setup_strategy()
    assert isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy), strategy
    assert distribute.num_workers(strategy) == 2
    if len(sys.argv) > 2:
        train_with_model_dir(output_dir, sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None, strategy)
        return
    logs = {}
    for config in CONFIGS:
        model, logs[config] = train(config, strategy)
        reference, logs[config + "_reference"] = train(config, tf.distribute.get_strategy())
        np.savez(
            os.path.join(output_dir, f"{config}.npz"),
            worker=np.concatenate([w.ravel() for w in model.get_weights()]),
            reference=np.concatenate([w.ravel() for w in reference.get_weights()]),
            initial=np.concatenate([w.ravel() for w in build(config).get_weights()]),
        )
    with open(os.path.join(output_dir, "logs.json"), "w") as file:
        json.dump(logs, file)


if __name__ == "__main__":
    main()
