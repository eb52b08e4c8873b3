"""`Trainer`: the facade that wires options, engines, services and loops; a drop-in for `model.fit`.

A `fit` call reads top-down: `Trainer.fit` checks its arguments and adapts
its inputs, `tftrain.loops.fit_loop.run_fit` runs the call to its target,
`tftrain.loops.epoch_loop.run_pass` runs each epoch's host calls, and
`tftrain.engine.step_runner.StepRunner` runs the steps of one call. The step is
the model's own `train_step` (so a `keras.Model` or `tftrain.CustomModel`
trains as under `model.fit`), or `Trainer.train_step` overridden in a subclass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import signal
from collections.abc import Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from tftrain import ema, evaluation, precision, timing
from tftrain.arguments import check_jit_compile
from tftrain.compat import keras_internals, tf_internals
from tftrain.engine import model_setup
from tftrain.loops import dry_run, fit_loop, inference, lr_sweep, preparation, run_setup
from tftrain.loops.owner import TrackedAttributes
from tftrain.loops.trainer_engines import Engines
from tftrain.options import EngineOptions, NonFinitePolicy, RunOptions, check_engine_options
from tftrain.services.loss_recovery import keep_every_steps_for
from tftrain.services.protocol import Service, check_services

# The Trainer's options that neither the engines, the run nor the non-finite policy hold (checked apart).
_OPTIONS_OF_THEIR_OWN = ("ema_decay", "mixed_precision", "measure_timing")


def _option_objects(
    *, use_tf_function: Any, jit_compile: Any, steps_per_loop: Any, **options: Any
) -> tuple[EngineOptions, RunOptions, NonFinitePolicy]:
    """The Trainer's options as their frozen objects, every check run: how steps run, what a fit writes, what a blow-up does.

    Args:
        use_tf_function, jit_compile, steps_per_loop: The engine's options
            (`jit_compile` resolved to a bool).
        **options: The fields of `RunOptions` and `NonFinitePolicy`, by name
            (`_OPTIONS_OF_THEIR_OWN` are dropped).

    Raises:
        TypeError, ValueError: what `Trainer(...)` raises for these values.
    """
    for name in _OPTIONS_OF_THEIR_OWN:
        options.pop(name)
    engine = EngineOptions(use_tf_function=use_tf_function, jit_compile=jit_compile, steps_per_loop=steps_per_loop)
    run_fields = {field.name for field in dataclasses.fields(RunOptions)}
    run = RunOptions(**{name: value for name, value in options.items() if name in run_fields})
    check_engine_options(run, engine)
    nonfinite_policy = NonFinitePolicy(
        **{name: value for name, value in options.items() if name not in run_fields},
        keep_every_steps=keep_every_steps_for(engine),
    )
    nonfinite_policy.check(model_dir=run.model_dir)
    return engine, run, nonfinite_policy


def check_options(**options: Any) -> None:
    """Runs the `Trainer`'s checks of its options on these values, with no model: what `Trainer(model, **options)` raises.

    For programs that take the options from elsewhere (`tftrain.flags`): a
    bad value fails with the Trainer's own message before a model is built.
    `jit_compile="auto"` is checked as a valid value (it is resolved against
    the model when the Trainer is made).

    Args:
        **options: `Trainer` keyword arguments, but `strategy`, `services`
            and `hparams`; omitted ones take their defaults.

    Raises:
        TypeError, ValueError: a bad value or combination, as `Trainer(...)` raises it.
    """
    parameters = inspect.signature(Trainer.__init__).parameters
    values = {name: parameter.default for name, parameter in parameters.items() if name in OPTION_NAMES}
    unknown = sorted(set(options) - set(values))
    if unknown:
        raise TypeError(
            f"Invalid arguments {unknown}. Expected options of `tftrain.Trainer`: {sorted(values)}."
        )
    values.update(options)
    ema.check_decay(values["ema_decay"])
    precision.check_policy(values["mixed_precision"])
    _option_objects(**{**values, "jit_compile": check_jit_compile(values["jit_compile"]) is True})


class Trainer:
    """Trains a `keras.Model` with a custom loop: fast, measured, Keras-callback driven.

    Two styles share this loop. Keras style: the model's own `train_step` /
    `test_step` run (any `keras.Model`, or a `tftrain.CustomModel`). Custom-loop
    style: subclass `Trainer` and override `train_step(batch)` and
    `eval_step(batch)`, using `self.model` and `self.optimizer`; each returns a
    dict of logs. `fit`, `evaluate` and `predict` take the arguments and inputs
    of `keras.Model.fit`/`evaluate`/`predict` and call Keras callbacks exactly
    as they do (docs/trainer.md lists the few deliberate differences).

    Example:
        ```python
        trainer = tftrain.Trainer(model, "adam", "sparse_categorical_crossentropy",
                                  metrics=["accuracy"], steps_per_loop=20)
        history = trainer.fit(x_train, y_train, epochs=3, validation_split=0.1)
        print(trainer.timing.summary())
        ```

    Args:
        model: Any `keras.Model`.
        optimizer: As in `keras.Model.compile`. If any of `optimizer`, `loss`,
            `metrics` is given, the model is compiled with them; otherwise it
            is used as compiled (or uncompiled, if its `train_step` needs no `compile`).
        loss: As in `compile`.
        metrics: As in `compile`.
        use_tf_function: Run steps in `tf.function` (True) or eagerly (False).
        jit_compile: Compile steps with XLA (True), or not (False, the
            default); `"auto"` resolves as `model.compile(jit_compile="auto")`
            does for this model: XLA only with a GPU or TPU, no strategy, and
            layers that all support it (see
            `tftrain.engine.model_setup.resolve_jit_compile`). The resolved
            value is `trainer.options.jit_compile`.
        steps_per_loop: Training steps per host call, or `"auto"` (chosen from
            measured call times). See `tftrain.options.EngineOptions`.
        strategy: The `tf.distribute.Strategy` to run under; None means the
            model's (`model.distribute_strategy`), as `model.fit` decides. An
            optimizer created outside its scope that holds no state yet is
            recreated in it.
        measure_timing: Time every host call and build `trainer.timing`
            (`trainer.timing.engine`, filled either way, names the engine
            that ran, every `"auto"` resolved: e.g. `"xla+loop4"`).
        count_flops: Count one training step's FLOPs on its traced graph after
            each `fit` (nothing retraced, nothing changed while training;
            needs `use_tf_function=True`):
            `trainer.timing` reports `flops_per_step`, `flops_per_sec` and the
            `utilization` where the devices' peak is known (docs/beyond_fit.md).
        peak_flops: With `count_flops`: the peak FLOP/s of all the devices the
            run uses; None looks it up (`tftrain.engine.peak_flops`).
        mixed_precision: `"mixed_float16"`, `"mixed_bfloat16"` or `"float32"`:
            the Keras dtype policy of the model's layers (float16 also wraps
            the optimizer in a `LossScaleOptimizer`); None: as built.
        model_dir: Checkpoints and TensorBoard files; `fit` on a `model_dir`
            with a checkpoint resumes it and trains up to the same target.
        checkpoint_every_steps: Also save every this many steps.
        max_to_keep: Checkpoints kept in `model_dir`.
        summary_every_steps: Also write training summaries every this many steps.
        profile_steps: `(start, stop)`: profile these training steps.
        terminate_on_nan: Stop at the first step whose loss is NaN or infinite;
            a `fit` whose callbacks hold Keras's `TerminateOnNaN` leaves it to
            that callback (no checkpoint then holds a non-finite step).
        preemption_signals: Signals on which `fit` saves and stops.
        best_checkpoint_monitor: Also keep the best epoch's checkpoint by this log.
        best_checkpoint_mode: `"min"`, `"max"` or `"auto"`.
        resume_from: A checkpoint to start from while `model_dir` has none.
        async_checkpoint: Write checkpoints in a background thread.
            Each of `model_dir` to here is a field of
            `tftrain.options.RunOptions`, which says exactly what it does.
        on_nonfinite: What a loss blow-up (NaN, infinity, or above
            `loss_spike_threshold`) does: `"stop"` raises `NonFiniteLossError`
            (the NaN guard); `"rollback"` restores the newest good training
            state kept (in memory, every `steps_per_loop` steps; needs
            `model_dir`) and goes on past the batches that caused it
            (docs/beyond_fit.md).
        loss_spike_threshold: A loss log above this is a blow-up too.
        max_rollbacks: With `"rollback"`: rollbacks allowed in a run, then
            `NonFiniteLossError`.
        rollback_lr_factor: With `"rollback"`: multiply the learning rate by
            this after each rollback. Each of `on_nonfinite` to here is a
            field of `tftrain.options.NonFinitePolicy`.
        ema_decay: Keep an exponential moving average of the weights (the
            optimizer's `use_ema`, with this momentum, e.g. 0.999) and use it
            for validation, `evaluate`, `predict`, the best checkpoint and
            `export`, while training goes on with the raw weights (which the
            model holds outside those; `averaged_weights()` swaps them in).
            Checkpoints hold both. None: no average (docs/beyond_fit.md).
        on_data_change: With `model_dir`: `"refuse"` (a resume whose data
            changed mid-epoch where its position cannot follow raises
            `RunChangedError`) or `"next_epoch"` (it starts the next epoch on
            the new data); see `tftrain.options.RunOptions` and
            docs/checkpoints.md ("Changing something between runs").
        hparams: With `model_dir`: values of your own to record with the
            run, by name (bool, int, float, str or None), e.g. a program's
            flags (`tftrain.flags.trainer_kwargs` passes them): kept in the
            run record and shown in TensorBoard's HParams tab, beside what
            tftrain records itself (docs/tensorboard.md).
        slurm_requeue: In a SLURM job, requeue it after a preemption's checkpoint (SIGUSR1 counts too); see
            `tftrain.options.RunOptions` and docs/distribution.md.
        services: Services of your own (`tftrain.services.Service`), run
            around every `fit`'s steps with the built-in ones (after the NaN
            guard, before the summaries and checkpoints); their state is
            saved with each checkpoint under their `name`. One service
            alone is taken as a list of one.

    Raises:
        TypeError: `model` is not a `keras.Model`, or an option has the wrong type.
        ValueError: an option has a bad value, cannot act with the others
            given (e.g. `rollback_lr_factor` with `on_nonfinite="stop"`,
            `count_flops` with `use_tf_function=False`, `max_to_keep` without
            `model_dir`), or `model_dir` is a file or not writable.
    """

    def __init__(
        self,
        model: keras.Model,
        optimizer: Any = None,
        loss: Any = None,
        metrics: Any = None,
        *,
        use_tf_function: bool = True,
        jit_compile: bool | str = False,
        steps_per_loop: int | str = "auto",
        strategy: tf.distribute.Strategy | None = None,
        measure_timing: bool = True,
        count_flops: bool = False,
        peak_flops: float | None = None,
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
        services: Sequence[Service] = (),
        on_nonfinite: str = "stop",
        loss_spike_threshold: float | None = None,
        max_rollbacks: int = 3,
        rollback_lr_factor: float = 1.0,
        ema_decay: float | None = None,
        on_data_change: str = "refuse",
        hparams: Mapping[str, bool | int | float | str | None] | None = None,
        slurm_requeue: bool = False,
    ):
        options = {name: value for name, value in locals().items() if name in OPTION_NAMES or name == "hparams"}
        if not isinstance(model, keras.Model):
            raise TypeError(
                "Invalid value for argument `model`. Received: an object of type "
                f"{type(model).__name__}. Expected a keras.Model (Sequential, functional, "
                "a subclass, or a tftrain.CustomModel)."
            )
        self.strategy = strategy or model.distribute_strategy
        jit_compile = model_setup.resolve_jit_compile(
            jit_compile, model, self.strategy, use_tf_function=use_tf_function
        )
        self.options, self.run_options, self.nonfinite_policy = _option_objects(**{**options, "jit_compile": jit_compile})
        self.services = check_services(services, reserved=run_setup.BUILT_IN_NAMES)
        self.model, self.model_dir = model, self.run_options.model_dir
        self.measure_timing = bool(measure_timing)
        self.ema_decay = ema.check_decay(ema_decay)
        self.mixed_precision = precision.check_policy(mixed_precision)
        in_scope = model_setup.prepare_model(
            model,
            self.strategy,
            optimizer=optimizer,
            loss=loss,
            metrics=metrics,
            mixed_precision=self.mixed_precision,
        )
        if self.ema_decay is not None:
            ema.enable(self.optimizer, self.ema_decay)
        with self.strategy.scope():
            self._global_step = tf.Variable(
                0, dtype=tf.int64, trainable=False, name="global_step",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )  # fmt: skip
        self.engines = Engines(
            self._engine_step,
            self.options,
            self.strategy,
            self._global_step,
            nonfinite_policy=self.nonfinite_policy,
            in_scope=in_scope,  # the variables `prepare_model` checked
            model=self.model,  # its step functions reset: `compile`, a callback (`Timing`)
        )
        self.timing: timing.TimingReport | None = None

    @property
    def global_step(self) -> tf.Variable:
        """Training steps done in the current (or last) `fit`, resumes included: one int64 variable.

        Incremented in the graph before each training step (a `tf.summary`
        call inside step k writes at step k), saved with every checkpoint and
        restored on resume; a fit with nothing to resume starts it at 0.
        """
        return self._global_step

    @property
    def chosen_steps_per_loop(self) -> int | None:
        """The training steps per host call that `steps_per_loop="auto"` chose (None before it chose, or without "auto")."""
        return self.engines.chosen_steps_per_loop

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
        # Keras objects a subclass assigns are its training state (`TrackedAttributes`).
        self.__dict__.setdefault("_tracked", TrackedAttributes()).assigned(name, value)
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        self.__dict__.setdefault("_tracked", TrackedAttributes()).deleted(name)
        super().__delattr__(name)

    @property
    def metrics(self) -> list[keras.metrics.Metric]:
        """The model's metrics plus the `keras.metrics.Metric` attributes of the trainer."""
        return list(self.model.metrics) + self._tracked.metrics()

    def checkpoint_state(self) -> dict[str, Any]:
        """The training state saved with every checkpoint besides the model and its optimizer.

        By default: each Keras optimizer, model and variable assigned as an
        attribute of the Trainer, as `owner_<name>`, and the variables of its
        metric attributes, as `owner_metrics`. Override to declare the state
        yourself (name -> trackable, as `tf.train.Checkpoint` keyword arguments).
        """
        return self._tracked.checkpoint_state(self.model)

    def averaged_weights(self) -> contextlib.AbstractContextManager[None]:
        """A block in which the model holds the weights evaluation uses; the raw weights come back after it, exactly.

        With `ema_decay`: the optimizer's moving averages (none before the
        first training step); without: the weights as they are.

        Example:
            ```python
            with trainer.averaged_weights():
                trainer.model.save_weights("averaged.weights.h5")
            ```
        """
        if self.ema_decay is None:
            return contextlib.nullcontext()
        return ema.averaged_weights(self.model)

    def reset_metrics(self) -> None:
        """Resets every metric in `self.metrics` (done at each epoch start)."""
        for metric in self.metrics:
            metric.reset_state()

    def train_step(self, batch: Any) -> dict[str, Any]:
        """One training step; by default the model's own `train_step(batch)`. Override for the custom-loop style."""
        return self.model.train_step(batch)

    def eval_step(self, batch: Any) -> dict[str, Any]:
        """One evaluation step. By default the model's own `test_step(batch)`."""
        return self.model.test_step(batch)

    def predict_step(self, batch: Any) -> Any:
        """One prediction step; returns the batch's predictions. By default the model's own `predict_step(batch)`."""
        return self.model.predict_step(batch)

    def _engine_step(self, kind: str) -> tuple[Any, bool]:
        """The step an engine of `kind` runs, and whether `make_runner` converts it with AutoGraph.

        A Trainer subclass's own step is user code: converted. The default
        step calls the model's own, looked up when the step traces (as
        Keras's `make_train_function` looks it up, after the callbacks are
        set: `tftrain.callbacks.Timing` wraps it then). The model's step is
        converted when it traces if it runs the user's code
        (`model_setup.model_step_is_user_code`: an override of Keras's step,
        or a `CustomModel` piece). Keras's own step and an unchanged
        `CustomModel`'s are not. (`model.fit` converts none of them: a
        model's `train_step` with `if tensor:` fails there and runs here.)
        """
        if not self.uses_model_step(kind):
            return getattr(self, f"{kind}_step"), True
        name = model_setup.MODEL_STEPS[kind]
        convert = self.options.use_tf_function and model_setup.model_step_is_user_code(self.model, name)

        def model_step(batch: Any) -> Any:
            step = getattr(self.model, name)
            if convert and not tf.executing_eagerly():  # AutoGraph caches its conversion of each function
                step = tf_internals.autograph_converted(step)
            return step(batch)

        model_step.__qualname__ = f"{type(self.model).__name__}.{name}"  # in errors and trace warnings
        return model_step, False

    def uses_model_step(self, kind: str) -> bool:
        """Whether the step of `kind` ("train", "eval", "predict") is the model's own: not overridden by a subclass or set on the instance."""
        step = getattr(self, f"{kind}_step")
        return getattr(step, "__func__", None) is getattr(Trainer, f"{kind}_step")

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
        """Trains the model, as `keras.Model.fit` does: same arguments, defaults, inputs and callback hooks.

        `x`, `y`, `batch_size`, `epochs`, `verbose`, `callbacks`,
        `validation_split`, `validation_data`, `shuffle`, `class_weight`,
        `sample_weight`, `initial_epoch`, `steps_per_epoch`, `validation_steps`,
        `validation_batch_size` and `validation_freq` mean what they mean in
        Keras 3's `fit` (inputs go through Keras's own adapters; `verbose` 1 or
        2 also prints the timing summary). With `model_dir`, a rerun resumes
        exactly where a killed run stopped and trains up to the same target.

        Args:
            total_steps: (tftrain) A step budget: train until this many steps
                in all, the last epoch cut short; `epochs` follows from it
                (data that never ends, without `steps_per_epoch`, makes one
                epoch). The budget belongs to the call: a rerun on the same
                `model_dir` finishes it, a larger one extends the run.
            validation_every_steps: (tftrain) Also validate every this many
                global steps, mid-epoch included (the epoch's training metrics
                are kept); recorded in `history.step_history` and TensorBoard.

        Returns:
            The `keras.callbacks.History` (also `self.model.history`).

        Raises:
            TypeError, ValueError: bad arguments or inputs, raised before any step runs.
            NonFiniteLossError: a loss became NaN or infinite (with
                `terminate_on_nan`, unless `callbacks` hold `TerminateOnNaN`).
        """
        arguments = preparation.FitArguments.named_in(locals())
        call = preparation.fit_call(self, arguments)
        history, self.timing = fit_loop.run_fit(self, call)
        return history

    def evaluate(
        self,
        x: Any = None,
        y: Any = None,
        batch_size: int | None = None,
        verbose: int | str = "auto",
        sample_weight: Any = None,
        steps: int | None = None,
        callbacks: list[keras.callbacks.Callback] | None = None,
        return_dict: bool = False,
        **kwargs: Any,
    ) -> dict[str, float] | list[float] | float:
        """Evaluates the model with `eval_step`, as `keras.Model.evaluate` does (same arguments and defaults).

        Returns:
            The metrics at the end of the pass, as Python floats, as Keras
            returns them: with `return_dict=True` a dict (metric name ->
            value); by default a list in Keras's metrics order (the compiled
            loss and metrics first, then the other logs by name), or a scalar
            if there is one value.

        Raises:
            ValueError: a keyword argument `keras.Model.evaluate` does not take.
        """
        logs = inference.evaluate(
            self, x, y, batch_size=batch_size, verbose=verbose, sample_weight=sample_weight, steps=steps,
            callbacks=callbacks, kwargs=kwargs,
        )  # fmt: skip
        return logs if return_dict else keras_internals.flatten_metrics_in_order(self.model, logs)

    def predict(
        self,
        x: Any,
        batch_size: int | None = None,
        verbose: int | str = "auto",
        steps: int | None = None,
        callbacks: list[keras.callbacks.Callback] | None = None,
    ) -> Any:
        """Predicts with `predict_step`, as `keras.Model.predict` does (same arguments).

        Returns:
            The predictions for every example, in the structure the step
            returns: NumPy arrays (ragged or sparse tensors where the outputs are).
        """
        return inference.predict(self, x, batch_size=batch_size, verbose=verbose, steps=steps, callbacks=callbacks)

    def evaluate_continuously(
        self, x: Any = None, y: Any = None, **kwargs: Any
    ) -> dict[int, dict[str, float]]:
        """Evaluates each checkpoint of `model_dir` (default: this Trainer's) as training writes it.

        `tftrain.evaluation.evaluate_continuously(self, x, y, **kwargs)`: see it
        for the arguments, when it returns and its errors.

        Returns:
            Global step -> logs of every checkpoint evaluated in `model_dir`.
        """
        return evaluation.evaluate_continuously(self, x, y, **kwargs)

    def find_learning_rate(
        self,
        x: Any = None,
        y: Any = None,
        *,
        batch_size: int | None = None,
        min_lr: float = 1e-7,
        max_lr: float = 10.0,
        steps: int = 100,
        smoothing: float = 0.98,
        stop_factor: float = 4.0,
        monitor: str = "loss",
    ) -> lr_sweep.LearningRateSweep:
        """The learning-rate range test: one training step per learning rate, from `min_lr` to `max_lr`, state kept.

        Step i trains at `min_lr * (max_lr / min_lr) ** (i / (steps - 1))`
        with `train_step`, on this Trainer's engine (eager, `tf.function`, XLA)
        and strategy; the data is read in order and cycled if it ends. The
        sweep stops early once the smoothed loss exceeds `stop_factor` times
        its lowest, or is not finite. The learning rate set is that of the
        model's optimizer (`self.optimizer`; a schedule is replaced for the
        sweep): a subclass step training with optimizers of its own is swept
        through the model's alone. Afterwards everything is as it was, bit
        for bit: the model's and optimizer's variables (learning rate,
        iterations, slots), the metrics, `checkpoint_state()`, `global_step`
        and `timing`; no callback or service runs and nothing is written.
        Variables that the first training step creates under eager
        execution (an optimizer not built before) keep the sweep's values,
        with a warning. See docs/beyond_fit.md.

        Args:
            x: The training data, as `fit` takes it (arrays, a
                `tf.data.Dataset`, a PyDataset, a generator: read once).
            y: Targets, for array inputs.
            batch_size: For array inputs, as in `fit` (default 32).
            min_lr: The first learning rate (> 0).
            max_lr: The last learning rate (> `min_lr`).
            steps: Learning rates tried, one training step each (>= 2).
            smoothing: The weight of the past in the bias-corrected moving
                average of the loss, in [0, 1).
            stop_factor: Stop once the smoothed loss exceeds this many times
                its lowest (> 1; `float("inf")`: only at a non-finite loss).
            monitor: The step's log that holds the loss.

        Returns:
            A `tftrain.LearningRateSweep`: the learning rates, losses and
            smoothed losses, the suggestion (the steepest descent of the
            smoothed loss against log lr) and `plot()`.

        Raises:
            ValueError: a bad argument, no optimizer, or no `monitor` log.
            TypeError: inputs `fit` does not take.
        """
        return lr_sweep.find_learning_rate(
            self, x, y, batch_size=batch_size, min_lr=min_lr, max_lr=max_lr, steps=steps,
            smoothing=smoothing, stop_factor=stop_factor, monitor=monitor,
        )  # fmt: skip

    def check(
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
        export: bool | dict[str, Any] = False,
    ) -> dry_run.DryRunReport:
        """A dry run of `fit` with these arguments: each stage of the run once, in seconds, then everything put back.

        Takes `fit`'s arguments, so a script can call `check(**fit_args)`
        before `fit(**fit_args)`, and runs on the engine that `fit` would use
        (eager, `tf.function`, XLA, `steps_per_loop`, the strategy), in
        order: `"prepare"` (`fit`'s argument checks, inputs adapted,
        variables built), then the fit loop itself with a budget of two
        epochs, in a temporary `model_dir`: `"train"` (one host call of the
        training step each epoch, the second timed as the steady call),
        `"validate"` (one batch of the validation data through the
        evaluation step after each epoch, where `fit` has validation data,
        whatever `validation_freq`), `"checkpoint"` (the services' epoch end,
        as in the run: e.g. the best checkpoint's monitor; then the training
        state saved and restored, every variable checked to come back),
        `"predict"` (one batch of the
        validation data's inputs, else `x`, through the prediction step) and
        `"export"` (with `export`: `export` to a temporary directory).

        Afterwards everything is as it was: every variable of the training
        state, bit for bit (the model's, its seed generators', the
        optimizer's, the metrics', `checkpoint_state()`, `global_step`), the
        NumPy and Python global random states, the engines (their traces
        and `steps_per_loop="auto"`'s measurements) and `timing`. No callback
        hook runs (callbacks are only checked, as `fit` checks them), and
        nothing is written to, read from or created in `model_dir`: a `fit`
        afterwards runs exactly as it would have without the check. What the
        data itself changes as it is read is not put back: a `tf.data`
        pipeline that reshuffles each iteration draws its next order for
        each pass the check starts, a generator is read (the predict stage
        is skipped for one), a PyDataset's hooks run. See docs/long_runs.md.

        Every argument but `export` is `fit`'s, as `fit` takes it; `verbose`
        other than 0 also prints the report's summary.

        Args:
            export: Also check `export`: True with its defaults, or a dict of
                its keyword arguments (e.g. `{"format": "tf_saved_model"}`).

        Returns:
            A `tftrain.DryRunReport`: each stage, whether it ran, its time
            (the first call: trace and steps; and a steady call) and `summary()`.

        Raises:
            DryRunError: the first stage that failed, named in the message,
                with its error chained and the report as `report`; the state
                is put back first.
            TypeError, ValueError: a bad `export` or `verbose`.
        """
        arguments = preparation.FitArguments.named_in(locals())
        return dry_run.run_check(self, arguments, export=export, export_to=self.export)

    def save(self, filepath: str, *, overwrite: bool = True) -> None:
        """Saves the model with its optimizer state to a `.keras` file (as `model.save`).

        Optimizers kept in a Trainer subclass's own attributes are not in the
        file: `model_dir` checkpoints keep a full training state.

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
        """Exports the model as a TensorFlow SavedModel for serving (`model.export(filepath, **kwargs)`).

        Raises:
            ValueError: the model is not built yet (train it, or call it on a batch, first).
        """
        if not self.model.built:
            raise ValueError(
                "Cannot export a model that is not built: its input shapes are unknown. Expected a "
                "built model: train it first, call it once on a batch, or `model.build(input_shape)`."
            )
        with self.averaged_weights():  # the EMA weights, with `ema_decay`
            self.model.export(filepath, **kwargs)


OPTION_NAMES = tuple(
    name
    for name, parameter in inspect.signature(Trainer.__init__).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY and name not in ("strategy", "services", "hparams")
)
"""The `Trainer`'s options a program may take from plain values (flags, a config): its keyword arguments but `strategy`, `services` and `hparams`."""
