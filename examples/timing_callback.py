"""Template: a Keras callback that reads the timing report to watch a run.

`ThroughputMonitor` extends `tftrain.callbacks.Timing` (the timing report of
`model.fit`, which also measures `tftrain.Trainer.fit` when the Trainer runs
the model's own `train_step`). After each epoch it logs the epoch's
steady-state step time, examples/sec and the host calls in which the step
traced again, adds `examples_per_sec` and `step_time_ms` to the epoch logs
(so History, CSVLogger and TensorBoard get them), and warns when the step
retraced after the first call or when the step time regresses against the
best earlier epoch. Copy it and change what it watches. Run:

    python examples/timing_callback.py                         # Trainer.fit, then model.fit
    python examples/timing_callback.py --drop_remainder=false  # a partial batch: no retrace in either loop
    python examples/timing_callback.py --stall_epoch=3         # a slow callback in epoch 3: warned

A `Trainer` subclass with its own `train_step` never calls the model's, so
this callback sees no steps there; read `trainer.timing` after `fit` instead.
"""

import statistics
import time
import warnings

import keras
import numpy as np
import tensorflow as tf
from absl import app, flags

import tftrain

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """Defines the flags (only when run as a program, so importing defines nothing)."""
    flags.DEFINE_enum(
        "loop", "both", ["trainer", "fit", "both"], "Which loop(s) to run.", flag_values=flag_values
    )
    flags.DEFINE_integer("epochs", 4, "Epochs to train.", flag_values=flag_values)
    flags.DEFINE_integer("num_examples", 2000, "Synthetic examples in one pass.", flag_values=flag_values)
    flags.DEFINE_integer("batch_size", 64, "Batch size.", flag_values=flag_values)
    flags.DEFINE_bool(
        "drop_remainder",
        True,
        "False keeps a partial batch (neither loop retraces for it: both trace on the dataset's spec).",
        flag_values=flag_values,
    )
    flags.DEFINE_integer(
        "stall_epoch", 0, "Slow down this epoch (1-based; 0: none).", flag_values=flag_values
    )
    flags.DEFINE_float(
        "stall_ms", 20.0, "Milliseconds added to each step of --stall_epoch.", flag_values=flag_values
    )
    flags.DEFINE_float(
        "slowdown_factor",
        2.0,
        "Warn when an epoch's step time exceeds the best by this factor.",
        flag_values=flag_values,
    )


class ThroughputMonitor(tftrain.callbacks.Timing):
    """Logs throughput and retraces per epoch; warns on retracing and step-time regressions.

    The timer files only steady-state host calls (`timer.step_times`): a call
    that traced the step, and the first call, are left out. So the calls of an
    epoch that added no step time, less the first call of the run, are the
    calls in which the step traced again.

    Args:
        slowdown_factor: Warn when an epoch's median step time exceeds the best
            earlier epoch's by this factor.
        verbose: Print one line per epoch and the timing summary at the end.

    Attributes:
        epoch_records: One dict per epoch: `epoch`, `steps`, `retraced_calls`,
            `step_time_median_s`, `examples_per_sec` (None where no steady call ran).
        alerts: The warnings issued, in order.
    """

    def __init__(self, slowdown_factor: float = 2.0, verbose: bool = True):
        super().__init__(verbose=verbose)
        self.slowdown_factor = slowdown_factor
        self.epoch_records: list[dict] = []
        self.alerts: list[str] = []
        self._calls = 0
        self._epoch_start = (0, 0, 0, 0.0, 0)

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self.epoch_records, self.alerts, self._calls = [], [], 0

    def on_epoch_begin(self, epoch, logs=None):
        timer = self.timer
        self._epoch_start = (
            self._calls,
            len(timer.step_times),
            timer.steps,
            timer.steady_seconds,
            timer.steady_examples,
        )

    def on_train_batch_end(self, batch, logs=None):
        super().on_train_batch_end(batch, logs)  # stops the clock first
        self._calls += 1

    def on_epoch_end(self, epoch, logs=None):
        calls_before, times_before, steps_before, seconds_before, examples_before = self._epoch_start
        timer = self.timer
        step_times = timer.step_times[times_before:]
        first_call = 1 if calls_before == 0 else 0
        seconds = timer.steady_seconds - seconds_before
        record = {
            "epoch": epoch,
            "steps": timer.steps - steps_before,
            "retraced_calls": self._calls - calls_before - len(step_times) - first_call,
            "step_time_median_s": statistics.median(step_times) if step_times else None,
            "examples_per_sec": (
                (timer.steady_examples - examples_before) / seconds
                if seconds > 0 and timer.steady_examples_known
                else None
            ),
        }
        self.epoch_records.append(record)
        self._check(record)
        if logs is not None:  # later callbacks (History, CSVLogger, TensorBoard) see these
            logs["examples_per_sec"] = record["examples_per_sec"] or float("nan")
            median = record["step_time_median_s"]
            logs["step_time_ms"] = float("nan") if median is None else median * 1e3
        if self.verbose:
            print(_describe(record, logs))

    def _check(self, record: dict) -> None:
        epoch = record["epoch"] + 1
        if record["retraced_calls"]:
            self._alert(
                f"Epoch {epoch}: the training step traced again in {record['retraced_calls']} host "
                "call(s). Tracing is slow; keep batch shapes and dtypes stable (e.g. "
                "`dataset.batch(n, drop_remainder=True)`)."
            )
        median = record["step_time_median_s"]
        earlier = [r["step_time_median_s"] for r in self.epoch_records[:-1] if r["step_time_median_s"]]
        if median is not None and earlier and median > self.slowdown_factor * min(earlier):
            self._alert(
                f"Epoch {epoch}: steady-state step time {median * 1e3:.2f} ms is "
                f"{median / min(earlier):.1f}x the best earlier epoch's ({min(earlier) * 1e3:.2f} ms). "
                "Look for input pipeline stalls, slow callbacks or other load on the machine."
            )

    def _alert(self, message: str) -> None:
        self.alerts.append(message)
        warnings.warn(message, stacklevel=2)


def _describe(record: dict, logs: dict | None) -> str:
    median, throughput = record["step_time_median_s"], record["examples_per_sec"]
    parts = [f"epoch {record['epoch'] + 1}: {record['steps']} steps"]
    if logs and "loss" in logs:
        parts.append(f"loss {logs['loss']:.4f}")
    parts.append("step n/a" if median is None else f"step {median * 1e3:.2f} ms")
    parts.append("n/a examples/s" if throughput is None else f"{throughput:,.0f} examples/s")
    parts.append(f"{record['retraced_calls']} retraced calls")
    return ", ".join(parts)


class Stall(keras.callbacks.Callback):
    """Sleeps after every step of one epoch: a stand-in for a slow callback or input stall."""

    def __init__(self, epoch: int, seconds: float):
        super().__init__()
        self.epoch, self.seconds, self._active = epoch, seconds, False

    def on_epoch_begin(self, epoch, logs=None):
        self._active = epoch == self.epoch

    def on_train_batch_end(self, batch, logs=None):
        if self._active:
            time.sleep(self.seconds)


def make_data(num_examples: int, batch_size: int, drop_remainder: bool) -> tuple[tf.data.Dataset, int]:
    """y = sum of 8 features, repeated; returns the dataset and steps per epoch (full batches of one pass)."""
    rng = np.random.default_rng(0)
    x = rng.random((num_examples, 8), dtype=np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True)))
    # With a partial batch, each pass has one batch more than steps_per_epoch, so the
    # partial batch arrives in the second epoch; the batch dimension of the dataset's
    # spec is then unknown, and both loops trace the step on that spec once.
    return dataset.batch(batch_size, drop_remainder=drop_remainder).repeat(), max(
        num_examples // batch_size, 1
    )


def train(
    loop: str,
    epochs: int,
    num_examples: int,
    batch_size: int,
    drop_remainder: bool = True,
    stall_epoch: int = 0,
    stall_ms: float = 20.0,
    slowdown_factor: float = 2.0,
    verbose: bool = True,
) -> ThroughputMonitor:
    """Trains a small regression model with `loop` ("trainer" or "fit") and returns the monitor."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.Adam(1e-2), "mse", jit_compile=False)
    dataset, steps_per_epoch = make_data(num_examples, batch_size, drop_remainder)
    callbacks = [Stall(stall_epoch - 1, stall_ms / 1e3)] if stall_epoch else []
    monitor = ThroughputMonitor(slowdown_factor, verbose=verbose)
    callbacks.append(monitor)  # after Stall, so the stall falls inside the monitor's clock
    if loop == "trainer":
        tftrain.Trainer(model).fit(
            dataset, epochs=epochs, steps_per_epoch=steps_per_epoch, callbacks=callbacks, verbose=0
        )
    elif loop == "fit":
        model.fit(dataset, epochs=epochs, steps_per_epoch=steps_per_epoch, callbacks=callbacks, verbose=0)
    else:
        raise ValueError(
            f"Invalid value for argument `loop`. Received: loop={loop!r}. Expected 'trainer' or 'fit'."
        )
    return monitor


def main(argv):
    del argv
    loops = ["trainer", "fit"] if FLAGS.loop == "both" else [FLAGS.loop]
    for loop in loops:
        print(f"--- {'tftrain.Trainer.fit' if loop == 'trainer' else 'keras Model.fit'}")
        monitor = train(
            loop,
            FLAGS.epochs,
            FLAGS.num_examples,
            FLAGS.batch_size,
            FLAGS.drop_remainder,
            FLAGS.stall_epoch,
            FLAGS.stall_ms,
            FLAGS.slowdown_factor,
        )
        print(f"alerts: {len(monitor.alerts)}")
        for alert in monitor.alerts:
            print(f"  {alert}")


if __name__ == "__main__":
    define_flags()
    app.run(main)
