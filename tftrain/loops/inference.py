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

from tftrain.compat import keras_internals
from tftrain.data.inputs import EpochPlan
from tftrain.loops import epoch_loop, hooks
from tftrain.loops.owner import StepOwner

__all__ = ["run_evaluation", "run_prediction", "validate_mid_epoch"]


def run_evaluation(
    owner: StepOwner, plan: EpochPlan, callback_list: keras.callbacks.CallbackList
) -> dict[str, Any]:
    """One evaluation pass (as `evaluate`, or `fit`'s validation); returns its logs as Python values."""
    owner.model.stop_evaluating = False
    plan.reset()
    callback_list.on_test_begin()
    owner.reset_metrics()
    logs = epoch_loop.run_pass(
        plan,
        owner.engines.loop("eval"),
        *hooks.batch_hooks(callback_list, "test"),
        steps_per_loop=owner.engines.steps_per_call("eval", callback_list),
        should_stop=lambda: getattr(owner.model, "stop_evaluating", False),
    )
    results = keras_internals.pythonify_logs(owner.final_logs(logs, "eval"))
    callback_list.on_test_end(results)
    return results


def validate_mid_epoch(
    owner: StepOwner, plan: EpochPlan, callback_list: keras.callbacks.CallbackList
) -> dict[str, Any]:
    """Validates without losing the epoch's training metrics (an evaluation resets every metric)."""
    saved = [(variable, variable.numpy()) for metric in owner.metrics for variable in metric.variables]
    with tf.summary.record_if(False):  # the writer in fit is the training step's
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
    epoch_loop.run_pass(
        plan,
        owner.engines.loop("predict"),
        begin_hook,
        on_batch_end,
        steps_per_loop=owner.engines.steps_per_call("predict", callback_list),
        should_stop=lambda: getattr(owner.model, "stop_predicting", False),
    )
    callback_list.on_predict_end()
    return _join_predictions(chunks, to_numpy=True)


def _join_predictions(chunks: list[Any], *, to_numpy: bool) -> Any:
    """Per-call prediction chunks -> one structure, joined along the example axis as Keras's predict does."""
    if len(chunks) == 1:
        joined = chunks[0]
    else:
        joined = tf.nest.map_structure(
            lambda *parts: keras_internals.concat_batches(list(parts)), chunks[0], *chunks[1:]
        )
    if not to_numpy:
        return joined
    return tf.nest.map_structure(
        lambda value: value if isinstance(value, tf.RaggedTensor | tf.SparseTensor) else np.asarray(value),
        joined,
    )
