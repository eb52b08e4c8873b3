"""The learning-rate range test: `Trainer.find_learning_rate`, one training step per learning rate.

The learning rate grows exponentially from `min_lr` to `max_lr`, one
training step each (Leslie Smith's range test, as Lightning's
`LearningRateFinder` and keras-team/keras#8891 describe it); the loss of each
step is recorded with its bias-corrected moving average, and the suggestion is
the learning rate where that smoothed loss falls fastest against log lr.

The sweep is the fit loop (`fit_loop.run_fit`) with a budget of `steps`
steps, one per host call, and one service (`_Sweep`) that sets each step's
learning rate, reads its loss and stops the run where the loss diverges. It
runs on the Trainer's own engine settings (eager, `tf.function`, XLA, its
strategy) in a `Sandbox`: no `model_dir`, none of the user's services or
callbacks, engines made for the sweep alone (the Trainer's engines, their
trace counts and `trainer.timing` are not touched), and the training state
(model, optimizer, metrics, the Trainer's own checkpointed state, the global
step) put back, bit for bit, when the sweep ends, also on an error or a
KeyboardInterrupt.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tftrain.arguments import check_lr_sweep
from tftrain.compat import keras_internals
from tftrain.fit_inputs import inputs
from tftrain.loops import preparation
from tftrain.loops.owner import StepOwner
from tftrain.loops.state_copy import Sandbox
from tftrain.options import NonFinitePolicy
from tftrain.services.protocol import Service

__all__ = ["LearningRateSweep", "find_learning_rate", "learning_rates", "suggest"]

_SKIP_BEGIN = 10  # at most: the first points' slope says little (Lightning skips 10)
_SKIP_END = 1  # the last point may be the one that diverged
_MIN_POINTS = 3


@dataclasses.dataclass(frozen=True)
class LearningRateSweep:
    """What `Trainer.find_learning_rate` measured: one point per training step.

    Attributes:
        learning_rates: The learning rate of each step, growing exponentially.
        losses: The loss (the step's `monitor` log) of each step.
        smoothed_losses: Their bias-corrected exponential moving average.
        suggestion: The learning rate where the smoothed loss falls fastest
            against log lr (the steepest descent), or None (see
            `no_suggestion_reason`). A starting point: a learning rate a few
            times lower is the safer choice where the curve is noisy.
        stopped_early: Whether the sweep ended before its last learning rate.
        stop_reason: Why it ended early (the loss diverged or was not
            finite, or the data ended), or None.
        no_suggestion_reason: Why `suggestion` is None, or None.
    """

    learning_rates: list[float]
    losses: list[float]
    smoothed_losses: list[float]
    suggestion: float | None
    stopped_early: bool
    stop_reason: str | None = None
    no_suggestion_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The sweep as plain Python values (lists of floats), e.g. for JSON."""
        return dataclasses.asdict(self)

    def plot(self, ax: Any = None, *, show_suggestion: bool = True) -> Any:
        """Draws the loss and the smoothed loss against the learning rate (log scale) with matplotlib.

        Args:
            ax: A matplotlib `Axes` to draw on; None draws on a new figure
                (`matplotlib.pyplot.subplots()`).
            show_suggestion: Mark the suggested learning rate (if any) with a
                vertical line.

        Returns:
            The `Axes` drawn on.

        Raises:
            ImportError: matplotlib is not installed (the `plot` extra).
        """
        try:
            import matplotlib  # noqa: F401
        except ImportError as error:
            raise ImportError(
                f"LearningRateSweep.plot needs matplotlib, which is not installed ({error}). Install the "
                'plot extra: pip install "tftrain[plot]"'
            ) from None
        if ax is None:  # pyplot (and its backend) only where a figure is made here
            import matplotlib.pyplot as plt

            ax = plt.subplots()[1]
        ax.plot(self.learning_rates, self.losses, alpha=0.35, label="loss")
        ax.plot(self.learning_rates, self.smoothed_losses, label="smoothed loss")
        if show_suggestion and self.suggestion is not None:
            ax.axvline(self.suggestion, color="red", linestyle="--", label=f"suggestion {self.suggestion:.3g}")
        ax.set(xscale="log", xlabel="learning rate", ylabel="loss")
        ax.legend()
        return ax


def learning_rates(min_lr: float, max_lr: float, steps: int) -> list[float]:
    """The sweep's learning rates: `min_lr * (max_lr / min_lr) ** (i / (steps - 1))` for i in 0..steps-1."""
    return [min_lr * (max_lr / min_lr) ** (i / (steps - 1)) for i in range(steps)]


def suggest(rates: list[float], smoothed: list[float]) -> tuple[float | None, str | None]:
    """The learning rate at the steepest descent of the smoothed loss against log lr.

    The first points (up to 10, a tenth of them) and the last one are
    skipped, as Lightning skips them: the start says little, and the last
    point may be where the loss diverged.

    Args:
        rates: The sweep's learning rates (at least one per smoothed loss).
        smoothed: The smoothed loss of each step that ran.

    Returns:
        `(suggestion, None)`, or `(None, reason)` with too few finite points
        or where the smoothed loss never falls.
    """
    count, skip_begin = len(smoothed), min(_SKIP_BEGIN, len(smoothed) // 10)
    kept = [i for i in range(skip_begin, count - _SKIP_END) if math.isfinite(smoothed[i])]
    if len(kept) < _MIN_POINTS:
        return None, (
            f"too few points: {count} steps ran, {len(kept)} left after skipping the first {skip_begin}, "
            f"the last {_SKIP_END} and any non-finite loss (at least {_MIN_POINTS} are needed). Run more "
            "steps, or lower `min_lr` if the loss diverged at once."
        )
    slopes = np.gradient(np.array([smoothed[i] for i in kept]), np.log([rates[i] for i in kept]))
    steepest = int(np.argmin(slopes))
    if not slopes[steepest] < 0:
        return None, (f"the smoothed loss never fell between {rates[kept[0]]:.3g} and {rates[kept[-1]]:.3g}. Sweep "
                      "lower learning rates (`min_lr`).")  # fmt: skip
    return rates[kept[steepest]], None


class _Sweep(Service):
    """The sweep's service: sets each step's learning rate, records its loss, stops the run where it diverges."""

    name = "lr_sweep"
    reads_every_call = True

    def __init__(self, owner: StepOwner, rates: list[float], smoothing: float, stop_factor: float, monitor: str):
        self.owner, self.rates, self.smoothing, self.stop_factor, self.monitor = owner, rates, smoothing, stop_factor, monitor
        self.losses, self.smoothed, self.stop_reason, self._average = [], [], None, 0.0
        with owner.engines.strategy.scope():  # what the steps read their learning rate from (`find_learning_rate`)
            self.learning_rate = keras.Variable(0.0, trainable=False, aggregation="only_first_replica")

    def next_stop(self, step: int) -> int:
        return step + 1  # one step per call, at its own learning rate

    def before_call(self, run: Any) -> None:
        self.learning_rate.assign(self.rates[len(self.losses)])
        self.owner.reset_metrics()  # the `loss` log of Keras's step is a mean since the last reset: this step's alone

    def after_call(self, run: Any, result: Any) -> None:
        index, lowest, logs = len(self.losses), min(self.smoothed, default=math.inf), result.logs or {}
        if self.monitor not in logs:  # a step returns a dict of logs (`tftrain.engine.step_outputs`)
            raise ValueError(f"Invalid value for argument `monitor`. Received: monitor={self.monitor!r}, but the training "
                             f"step returned the logs {sorted(logs)}. Expected the name of the step's loss log.")
        loss, rate = float(np.mean(np.asarray(logs[self.monitor], dtype=np.float64))), self.rates[index]
        self._average = self.smoothing * self._average + (1 - self.smoothing) * loss
        value = self._average / (1 - self.smoothing ** (index + 1))  # bias-corrected
        self.losses.append(loss)
        self.smoothed.append(value)
        if not math.isfinite(value):
            self.stop_reason = f"the loss was not finite ({loss}) at learning rate {rate:.3g}"
        # `stop_factor` times the lowest smoothed loss, for a positive loss; above it by as much in general.
        elif value - lowest > (self.stop_factor - 1) * abs(lowest):
            self.stop_reason = (f"the smoothed loss ({value:.4g}) rose above {self.stop_factor:g} times its lowest "
                                f"({lowest:.4g}) at learning rate {rate:.3g}")  # fmt: skip
        self.owner.model.stop_training = self.stop_reason is not None

    def result(self) -> LearningRateSweep:
        if self.stop_reason is None and len(self.losses) < len(self.rates):
            self.stop_reason = f"the data ended after {len(self.losses)} steps (a generator is read once)"
        suggestion, no_suggestion_reason = suggest(self.rates, self.smoothed)
        return LearningRateSweep(self.rates[: len(self.losses)], self.losses, self.smoothed, suggestion,
                                 self.stop_reason is not None, self.stop_reason, no_suggestion_reason)  # fmt: skip


def find_learning_rate(
    owner: StepOwner,
    x: Any,
    y: Any = None,
    *,
    batch_size: int | None = None,
    min_lr: float = 1e-7,
    max_lr: float = 10.0,
    steps: int = 100,
    smoothing: float = 0.98,
    stop_factor: float = 4.0,
    monitor: str = "loss",
) -> LearningRateSweep:
    """Runs the range test on `owner`'s training step and puts its state back.

    `Trainer.find_learning_rate(x, y, ...)` calls this with itself as
    `owner`; it documents the arguments, what is put back and the errors.

    Returns:
        A `LearningRateSweep`.
    """
    check_lr_sweep(min_lr, max_lr, steps, smoothing, stop_factor)
    preparation.check_step(owner, "train")  # an uncompiled model: fit's error
    optimizer = getattr(owner.model, "optimizer", None)
    if optimizer is None:
        raise ValueError("find_learning_rate sweeps the learning rate of the model's optimizer, but the model has none. "
                         "Expected `optimizer=` given to `tftrain.Trainer(...)` or `model.compile(optimizer=...)`.")
    sweep = _Sweep(owner, learning_rates(min_lr, max_lr, steps), smoothing, stop_factor, monitor)
    # The data read in order: `steps` batches, cycled where it ends (a generator, read once, is not).
    kind = inputs.input_kind(x)
    if kind == "dataset" and x.cardinality() == tf.data.UNKNOWN_CARDINALITY:
        x = x.repeat()  # of unknown length: cycled by tf.data (an empty one still ends)
    budget = {"steps_per_epoch" if kind == "generator" else "total_steps": steps}
    with Sandbox(owner, "find_learning_rate") as sandbox:
        # No NaN guard (the sweep stops at a non-finite loss), no service but the sweep, no model_dir.
        sandbox.set_aside(owner, services=(sweep,), nonfinite_policy=NonFinitePolicy(terminate_on_nan=False))
        # The steps read the sweep's variable, as a callable learning rate (Keras would take a variable for the
        # optimizer's own); the optimizer's learning rate (a variable, a schedule, a callable) is put back after.
        sandbox.on_exit(keras_internals.set_learning_rate_object, optimizer, keras_internals.learning_rate_object(optimizer))
        keras_internals.set_learning_rate_object(optimizer, lambda: sweep.learning_rate)
        sandbox.use_run_options(model_dir=None)  # before the preparation: nothing of the run's directory is read
        arguments = preparation.FitArguments(x, y, batch_size, shuffle=False, verbose=0, **budget)
        sandbox.fit(preparation.fit_call(owner, arguments))
    return sweep.result()
