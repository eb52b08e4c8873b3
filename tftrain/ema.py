"""Training with EMA weights: Keras's optimizer averages, used wherever the model is judged or shipped.

`Trainer(ema_decay=0.999)` turns on the optimizer's own exponential moving
average of the trainable weights (`use_ema=True, ema_momentum=0.999`: Keras
updates the averages after every step, under every engine and strategy) and
swaps the averages into the model, exactly and only for the time it takes,
wherever the model is evaluated or shipped: validation in `fit`,
`evaluate`, `predict`, the best checkpoint and `export`. Training goes on
with the raw weights. Every checkpoint holds both (the averages are
optimizer variables), so a resume is exact.

Keras's own `keras.callbacks.SwapEMAWeights` swaps with additions and
subtractions, which changes the raw weights in their last bits; here the raw
values are kept aside and put back as they were.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf

from tftrain.compat import keras_internals

__all__ = ["averaged_weights", "check_decay", "enable"]


def check_decay(decay: Any) -> float | None:
    """Returns `decay` as a float if it is a valid EMA decay (in (0, 1)), or None; else raises ValueError."""
    if decay is None:
        return None
    if (
        isinstance(decay, bool)
        or not isinstance(decay, int | float)
        or not (0 < decay < 1 and math.isfinite(decay))
    ):
        raise ValueError(
            f"Invalid value for argument `ema_decay`. Received: ema_decay={decay!r}. Expected a number in "
            "(0, 1), e.g. 0.999 (each step: average = decay * average + (1 - decay) * weights), or None."
        )
    return float(decay)


def _averaging_optimizer(optimizer: Any) -> Any:
    """The optimizer that keeps the averages (a `LossScaleOptimizer`'s inner one)."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def enable(optimizer: keras.optimizers.Optimizer, decay: float) -> None:
    """Turns on the optimizer's moving average of the weights, with momentum `decay`.

    Args:
        optimizer: The model's optimizer, not built yet (or built with
            `use_ema=True` and the same momentum).
        decay: The average's momentum (`check_decay`).

    Raises:
        ValueError: the optimizer is built without EMA, averages with another
            momentum, or overwrites the weights with the averages during
            training (`ema_overwrite_frequency`).
    """
    inner = _averaging_optimizer(optimizer)
    if not isinstance(inner, keras.optimizers.Optimizer):
        raise ValueError(
            f"Invalid combination of arguments. Received: ema_decay={decay!r} with an optimizer of type "
            f"{type(optimizer).__name__}. Expected a keras.optimizers.Optimizer: it keeps the averages."
        )
    if inner.ema_overwrite_frequency:
        raise ValueError(
            f"Invalid combination of arguments. Received: ema_decay={decay!r} with an optimizer whose "
            f"ema_overwrite_frequency={inner.ema_overwrite_frequency!r}. Expected ema_overwrite_frequency=None: "
            "with `ema_decay` training goes on with the raw weights and only evaluation uses the averages."
        )
    if inner.use_ema:
        if not math.isclose(float(inner.ema_momentum), decay):
            raise ValueError(
                f"Invalid combination of arguments. Received: ema_decay={decay!r} with an optimizer made with "
                f"use_ema=True, ema_momentum={inner.ema_momentum!r}. Expected the same value in both, or "
                "one of them."
            )
        return
    if inner.built:
        raise ValueError(
            f"Invalid combination of arguments. Received: ema_decay={decay!r} with an optimizer that is "
            "already built without averages (it has trained, or a checkpoint was restored into it). "
            f"Expected an optimizer made with use_ema=True, ema_momentum={decay!r}, or a new one."
        )
    inner.use_ema = True
    inner.ema_momentum = decay


@contextlib.contextmanager
def averaged_weights(model: keras.Model) -> Iterator[None]:
    """Within the block, the model's trainable weights are the optimizer's moving averages.

    The raw weights are kept aside and put back exactly (bit for bit) when
    the block ends, also on an error. Before the first training step (the
    optimizer's averages hold nothing yet), the weights are left as they are.

    Args:
        model: A model whose optimizer has `use_ema=True`.

    Raises:
        ValueError: the model's optimizer keeps no averages.
    """
    optimizer = _averaging_optimizer(getattr(model, "optimizer", None))
    if optimizer is None or not getattr(optimizer, "use_ema", False):
        raise ValueError(
            "Cannot use averaged weights: the model's optimizer keeps no moving average. Expected "
            "`Trainer(..., ema_decay=0.999)` or an optimizer made with `use_ema=True`."
        )
    if not optimizer.built or int(optimizer.iterations.numpy()) == 0:
        yield  # no step yet: the averages hold nothing (Keras sets them at the first step)
        return
    pairs = keras_internals.moving_averages(optimizer, model.trainable_variables)
    raw = [tf.identity(variable.value) for variable, _ in pairs]
    try:
        for variable, average in pairs:
            variable.assign(average)
        yield
    finally:
        for (variable, _), value in zip(pairs, raw, strict=True):
            variable.assign(value)
