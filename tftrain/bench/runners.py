"""One function per way of training; each trains a fresh copy of a workload's model.

Every runner starts from the workload's initial weights, reads the workload's
one cached input pipeline, trains for `epochs` epochs without validation,
and returns the wall time of the whole call and of each epoch. Epoch times
end after a host sync (the epoch's loss is read back), so asynchronous work
is not under-counted.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tftrain import _hooks
from tftrain.bench import optional
from tftrain.bench.workloads import WorkloadData
from tftrain.timing import StepTimer, Timing
from tftrain.trainer import Trainer


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How long each run trains.

    Attributes:
        epochs: Epochs per run; the first one includes tracing/compiling.
        steps_per_loop: `k` of the k-steps-per-call variants (`graph_loop`,
            `xla_loop`, `handwritten_loop`, Keras `steps_per_execution`).
        eager_steps: Steps per epoch for the eager variants (they are slow);
            None or 0 means full epochs. Capped at the steps in one pass.
        checkpoint_every_steps: How often `graph_checkpoint` saves; None
            means every `steps_per_epoch // 4` steps (the Trainer also saves
            at each epoch end).
    """

    epochs: int = 2
    steps_per_loop: int = 20
    eager_steps: int | None = 100
    checkpoint_every_steps: int | None = None


@dataclasses.dataclass
class RunResult:
    """What one run measured.

    Attributes:
        total_s: Wall seconds of the whole training call (setup, tracing and
            all epochs; no validation).
        epoch_s: Wall seconds of each epoch.
        epoch_cpu_s: Process CPU seconds (all threads) of each epoch: less
            sensitive than wall time to other programs on the machine.
        steps_per_epoch: Training steps (batches) per epoch.
        final_loss: Mean training loss of the last epoch (None for `data_only`).
        timing: `TimingReport.to_dict()` where the variant has one.
        notes: Facts about the run (e.g. Keras's resolved `jit_compile`).
        model: The trained model (for the untimed validation check).
    """

    total_s: float
    epoch_s: list[float]
    epoch_cpu_s: list[float]
    steps_per_epoch: int
    final_loss: float | None = None
    timing: dict[str, Any] | None = None
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)
    model: keras.Model | None = None


Runner = Callable[[WorkloadData, RunOptions], RunResult]


@dataclasses.dataclass(frozen=True)
class Variant:
    """A way of training.

    Attributes:
        name: Name used on the command line and in the report.
        description: One line for the report.
        run: The runner.
        eager: Runs eagerly, so it trains `eager_steps` steps per epoch.
        unavailable_reason: For a variant that needs an optional package:
            returns why it cannot run in this process, or None if it can
            (the variant is skipped, with the reason, when it cannot).
    """

    name: str
    description: str
    run: Runner
    eager: bool = False
    unavailable_reason: Callable[[], str | None] | None = None

    def unavailable(self) -> str | None:
        """Why the variant cannot run in this process (e.g. a missing optional package), or None."""
        return None if self.unavailable_reason is None else self.unavailable_reason()


class EpochClock:
    """Wall time (`time.perf_counter`) and process CPU time of each epoch."""

    def __init__(self):
        self.wall_s: list[float] = []
        self.cpu_s: list[float] = []
        self._wall = self._cpu = 0.0

    def start(self) -> None:
        """Starts an epoch."""
        self._wall, self._cpu = time.perf_counter(), time.process_time()

    def stop(self) -> None:
        """Ends the epoch (after a host sync)."""
        self.wall_s.append(time.perf_counter() - self._wall)
        self.cpu_s.append(time.process_time() - self._cpu)


class EpochTimer(keras.callbacks.Callback):
    """Times each epoch and keeps the last epoch's logs.

    Only epoch hooks are overridden, so batch dispatch is as without it.
    `on_epoch_end` receives logs already converted to Python floats, so the
    clock stops after the epoch's work has finished.
    """

    def __init__(self):
        super().__init__()
        self.clock = EpochClock()
        self.last_logs: dict[str, Any] = {}

    def on_epoch_begin(self, epoch, logs=None):
        self.clock.start()

    def on_epoch_end(self, epoch, logs=None):
        self.clock.stop()
        self.last_logs = dict(logs or {})


def eager_steps_per_epoch(data: WorkloadData, options: RunOptions) -> int:
    """Steps per epoch of the eager variants."""
    if not options.eager_steps:
        return data.steps_per_epoch
    return min(options.eager_steps, data.steps_per_epoch)


def _train_data(data: WorkloadData, steps: int) -> tf.data.Dataset:
    """The training pipeline, cut to its first `steps` batches for the eager variants.

    Both eager variants read it the same way: each epoch is one pass over the
    same first `steps` batches.
    """
    return data.train if steps == data.steps_per_epoch else data.train.take(steps)


def _run_trainer(
    data: WorkloadData,
    options: RunOptions,
    *,
    eager: bool = False,
    notes: dict[str, Any] | None = None,
    **trainer_options,
) -> RunResult:
    trainer_options.setdefault("steps_per_loop", 1)  # every variant but `default` names its k
    model = data.fresh_model()
    compile_args = data.workload.compile_args()
    if data.workload.compiled_by_model:
        model.compile(**compile_args)
        trainer = Trainer(model, **trainer_options)
    else:
        trainer = Trainer(model, **compile_args, **trainer_options)
    steps = eager_steps_per_epoch(data, options) if eager else data.steps_per_epoch
    epoch_timer = EpochTimer()
    start = time.perf_counter()
    trainer.fit(_train_data(data, steps), epochs=options.epochs, callbacks=[epoch_timer], verbose=0)
    total = time.perf_counter() - start
    return RunResult(
        total_s=total,
        epoch_s=epoch_timer.clock.wall_s,
        epoch_cpu_s=epoch_timer.clock.cpu_s,
        steps_per_epoch=steps,
        final_loss=epoch_timer.last_logs.get("loss"),
        timing=trainer.timing.to_dict() if trainer.timing is not None else None,
        notes={
            "engine": trainer.options.name,
            "measure_timing": trainer.measure_timing,
            **({"steps_per_loop_chosen": trainer.chosen_steps_per_loop} if trainer.options.auto else {}),
            **(notes or {}),
        },
        model=model,
    )


def run_eager(data: WorkloadData, options: RunOptions) -> RunResult:
    """`tftrain.Trainer(use_tf_function=False)`."""
    return _run_trainer(data, options, eager=True, use_tf_function=False)


def run_graph(data: WorkloadData, options: RunOptions) -> RunResult:
    """`tftrain.Trainer(steps_per_loop=1)`: tf.function, one step per host call."""
    return _run_trainer(data, options)


def run_default(data: WorkloadData, options: RunOptions) -> RunResult:
    """`tftrain.Trainer` with its defaults: `steps_per_loop="auto"` (k chosen from measured call times)."""
    return _run_trainer(data, options, steps_per_loop="auto")


def run_xla(data: WorkloadData, options: RunOptions) -> RunResult:
    """`tftrain.Trainer(jit_compile=True)`."""
    return _run_trainer(data, options, jit_compile=True)


def run_graph_loop(data: WorkloadData, options: RunOptions) -> RunResult:
    """`tftrain.Trainer(steps_per_loop=k)`."""
    return _run_trainer(data, options, steps_per_loop=options.steps_per_loop)


def run_xla_loop(data: WorkloadData, options: RunOptions) -> RunResult:
    """`tftrain.Trainer(jit_compile=True, steps_per_loop=k)`."""
    return _run_trainer(data, options, jit_compile=True, steps_per_loop=options.steps_per_loop)


def run_trainer_no_timing(data: WorkloadData, options: RunOptions) -> RunResult:
    """`tftrain.Trainer(measure_timing=False)` (otherwise as `graph`)."""
    return _run_trainer(data, options, measure_timing=False)


def run_graph_no_sync(data: WorkloadData, options: RunOptions) -> RunResult:
    """`tftrain.Trainer(terminate_on_nan=False, measure_timing=False)`: no host read of each call's logs.

    The NaN guard and the timing each wait for a call's logs on the host; with
    one step per call that is one sync per step, which the hand-written loop
    does not pay. This variant shows what that sync costs.
    """
    return _run_trainer(data, options, terminate_on_nan=False, measure_timing=False)


def checkpoint_every(data: WorkloadData, options: RunOptions) -> int:
    """Steps between the saves of `graph_checkpoint`: as asked, else a quarter epoch (at least 1)."""
    return options.checkpoint_every_steps or max(1, data.steps_per_epoch // 4)


def run_graph_checkpoint(data: WorkloadData, options: RunOptions) -> RunResult:
    """`tftrain.Trainer(model_dir=..., checkpoint_every_steps=N)` (otherwise as `graph`).

    A fresh temporary `model_dir` per run (removed afterwards), so no run
    resumes from another; the Trainer's timing report has the save times.
    """
    every = checkpoint_every(data, options)
    with tempfile.TemporaryDirectory(prefix="tftrain-bench-") as model_dir:
        return _run_trainer(
            data,
            options,
            model_dir=model_dir,
            checkpoint_every_steps=every,
            notes={"checkpoint_every_steps": every},
        )


def _run_keras_fit(
    data: WorkloadData, options: RunOptions, *, steps_per_execution: int = 1, timing: bool = False
) -> RunResult:
    model = data.fresh_model()
    compile_args = data.workload.compile_args()
    if steps_per_execution != 1:
        compile_args["steps_per_execution"] = steps_per_execution
    model.compile(**compile_args)
    epoch_timer = EpochTimer()
    callbacks: list[keras.callbacks.Callback] = [epoch_timer]
    timing_callback = Timing() if timing else None
    if timing_callback is not None:
        callbacks.append(timing_callback)
    start = time.perf_counter()
    # shuffle=False only silences Keras's warning: a Dataset is never shuffled by fit.
    model.fit(data.train, epochs=options.epochs, callbacks=callbacks, verbose=0, shuffle=False)
    total = time.perf_counter() - start
    report = timing_callback.report if timing_callback is not None else None
    return RunResult(
        total_s=total,
        epoch_s=epoch_timer.clock.wall_s,
        epoch_cpu_s=epoch_timer.clock.cpu_s,
        steps_per_epoch=data.steps_per_epoch,
        final_loss=epoch_timer.last_logs.get("loss"),
        timing=report.to_dict() if report is not None else None,
        notes={"jit_compile": bool(model.jit_compile), "steps_per_execution": int(model.steps_per_execution)},
        model=model,
    )


def run_keras_fit(data: WorkloadData, options: RunOptions) -> RunResult:
    """`model.compile(...)` with default settings, then `model.fit`."""
    return _run_keras_fit(data, options)


def run_keras_fit_spe(data: WorkloadData, options: RunOptions) -> RunResult:
    """`model.compile(steps_per_execution=k)`, then `model.fit`."""
    return _run_keras_fit(data, options, steps_per_execution=options.steps_per_loop)


def run_keras_fit_timing(data: WorkloadData, options: RunOptions) -> RunResult:
    """`model.fit(callbacks=[tftrain.callbacks.Timing()])`."""
    return _run_keras_fit(data, options, timing=True)


def call_counts(steps: int, steps_per_call: int) -> list[int]:
    """Steps of each call when an epoch of `steps` runs `steps_per_call` at a time (the last call may run fewer)."""
    full_calls, rest = divmod(steps, steps_per_call)
    return [steps_per_call] * full_calls + ([rest] if rest else [])


def _run_handwritten(
    data: WorkloadData,
    options: RunOptions,
    *,
    use_tf_function: bool,
    jit_compile: bool = False,
    steps_per_call: int = 1,
) -> RunResult:
    """The classic loop: GradientTape, `apply_gradients`, metrics, `for x, y in ds`.

    With `steps_per_call=k`, a `tf.function` runs k steps per call, each
    reading its batch from the iterator inside the graph (`tf.range`).
    """
    model = data.fresh_model()
    compile_args = data.workload.compile_args()
    optimizer = compile_args["optimizer"]
    optimizer.build(model.trainable_variables)  # as Keras and the Trainer do before the first trace
    loss_object = compile_args["loss"]
    train_loss = keras.metrics.Mean(name="loss")
    train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")

    def train_step(x, y):
        with tf.GradientTape() as tape:
            predictions = model(x, training=True)
            loss = loss_object(y, predictions)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        train_loss.update_state(loss)
        train_accuracy.update_state(y, predictions)

    def train_loop(iterator, steps):
        for _ in tf.range(steps):
            x, y = next(iterator)
            train_step(x, y)

    if steps_per_call > 1:
        train_loop = tf.function(train_loop, jit_compile=False)
    elif use_tf_function:
        train_step = tf.function(train_step, jit_compile=jit_compile)
    steps = data.steps_per_epoch if use_tf_function else eager_steps_per_epoch(data, options)
    train_data = _train_data(data, steps)
    clock = EpochClock()
    final_loss = None
    start = time.perf_counter()
    for _ in range(options.epochs):
        train_loss.reset_state()
        train_accuracy.reset_state()
        clock.start()
        if steps_per_call > 1:
            iterator = iter(train_data)
            for count in call_counts(steps, steps_per_call):
                train_loop(iterator, tf.constant(count))  # a tensor: one trace for every count
        else:
            for x, y in train_data:
                train_step(x, y)
        final_loss = float(train_loss.result())  # host sync
        clock.stop()
    total = time.perf_counter() - start
    notes: dict[str, Any] = {}
    if steps_per_call > 1:
        notes["trace_count"] = int(train_loop.experimental_get_tracing_count())
        notes["steps_per_call"] = steps_per_call
    elif use_tf_function:
        notes["trace_count"] = int(train_step.experimental_get_tracing_count())
        notes["jit_compile"] = jit_compile
    return RunResult(
        total_s=total,
        epoch_s=clock.wall_s,
        epoch_cpu_s=clock.cpu_s,
        steps_per_epoch=steps,
        final_loss=final_loss,
        notes=notes,
        model=model,
    )


def run_handwritten(data: WorkloadData, options: RunOptions) -> RunResult:
    """The classic hand-written loop with `@tf.function def train_step(x, y)`."""
    return _run_handwritten(data, options, use_tf_function=True)


def run_handwritten_xla(data: WorkloadData, options: RunOptions) -> RunResult:
    """The hand-written loop with `@tf.function(jit_compile=True)`."""
    return _run_handwritten(data, options, use_tf_function=True, jit_compile=True)


def run_handwritten_loop(data: WorkloadData, options: RunOptions) -> RunResult:
    """The hand-written loop with k steps per `tf.function` call (`for _ in tf.range(k)`)."""
    return _run_handwritten(data, options, use_tf_function=True, steps_per_call=options.steps_per_loop)


def run_handwritten_eager(data: WorkloadData, options: RunOptions) -> RunResult:
    """The same hand-written loop without `tf.function`."""
    return _run_handwritten(data, options, use_tf_function=False)


def run_torch_eager(data: WorkloadData, options: RunOptions) -> RunResult:
    """The same model, data and SGD step in PyTorch (eager, its normal mode); `linear` only.

    The PyTorch model starts from the Keras initial weights and reads the same
    batches (converted to tensors before the clock starts); afterwards its
    weights are copied into a Keras model, so the untimed check evaluates
    both frameworks with the same code.
    """
    import torch  # optional: loaded before TensorFlow by python -m tftrain.bench (see `optional`)

    model = data.fresh_model()
    dense = [layer for layer in model.layers if isinstance(layer, keras.layers.Dense)]
    if len(dense) != len(model.layers):
        raise ValueError(f"torch_eager needs a stack of Dense layers; {data.workload.name} is not one.")
    compile_args = data.workload.compile_args()
    if not isinstance(compile_args["optimizer"], keras.optimizers.SGD) or not isinstance(
        compile_args["loss"], keras.losses.MeanSquaredError
    ):
        raise ValueError(
            f"torch_eager mirrors plain SGD on the squared error; {data.workload.name} is not that."
        )
    linears = []
    for layer in dense:
        kernel, bias = (variable.numpy() for variable in layer.weights)
        linear = torch.nn.Linear(kernel.shape[0], kernel.shape[1])
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(kernel.T.copy()))
            linear.bias.copy_(torch.from_numpy(bias))
        linears.append(linear)
    torch_model = torch.nn.Sequential(*linears)
    optimizer = torch.optim.SGD(torch_model.parameters(), lr=float(compile_args["optimizer"].learning_rate))
    loss_fn = torch.nn.MSELoss()
    batches = [(torch.from_numpy(x.numpy()), torch.from_numpy(y.numpy())) for x, y in data.train]
    clock = EpochClock()
    final_loss = None
    start = time.perf_counter()
    for _ in range(options.epochs):
        clock.start()
        loss_sum = torch.zeros(())
        for x, y in batches:
            optimizer.zero_grad()
            loss = loss_fn(torch_model(x), y)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
        final_loss = float(loss_sum) / len(batches)
        clock.stop()
    total = time.perf_counter() - start
    for layer, linear in zip(dense, linears, strict=True):
        layer.set_weights([linear.weight.detach().numpy().T, linear.bias.detach().numpy()])
    return RunResult(
        total_s=total,
        epoch_s=clock.wall_s,
        epoch_cpu_s=clock.cpu_s,
        steps_per_epoch=len(batches),
        final_loss=final_loss,
        notes={"torch": torch.__version__, "torch_threads": torch.get_num_threads()},
        model=model,
    )


def run_step_only(data: WorkloadData, options: RunOptions) -> RunResult:
    """The model's own cost: the hand-written step on one fixed batch, k steps per call, no input pipeline.

    Together with `data_only` this bounds every loop from below: a loop
    cannot take less than reading its batches plus computing its steps.
    """
    model = data.fresh_model()
    compile_args = data.workload.compile_args()
    optimizer, loss_object = compile_args["optimizer"], compile_args["loss"]
    optimizer.build(model.trainable_variables)
    x, y = next(iter(data.train))

    @tf.function
    def train_steps(steps):
        loss = tf.constant(0.0)
        for _ in tf.range(steps):
            with tf.GradientTape() as tape:
                loss = loss_object(y, model(x, training=True))
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        return loss

    clock = EpochClock()
    final_loss = None
    start = time.perf_counter()
    for _ in range(options.epochs):
        clock.start()
        for count in call_counts(data.steps_per_epoch, options.steps_per_loop):
            loss = train_steps(tf.constant(count))
        final_loss = float(loss)  # host sync
        clock.stop()
    return RunResult(
        total_s=time.perf_counter() - start,
        epoch_s=clock.wall_s,
        epoch_cpu_s=clock.cpu_s,
        steps_per_epoch=data.steps_per_epoch,
        final_loss=final_loss,
        notes={"trace_count": int(train_steps.experimental_get_tracing_count())},
    )


def run_data_only(data: WorkloadData, options: RunOptions) -> RunResult:
    """Only iterates the input pipeline (no model): the floor for a Python `for` loop."""
    clock = EpochClock()
    start = time.perf_counter()
    for _ in range(options.epochs):
        clock.start()
        for _batch in data.train:
            pass
        clock.stop()
    return RunResult(
        total_s=time.perf_counter() - start,
        epoch_s=clock.wall_s,
        epoch_cpu_s=clock.cpu_s,
        steps_per_epoch=data.steps_per_epoch,
    )


def timing_hook_seconds(calls: int = 20_000, repeats: int = 5) -> float:
    """What the Trainer's timing adds to one host call, measured directly (the best of `repeats`).

    Per call, `Trainer.fit` with `measure_timing=True` does exactly this
    around the call: start the clock, wait for the call's logs (already
    ready here, as they are after the NaN check reads them), stop the clock
    and file the call. A tight loop of that work has no training step in it,
    so, unlike comparing two training runs, it is not drowned by noise.

    Args:
        calls: Host calls per measurement.
        repeats: Measurements; the smallest is returned.

    Returns:
        Seconds per host call.
    """
    logs = {"loss": tf.constant(0.5), "accuracy": tf.constant(0.25)}
    best = float("inf")
    for _ in range(repeats):
        timer = StepTimer()
        start = time.perf_counter()
        for _ in range(calls):
            timer.begin_call()
            _hooks.block_until_ready(logs)
            timer.end_call(1, 128, traced=False)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


# Ordered so that compared variants run next to each other.
VARIANTS: dict[str, Variant] = {
    variant.name: variant
    for variant in [
        Variant("handwritten", "hand-written loop, @tf.function train_step(x, y)", run_handwritten),
        Variant("graph", "Trainer, tf.function, steps_per_loop=1", run_graph),
        Variant("default", 'Trainer defaults: steps_per_loop="auto"', run_default),
        Variant("trainer_no_timing", "Trainer(measure_timing=False), otherwise graph", run_trainer_no_timing),
        Variant(
            "graph_no_sync",
            "Trainer(terminate_on_nan=False, measure_timing=False): no per-call host sync",
            run_graph_no_sync,
        ),
        Variant(
            "graph_checkpoint",
            "Trainer(model_dir=..., checkpoint_every_steps=N): checkpoints and TensorBoard files",
            run_graph_checkpoint,
        ),
        Variant("handwritten_xla", "hand-written loop, @tf.function(jit_compile=True)", run_handwritten_xla),
        Variant("xla", "Trainer(jit_compile=True)", run_xla),
        Variant(
            "handwritten_loop",
            "hand-written loop, k steps per tf.function call (tf.range)",
            run_handwritten_loop,
        ),
        Variant("graph_loop", "Trainer(steps_per_loop=k)", run_graph_loop),
        Variant("xla_loop", "Trainer(jit_compile=True, steps_per_loop=k)", run_xla_loop),
        Variant("keras_fit", "model.fit, default compile settings", run_keras_fit),
        Variant("keras_fit_spe", "model.fit, compile(steps_per_execution=k)", run_keras_fit_spe),
        Variant(
            "keras_fit_timing", "model.fit(callbacks=[tftrain.callbacks.Timing()])", run_keras_fit_timing
        ),
        Variant(
            "handwritten_eager", "hand-written loop without tf.function", run_handwritten_eager, eager=True
        ),
        Variant("eager", "Trainer(use_tf_function=False)", run_eager, eager=True),
        Variant(
            "torch_eager",
            "the same model and SGD step in PyTorch (eager)",
            run_torch_eager,
            unavailable_reason=optional.torch_unavailable_reason,
        ),
        Variant(
            "step_only",
            "the step alone: k steps per call on one fixed batch, no input pipeline",
            run_step_only,
        ),
        Variant("data_only", "iterate the input pipeline only, no model", run_data_only),
    ]
}
