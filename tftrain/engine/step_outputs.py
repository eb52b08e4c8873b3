"""What a step must return, checked once: a dict of logs (training, evaluation) or the batch's predictions.

Keras's `fit` and `evaluate` take whatever `train_step` / `test_step`
return and fail at the first batch's end with an error about the value
(`'Tensor' object has no attribute 'items'`), or, for None, deep in
TensorFlow. `returns_checked` names the step, what it returned and what is
expected instead, when the step is traced (graph engines) or at its first
call (eager): never per step.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

__all__ = ["describe", "returns_checked", "step_label"]


def step_label(step_fn: Callable[..., Any], name: str) -> str:
    """The step's name for an error: its qualified name without the enclosing functions (`MyTrainer.train_step`)."""
    label = getattr(step_fn, "__qualname__", None) or name
    return label.rsplit("<locals>.", 1)[-1]


def describe(value: Any) -> str:
    """A short description of a returned value: its type, and its shape and dtype or length."""
    if value is None:
        return "None"
    if isinstance(value, tf.Tensor | tf.Variable | np.ndarray | np.generic):
        kind = "NumPy value" if isinstance(value, np.ndarray | np.generic) else "tf.Tensor"
        return f"a {kind} of shape {tuple(value.shape)} and dtype {value.dtype.name}"
    if isinstance(value, list | tuple):
        return f"a {type(value).__name__} of {len(value)} items"
    return f"an object of type {type(value).__name__}"


def _check_logs(logs: Any, label: str) -> None:
    if isinstance(logs, dict):
        return
    raise TypeError(
        f"Invalid return value of the step `{label}`. Received: {describe(logs)}. Expected a dict of logs, "
        'name -> value (e.g. `return {"loss": loss}`), as Keras\'s `train_step` and `test_step` return: '
        "fit and evaluate report them to callbacks, the progress bar and History."
    )


def _none_paths(value: Any, path: str = "") -> list[str]:
    """The key paths of the None values in a structure of dicts, lists and tuples (`""`: the value itself)."""
    if value is None:
        return [path]
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    else:
        return []
    return [found for key, item in items for found in _none_paths(item, f"{path}[{key!r}]")]


def _check_predictions(outputs: Any, label: str) -> None:
    paths = _none_paths(outputs)
    if not paths:
        return
    where = "" if paths == [""] else f" at outputs{', outputs'.join(paths)}"
    raise TypeError(
        f"Invalid return value of the step `{label}`. Received: None{where}. Expected the batch's "
        "predictions: a tensor, or a structure (dict, list, tuple) of tensors, with no None in it."
    )


def returns_checked(step_fn: Callable[[Any], Any], label: str, *, predictions: bool) -> Callable[[Any], Any]:
    """`step_fn`, its return checked where it is traced, and at its first eager call.

    Args:
        step_fn: The step (`batch -> logs`, or predictions).
        label: Its name in the error (`step_label`).
        predictions: The step returns predictions (any structure of tensors,
            no None) rather than a dict of logs.

    Returns:
        The step; it raises `TypeError` naming the step, what it returned and what is expected.
    """
    check = _check_predictions if predictions else _check_logs
    checked_eagerly = False

    @functools.wraps(step_fn)
    def step(batch):
        nonlocal checked_eagerly
        outputs = step_fn(batch)
        if tf.inside_function():  # runs only while the step traces
            check(outputs, label)
        elif not checked_eagerly:
            check(outputs, label)
            checked_eagerly = True
        return outputs

    return step
