"""`Trainer`: a lean custom training loop driven by Keras callbacks.

The Trainer runs a training step under the engine chosen by its options
(`tftrain.loops`), drives a `keras.callbacks.CallbackList` exactly where
`model.fit` would, and times itself (`tftrain.timing`). The step is the
model's own `train_step` (so a `keras.Model` or `tftrain.CustomModel` trains
as under `model.fit`), or `Trainer.train_step` overridden in a subclass.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tftrain import checkpoint as checkpoint_lib
from tftrain import data as data_lib
from tftrain import distribute, hooks, loops, precision, strategy_checks, timing, training_run
from tftrain.model import CustomModel

_DEFAULT_MODEL_STEPS = {
    "train_step": (keras.Model.train_step, CustomModel.train_step),
    "test_step": (keras.Model.test_step, CustomModel.test_step),
}


def _uses_default_step(model: keras.Model, name: str) -> bool:
    return getattr(type(model), name) in _DEFAULT_MODEL_STEPS[name]


class Trainer:
    """Trains a `keras.Model` with a custom loop: fast, measured, Keras-callback driven.

    Two styles share this loop:

    * Keras style: the model's own `train_step`/`test_step` run (any
      `keras.Model`, or a `tftrain.CustomModel` with overridden pieces).
    * Custom-loop style: subclass `Trainer` and override `train_step(batch)`
      and `eval_step(batch)`, using `self.model` and `self.optimizer`; each
      returns a dict of logs.

    Example:
        ```python
        trainer = tftrain.Trainer(model, "adam", "sparse_categorical_crossentropy",
                                  metrics=["accuracy"], steps_per_loop=20)
        history = trainer.fit(train_ds, epochs=3, validation_data=val_ds)
        print(trainer.timing.summary())
        ```

    Args:
        model: Any `keras.Model`.
        optimizer: As in `keras.Model.compile` (name or instance). If any of
            `optimizer`, `loss`, `metrics` is given, the model is compiled with
            them; otherwise it is used as compiled (or uncompiled, if its own
            `train_step` does not need `compile`).
        loss: As in `compile`.
        metrics: As in `compile`.
        use_tf_function: Run steps in `tf.function` (True) or eagerly (False).
        jit_compile: Compile steps with XLA.
        steps_per_loop: Training steps per host call (a `tf.while_loop` over the
            iterator inside one `tf.function` when above 1). Batch callbacks
            fire once per host call, as with Keras's `steps_per_execution`.
        strategy: The `tf.distribute.Strategy` to run under; None means the
            current one.
        measure_timing: Time every host call (one host sync per call) and
            build `trainer.timing`. Trace counting is always on.
        model_dir: A directory for checkpoints (`model_dir/checkpoints`) and
            TensorBoard event files (`model_dir/train`, `model_dir/validation`).
            `fit` on a `model_dir` that holds a checkpoint resumes from it and
            trains up to the same target, so rerunning a killed command
            finishes the job.
        checkpoint_every_steps: Also save every this many training steps
            (None: only at epoch ends). Needs `model_dir`.
        max_to_keep: Checkpoints kept in `model_dir`.
        summary_every_steps: Also write training summaries every this many
            steps (None: only at epoch ends). Needs `model_dir`.
        profile_steps: `(start, stop)`: run the TensorFlow profiler over these
            training steps (1-based, both included); the trace goes to
            `model_dir/train` for TensorBoard's profile tab. Needs `model_dir`.
        terminate_on_nan: Stop with `NonFiniteLossError` at the first step
            whose loss (a `loss` or `*_loss` log) is NaN or infinite; no
            checkpoint is written for it.
        mixed_precision: `"mixed_float16"`, `"mixed_bfloat16"` or `"float32"`:
            switch the model's layers to this Keras dtype policy (variables
            stay float32) and, for float16, wrap the optimizer in a
            `keras.optimizers.LossScaleOptimizer`. None uses the model as built.

    Raises:
        TypeError: `model` is not a `keras.Model`, or an option has the wrong type.
        ValueError: an option has a bad value, or `model_dir` is a file or
            not writable.
    """

    def __init__(
        self,
        model: keras.Model,
        optimizer: Any = None,
        loss: Any = None,
        metrics: Any = None,
        *,
        use_tf_function: bool = True,
        jit_compile: bool = False,
        steps_per_loop: int = 1,
        strategy: tf.distribute.Strategy | None = None,
        measure_timing: bool = True,
        model_dir: str | None = None,
        checkpoint_every_steps: int | None = None,
        max_to_keep: int = 5,
        summary_every_steps: int | None = None,
        profile_steps: tuple[int, int] | None = None,
        terminate_on_nan: bool = True,
        mixed_precision: str | None = None,
    ):
        if not isinstance(model, keras.Model):
            raise TypeError(
                "Invalid value for argument `model`. Received: an object of type "
                f"{type(model).__name__}. Expected a keras.Model (Sequential, functional, "
                "a subclass, or a tftrain.CustomModel)."
            )
        self.options = loops.EngineOptions(
            use_tf_function=use_tf_function,
            jit_compile=jit_compile,
            steps_per_loop=steps_per_loop,
        )
        self.strategy = strategy or tf.distribute.get_strategy()
        self.model = model
        self.measure_timing = bool(measure_timing)
        self.run_options = training_run.RunOptions(
            model_dir=model_dir,
            checkpoint_every_steps=checkpoint_every_steps,
            max_to_keep=max_to_keep,
            summary_every_steps=summary_every_steps,
            profile_steps=profile_steps,
            terminate_on_nan=terminate_on_nan,
        )
        self.model_dir = self.run_options.model_dir
        strategy_checks.check_model_in_scope(model, self.strategy)
        self.mixed_precision = precision.check_policy(mixed_precision)
        with self.strategy.scope():  # a LossScaleOptimizer creates variables
            precision.apply_policy(model, self.mixed_precision)
            if optimizer is not None or loss is not None or metrics is not None:
                model.compile(optimizer=optimizer, loss=loss, metrics=metrics)
            precision.wrap_model_optimizer(model, self.mixed_precision)
        self.timing: timing.TimingReport | None = None
        self._train_loop: loops.StepLoop | None = None
        self._eval_loop: loops.StepLoop | None = None

    # ----------------------------------------------------------------- steps

    @property
    def optimizer(self) -> keras.optimizers.Optimizer:
        """The model's optimizer (raises a clear error if there is none)."""
        if getattr(self.model, "optimizer", None) is None:
            raise ValueError(
                "This training step needs an optimizer, but the model has none. Pass "
                "`optimizer=` to `tftrain.Trainer(...)` or call `model.compile(optimizer=...)`."
            )
        return self.model.optimizer

    @property
    def metrics(self) -> list[keras.metrics.Metric]:
        """The model's metrics plus any `keras.metrics.Metric` attributes of the trainer."""
        own = [value for value in vars(self).values() if isinstance(value, keras.metrics.Metric)]
        return list(self.model.metrics) + own

    def reset_metrics(self) -> None:
        """Resets every metric in `self.metrics` (done at each epoch start)."""
        for metric in self.metrics:
            metric.reset_state()

    def train_step(self, batch: Any) -> dict[str, Any]:
        """One training step. By default the model's own `train_step(batch)`.

        Override in a subclass for the custom-loop style; return a dict of logs.
        """
        return self.model.train_step(batch)

    def eval_step(self, batch: Any) -> dict[str, Any]:
        """One evaluation step. By default the model's own `test_step(batch)`."""
        return self.model.test_step(batch)

    def _overrides(self, name: str) -> bool:
        return getattr(type(self), name) is not getattr(Trainer, name)

    def _check_model_step(self, trainer_step: str, model_step: str) -> None:
        """Before any step runs: the default steps need a compiled model (and optimizer)."""
        if self._overrides(trainer_step) or not _uses_default_step(self.model, model_step):
            return
        if not self.model.compiled:
            raise ValueError(
                f"The model is not compiled, and its default `{model_step}` needs a loss"
                f"{' and an optimizer' if model_step == 'train_step' else ''}. Pass "
                "`optimizer=` and `loss=` to `tftrain.Trainer(...)`, call `model.compile(...)`, "
                f"or override `{model_step}` (tftrain.CustomModel) or `Trainer.{trainer_step}`."
            )
        if model_step == "train_step" and getattr(self.model, "optimizer", None) is None:
            raise ValueError(
                "The model was compiled without an optimizer, and its default `train_step` "
                "needs one. Pass `optimizer=` to `tftrain.Trainer(...)` or to `model.compile`."
            )

    def _build(self, dataset: tf.data.Dataset) -> None:
        """Creates model, metric and optimizer variables before the first trace.

        Creating them inside the first `tf.function` call would trace it twice.
        Keras's own symbolic build (what `fit` uses) does this for compiled
        models with default steps; otherwise the optimizer is built if it can be.
        """
        model = self.model
        with self.strategy.scope():
            default_steps = not self._overrides("train_step") and _uses_default_step(model, "train_step")
            if default_steps and model.compiled and hasattr(model, "_symbolic_build"):
                model._symbolic_build(data_batch=dataset.element_spec)
            elif model.built and getattr(model, "optimizer", None) is not None and not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)
        strategy_checks.check_model_in_scope(model, self.strategy)

    def _loop(self, kind: str) -> loops.StepLoop:
        if kind == "train":
            if self._train_loop is None:
                self._train_loop = loops.make_loop(
                    self.train_step,
                    self.options,
                    self.strategy,
                    "train_step",
                    stop_on_nonfinite=self.run_options.terminate_on_nan,
                )
            return self._train_loop
        if self._eval_loop is None:
            self._eval_loop = loops.make_loop(self.eval_step, self.options, self.strategy, "eval_step")
        return self._eval_loop

    def _make_iterator(self):
        """How a dataset becomes an iterator: plain, or distributed under a strategy."""
        if self.strategy is tf.distribute.get_strategy() and not tf.distribute.has_strategy():
            return iter
        return lambda ds: iter(self.strategy.experimental_distribute_dataset(ds))

    # ------------------------------------------------------------------- fit

    def fit(
        self,
        train_data: Any,
        *,
        epochs: int = 1,
        steps_per_epoch: int | None = None,
        validation_data: Any = None,
        validation_steps: int | None = None,
        callbacks: list[keras.callbacks.Callback] | None = None,
        verbose: int | str = "auto",
        batch_size: int | None = None,
    ) -> keras.callbacks.History:
        """Trains the model.

        Args:
            train_data: A batched `tf.data.Dataset`, or arrays `(x, y)` /
                `(x, y, sample_weight)` (batched by `batch_size` and shuffled
                each epoch, as `model.fit` does).
            epochs: Number of epochs (>= 0).
            steps_per_epoch: Steps per epoch; None means one pass over the data.
                Required for a dataset that repeats forever.
            validation_data: Evaluated after each epoch; logs get a `val_` prefix.
            validation_steps: Steps per validation; None means one pass.
            callbacks: Keras callbacks.
            verbose: 0 silent; 1 or "auto" a progress bar per epoch and a timing
                summary at the end; 2 one line per epoch.
            batch_size: Batch size for array inputs (default 32).

        Returns:
            The `keras.callbacks.History` (also `self.model.history`).

        Raises:
            TypeError, ValueError: bad input, raised before any step runs.
        """
        if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
            raise ValueError(
                f"Invalid value for argument `epochs`. Received: epochs={epochs!r}. Expected an integer >= 0."
            )
        verbose = hooks.check_verbose(verbose)
        self._check_model_step("train_step", "train_step")
        dataset = data_lib.as_dataset(train_data, argument="train_data", batch_size=batch_size, shuffle=True)
        plan = data_lib.EpochPlan(dataset, steps_per_epoch, "train_data", make_iterator=self._make_iterator())
        val_plan = None
        if validation_data is not None:
            self._check_model_step("eval_step", "test_step")
            val_dataset = data_lib.as_dataset(
                validation_data, argument="validation_data", batch_size=batch_size
            )
            val_plan = data_lib.EpochPlan(
                val_dataset,
                validation_steps,
                "validation_data",
                "validation_steps",
                make_iterator=self._make_iterator(),
            )
        strategy_checks.check_global_batch(dataset.element_spec, self.strategy, "train_data")
        if val_plan is not None:
            strategy_checks.check_global_batch(val_dataset.element_spec, self.strategy, "validation_data")
        self._build(dataset)
        train_loop = self._loop("train")
        timer = timing.StepTimer()
        run = training_run.start_run(
            self.run_options,
            model=self.model,
            extra_state=lambda: checkpoint_lib.attribute_state(self, exclude=self.model),
            plan=plan,
            epochs=epochs,
            timer=timer if self.measure_timing else None,
            trace_counter=train_loop.trace_counter,
            verbose=verbose,
            worker=distribute.worker_role(self.strategy),
        )
        callback_list = keras.callbacks.CallbackList(
            callbacks,
            add_history=True,
            add_progbar=verbose != 0,
            model=self.model,
            verbose=verbose,
            epochs=epochs,
            steps=plan.steps,
        )
        self.model.stop_training = False
        epoch_logs: dict[str, Any] = {}
        try:
            callback_list.on_train_begin()
            for epoch in range(run.progress.epoch, epochs):
                if run.progress.step_in_epoch == 0:  # else: resumed mid-epoch, metrics restored
                    self.reset_metrics()
                callback_list.on_epoch_begin(epoch)
                logs = training_run.run_pass(
                    plan,
                    train_loop,
                    *hooks.batch_hooks(callback_list, "train"),
                    steps_per_loop=self.options.steps_per_loop,
                    timer=timer if self.measure_timing else None,
                    run=run,
                    model=self.model,
                )
                epoch_logs = hooks.pythonify_logs(logs)
                if val_plan is not None and not self.model.stop_training:
                    val_logs = self._run_evaluation(val_plan, callback_list)
                    epoch_logs.update({f"val_{key}": value for key, value in val_logs.items()})
                callback_list.on_epoch_end(epoch, epoch_logs)
                run.end_epoch(epoch_logs)
                if self.model.stop_training:
                    break
            callback_list.on_train_end(logs=epoch_logs)
        finally:
            run.close()
        self.timing = timer.report(run.trace_count())
        if verbose and self.measure_timing:
            print(f"tftrain timing ({self.options.name}):\n{self.timing.summary()}")
        return self.model.history

    # -------------------------------------------------------------- evaluate

    def evaluate(
        self,
        data: Any,
        *,
        steps: int | None = None,
        callbacks: list[keras.callbacks.Callback] | None = None,
        batch_size: int | None = None,
    ) -> dict[str, float]:
        """Evaluates the model with `eval_step` over `data`.

        Args:
            data: A batched `tf.data.Dataset` or arrays `(x, y)`.
            steps: Steps to run; None means one pass over the data.
            callbacks: Keras callbacks (their `on_test_*` hooks run).
            batch_size: Batch size for array inputs (default 32).

        Returns:
            The logs of the last step as Python floats, e.g. ``{"loss": 0.3}``.
        """
        self._check_model_step("eval_step", "test_step")
        dataset = data_lib.as_dataset(data, argument="data", batch_size=batch_size)
        plan = data_lib.EpochPlan(dataset, steps, "data", "steps", make_iterator=self._make_iterator())
        strategy_checks.check_global_batch(dataset.element_spec, self.strategy, "data")
        self._build(dataset)
        callback_list = keras.callbacks.CallbackList(callbacks, model=self.model, steps=plan.steps)
        return self._run_evaluation(plan, callback_list)

    def _run_evaluation(self, plan: data_lib.EpochPlan, callback_list) -> dict[str, float]:
        self.reset_metrics()
        callback_list.on_test_begin()
        logs = training_run.run_pass(
            plan,
            self._loop("eval"),
            *hooks.batch_hooks(callback_list, "test"),
            steps_per_loop=self.options.steps_per_loop,
        )
        results = hooks.pythonify_logs(logs)
        callback_list.on_test_end(results)
        return results

    # ---------------------------------------------------------------- export

    def save(self, filepath: str, *, overwrite: bool = True) -> None:
        """Saves the model with its optimizer state to a `.keras` file (as `model.save`).

        Load it with `keras.models.load_model(filepath)` (pass `custom_objects`
        for subclassed models, or register them with
        `keras.saving.register_keras_serializable`). Optimizers kept in a
        Trainer subclass's own attributes are not in the file: use
        `model_dir` checkpoints to keep a full training state.

        Args:
            filepath: The file to write; must end in `.keras`.
            overwrite: Replace an existing file.

        Raises:
            ValueError: `filepath` does not end in `.keras`.
        """
        if not str(filepath).endswith(".keras"):
            raise ValueError(
                f"Invalid value for argument `filepath`. Received: filepath={filepath!r}. Expected a "
                "path ending in `.keras`; for a SavedModel for serving, use `trainer.export(path)`."
            )
        self.model.save(filepath, overwrite=overwrite)

    def export(self, filepath: str, **kwargs: Any) -> None:
        """Exports the model as a TensorFlow SavedModel for serving (as `model.export`).

        The SavedModel holds the forward pass only (no optimizer); load it
        with `tf.saved_model.load(filepath)` and call its `serve` endpoint.

        Args:
            filepath: The directory to write.
            **kwargs: Passed to `keras.Model.export` (e.g. `input_signature`).

        Raises:
            ValueError: the model is not built yet (train it, or call it on a batch, first).
        """
        if not self.model.built:
            raise ValueError(
                "Cannot export a model that is not built: its input shapes are unknown. Expected a "
                "built model: train it first, call it once on a batch, or `model.build(input_shape)`."
            )
        self.model.export(filepath, **kwargs)
