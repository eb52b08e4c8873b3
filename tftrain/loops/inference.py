"""The evaluation loop: one pass of eval or predict steps, for `evaluate`, `predict` and validation.

Keras's evaluation and prediction loops on the owner's engines: the same
callback hooks (`on_test_*`, `on_predict_*`), metrics reset at the start,
logs as Keras reports them, predictions joined along the example axis.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tftrain.arguments import check_verbose
from tftrain.compat import keras_internals
from tftrain.fit_inputs import inputs
from tftrain.fit_inputs.epoch_plan import EpochPlan
from tftrain.loops import epoch_loop, hooks, preparation
from tftrain.loops.owner import StepOwner

__all__ = [
    "callback_list",
    "evaluate",
    "pass_logs",
    "predict",
    "run_evaluation",
    "run_prediction",
    "validate_mid_epoch",
]


def evaluate(
    owner: StepOwner,
    x: Any,
    y: Any,
    *,
    batch_size: int | None,
    verbose: int | str,
    sample_weight: Any,
    steps: int | None,
    callbacks: Any,
    kwargs: dict[str, Any],
) -> dict[str, float]:
    """`Trainer.evaluate` (its arguments, by keyword): checks, adapts the inputs, runs one evaluation pass.

    Returns the pass's logs by name (`Trainer.evaluate` returns them as
    `keras.Model.evaluate` does: a dict with `return_dict`, else their values
    in Keras's metrics order).
    """
    check_verbose(verbose)
    preparation.check_step(owner, "eval")
    _check_evaluate_kwargs(kwargs)
    data = inputs.adapt(x, y, sample_weight, batch_size=batch_size, steps=steps, steps_argument="steps")
    plan = preparation.plan_for(owner, "eval", data, "x")
    preparation.build(owner, plan.dataset)
    return run_evaluation(owner, plan, callback_list(callbacks, verbose, plan, owner.model))


def _check_evaluate_kwargs(kwargs: dict[str, Any]) -> None:
    """`evaluate`'s `**kwargs`, as Keras takes them: its private `_use_cached_eval_dataset` only.

    Keras's `fit` passes `_use_cached_eval_dataset=True` to reuse its
    validation iterator; the Trainer validates with its own evaluation loop,
    so only False (evaluate `x`) has a meaning here.
    """
    kwargs = dict(kwargs)
    if kwargs.pop("_use_cached_eval_dataset", False):
        raise ValueError(
            "Invalid value for argument `_use_cached_eval_dataset`. Received: _use_cached_eval_dataset=True. "
            "Expected False: the Trainer keeps no evaluation dataset of `fit`'s (pass the data as `x`)."
        )
    if kwargs:
        raise ValueError(f"Arguments not recognized: {kwargs}")


def predict(
    owner: StepOwner, x: Any, *, batch_size: int | None, verbose: int | str, steps: int | None, callbacks: Any
) -> Any:
    """`Trainer.predict` (its arguments, by keyword): adapts the inputs, runs one prediction pass."""
    check_verbose(verbose)
    data = inputs.adapt(x, batch_size=batch_size, steps=steps, steps_argument="steps")
    plan = preparation.plan_of(owner, data)
    return run_prediction(owner, plan, callback_list(callbacks, verbose, plan, owner.model))


def callback_list(
    callbacks: Any, verbose: int | str, plan: EpochPlan, model: keras.Model
) -> keras.callbacks.CallbackList:
    """The `CallbackList` of one evaluation or prediction pass, as Keras's `evaluate`/`predict` build it."""
    return keras.callbacks.CallbackList(
        callbacks, add_progbar=verbose != 0, verbose=verbose, epochs=1, steps=plan.steps, model=model
    )


def pass_logs(owner: StepOwner, logs: Any, kind: str) -> dict[str, Any]:
    """A pass's logs as `fit` reports them: the model's metric results where they match the step's logs.

    A step of the owner's own (`kind` "train" or "eval") reports what it
    returns: the model's compiled metrics are not its metrics.
    """
    if not owner.uses_model_step(kind):
        return dict(logs or {})
    return dict(keras_internals.metrics_result_or_logs(owner.model, logs or {}))


def run_evaluation(
    owner: StepOwner, plan: EpochPlan, callback_list: keras.callbacks.CallbackList
) -> dict[str, Any]:
    """One evaluation pass (as `evaluate`, or `fit`'s validation); returns its logs as Python values."""
    owner.model.stop_evaluating = False
    plan.reset()
    callback_list.on_test_begin()
    owner.reset_metrics()
    with owner.averaged_weights():
        logs = epoch_loop.run_pass(
            plan,
            owner.engines.runner("eval"),
            *hooks.batch_hooks(callback_list, "test"),
            steps_per_loop=owner.engines.steps_per_call("eval", callback_list),
            should_stop=lambda: getattr(owner.model, "stop_evaluating", False),
        )
    results = keras_internals.pythonify_logs(pass_logs(owner, logs, "eval"))
    callback_list.on_test_end(results)
    return results


def validate_mid_epoch(
    owner: StepOwner, plan: EpochPlan, callback_list: keras.callbacks.CallbackList
) -> dict[str, Any]:
    """Validates without losing the epoch's training metrics (an evaluation resets every metric)."""
    saved = [(variable, variable.numpy()) for metric in owner.metrics for variable in metric.variables]
    # The validation's traced steps record no summaries (the default writer in fit is the
    # training step's); callbacks record as under fit (Keras's TensorBoard on_test_end).
    with tf.summary.record_if(lambda: not tf.inside_function()):
        logs = run_evaluation(owner, plan, callback_list)
    for variable, value in saved:
        variable.assign(value)
    return logs


def run_prediction(owner: StepOwner, plan: EpochPlan, callback_list: keras.callbacks.CallbackList) -> Any:
    """One prediction pass; returns the predictions for every example, as NumPy arrays.

    A batch hook's logs are `{"outputs": predictions of that host call}`.
    """
    begin_hook, end_hook = hooks.batch_hooks(callback_list, "predict")
    chunks: list[Any] = []

    def on_batch_end(index: int, call_chunks: list[Any]) -> None:
        chunks.extend(call_chunks)
        end_hook(index, {"outputs": _join_predictions(call_chunks, to_numpy=False)})

    owner.model.stop_predicting = False
    callback_list.on_predict_begin()
    with owner.averaged_weights():
        epoch_loop.run_pass(
            plan,
            owner.engines.runner("predict"),
            begin_hook,
            on_batch_end,
            steps_per_loop=owner.engines.steps_per_call("predict", callback_list),
            should_stop=lambda: getattr(owner.model, "stop_predicting", False),
        )
    callback_list.on_predict_end()
    return _join_predictions(chunks, to_numpy=True)


def _join_predictions(chunks: list[Any], *, to_numpy: bool) -> Any:
    """Per-call prediction chunks -> one structure, joined along the example axis as Keras's predict does.

    With `to_numpy`: writable NumPy arrays, as `predict` returns (ragged or
    sparse tensors stay tensors). Dense chunks are joined by NumPy, whose
    copy is the result; one chunk is copied once (a view of TensorFlow's
    buffer is read-only).
    """
    if not to_numpy:
        if len(chunks) == 1:
            return chunks[0]
        return tf.nest.map_structure(lambda *parts: keras_internals.concat_batches(list(parts)), *chunks)
    return tf.nest.map_structure(lambda *parts: _joined_array(list(parts)), *chunks)


def _joined_array(parts: list[Any]) -> Any:
    """One output's chunks -> a writable NumPy array (Keras's ragged join where their shapes differ)."""
    if all(isinstance(part, tf.Tensor) for part in parts):
        if len(parts) == 1:
            return parts[0].numpy()  # a copy: the only one
        if len({tuple(part.shape[1:]) for part in parts}) == 1:
            arrays = [np.asarray(part) for part in parts]  # views: NumPy's join makes the one copy
            return np.stack(arrays) if arrays[0].ndim == 0 else np.concatenate(arrays)
    joined = keras_internals.concat_batches(parts)
    return joined.numpy() if isinstance(joined, tf.Tensor) else joined
