"""Checks of `fit`/`evaluate`/`predict` arguments against each other and the model, before any step runs.

Each raises with what was received, what was expected and how to fix it, so
a bad call fails before it trains (or touches a `model_dir`) at all.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import keras
import tensorflow as tf

from tftrain.fit_inputs import inputs


def should_validate(epoch: int, validation_freq: int | list[int]) -> bool:
    """Whether `fit` validates after 0-based `epoch`, as Keras decides."""
    if isinstance(validation_freq, int):
        return (epoch + 1) % validation_freq == 0
    return epoch + 1 in validation_freq


def check_resume_sources(callbacks: Any, model_dir: str) -> None:
    """One resume mechanism per run: `BackupAndRestore` and a `model_dir` would both restore the model."""
    for callback in tf.nest.flatten(callbacks or []):
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            raise ValueError(
                f"Invalid combination of arguments. Received: a keras.callbacks.BackupAndRestore callback with "
                f"model_dir={model_dir!r}. Both back up and restore the run, and each would overwrite "
                "the other's restore. Expected one of them: model_dir resumes exactly (mid-epoch, with the "
                "data position); BackupAndRestore resumes at an epoch or step boundary, as under model.fit."
            )


def check_targets(model: keras.Model, element_spec: Any, argument: str) -> None:
    """A compiled loss with Keras's own loss computation needs targets; raises if the data yields none.

    Only for the default `train_step`/`test_step` and `compute_loss`, where
    Keras would otherwise fail with an AttributeError on `None` deep inside the loss.
    """
    if getattr(model, "loss", None) is None:
        return
    if type(model).compute_loss is not keras.Model.compute_loss:
        return
    x, y, _ = keras.utils.unpack_x_y_sample_weight(element_spec)
    if y is None or isinstance(y, tf.OptionalSpec):
        hint = ""
        if isinstance(x, tuple) and len(x) in (2, 3):
            hint = " (A tuple `(x, y)` given as `x` is read as several inputs, as model.fit reads it: write fit(x, y).)"
        raise ValueError(
            f"Invalid value for argument `{argument}`: it yields inputs only, no targets (its batches are "
            f"{element_spec}), but the model was compiled with loss={model.loss!r}, which needs them. "
            "Expected batches `(x, y)` or `(x, y, sample_weight)`: pass `y=` with arrays, or map the "
            f"dataset to `(x, y)` pairs.{hint}"
        )


def check_batched_for_model(model: keras.Model, element_spec: Any, argument: str) -> None:
    """Raises if a functional model's inputs have one more axis than the data's: an unbatched dataset."""
    model_inputs = getattr(model, "inputs", None) if model.built else None
    if not model_inputs:
        return
    x, _, _ = keras.utils.unpack_x_y_sample_weight(element_spec)
    specs = [spec for spec in tf.nest.flatten(x) if hasattr(spec, "shape")]
    if len(specs) != len(model_inputs):
        return
    if all(
        spec.shape.rank is not None and spec.shape.rank == len(tensor.shape) - 1
        for spec, tensor in zip(specs, model_inputs, strict=True)
    ):
        raise ValueError(
            f"Invalid value for argument `{argument}`: it yields single examples, not batches (inputs of shape "
            f"{[spec.shape.as_list() for spec in specs]} for model inputs of shape "
            f"{[list(tensor.shape) for tensor in model_inputs]}). Expected a batched dataset: batch it "
            "with `dataset.batch(batch_size)`."
        )


def step_budget_epochs(
    data: inputs.AdaptedInput, total_steps: int, epochs: int
) -> tuple[inputs.AdaptedInput, int]:
    """The epochs that train `total_steps` steps (the last one cut short), and the data's steps per epoch.

    Data that never ends with no `steps_per_epoch` makes one epoch of
    `total_steps` steps.

    Raises:
        ValueError: `epochs` (other than its default 1) contradicts the budget,
            or the data's length is unknown and no `steps_per_epoch` says how
            long an epoch is.
    """
    cardinality = int(data.dataset.cardinality())
    per_epoch = data.steps or (cardinality if cardinality > 0 else None)
    if per_epoch is None:
        if cardinality != tf.data.INFINITE_CARDINALITY:
            raise ValueError(
                f"Invalid combination of arguments. Received: total_steps={total_steps} with data of unknown "
                "length and steps_per_epoch=None. Expected steps_per_epoch=<steps>, so the budget can be "
                "split into epochs, or data that repeats (one epoch of total_steps steps)."
            )
        per_epoch = total_steps
        data = dataclasses.replace(data, steps=total_steps)
    needed = math.ceil(total_steps / per_epoch)
    if epochs not in (1, needed):
        raise ValueError(
            f"Invalid combination of arguments. Received: total_steps={total_steps} and epochs={epochs}, "
            f"with {per_epoch} steps per epoch: the budget takes {needed} epochs. Expected epochs={needed} "
            "(or left at its default), or no total_steps."
        )
    return data, needed
