"""TensorBoard summaries of a training run, and a profiler window.

`TrainingSummaries` writes event files under `log_dir/train` and
`log_dir/validation`: the loss and every metric at each epoch end and every N
steps, the learning rate (schedules included), throughput and step time from
the timing hooks, and the first call's trace + compile time. All scalars use
the global training step as their x axis, so a resumed run continues its curves.

`ProfileWindow` runs the TensorFlow profiler over a range of training steps;
its trace opens in TensorBoard's profile tab.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

# `check_every_steps` and `check_profile_steps` live in `tftrain.arguments`; they stay importable here.
from tftrain.arguments import check_every_steps, check_profile_steps  # noqa: F401
from tftrain.layout import TRAIN_RUN, VALIDATION_RUN, ModelDirLayout


def learning_rate_of(optimizer: Any) -> float | None:
    """The optimizer's current learning rate (a schedule is evaluated at its step), or None."""
    if optimizer is None:
        return None
    try:
        value = optimizer.learning_rate
    except (AttributeError, TypeError, ValueError):
        return None
    if callable(value):  # a schedule that the optimizer did not evaluate
        value = value(optimizer.iterations)
    try:
        return float(np.asarray(value))
    except (TypeError, ValueError):
        return None


def scalars(logs: Mapping[str, Any] | None) -> dict[str, float]:
    """The scalar entries of logs as floats (other entries are skipped)."""
    result = {}
    for key, value in (logs or {}).items():
        array = np.asarray(value)
        if array.ndim == 0 and np.issubdtype(array.dtype, np.number):
            result[key] = float(array)
    return result


class TrainingSummaries:
    """Writes a training run's TensorBoard event files.

    Args:
        log_dir: The run's directory; event files go to `log_dir/train` and
            `log_dir/validation`.
        every_steps: Also write the training logs every this many steps
            (None: only at epoch ends). The writer does not count steps: the
            summary service calls `on_steps` at these marks
            (`tftrain.services.EveryNSteps`).

    Raises:
        ValueError: `every_steps` is not None or an integer >= 1.
    """

    def __init__(self, log_dir: str, *, every_steps: int | None = None):
        check_every_steps(every_steps, "summary_every_steps")
        self.log_dir = str(log_dir)
        self.every_steps = every_steps
        self._writers: dict[str, Any] = {}

    def writer(self, run: str):
        """The `tf.summary` writer of a run (`"train"` or `"validation"`), created on first use."""
        if run not in self._writers:
            with tf.init_scope():
                self._writers[run] = tf.summary.create_file_writer(ModelDirLayout(self.log_dir).events(run))
        return self._writers[run]

    def write(self, run: str, step: int, values: Mapping[str, float]) -> None:
        """Writes scalars to a run at a step."""
        if not values:
            return
        # record_if(True): a fit's condition for summaries inside the training step does not apply here.
        with tf.init_scope(), self.writer(run).as_default(step=step), tf.summary.record_if(True):
            for name, value in values.items():
                tf.summary.scalar(name, value)

    def on_steps(
        self,
        step: int,
        logs: Mapping[str, Any] | None,
        *,
        learning_rate: float | None = None,
        rates: Mapping[str, float] | None = None,
    ) -> None:
        """Writes the training logs, learning rate and timing rates at an N-step mark."""
        values = {f"step_{key}": value for key, value in scalars(logs).items()}
        if learning_rate is not None:
            values["learning_rate"] = learning_rate
        values.update(rates or {})
        self.write(TRAIN_RUN, step, values)

    def on_epoch_end(
        self,
        step: int,
        logs: Mapping[str, Any] | None,
        *,
        learning_rate: float | None = None,
        rates: Mapping[str, float] | None = None,
    ) -> None:
        """Writes an epoch's logs (`val_*` entries to the validation run, the rest to train) and speed."""
        train, validation = {}, {}
        for key, value in scalars(logs).items():
            if key.startswith("val_"):
                validation[f"epoch_{key[4:]}"] = value
            else:
                train[f"epoch_{key}"] = value
        if learning_rate is not None:
            train["learning_rate"] = learning_rate
        train.update(rates or {})
        self.write(TRAIN_RUN, step, train)
        self.write(VALIDATION_RUN, step, validation)
        self.flush()

    def on_trace(self, step: int, first_call_s: float) -> None:
        """Writes the first host call's time: trace + compile + run."""
        self.write(TRAIN_RUN, step, {"trace_time_s": first_call_s})

    def flush(self) -> None:
        """Flushes every writer to disk."""
        for writer in self._writers.values():
            writer.flush()

    def close(self) -> None:
        """Flushes and closes the writers."""
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()


class ProfileWindow:
    """Runs the TensorFlow profiler from training step `start` to `stop` (1-based, both included).

    Call `before_steps(done)` before a host call and `after_steps(done)`
    after it, with the global steps done; host calls should not cross the
    window's edges (see `boundaries`).

    Args:
        log_dir: Where the trace goes (TensorBoard's profile tab reads it).
        window: `(start, stop)`, already validated by `check_profile_steps`.
    """

    def __init__(self, log_dir: str, window: tuple[int, int]):
        self.log_dir = str(log_dir)
        self.start, self.stop = window
        self.active = False
        self.done = False

    @property
    def boundaries(self) -> tuple[int, int]:
        """The global step counts at which a host call must end (before the window and at its end)."""
        return self.start - 1, self.stop

    def before_steps(self, done: int) -> None:
        """Starts the profiler if the next step is the window's first."""
        if not self.active and not self.done and done == self.start - 1:
            tf.profiler.experimental.start(self.log_dir)
            self.active = True

    def after_steps(self, done: int) -> None:
        """Stops the profiler once the window's last step has run."""
        if self.active and done >= self.stop:
            self.close()

    def close(self) -> None:
        """Stops the profiler if it runs (also on errors)."""
        if self.active:
            tf.profiler.experimental.stop()
            self.active = False
            self.done = True
