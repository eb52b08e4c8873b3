"""The learning-rate range test: `Trainer.find_learning_rate`, one training step per learning rate.

The learning rate grows exponentially from `min_lr` to `max_lr`, one
training step each (Leslie Smith's range test, as Lightning's
`LearningRateFinder` and keras-team/keras#8891 describe it); the loss of each
step is recorded with its bias-corrected moving average, and the suggestion is
the learning rate where that smoothed loss falls fastest against log lr.

The steps run on the Trainer's own engine settings (eager, `tf.function`, XLA,
its strategy) through a step runner made for the sweep alone
(`tftrain.engine.step_runner.make_runner`), so the Trainer's engines, their trace
counts and `trainer.timing` are not touched. The training state (model,
optimizer, metrics, the Trainer's own checkpointed state, the global step) is
copied first and put back, bit for bit, when the sweep ends, also on an error
or a KeyboardInterrupt.
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
from tftrain.engine import step_runner
from tftrain.fit_inputs import inputs
from tftrain.fit_inputs.epoch_plan import EpochPlan
from tftrain.loops import preparation
from tftrain.loops.owner import StepOwner
from tftrain.loops.state_copy import StateCopy

__all__ = ["LearningRateSweep", "find_learning_rate", "learning_rates", "suggest"]

PLOT_EXTRA_HINT = 'pip install "tftrain[plot]"'
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
                f"LearningRateSweep.plot needs matplotlib, which is not installed ({error}). Install "
                f"the plot extra: {PLOT_EXTRA_HINT}"
            ) from None
        if ax is None:
            import matplotlib.pyplot as plt

            _, ax = plt.subplots()
        ax.plot(self.learning_rates, self.losses, alpha=0.35, label="loss")
        ax.plot(self.learning_rates, self.smoothed_losses, label="smoothed loss")
        if show_suggestion and self.suggestion is not None:
            ax.axvline(
                self.suggestion, color="red", linestyle="--", label=f"suggestion {self.suggestion:.3g}"
            )
        ax.set_xscale("log")
        ax.set_xlabel("learning rate")
        ax.set_ylabel("loss")
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
    count = len(smoothed)
    skip_begin = min(_SKIP_BEGIN, count // 10)
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
        return None, (
            "the smoothed loss never fell between "
            f"{rates[kept[0]]:.3g} and {rates[kept[-1]]:.3g}. Sweep lower learning rates (`min_lr`)."
        )
    return rates[kept[steepest]], None


class _LearningRate:
    """Sets the optimizer's learning rate for each step, and puts back what it was.

    A learning rate held in a variable (a float given to the optimizer) is
    assigned; a `LearningRateSchedule` (or a callable) is replaced by a
    variable for the sweep and put back after it.
    """

    def __init__(self, optimizer: keras.optimizers.Optimizer, strategy: tf.distribute.Strategy):
        self._optimizer = optimizer
        self._original = keras_internals.learning_rate_object(optimizer)
        self._replaced = not isinstance(self._original, keras.Variable | tf.Variable)
        if self._replaced:
            with strategy.scope():
                self.variable = keras.Variable(
                    0.0, dtype=keras.config.floatx(), trainable=False, name="lr_sweep_learning_rate",
                    aggregation="only_first_replica",
                )  # fmt: skip
        else:
            self.variable = self._original

    def install(self) -> None:
        if self._replaced:
            # As a callable learning rate: a variable there Keras takes for the optimizer's own.
            keras_internals.set_learning_rate_object(self._optimizer, lambda: self.variable)

    def remove(self) -> None:
        if self._replaced:
            keras_internals.set_learning_rate_object(self._optimizer, self._original)


def _loss_of(logs: Any, monitor: str) -> float:
    if not isinstance(logs, dict) or monitor not in logs:
        keys = sorted(logs) if isinstance(logs, dict) else type(logs).__name__
        raise ValueError(
            f"Invalid value for argument `monitor`. Received: monitor={monitor!r}, but the training step "
            f"returned the logs {keys}. Expected the name of the step's loss log."
        )
    return float(np.mean(np.asarray(logs[monitor], dtype=np.float64)))


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
    preparation.check_step(owner, "train")
    optimizer = getattr(owner.model, "optimizer", None)
    if optimizer is None:
        raise ValueError(
            "find_learning_rate sweeps the learning rate of the model's optimizer, but the model has none. "
            "Expected `optimizer=` given to `tftrain.Trainer(...)` or `model.compile(optimizer=...)`."
        )
    data = inputs.adapt(x, y, batch_size=batch_size, shuffle=False)
    # The sweep reads `steps` batches, cycling the data: no "endless data" warning.
    plan = preparation.plan_for(owner, "train", dataclasses.replace(data, steps=steps), "x")
    preparation.build(owner, plan.dataset)
    engines = owner.engines
    copy = StateCopy(owner)
    copy.take()
    rate = _LearningRate(optimizer, engines.strategy)
    try:
        rate.install()
        options = dataclasses.replace(engines.options, steps_per_loop=1)
        step, autograph = engines.step_of("train")
        runner = step_runner.make_runner(step, options, engines.strategy, "train_step", autograph=autograph)
        batches = _Batches(plan, runner)
        if hasattr(runner.step, "get_concrete_function"):
            # Traced first: variables a step creates on its first trace are copied with their initial values.
            runner.step.get_concrete_function(batches.iterator.element_spec)
        copy.take()
        rates = learning_rates(min_lr, max_lr, steps)
        return _sweep(owner, batches, rate, rates, smoothing, stop_factor, monitor)
    finally:
        rate.remove()
        copy.restore()
        plan.close()
        copy.warn_not_copied("find_learning_rate", stacklevel=3)


class _Batches:
    """One training step at a time over the data, starting a new pass where a pass ends."""

    def __init__(self, plan: EpochPlan, runner: step_runner.StepRunner):
        self.plan, self.runner = plan, runner
        self.iterator = plan.begin_epoch()
        self._in_pass = 0

    def step(self) -> Any:
        """Runs one step; returns its logs, or None where the data ended and cannot be read again."""
        result = self.runner(self.iterator, 1)
        if result.steps == 0 and self._in_pass > 0 and not self.plan.single_pass:
            self.plan.reset()
            self.iterator, self._in_pass = self.plan.begin_epoch(), 0
            result = self.runner(self.iterator, 1)
        if result.steps == 0 and self._in_pass == 0:
            raise ValueError(
                f"Invalid value for argument `{self.plan.argument}`: the data yielded no batches. Expected "
                "at least one batch; check filters or `take`."
            )
        self._in_pass += result.steps
        return result.logs if result.steps else None


def _sweep(
    owner: StepOwner,
    batches: _Batches,
    rate: _LearningRate,
    rates: list[float],
    smoothing: float,
    stop_factor: float,
    monitor: str,
) -> LearningRateSweep:
    losses: list[float] = []
    smoothed: list[float] = []
    average, lowest = 0.0, math.inf
    stop_reason = None
    for index, learning_rate in enumerate(rates):
        rate.variable.assign(learning_rate)
        owner.reset_metrics()  # the `loss` log of Keras's step is a mean since the last reset: this step's alone
        logs = batches.step()
        if logs is None:
            stop_reason = f"the data ended after {index} steps (a generator is read once)"
            break
        loss = _loss_of(logs, monitor)
        average = smoothing * average + (1 - smoothing) * loss
        value = average / (1 - smoothing ** (index + 1))  # bias-corrected
        losses.append(loss)
        smoothed.append(value)
        if not math.isfinite(value):
            stop_reason = f"the loss was not finite ({loss}) at learning rate {learning_rate:.3g}"
            break
        # `stop_factor` times the lowest smoothed loss, for a positive loss; above it by as much in general.
        if value - lowest > (stop_factor - 1) * abs(lowest):
            stop_reason = (
                f"the smoothed loss ({value:.4g}) rose above {stop_factor:g} times its lowest "
                f"({lowest:.4g}) at learning rate {learning_rate:.3g}"
            )
            break
        lowest = min(lowest, value)
    suggestion, no_suggestion_reason = suggest(rates, smoothed)
    return LearningRateSweep(
        learning_rates=rates[: len(losses)],
        losses=losses,
        smoothed_losses=smoothed,
        suggestion=suggestion,
        stopped_early=stop_reason is not None,
        stop_reason=stop_reason,
        no_suggestion_reason=no_suggestion_reason,
    )
