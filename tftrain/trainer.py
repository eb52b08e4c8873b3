"""`Trainer`: a lean custom training loop driven by Keras callbacks.

The Trainer runs a training step under the engine chosen by its options
(`tftrain.engine.step_loop`), drives a `keras.callbacks.CallbackList` exactly where
`model.fit` would, and times itself (`tftrain.timing`). The step is the
model's own `train_step` (so a `keras.Model` or `tftrain.CustomModel` trains
as under `model.fit`), or `Trainer.train_step` overridden in a subclass.
"""

from __future__ import annotations

import signal
from typing import Any

import keras
import tensorflow as tf

from tftrain import distribute, options, precision, timing
from tftrain.compat import keras_internals
from tftrain.data import fit_checks, inputs
from tftrain.engine import model_setup, step_loop, strategy_checks
from tftrain.engine.auto_steps import StepsPerCall
from tftrain.loops import epoch_loop, hooks, run_setup
from tftrain.loops.export import ExportMixin
from tftrain.loops.inference import InferenceMixin
from tftrain.options import check_int
from tftrain.services.periodic_validation import PeriodicValidation
from tftrain.services.step_summaries import InStepSummaries

_TRACKED_TYPES = (keras.optimizers.Optimizer, keras.Model, tf.Variable, keras.Variable, keras.metrics.Metric)
_UNTRACKED_NAMES = frozenset({"model", "_global_step"})  # saved by the checkpoint itself


class Trainer(InferenceMixin, ExportMixin):
    """Trains a `keras.Model` with a custom loop: fast, measured, Keras-callback driven.

    Two styles share this loop:

    * Keras style: the model's own `train_step`/`test_step` run (any
      `keras.Model`, or a `tftrain.CustomModel` with overridden pieces).
    * Custom-loop style: subclass `Trainer` and override `train_step(batch)`
      and `eval_step(batch)`, using `self.model` and `self.optimizer`; each
      returns a dict of logs.

    `fit`, `evaluate` and `predict` take the arguments and inputs of
    `keras.Model.fit`/`evaluate`/`predict` and call Keras callbacks exactly
    as they do (docs/trainer.md lists the few deliberate differences), so
    `model.fit(x, y, ...)` becomes `Trainer(model).fit(x, y, ...)`.

    Example:
        ```python
        trainer = tftrain.Trainer(model, "adam", "sparse_categorical_crossentropy",
                                  metrics=["accuracy"], steps_per_loop=20)
        history = trainer.fit(x_train, y_train, epochs=3, validation_split=0.1)
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
            `"auto"` (the default): k is chosen from the measured time of
            the first calls, so that a call's fixed overhead is at most 2%
            of it (up to 200 steps, calls of at most 0.5 s); while a
            callback implements batch hooks (other than Keras's progress bar
            and History), each call runs one step, as under `model.fit`.
            Without `tf.function`, or under several worker processes,
            "auto" is one step per call.
        strategy: The `tf.distribute.Strategy` to run under; None means the
            model's (`model.distribute_strategy`: the one whose scope built
            it, else the current one), as `model.fit` decides. An optimizer
            instance created outside the strategy's scope that holds no state
            yet is recreated in it (`trainer.optimizer` is the one that trains).
        measure_timing: Time every host call (when its results are read:
            at once for one-step calls, one call late for k-step calls) and
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
        preemption_signals: With `model_dir`: signals (numbers or names) on
            which `fit` finishes the host call in flight, saves a checkpoint
            at that step and raises `tftrain.PreemptedError`; rerunning
            resumes exactly there. Under several workers, a signal reaching
            any worker stops them all at one agreed step (one host call
            later), each saving (see docs/distribution.md). `()` keeps the
            process's default handlers (SIGTERM then kills it). Installed
            only while `fit` runs.
        best_checkpoint_monitor: With `model_dir`: also keep the checkpoint of
            the best epoch by this log (e.g. `"val_loss"`) in `model_dir/best`,
            apart from the rotating ones (load it with
            `tftrain.checkpoint.restore_model`).
        best_checkpoint_mode: `"min"`, `"max"` or `"auto"` (max for
            accuracy-like names).
        resume_from: With `model_dir`: a checkpoint (path prefix such as
            `"run1/checkpoints/ckpt-3000"`, or a directory: its latest) to
            continue from when `model_dir` holds no checkpoint yet: weights,
            optimizer, global step, epoch and data position, validated as a
            resume is. Once `model_dir` has checkpoints of its own, they win,
            so rerunning the command resumes the new run.
        async_checkpoint: With `model_dir`: write checkpoints in a background
            thread (TensorFlow's asynchronous checkpointing): a save copies the
            state to host memory and training goes on while the files are
            written. A checkpoint becomes the latest only once complete, so a
            crash mid-write resumes from the one before; the next save, the
            end of `fit` and a preemption wait for a pending write, and its
            error (e.g. a full disk) is raised there. Costs a host copy of the
            saved state. See docs/checkpoints.md.
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
        steps_per_loop: int | str = "auto",
        strategy: tf.distribute.Strategy | None = None,
        measure_timing: bool = True,
        model_dir: str | None = None,
        checkpoint_every_steps: int | None = None,
        max_to_keep: int = 5,
        summary_every_steps: int | None = None,
        profile_steps: tuple[int, int] | None = None,
        terminate_on_nan: bool = True,
        mixed_precision: str | None = None,
        preemption_signals: Any = (signal.SIGTERM,),
        best_checkpoint_monitor: str | None = None,
        best_checkpoint_mode: str = "auto",
        resume_from: str | None = None,
        async_checkpoint: bool = False,
    ):
        if not isinstance(model, keras.Model):
            raise TypeError(
                "Invalid value for argument `model`. Received: an object of type "
                f"{type(model).__name__}. Expected a keras.Model (Sequential, functional, "
                "a subclass, or a tftrain.CustomModel)."
            )
        self.options = options.EngineOptions(
            use_tf_function=use_tf_function,
            jit_compile=jit_compile,
            steps_per_loop=steps_per_loop,
        )
        self.strategy = strategy or model.distribute_strategy
        self.model = model
        self.measure_timing = bool(measure_timing)
        self.run_options = options.RunOptions(
            model_dir=model_dir,
            checkpoint_every_steps=checkpoint_every_steps,
            max_to_keep=max_to_keep,
            summary_every_steps=summary_every_steps,
            profile_steps=profile_steps,
            terminate_on_nan=terminate_on_nan,
            preemption_signals=preemption_signals,
            best_checkpoint_monitor=best_checkpoint_monitor,
            best_checkpoint_mode=best_checkpoint_mode,
            resume_from=resume_from,
            async_checkpoint=async_checkpoint,
        )
        self.model_dir = self.run_options.model_dir
        strategy_checks.check_model_in_scope(model, self.strategy)
        self.mixed_precision = precision.check_policy(mixed_precision)
        with self.strategy.scope():  # a LossScaleOptimizer creates variables
            precision.apply_policy(model, self.mixed_precision)
            if optimizer is not None or loss is not None or metrics is not None:
                optimizer = strategy_checks.adopt_optimizer(optimizer, self.strategy)
                model.compile(optimizer=optimizer, loss=loss, metrics=metrics)
            elif getattr(model, "optimizer", None) is not None:
                model.optimizer = strategy_checks.adopt_optimizer(model.optimizer, self.strategy)
            precision.wrap_model_optimizer(model, self.mixed_precision)
        with self.strategy.scope():
            self._global_step = tf.Variable(
                0,
                dtype=tf.int64,
                trainable=False,
                name="global_step",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
        self._in_step_summaries: InStepSummaries | None = None
        self._auto_steps: dict[str, StepsPerCall] = {}
        self.timing: timing.TimingReport | None = None
        self._loops: dict[str, step_loop.StepLoop] = {}

    @property
    def global_step(self) -> tf.Variable:
        """The global step: training steps done in the current (or last) `fit`, resumes included.

        One int64 variable, incremented in the graph before each training
        step (so a `tf.summary` call inside step k writes at step k), saved
        with every checkpoint and restored on resume. A fit without a
        checkpoint to resume starts it at 0.
        """
        return self._global_step

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

    def __setattr__(self, name: str, value: Any) -> None:
        # Keras objects a subclass assigns as attributes are its training state
        # (a GAN's second optimizer, its own metrics): tracked here, as Keras
        # tracks a layer's attributes, so `checkpoint_state` and `metrics` need
        # no scan of the instance's attributes.
        tracked = self.__dict__.setdefault("_tracked", {})
        tracked.pop(name, None)
        if name not in _UNTRACKED_NAMES and isinstance(value, _TRACKED_TYPES):
            tracked[name] = value
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        self.__dict__.get("_tracked", {}).pop(name, None)
        super().__delattr__(name)

    @property
    def metrics(self) -> list[keras.metrics.Metric]:
        """The model's metrics plus the `keras.metrics.Metric` attributes of the trainer."""
        own = [value for value in self._tracked.values() if isinstance(value, keras.metrics.Metric)]
        return list(self.model.metrics) + own

    def checkpoint_state(self) -> dict[str, Any]:
        """The training state kept besides the model and its optimizer, saved with every checkpoint.

        By default: each Keras optimizer, model and variable assigned as an
        attribute of the Trainer (e.g. a GAN's second optimizer), as
        `owner_<name>`, and the variables of its Keras metric attributes, as
        `owner_metrics`. Override to declare the state yourself (return a
        dict of name -> trackable); the model and `model.optimizer` are
        always saved.

        Returns:
            Name -> trackable (`tf.train.Checkpoint` keyword arguments).
        """
        state: dict[str, Any] = {}
        metric_variables = []
        for name, value in sorted(self._tracked.items()):
            if isinstance(value, keras.metrics.Metric):
                metric_variables += list(value.variables)
            elif value is not self.model:
                state[f"owner_{name}"] = value
        if metric_variables:
            state["owner_metrics"] = metric_variables
        return state

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

    def predict_step(self, batch: Any) -> Any:
        """One prediction step; returns the batch's predictions. By default the model's own `predict_step(batch)`."""
        return self.model.predict_step(batch)

    def _overrides(self, name: str) -> bool:
        return getattr(type(self), name) is not getattr(Trainer, name)

    def _check_model_step(self, trainer_step: str, model_step: str) -> None:
        """Before any step runs: the default steps need a compiled model (and optimizer)."""
        if not self._overrides(trainer_step):
            model_setup.check_compiled_for(self.model, model_step, trainer_step)

    def _check_data(self, dataset: tf.data.Dataset, argument: str, step: str) -> None:
        """Data checks before any step: batched, targets where the loss needs them, an even global batch."""
        model_step = {"train_step": "train_step", "eval_step": "test_step"}[step]
        default = not self._overrides(step) and model_setup.uses_default_step(self.model, model_step)
        model_setup.check_data(self.model, dataset, argument, self.strategy, default_step=default)

    def _build(self, dataset: tf.data.Dataset) -> None:
        """Creates the model's, metrics' and optimizer's variables before the first trace."""
        default = not self._overrides("train_step") and model_setup.uses_default_step(
            self.model, "train_step"
        )
        model_setup.build_variables(self.model, dataset, self.strategy, default_train_step=default)

    def _loop(self, kind: str) -> step_loop.StepLoop:
        """The engine of `kind` ("train", "eval" or "predict"), built once."""
        if kind not in self._loops:
            step, name = {
                "train": (self.train_step, "train_step"),
                "eval": (self.eval_step, "eval_step"),
                "predict": (self.predict_step, "predict_step"),
            }[kind]
            self._loops[kind] = step_loop.make_loop(
                step,
                self.options,
                self.strategy,
                name,
                stop_on_nonfinite=kind == "train" and self.run_options.terminate_on_nan,
                collect=kind == "predict",
                step_counter=self._global_step if kind == "train" else None,
            )
        return self._loops[kind]

    def _make_iterator(self):
        """How a dataset becomes an iterator: plain, or distributed under a strategy."""
        if self.strategy is tf.distribute.get_strategy() and not tf.distribute.has_strategy():
            return iter
        return lambda ds: iter(self.strategy.experimental_distribute_dataset(ds))

    def _validate_mid_epoch(self, plan: inputs.EpochPlan, callback_list: Any) -> dict[str, Any]:
        """Validates without losing the epoch's training metrics (an evaluation resets every metric)."""
        saved = [(variable, variable.numpy()) for metric in self.metrics for variable in metric.variables]
        with tf.summary.record_if(False):  # the writer in fit is the training step's
            logs = self._run_evaluation(plan, callback_list)
        for variable, value in saved:
            variable.assign(value)
        return logs

    def _final_logs(self, logs: Any, step: str) -> dict[str, Any]:
        """A pass's logs as fit reports them: the model's metric results where they match the step's logs.

        A Trainer subclass's own step reports what it returns: the model's
        compiled metrics are not its metrics.
        """
        if self._overrides(step):
            return dict(logs or {})
        return dict(keras_internals.metrics_result_or_logs(self.model, logs or {}))

    @property
    def chosen_steps_per_loop(self) -> int | None:
        """The training steps per host call that `steps_per_loop="auto"` chose (None before it chose, or without "auto")."""
        chooser = self._auto_steps.get("train")
        return chooser.chosen if chooser is not None else None

    def _steps_per_call(self, kind: str, callback_list: Any) -> int | StepsPerCall:
        """Steps per host call in a pass of `kind` ("train", "eval", "predict").

        With `steps_per_loop="auto"`: the Trainer's chooser for `kind` (what
        it learned is kept across calls), or 1 while a callback implements
        that kind's batch hooks (it may count on one call per step), and 1
        under several workers (each would measure its own times, and every
        worker must run the same steps per call).
        """
        if not self.options.auto:
            return self.options.fixed_steps
        if distribute.num_workers(self.strategy) > 1:
            return 1
        hook_kind = {"train": "train", "eval": "test", "predict": "predict"}[kind]
        if hooks.relies_on_batch_hooks(callback_list, hook_kind):
            return 1
        return self._auto_steps.setdefault(kind, StepsPerCall("auto"))

    def _step_summaries_for(self, chief: bool) -> InStepSummaries | None:
        """The writer and cadence of `tf.summary` calls in the training step: the chief's, with `model_dir`.

        Made once: a traced step keeps the writer and condition it was traced
        with. None under XLA: it cannot compile summary ops (on CPU and GPU),
        so the step's summaries are not recorded there.
        """
        if self.model_dir is None or not chief or self.options.jit_compile:
            return None
        if self._in_step_summaries is None:
            self._in_step_summaries = InStepSummaries(
                self.model_dir, self._global_step, self.run_options.summary_every_steps
            )
        return self._in_step_summaries

    def _plan(self, data: inputs.AdaptedInput) -> inputs.EpochPlan:
        return inputs.EpochPlan(data, make_iterator=self._make_iterator())

    # ------------------------------------------------------------------- fit

    def fit(
        self,
        x: Any = None,
        y: Any = None,
        batch_size: int | None = None,
        epochs: int = 1,
        verbose: int | str = "auto",
        callbacks: list[keras.callbacks.Callback] | None = None,
        validation_split: float = 0.0,
        validation_data: Any = None,
        shuffle: bool | str = True,
        class_weight: dict[int, float] | None = None,
        sample_weight: Any = None,
        initial_epoch: int = 0,
        steps_per_epoch: int | None = None,
        validation_steps: int | None = None,
        validation_batch_size: int | None = None,
        validation_freq: int | list[int] = 1,
        *,
        total_steps: int | None = None,
        validation_every_steps: int | None = None,
    ) -> keras.callbacks.History:
        """Trains the model, as `keras.Model.fit` does.

        Same arguments, defaults and meanings as Keras 3's `fit`; the inputs
        go through Keras's own adapters. Beyond `fit`: with `model_dir`, a
        rerun resumes exactly where a killed run stopped.

        Args:
            x: Inputs: NumPy arrays or tensors (alone, or in a list, tuple or
                dict; ragged and sparse too), a batched `tf.data.Dataset` of
                `(x, y)` / `(x, y, sample_weight)`, a `keras.utils.PyDataset`
                or a Python generator of such batches.
            y: Targets, for array inputs only.
            batch_size: Batch size for array inputs (default 32).
            epochs: Index of the last epoch (trains `epochs - initial_epoch` epochs).
            verbose: "auto" or 1: a progress bar per epoch; 2: one line per
                epoch (both print the timing summary at the end); 0: silent.
            callbacks: Keras callbacks.
            validation_split: Fraction of array inputs (the last examples,
                before shuffling) held out for validation.
            validation_data: Data to validate on after epochs: `(x_val, y_val)`,
                `(x_val, y_val, sample_weight_val)`, or a dataset/PyDataset/generator.
            shuffle: Shuffle array inputs each epoch (`"batch"`: in batch-sized chunks).
            class_weight: Class index -> loss weight (single-output models).
            sample_weight: Per-example loss weights, for array inputs only.
            initial_epoch: Epoch to start at (to continue an earlier run). A
                `model_dir` checkpoint, when one is restored, decides instead.
            steps_per_epoch: Steps per epoch; None means one pass over the
                data. Required for data that never ends.
            validation_steps: Steps per validation; None means one pass.
            validation_batch_size: Batch size for array validation data
                (default: `batch_size`).
            validation_freq: Validate every this many epochs, or after the
                (1-based) epochs in a list.
            total_steps: (tftrain) A step budget: train until this many
                steps in all, the last epoch cut short; `epochs` follows
                from it (data that never ends, without `steps_per_epoch`,
                makes one epoch). A rerun on the same `model_dir` finishes
                the budget exactly.
            validation_every_steps: (tftrain) Also validate every this many
                global steps, mid-epoch included (the training metrics of
                the epoch are kept). Each such validation runs the `on_test_*`
                hooks, is recorded in `history.step_history` (`"step"` and
                `"val_<name>"` lists) and written to TensorBoard at its step
                (`step_*` in the validation run). `validation_freq=[]` turns
                the per-epoch validation off.

        Returns:
            The `keras.callbacks.History` (also `self.model.history`).

        Raises:
            TypeError, ValueError: bad arguments or inputs, raised before any step runs.
            NonFiniteLossError: a loss became NaN or infinite (with `terminate_on_nan`).
        """
        check_int("epochs", epochs, 0)
        check_int("initial_epoch", initial_epoch, 0)
        options.check_verbose(verbose)
        validation_split = options.check_validation_split(validation_split)
        validation_freq = options.check_validation_freq(validation_freq)
        epochs = inputs.keras_epoch_limit(epochs)
        self._check_model_step("train_step", "train_step")
        fit_checks.check_resume_sources(callbacks, self.model_dir)
        if validation_split and validation_data is None:
            (x, y, sample_weight), validation_data = inputs.split_validation(
                x, y, sample_weight, validation_split
            )
        train = inputs.adapt(
            x,
            y,
            sample_weight,
            batch_size=batch_size,
            steps=steps_per_epoch,
            shuffle=shuffle,
            class_weight=class_weight,
        )
        if check_int("total_steps", total_steps, optional=True) is not None:
            train, epochs = fit_checks.step_budget_epochs(train, total_steps, epochs)
        plan = self._plan(train)
        fit_checks.check_single_pass(
            plan,
            epochs - initial_epoch,
            "x",
            "steps_per_epoch",
            f"epochs={epochs}, initial_epoch={initial_epoch}",
        )
        self._check_data(plan.dataset, "x", "train_step")
        val_plan = None
        if validation_data is not None:
            self._check_model_step("eval_step", "test_step")
            val_x, val_y, val_sample_weight = keras.utils.unpack_x_y_sample_weight(validation_data)
            val_plan = self._plan(
                inputs.adapt(
                    val_x,
                    val_y,
                    val_sample_weight,
                    batch_size=validation_batch_size
                    or (batch_size if inputs.input_kind(val_x) == "arrays" else None),
                    steps=validation_steps,
                    argument="validation_data",
                    steps_argument="validation_steps",
                )
            )
            validations = sum(
                fit_checks.should_validate(epoch, validation_freq) for epoch in range(initial_epoch, epochs)
            )
            fit_checks.check_single_pass(
                val_plan, validations, "validation_data", "validation_steps", f"{validations} validations"
            )
            self._check_data(val_plan.dataset, "validation_data", "eval_step")
        if check_int("validation_every_steps", validation_every_steps, optional=True) and val_plan is None:
            raise ValueError(
                f"Invalid combination of arguments. Received: validation_every_steps={validation_every_steps!r} "
                "with no validation data. Expected `validation_data=` or `validation_split=`."
            )
        plan.reset()  # as Keras's fit resets its epoch iterator (a PyDataset's on_epoch_end runs)
        self._build(plan.dataset)
        train_loop = self._loop("train")
        timer = timing.StepTimer()
        callback_list = keras.callbacks.CallbackList(
            callbacks,
            add_history=True,
            add_progbar=verbose != 0,
            verbose=verbose,
            epochs=epochs,
            steps=plan.steps,
            model=self.model,
        )
        self.model.history.step_history = step_history = {}
        extra_services = []
        if validation_every_steps is not None:
            extra_services.append(
                PeriodicValidation(
                    validation_every_steps,
                    lambda: self._validate_mid_epoch(val_plan, callback_list),
                    step_history,
                )
            )
        worker = distribute.worker_role(self.strategy)
        run = run_setup.start_run(
            self.run_options,
            model=self.model,
            extra_state=self.checkpoint_state,
            plan=plan,
            epochs=epochs,
            timer=timer if self.measure_timing else None,
            trace_counter=train_loop.trace_counter,
            verbose=options.check_verbose(verbose),
            strategy=self.strategy,
            total_steps=total_steps,
            extra_services=tuple(extra_services),
            global_step=self._global_step,
            in_step_summaries=lambda: self._step_summaries_for(worker[0]),
        )
        self.model.stop_training = False
        training_logs = None
        try:
            callback_list.on_train_begin()
            if not run.resumed:  # where to start, as fit reads it after on_train_begin (BackupAndRestore)
                run.progress.epoch = keras_internals.initial_epoch(self.model) or initial_epoch
            for epoch in range(run.progress.epoch, epochs):
                if run.progress.step_in_epoch == 0:  # else: resumed mid-epoch, metrics restored
                    self.reset_metrics()
                callback_list.on_epoch_begin(epoch)
                logs = epoch_loop.run_pass(
                    plan,
                    train_loop,
                    *hooks.batch_hooks(callback_list, "train"),
                    steps_per_loop=self._steps_per_call("train", callback_list),
                    timer=timer if self.measure_timing else None,
                    run=run,
                    should_stop=lambda: self.model.stop_training,
                )
                epoch_logs = self._final_logs(logs, "train_step")
                if val_plan is not None and fit_checks.should_validate(epoch, validation_freq):
                    with tf.summary.record_if(False):  # the writer in fit is the training step's
                        val_logs = self._run_evaluation(val_plan, callback_list)
                    epoch_logs.update({f"val_{key}": value for key, value in val_logs.items()})
                callback_list.on_epoch_end(epoch, epoch_logs)
                training_logs = epoch_logs
                run.end_epoch(keras_internals.pythonify_logs(epoch_logs))
                if self.model.stop_training or run.finished:
                    break
            optimizer = getattr(self.model, "optimizer", None)
            if isinstance(optimizer, keras.optimizers.Optimizer) and epochs > 0:
                optimizer.finalize_variable_values(self.model.trainable_weights)  # e.g. EMA weights
            callback_list.on_train_end(logs=training_logs)
        finally:
            run.close()
            plan.close()
            if val_plan is not None:
                val_plan.close()
        self.timing = timer.report(run.trace_count())
        if verbose != 0 and self.measure_timing:
            print(f"tftrain timing ({self.options.name}):\n{self.timing.summary()}")
        return self.model.history
