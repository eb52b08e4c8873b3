"""`Trainer.evaluate` and `Trainer.predict`: Keras's evaluation and prediction loops on the Trainer's engines.

A mixin of `tftrain.Trainer` (kept apart to keep each module small); it uses
the Trainer's engines (`_loop`), input plans (`_plan`) and checks.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tftrain import evaluation, options
from tftrain.compat import keras_internals
from tftrain.data import inputs
from tftrain.loops import epoch_loop, hooks


class InferenceMixin:
    """`evaluate` and `predict` for `tftrain.Trainer`."""

    def evaluate(
        self,
        x: Any = None,
        y: Any = None,
        batch_size: int | None = None,
        verbose: int | str = "auto",
        sample_weight: Any = None,
        steps: int | None = None,
        callbacks: list[keras.callbacks.Callback] | None = None,
        return_dict: bool = True,
    ) -> dict[str, float] | list[float] | float:
        """Evaluates the model with `eval_step`, as `keras.Model.evaluate` does.

        Same arguments and meanings as Keras 3's `evaluate`, with one
        difference in default: `return_dict=True` (Keras: False).

        Args:
            x: Inputs, as for `fit`.
            y: Targets, for array inputs only.
            batch_size: Batch size for array inputs (default 32).
            verbose: "auto" or 1: a progress bar; 0: silent.
            sample_weight: Per-example weights, for array inputs only.
            steps: Steps to run; None means one pass over the data.
            callbacks: Keras callbacks (their `on_test_*` hooks run).
            return_dict: Return `{name: value}` (the default here); False
                gives Keras's default: the values in `model.metrics_names`
                order (a scalar if there is one).

        Returns:
            The metrics at the end of the pass, as Python floats.
        """
        options.check_verbose(verbose)
        self._check_model_step("eval_step", "test_step")
        plan = self._plan(
            inputs.adapt(x, y, sample_weight, batch_size=batch_size, steps=steps, steps_argument="steps")
        )
        self._check_data(plan.dataset, "x", "eval_step")
        self._build(plan.dataset)
        callback_list = keras.callbacks.CallbackList(
            callbacks, add_progbar=verbose != 0, verbose=verbose, epochs=1, steps=plan.steps, model=self.model
        )
        logs = self._run_evaluation(plan, callback_list)
        if return_dict:
            return logs
        return keras_internals.flatten_metrics_in_order(self.model, logs)

    def evaluate_continuously(
        self,
        x: Any = None,
        y: Any = None,
        *,
        model_dir: str | None = None,
        batch_size: int | None = None,
        steps: int | None = None,
        sample_weight: Any = None,
        callbacks: list[keras.callbacks.Callback] | None = None,
        verbose: int | str = 0,
        timeout_s: float | None = 3600.0,
        poll_interval_s: float = 1.0,
        last_step: int | None = None,
    ) -> dict[int, dict[str, float]]:
        """Evaluates each checkpoint of `model_dir` (default: this Trainer's) as training writes it.

        `tftrain.evaluation.evaluate_continuously(self, ...)`: see it for the
        arguments, when it returns and its errors. Results go to TensorBoard
        (`model_dir/eval`) and to `model_dir/eval/results.json`.

        Returns:
            Global step -> logs of every checkpoint evaluated in `model_dir`.
        """
        return evaluation.evaluate_continuously(
            self,
            x,
            y,
            model_dir=model_dir,
            batch_size=batch_size,
            steps=steps,
            sample_weight=sample_weight,
            callbacks=callbacks,
            verbose=verbose,
            timeout_s=timeout_s,
            poll_interval_s=poll_interval_s,
            last_step=last_step,
        )

    def _run_evaluation(self, plan: inputs.EpochPlan, callback_list) -> dict[str, Any]:
        self.model.stop_evaluating = False
        plan.reset()
        callback_list.on_test_begin()
        self.reset_metrics()
        logs = epoch_loop.run_pass(
            plan,
            self._loop("eval"),
            *hooks.batch_hooks(callback_list, "test"),
            steps_per_loop=self._steps_per_call("eval", callback_list),
            should_stop=lambda: getattr(self.model, "stop_evaluating", False),
        )
        results = keras_internals.pythonify_logs(self._final_logs(logs, "eval_step"))
        callback_list.on_test_end(results)
        return results

    def predict(
        self,
        x: Any,
        batch_size: int | None = None,
        verbose: int | str = "auto",
        steps: int | None = None,
        callbacks: list[keras.callbacks.Callback] | None = None,
    ) -> Any:
        """Predicts with `predict_step`, as `keras.Model.predict` does, under the Trainer's engine.

        Args:
            x: Inputs, as for `fit` (targets in the data are ignored).
            batch_size: Batch size for array inputs (default 32).
            verbose: "auto" or 1: a progress bar; 0: silent.
            steps: Steps to run; None means one pass over the data.
            callbacks: Keras callbacks (their `on_predict_*` hooks run; a batch
                hook's logs are `{"outputs": predictions of that host call}`).

        Returns:
            The predictions for every example, in the structure the step
            returns: NumPy arrays (ragged or sparse tensors where the outputs are).

        Raises:
            ValueError: the data yielded no batch.
        """
        options.check_verbose(verbose)
        plan = self._plan(inputs.adapt(x, batch_size=batch_size, steps=steps, steps_argument="steps"))
        callback_list = keras.callbacks.CallbackList(
            callbacks, add_progbar=verbose != 0, verbose=verbose, epochs=1, steps=plan.steps, model=self.model
        )
        begin_hook, end_hook = hooks.batch_hooks(callback_list, "predict")
        chunks: list[Any] = []

        def on_batch_end(index: int, call_chunks: list[Any]) -> None:
            chunks.extend(call_chunks)
            end_hook(index, {"outputs": _join_predictions(call_chunks, to_numpy=False)})

        self.model.stop_predicting = False
        callback_list.on_predict_begin()
        epoch_loop.run_pass(
            plan,
            self._loop("predict"),
            begin_hook,
            on_batch_end,
            steps_per_loop=self._steps_per_call("predict", callback_list),
            should_stop=lambda: getattr(self.model, "stop_predicting", False),
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
