"""Keras callbacks that give `keras.Model.fit` what `tftrain.Trainer` has built in.

`Timing` measures `model.fit` as the Trainer measures itself (the same
`tftrain.timing.TimingReport`); `TensorBoardSummaries` and
`CheckpointAndResume` drive the Trainer's services from `fit`'s hooks.
`standard_callbacks(model_dir)` returns the set for a model directory:
`Timing`, `TensorBoardSummaries` and `CheckpointAndResume`, so a
`tftrain.CustomModel` trained with `model.fit` gets the same timing report,
the same TensorBoard event files and checkpoints in the same format.
`RunRecordLogger` hands a Trainer run's record to an experiment tracker
(MLflow, Weights & Biases) as the run's parameters.

Example:
    ```python
    model.fit(dataset, epochs=10, callbacks=tftrain.callbacks.standard_callbacks("runs/exp1"))
    ```
"""

from __future__ import annotations

import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tftrain import arguments, summaries
from tftrain import checkpoint as checkpoint_lib
from tftrain.arguments import check_int
from tftrain.checkpoint import run_record
from tftrain.checkpoint.layout import ModelDirLayout
from tftrain.compat import keras_internals
from tftrain.engine import calls
from tftrain.loops import run_setup
from tftrain.options import EngineOptions
from tftrain.services.hparams import hparams_of
from tftrain.services.profiler import ProfilerService
from tftrain.services.protocol import Service
from tftrain.services.tensorboard import SummaryService
from tftrain.timing import StepTimer, TimingReport, TraceCounter

__all__ = [
    "CheckpointAndResume",
    "RunRecordLogger",
    "ServicesCallback",
    "TensorBoardSummaries",
    "Timing",
    "standard_callbacks",
]


class Timing(keras.callbacks.Callback):
    """Keras callback that measures `model.fit` like `Trainer.fit` measures itself.

    After training, `callback.report` is a `TimingReport`. Trace counting wraps
    the model's `train_step` (the model's train function is rebuilt once for
    that); examples are counted in the graph, so `examples_per_sec` is right
    for partial batches and under a distribution strategy.

    Example:
        ```python
        timing = tftrain.callbacks.Timing()
        model.fit(dataset, epochs=2, callbacks=[timing])
        print(timing.report.summary())
        ```

    Args:
        verbose: If true, print the summary when training ends.
    """

    def __init__(self, verbose: bool = False):
        super().__init__()
        self.verbose = verbose
        self.report: TimingReport | None = None
        self._timer = StepTimer()
        self._counter = TraceCounter("train_step", "data")
        self._traces_at_call_start = 0
        self._counts_at_call_start = np.zeros(2, np.int64)

    @property
    def timer(self) -> StepTimer:
        """The callback's `StepTimer` (read by `TensorBoardSummaries` for throughput)."""
        return self._timer

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        hook = getattr(model, "_tftrain_timing_hook", None) or _install_timing_hook(model)
        hook.callback = self

    def on_train_begin(self, logs=None):
        self._timer.reset()
        self._counter.count = 0
        self.report = None

    def on_train_batch_begin(self, batch, logs=None):
        self._traces_at_call_start = self._counter.count
        self._counts_at_call_start = self._read_counts()
        self._timer.begin_call()

    def on_train_batch_end(self, batch, logs=None):
        steps, examples = self._read_counts() - self._counts_at_call_start  # also syncs
        self._timer.end_call(
            steps=int(steps), examples=int(examples), traced=self._counter.count != self._traces_at_call_start
        )

    def _read_counts(self) -> np.ndarray:
        counts = self.model._tftrain_timing_hook.counts.numpy()
        replicas = self.model.distribute_strategy.num_replicas_in_sync
        return np.array([counts[0] // replicas, counts[1]], np.int64)

    def on_train_end(self, logs=None):
        self.report = self._timer.report(self._counter.count, engine=fit_engine_name(self.model))
        self.model._tftrain_timing_hook.callback = None
        if self.verbose:
            print(self.report.summary())


def fit_engine_name(model: keras.Model) -> str:
    """The engine `model.fit` runs for a compiled model, named as the Trainer names its engines.

    From the model's `run_eagerly`, resolved `jit_compile` (Keras ignores it
    for an eager model) and `steps_per_execution`, e.g. `"xla+loop4"`.
    """
    eager = bool(getattr(model, "run_eagerly", False))
    return EngineOptions(
        use_tf_function=not eager,
        jit_compile=bool(getattr(model, "jit_compile", False)) and not eager,
        steps_per_loop=int(getattr(model, "steps_per_execution", 1) or 1),
    ).name


def _install_timing_hook(model: keras.Model) -> types.SimpleNamespace:
    """Wraps `model.train_step` once so that every step is counted in the graph.

    The counts variable belongs to the model (a traced train function keeps
    using the variable it captured); the active `Timing` callback, if any,
    is told about traces.
    """
    with model.distribute_strategy.scope():
        # [steps, examples], summed over replicas when read.
        counts = tf.Variable(
            [0, 0],
            dtype=tf.int64,
            trainable=False,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.SUM,
        )
    # Not a dict: Keras would store a tracked copy of a dict attribute.
    hook = types.SimpleNamespace(callback=None, counts=counts)
    original = model.train_step

    def train_step(data):
        callback = hook.callback
        if callback is not None and not tf.executing_eagerly():
            callback._counter._record(data)
        size = tf.cast(tf.shape(tf.nest.flatten(data)[0])[0], tf.int64)
        counts.assign_add(tf.stack([tf.constant(1, tf.int64), size]))
        return original(data)

    model.train_step = train_step
    model._tftrain_timing_hook = hook
    # Keras caches the train function built from the old `train_step`.
    model.train_function = None
    return hook


class ServicesCallback(keras.callbacks.Callback):
    """Drives services (`tftrain.services.Service`) from `keras.Model.fit`'s hooks.

    The thin adapter between Keras's callback protocol and the services'
    protocol: it is the services' `RunState`, keeps the global step from the
    epoch and batch indices, and turns each `on_train_batch_end` into the
    services' `results_read` and `after_call` for the steps since the last
    one. `model.fit` decides its host calls itself, so the services'
    boundaries (`next_stop`) cannot cut them here. Subclasses build their
    services in `make_services`.

    Attributes:
        progress: Where the run is (the `RunState`'s progress).
        epoch_steps: Steps in the current epoch, if `fit` knows them.
        total_steps: Always None (`model.fit` has no step budget).
        nonfinite_step: Always None (no loss check here; these services write no checkpoint).
    """

    total_steps = None
    nonfinite_step = None

    def __init__(self):
        super().__init__()
        self.services: list[Service] = []
        self.progress = checkpoint_lib.Progress()
        self._epoch_start = 0
        self.epoch_steps: int | None = None

    def make_services(self) -> list[Service]:
        """The services to drive, built when training begins."""
        return []

    def latest_checkpoint(self) -> str | None:
        """No checkpoints of their own: the NaN guard's message names none."""
        return None

    def service_states(self) -> dict:
        """No checkpoints of their own: nothing saves the services' states."""
        return {}

    @property
    def epoch_ending(self) -> bool:
        """Whether the batch just ended is the epoch's last (`fit` knows its steps)."""
        return self.progress.step_in_epoch == self.epoch_steps

    def settle(self) -> None:
        """Nothing to read: `model.fit` hands every batch's logs to the hooks."""

    def data_position(self) -> tuple[None, int]:
        """`model.fit`'s iterator is not reachable from a callback."""
        return None, self.progress.step_in_epoch

    def report_validation(self, logs: dict) -> None:
        """Tells every service of a validation taken at the current step."""
        for service in self.services:
            service.validated(self, logs)

    def on_train_begin(self, logs=None):
        self.services = self.make_services()
        self.progress = checkpoint_lib.Progress()

    def on_epoch_begin(self, epoch, logs=None):
        steps = self.params.get("steps")
        # A resumed fit starts at a later epoch: its first step is epoch * steps + 1.
        self._epoch_start = epoch * steps if steps else self.progress.global_step
        self.progress.epoch = epoch
        self.progress.global_step = self._epoch_start
        self.progress.step_in_epoch = 0
        self.epoch_steps = steps

    def on_train_batch_begin(self, batch, logs=None):
        self.progress.global_step = self._epoch_start + batch
        for service in self.services:
            service.before_call(self)

    def on_train_batch_end(self, batch, logs=None):
        before = self.progress.global_step
        self.progress.global_step = self._epoch_start + batch + 1
        self.progress.step_in_epoch = batch + 1
        result = calls.LoopResult(self.progress.global_step - before, None, logs)
        for service in self.services:
            service.results_read(self, result)
        for service in self.services:
            service.after_call(self, result)

    def on_epoch_end(self, epoch, logs=None):
        for service in self.services:
            service.end_epoch(self, dict(logs or {}))

    def on_train_end(self, logs=None):
        for service in self.services:
            service.close()
        self.services = []


class TensorBoardSummaries(ServicesCallback):
    """Writes the Trainer's TensorBoard summaries from `model.fit`.

    Event files go to `log_dir/train` and `log_dir/validation`: `epoch_*`
    scalars at each epoch end, `step_*` scalars every `every_steps` steps,
    `learning_rate`, and, given a `Timing` callback listed before this one,
    `steps_per_sec`, `examples_per_sec`, `step_time_s` and `trace_time_s`.
    The x axis is the global training step. The same summary and profiler
    services as the Trainer's write them.

    Args:
        log_dir: The run's directory.
        every_steps: Also write the training logs every this many steps.
        profile_steps: `(start, stop)`: profile these training steps (1-based,
            both included) into `log_dir/train`. With `steps_per_execution`
            the profiler starts and stops at the host calls around the window.
        timing: The `Timing` callback to read step times from.

    Raises:
        ValueError: bad `every_steps` or `profile_steps`.
    """

    def __init__(
        self,
        log_dir: str,
        *,
        every_steps: int | None = None,
        profile_steps: tuple[int, int] | None = None,
        timing: Timing | None = None,
    ):
        super().__init__()
        self.log_dir = checkpoint_lib.ensure_writable_directory(log_dir, "log_dir")
        arguments.check_every_steps(every_steps, "every_steps")
        self.every_steps = every_steps
        self.profile_steps = arguments.check_profile_steps(profile_steps)
        self.timing = timing

    def make_services(self) -> list[Service]:
        services: list[Service] = []
        if self.profile_steps is not None:
            steps, epochs = self.params.get("steps"), self.params.get("epochs")
            total = steps * epochs if steps and epochs else None
            window = arguments.check_profile_steps(self.profile_steps, total)
            services.append(
                ProfilerService(summaries.ProfileWindow(ModelDirLayout(self.log_dir).train, window))
            )
        timer = self.timing.timer if self.timing is not None else None
        writer = summaries.TrainingSummaries(self.log_dir, every_steps=self.every_steps)
        services.append(SummaryService(writer, timer, self.model.optimizer))
        return services


class CheckpointAndResume(keras.callbacks.Callback):
    """Checkpoints `model.fit` at each epoch end and resumes it on the next `fit`.

    Saves what the Trainer saves (model, optimizer, random-generator states,
    metric states) with the same crash safety, fallback past damaged
    checkpoints and refusal of incompatible ones or of NaN/Inf weights. On
    `on_train_begin` it restores the latest checkpoint and makes `fit` start
    at the next epoch, so rerunning a killed `fit(epochs=N)` trains up to N.

    Unlike `Trainer(model_dir=...)`, `model.fit` does not expose its data
    iterator: resuming starts the epoch after the last completed one, on a
    fresh pass over the data. Steps of an interrupted epoch are trained
    again, and a reshuffling dataset's later epochs may be ordered
    differently from an uninterrupted run. Use the Trainer for exact
    mid-epoch resume.

    Args:
        directory: The model directory; checkpoints go to `directory/checkpoints`.
        max_to_keep: Checkpoints kept.

    Raises:
        ValueError: `directory` is a file or not writable, or a bad `max_to_keep`.
    """

    def __init__(self, directory: str, *, max_to_keep: int = 5):
        super().__init__()
        self.directory = checkpoint_lib.ensure_writable_directory(directory, "directory")
        check_int("max_to_keep", max_to_keep)
        self.max_to_keep = max_to_keep
        self.checkpointer: checkpoint_lib.Checkpointer | None = None
        self.restored: checkpoint_lib.Progress | None = None

    def on_train_begin(self, logs=None):
        model = self.model
        self.checkpointer = checkpoint_lib.Checkpointer(
            ModelDirLayout(self.directory).checkpoints,
            # Metric states are not needed: fit resumes at an epoch start, where they are reset.
            lambda: checkpoint_lib.training_state(model, metrics=False),
            max_to_keep=self.max_to_keep,
        )
        if self.checkpointer.latest is None:
            return
        if not model.built:
            raise ValueError(
                f"Cannot resume from {self.checkpointer.latest}: the model is not built yet, so its "
                "variables do not exist to be restored. Expected a built model: call it once on a "
                "batch, or `model.build(input_shape)`, before `fit`."
            )
        # Without a strategy, keras builds the optimizer in the first train step: too late here.
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)
        self.restored = self.checkpointer.restore_latest()
        if self.restored is not None:
            keras_internals.set_initial_epoch(self.model, self.restored.epoch)  # read by keras.Model.fit
            run_setup.report_resume(
                f"tftrain: resumed from {self.checkpointer.latest} at epoch {self.restored.epoch + 1} "
                f"(step {self.restored.global_step}).",
                self.params.get("verbose", 1),
            )

    def on_epoch_end(self, epoch, logs=None):
        steps = self.params.get("steps") or 0
        progress = checkpoint_lib.Progress(epoch=epoch + 1, global_step=(epoch + 1) * steps)
        self.checkpointer.save(progress, number=progress.global_step or None)

    def on_train_end(self, logs=None):
        keras_internals.set_initial_epoch(self.model, None)


class RunRecordLogger(keras.callbacks.Callback):
    """Hands a Trainer run's record to an experiment tracker as the run's parameters, when training begins.

    MLflow's `mlflow.keras.MlflowCallback` and W&B's `WandbMetricsLogger`
    record a `Trainer.fit` as they record a `model.fit` (its logs; MLflow also
    the optimizer's configuration), but neither knows the run record: the
    optimizer, loss and metrics, the data, the Trainer's options, the target,
    the versions and your own values (`Trainer(hparams=...)`). A Trainer with
    a `model_dir` writes the record at the start of every `fit`
    (`model_dir/run_record.json`); this callback reads it at `on_train_begin`
    and passes it to `log_params` as TensorBoard's HParams tab shows it
    (`tftrain.services.hparams.hparams_of`: each value once, yours by their
    names, the Trainer's options as `trainer.<option>`, the rest by group,
    e.g. `optimizer.learning_rate`; lists as JSON text, the model's and
    optimizer's structure and the values that are None left out).

    Example:
        ```python
        trainer = tftrain.Trainer(model, model_dir="runs/exp1", hparams={"width": 64})
        with mlflow.start_run():
            trainer.fit(x, y, epochs=5, callbacks=[
                mlflow.keras.MlflowCallback(),
                tftrain.callbacks.RunRecordLogger(mlflow.log_params, "runs/exp1"),
            ])
        ```

    With W&B, after `wandb.init(...)`: `RunRecordLogger(wandb.config.update, "runs/exp1")`.

    Args:
        log_params: Called once per `fit` with the record, a dict of names to
            bool, int, float or str values: e.g. `mlflow.log_params` or
            `wandb.config.update`.
        model_dir: The Trainer's `model_dir`. Where it holds no record when
            training begins (`model.fit`, or a Trainer without this
            `model_dir`), a warning says so and nothing is logged.

    Attributes:
        params: What the last `fit` logged, or None.

    Raises:
        TypeError: `log_params` is not callable.
    """

    def __init__(self, log_params: Callable[[dict[str, Any]], Any], model_dir: str):
        super().__init__()
        if not callable(log_params):
            raise TypeError(
                f"Invalid value for argument `log_params`. Received: log_params={log_params!r}. "
                "Expected a function that takes a dict of parameters, e.g. `mlflow.log_params` or "
                "`wandb.config.update`."
            )
        self.log_params = log_params
        self.model_dir = arguments.check_path_not_empty(model_dir, "model_dir")
        self.params: Mapping[str, Any] | None = None

    def on_train_begin(self, logs=None):
        record = run_record.read_file(self.model_dir)
        if record is None:
            warnings.warn(
                f"tftrain: no run record to log: {ModelDirLayout(self.model_dir).run_record} is missing or "
                "unreadable. A `tftrain.Trainer` with this `model_dir` writes it at the start of every `fit`; "
                "`model.fit` writes none.",
                stacklevel=2,
            )
            self.params = None
            return
        self.params = hparams_of(record)
        self.log_params(dict(self.params))


def standard_callbacks(
    model_dir: str,
    *,
    summary_every_steps: int | None = None,
    profile_steps: tuple[int, int] | None = None,
    max_to_keep: int = 5,
    verbose_timing: bool = False,
) -> list[keras.callbacks.Callback]:
    """The callbacks that give `model.fit` a model directory like `Trainer(model_dir=...)`.

    Args:
        model_dir: Checkpoints go to `model_dir/checkpoints`, event files to
            `model_dir/train` and `model_dir/validation`.
        summary_every_steps: Also write training summaries every this many steps.
        profile_steps: `(start, stop)`: profile these training steps.
        max_to_keep: Checkpoints kept.
        verbose_timing: Print the timing report when training ends.

    Returns:
        `[Timing, TensorBoardSummaries, CheckpointAndResume]`, in the order they must run.
    """
    timing = Timing(verbose=verbose_timing)
    return [
        timing,
        TensorBoardSummaries(
            model_dir, every_steps=summary_every_steps, profile_steps=profile_steps, timing=timing
        ),
        CheckpointAndResume(model_dir, max_to_keep=max_to_keep),
    ]
