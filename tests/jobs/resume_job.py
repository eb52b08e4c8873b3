"""A small training job for kill-and-resume tests, run as `python resume_job.py MODEL_DIR [options]`.

Trains an MLP with Dropout on a shuffled, repeating dataset under op
determinism, with checkpoints every 3 steps, and writes the final weights and
step count to MODEL_DIR/final.npz. `--kill=step:N` SIGKILLs the process after
step N, `--kill=epoch:E` at the start of epoch E (just after the previous
epoch's checkpoint), `--kill=save:N` in the middle of the N-th checkpoint write
(files written, one truncated, temporary files left, nothing recorded; with
`--async-checkpoint`, in the background writer thread).
`--kill=sigterm:N` sends the process SIGTERM after step N: the Trainer saves a
checkpoint at the step it reached and raises PreemptedError; the job then exits
with status 3. `--kill=usr1:N` sends SIGUSR1 (SLURM's time-limit warning) instead.
`--slurm-requeue` trains with `slurm_requeue=True` (SIGUSR1 counts, the job is requeued).
`--async-checkpoint` writes checkpoints in the background (`async_checkpoint=True`).
`--step-sleep=S` sleeps S seconds after each step (a run slow enough for a
continuous evaluator to watch).
`--arrays` trains on the arrays themselves (48 examples, `shuffle=True`, whole
passes) in batches of `--batch-size` (default 8): a rerun with another batch
size converts the data position.
"""

import argparse
import glob
import os
import signal
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tftrain  # noqa: E402


def kill_now():
    os.kill(os.getpid(), signal.SIGKILL)


class KillAt(keras.callbacks.Callback):
    def __init__(self, kind, value):
        super().__init__()
        self.kind, self.value = kind, value

    def on_train_batch_end(self, batch, logs=None):
        if self.kind == "step" and int(self.model.optimizer.iterations) >= self.value:
            kill_now()
        if self.kind in ("sigterm", "usr1") and int(self.model.optimizer.iterations) == self.value:
            os.kill(os.getpid(), signal.SIGTERM if self.kind == "sigterm" else signal.SIGUSR1)

    def on_epoch_begin(self, epoch, logs=None):
        if self.kind == "epoch" and epoch == self.value:
            kill_now()


class SleepEachStep(keras.callbacks.Callback):
    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.seconds)


def kill_during_save(save_number, model_dir):
    """Makes the N-th checkpoint write die half-way, leaving what a real kill can leave."""
    original = tf.train.Checkpoint._write
    calls = []

    def write(self, file_prefix, *args, **kwargs):
        path = original(self, file_prefix, *args, **kwargs)
        options = kwargs.get("options", args[0] if args else None)
        if options is not None and options.experimental_enable_async_checkpoint:
            return path  # handed to the writer thread, whose own write comes here next
        calls.append(path)
        if len(calls) == save_number:
            data = glob.glob(path + ".data-*")[0]
            with open(data, "r+b") as handle:
                handle.truncate(os.path.getsize(data) // 2)
            os.makedirs(path + "_temp", exist_ok=True)
            with open(os.path.join(path + "_temp", "part-00000-of-00001.data-00000-of-00001"), "wb") as f:
                f.write(b"partial")
            with open(os.path.join(os.path.dirname(path), "checkpoint.tmp0123abcd"), "w") as f:
                f.write("partial")
            kill_now()
        return path

    tf.train.Checkpoint._write = write


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("--kill", default="")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--async-checkpoint", action="store_true")
    parser.add_argument("--arrays", action="store_true")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--slurm-requeue", action="store_true")
    args = parser.parse_args()

    tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(7)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, 6)).astype("float32")
    y = (x[:, 0] + x[:, 1] > 0).astype("int32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(48).batch(8).repeat()
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(2),
        ]
    )
    trainer = tftrain.Trainer(
        model,
        keras.optimizers.Adam(0.01),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        model_dir=args.model_dir,
        checkpoint_every_steps=3,
        async_checkpoint=args.async_checkpoint,
        slurm_requeue=args.slurm_requeue,
    )
    callbacks = [SleepEachStep(args.step_sleep)] if args.step_sleep else []
    if args.kill:
        kind, value = args.kill.split(":")
        if kind == "save":
            kill_during_save(int(value), args.model_dir)
        else:
            callbacks.append(KillAt(kind, int(value)))
    if args.arrays:
        inputs = dict(x=x, y=y, batch_size=args.batch_size, shuffle=True)
    else:
        inputs = dict(x=dataset, steps_per_epoch=4)
    try:
        history = trainer.fit(**inputs, epochs=args.epochs, verbose=2, callbacks=callbacks)
    except tftrain.PreemptedError as error:
        print(f"PREEMPTED step={error.step} checkpoint={error.checkpoint}: {error}")
        raise SystemExit(3) from None
    np.savez(
        os.path.join(args.model_dir, "final.npz"),
        steps=int(model.optimizer.iterations),
        last_loss=history.history["loss"][-1],
        **{f"w{i}": w.numpy() for i, w in enumerate(model.weights)},
    )


if __name__ == "__main__":
    main()
