"""The ways of training that the benchmark compares, each as a runner of interleaved segments.

Every runner starts from the workload's initial weights, reads the
workload's one endless training stream, builds its model and traced
functions once (in its first turn), then runs `lane.segments` segments of
`lane.steps` steps, each between `lane.start()` and `lane.stop()` (see
`segments`). A segment's clock stops after a host sync (its loss is read
back), so asynchronous work is not under-counted. The Trainer's and Keras's
runners live in `fit_runners`; the hand-written loops, PyTorch and the
floors are here.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable

import keras
import tensorflow as tf

from tftrain.bench import optional
from tftrain.bench.fit_runners import Outcome, RunOptions, run_graph_checkpoint, run_keras_fit, run_trainer
from tftrain.bench.segments import Lane
from tftrain.bench.workloads import WorkloadData
from tftrain.engine.calls import block_until_ready
from tftrain.timing import StepTimer

__all__ = ["Outcome", "RunOptions", "Variant", "VARIANTS", "AUTO_REFERENCE_K"]

Runner = Callable[[WorkloadData, RunOptions, Lane], Outcome]

AUTO_REFERENCE_K = (1, 5, 20, 100)
"""The fixed k that `steps_per_loop="auto"` is compared with (`graph_loop_k<k>`)."""


@dataclasses.dataclass(frozen=True)
class Variant:
    """A way of training.

    Attributes:
        name: Name used on the command line and in the report.
        description: One line for the report.
        run: The runner.
        eager: Runs eagerly, so its segments have `eager_steps` steps.
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


def call_counts(steps: int, steps_per_call: int) -> list[int]:
    """Steps of each call when a segment of `steps` runs `steps_per_call` at a time (the last call may run fewer)."""
    full_calls, rest = divmod(steps, steps_per_call)
    return [steps_per_call] * full_calls + ([rest] if rest else [])


def _trainer(**trainer_options) -> Runner:
    return lambda data, options, lane: run_trainer(data, options, lane, **trainer_options)


def _trainer_loop(**trainer_options) -> Runner:
    """A Trainer runner with `steps_per_loop` = the workload's k."""
    return lambda data, options, lane: run_trainer(
        data, options, lane, steps_per_loop=options.steps_per_loop, **trainer_options
    )


def _run_handwritten(
    data: WorkloadData,
    options: RunOptions,
    lane: Lane,
    *,
    use_tf_function: bool,
    jit_compile: bool = False,
    loop: bool = False,
) -> Outcome:
    """The classic loop: GradientTape, `apply_gradients`, metrics, batches from one iterator.

    With `loop=True`, a `tf.function` runs k steps per call, each reading its
    batch from the iterator inside the graph (`tf.range`).
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

    if loop:
        train_loop = tf.function(train_loop, jit_compile=False)
    elif use_tf_function:
        train_step = tf.function(train_step, jit_compile=jit_compile)
    iterator = iter(data.train)
    final_loss = None
    for _ in range(lane.segments):
        lane.start()
        train_loss.reset_state()
        train_accuracy.reset_state()
        if loop:
            for count in call_counts(lane.steps, options.steps_per_loop):
                train_loop(iterator, tf.constant(count))  # a tensor: one trace for every count
        else:
            for _ in range(lane.steps):
                train_step(*next(iterator))
        final_loss = float(train_loss.result())  # host sync
        lane.stop()
    notes = {}
    if loop:
        notes = {
            "trace_count": int(train_loop.experimental_get_tracing_count()),
            "steps_per_call": options.steps_per_loop,
        }
    elif use_tf_function:
        notes = {"trace_count": int(train_step.experimental_get_tracing_count()), "jit_compile": jit_compile}
    return Outcome(final_loss=final_loss, notes=notes, model=model)


def _handwritten(**keywords) -> Runner:
    return lambda data, options, lane: _run_handwritten(data, options, lane, **keywords)


def run_torch_eager(data: WorkloadData, options: RunOptions, lane: Lane) -> Outcome:
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
    # The first pass of the stream, converted before the first segment; segments cycle through it.
    batches = [
        (torch.from_numpy(x.numpy()), torch.from_numpy(y.numpy()))
        for x, y in data.train.take(data.steps_per_epoch)
    ]
    position = 0
    final_loss = None
    for _ in range(lane.segments):
        lane.start()
        loss_sum = torch.zeros(())
        for _ in range(lane.steps):
            x, y = batches[position]
            position = (position + 1) % len(batches)
            optimizer.zero_grad()
            loss = loss_fn(torch_model(x), y)
            loss.backward()
            optimizer.step()
            loss_sum += loss.detach()
        final_loss = float(loss_sum) / lane.steps
        lane.stop()
    for layer, linear in zip(dense, linears, strict=True):
        layer.set_weights([linear.weight.detach().numpy().T, linear.bias.detach().numpy()])
    return Outcome(
        final_loss=final_loss,
        notes={"torch": torch.__version__, "torch_threads": torch.get_num_threads()},
        model=model,
    )


def run_step_only(data: WorkloadData, options: RunOptions, lane: Lane) -> Outcome:
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

    final_loss = None
    for _ in range(lane.segments):
        lane.start()
        for count in call_counts(lane.steps, options.steps_per_loop):
            loss = train_steps(tf.constant(count))
        final_loss = float(loss)  # host sync
        lane.stop()
    return Outcome(
        final_loss=final_loss, notes={"trace_count": int(train_steps.experimental_get_tracing_count())}
    )


def run_data_only(data: WorkloadData, options: RunOptions, lane: Lane) -> Outcome:
    """Only reads batches from the input pipeline (no model): the floor for a Python loop over it."""
    del options
    iterator = iter(data.train)
    for _ in range(lane.segments):
        lane.start()
        for _ in range(lane.steps):
            next(iterator)
        lane.stop()
    return Outcome()


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
            block_until_ready(logs)
            timer.end_call(1, 128, traced=False)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def _graph_loop_at(k: int) -> Variant:
    return Variant(
        f"graph_loop_k{k}",
        f"Trainer(steps_per_loop={k}): a fixed k for the auto goal",
        _trainer(steps_per_loop=k),
    )


# Ordered so that compared variants run next to each other.
VARIANTS: dict[str, Variant] = {
    variant.name: variant
    for variant in [
        Variant(
            "handwritten",
            "hand-written loop, @tf.function train_step(x, y)",
            _handwritten(use_tf_function=True),
        ),
        Variant("graph", "Trainer, tf.function, steps_per_loop=1", _trainer()),
        Variant("default", 'Trainer defaults: steps_per_loop="auto"', _trainer(steps_per_loop="auto")),
        Variant(
            "trainer_no_timing",
            "Trainer(measure_timing=False), otherwise graph",
            _trainer(measure_timing=False),
        ),
        Variant(
            "graph_no_sync",
            "Trainer(terminate_on_nan=False, measure_timing=False): no per-call host sync",
            _trainer(terminate_on_nan=False, measure_timing=False),
        ),
        Variant(
            "graph_checkpoint",
            "Trainer(model_dir=..., checkpoint_every_steps=N): checkpoints and TensorBoard files",
            run_graph_checkpoint,
        ),
        Variant(
            "handwritten_xla",
            "hand-written loop, @tf.function(jit_compile=True)",
            _handwritten(use_tf_function=True, jit_compile=True),
        ),
        Variant("xla", "Trainer(jit_compile=True)", _trainer(jit_compile=True)),
        Variant(
            "handwritten_loop",
            "hand-written loop, k steps per tf.function call (tf.range)",
            _handwritten(use_tf_function=True, loop=True),
        ),
        Variant("graph_loop", "Trainer(steps_per_loop=k)", _trainer_loop()),
        *(_graph_loop_at(k) for k in AUTO_REFERENCE_K),
        Variant("xla_loop", "Trainer(jit_compile=True, steps_per_loop=k)", _trainer_loop(jit_compile=True)),
        Variant("keras_fit", "model.fit, default compile settings", run_keras_fit),
        Variant(
            "keras_fit_spe",
            "model.fit, compile(steps_per_execution=k)",
            lambda data, options, lane: run_keras_fit(
                data, options, lane, steps_per_execution=options.steps_per_loop
            ),
        ),
        Variant(
            "keras_fit_timing",
            "model.fit(callbacks=[tftrain.callbacks.Timing()])",
            functools.partial(run_keras_fit, timing=True),
        ),
        Variant(
            "handwritten_eager",
            "hand-written loop without tf.function",
            _handwritten(use_tf_function=False),
            eager=True,
        ),
        Variant("eager", "Trainer(use_tf_function=False)", _trainer(use_tf_function=False), eager=True),
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
        Variant("data_only", "read batches from the input pipeline only, no model", run_data_only),
    ]
}
