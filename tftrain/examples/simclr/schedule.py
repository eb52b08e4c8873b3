"""SimCLR's learning-rate schedule: linear warmup, then cosine decay to zero."""

from __future__ import annotations

import math

import keras
import tensorflow as tf

SCALINGS = ("linear", "sqrt")


def _check_positive_int(argument: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (value == 0 and not allow_none):
        expected = "an integer >= 1" + (" (0 or None: not given)" if allow_none else "")
        raise ValueError(
            f"Invalid value for argument `{argument}`. Received: {argument}={value!r}. Expected {expected}."
        )


def train_steps_of(
    num_examples: int, train_steps: int | None, train_epochs: int | None, train_batch_size: int
) -> int:
    """Returns the number of training steps of a run.

    As SimCLR counts them: `train_steps` when given (not None or 0), otherwise
    `num_examples * train_epochs // train_batch_size + 1`.

    Args:
        num_examples: The number of training examples per epoch.
        train_steps: The number of steps, or None/0 to derive it from epochs.
        train_epochs: The number of epochs, used when `train_steps` is not given.
        train_batch_size: The global batch size.

    Returns:
        The total number of training steps.

    Raises:
        ValueError: neither `train_steps` nor `train_epochs` is given, or a
            non-positive count.
    """
    _check_positive_int("num_examples", num_examples)
    _check_positive_int("train_batch_size", train_batch_size)
    _check_positive_int("train_steps", train_steps, allow_none=True)
    _check_positive_int("train_epochs", train_epochs, allow_none=True)
    if train_steps:
        return train_steps
    if not train_epochs:
        raise ValueError(
            f"Invalid value for argument `train_epochs`. Received: train_epochs={train_epochs!r} "
            f"with train_steps={train_steps!r}. Expected train_steps or train_epochs >= 1."
        )
    return num_examples * train_epochs // train_batch_size + 1


@keras.saving.register_keras_serializable(package="tftrain")
class WarmUpAndCosineDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to a batch-scaled learning rate, then cosine decay to 0.

    The peak learning rate is `base_learning_rate * train_batch_size / 256`
    ("linear") or `base_learning_rate * sqrt(train_batch_size)` ("sqrt"). It is
    reached after `int(round(warmup_epochs * num_examples // train_batch_size))`
    steps, then follows half a cosine to 0 at the last training step (see
    `train_steps_of`), and stays 0 after it.

    Args:
        base_learning_rate: The learning rate before batch-size scaling.
        num_examples: The number of training examples per epoch.
        train_batch_size: The global batch size.
        train_steps: The total number of steps; wins over `train_epochs`.
        train_epochs: The number of epochs, when `train_steps` is not given.
        warmup_epochs: The length of the warmup, in epochs (may be fractional).
        learning_rate_scaling: "linear" or "sqrt".

    Raises:
        ValueError: a bad scaling name, or bad counts.
    """

    def __init__(
        self,
        base_learning_rate: float,
        num_examples: int,
        train_batch_size: int,
        train_steps: int | None = None,
        train_epochs: int | None = None,
        warmup_epochs: float = 10,
        learning_rate_scaling: str = "linear",
    ):
        super().__init__()
        if learning_rate_scaling not in SCALINGS:
            raise ValueError(
                "Invalid value for argument `learning_rate_scaling`. Received: "
                f"learning_rate_scaling={learning_rate_scaling!r}. Expected one of {SCALINGS}."
            )
        if (
            isinstance(warmup_epochs, bool)
            or not isinstance(warmup_epochs, (int, float))
            or warmup_epochs < 0
        ):
            raise ValueError(
                f"Invalid value for argument `warmup_epochs`. Received: warmup_epochs={warmup_epochs!r}. "
                "Expected a number >= 0."
            )
        self.total_steps = train_steps_of(num_examples, train_steps, train_epochs, train_batch_size)
        self.base_learning_rate = base_learning_rate
        self.num_examples = num_examples
        self.train_batch_size = train_batch_size
        self.train_steps = train_steps
        self.train_epochs = train_epochs
        self.warmup_epochs = warmup_epochs
        self.learning_rate_scaling = learning_rate_scaling
        self.warmup_steps = int(round(warmup_epochs * num_examples // train_batch_size))
        if learning_rate_scaling == "linear":
            self.scaled_learning_rate = base_learning_rate * train_batch_size / 256.0
        else:
            self.scaled_learning_rate = base_learning_rate * math.sqrt(train_batch_size)

    def __call__(self, step):
        """Returns the learning rate at `step` (a scalar tensor or number), as float32."""
        with tf.name_scope("WarmUpAndCosineDecay"):
            step = tf.cast(step, tf.float32)
            peak = tf.constant(self.scaled_learning_rate, tf.float32)
            warmup_steps = float(self.warmup_steps)
            warmup = peak * step / warmup_steps if self.warmup_steps else peak
            decay_steps = float(max(self.total_steps - self.warmup_steps, 1))
            progress = tf.clip_by_value((step - warmup_steps) / decay_steps, 0.0, 1.0)
            cosine = 0.5 * peak * (1.0 + tf.cos(math.pi * progress))
            return tf.where(step < warmup_steps, warmup, cosine)

    def get_config(self) -> dict:
        """Returns the constructor arguments; `from_config` rebuilds the schedule."""
        return {
            "base_learning_rate": self.base_learning_rate,
            "num_examples": self.num_examples,
            "train_batch_size": self.train_batch_size,
            "train_steps": self.train_steps,
            "train_epochs": self.train_epochs,
            "warmup_epochs": self.warmup_epochs,
            "learning_rate_scaling": self.learning_rate_scaling,
        }
