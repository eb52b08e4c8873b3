"""Built-in timing: host-call timer, trace counting, the report, a Keras callback.

Every `Trainer.fit` measures itself with these pieces, and `Timing` gives the
same report for `keras.Model.fit`. The clock is `time.perf_counter` (monotonic)
and each host call is timed only after its outputs are available on the host,
so device work is not under-counted on asynchronous devices.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import types
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tftrain.options import EngineOptions

# A step function that traced this many times is called "retracing" and warned
# about once, naming what changed. Two traces are normal: the first batch, and a
# relaxed shape after a partial last batch (`reduce_retracing=True`).
RETRACE_WARNING_THRESHOLD = 4

# Step times kept in a checkpoint's timing state (the median of a resumed run
# is taken over these).
MAX_SAVED_STEP_TIMES = 10_000


@dataclasses.dataclass(frozen=True)
class TimingReport:
    """What one `fit` measured.

    Attributes:
        first_step_s: Seconds of the first host call: tracing, compiling and
            running it. With `steps_per_loop=k` that call runs k steps.
        step_time_median_s: Median seconds per training step in steady state
            (host calls after the first one that did not trace).
        step_time_p90_s: 90th percentile of the same.
        examples_per_sec: Examples per second in steady state.
        steps: Training steps run (each step of a k-step loop counts).
        trace_count: How many times the training step function was traced.
        checkpoint_saves: Checkpoints written during the run (Trainer with a
            `model_dir`; 0 otherwise).
        checkpoint_save_median_s: Median seconds one checkpoint save took
            (outside the step times above), or None without saves.
        engine: The engine the training steps ran under, after every
            `"auto"` was resolved (`EngineOptions.ran_name`): e.g. `"graph"`,
            `"xla+loop4"`, `"graph+loop20 (auto)"` (the k that
            `steps_per_loop="auto"` chose), `"eager"`. Under `model.fit`
            (`Timing`): the engine Keras ran, from the model's `run_eagerly`,
            resolved `jit_compile` and `steps_per_execution`. None if unknown.
        flops_per_step: Floating-point operations of one training step (all
            replicas), counted from the traced step
            (`Trainer(count_flops=True)`, `tftrain.engine.flops`); None when
            not asked for or not countable (a warning says why).
        flops_per_sec: `flops_per_step / step_time_median_s`: FLOP/s in
            steady state, or None.
        peak_flops: Peak FLOP/s of all the devices the run used (the
            `Trainer`'s `peak_flops`, or `tftrain.engine.peak_flops`'s table
            for the model's compute dtype), or None if unknown.
        utilization: `flops_per_sec / peak_flops` (model FLOPs utilisation,
            0 to 1), or None.
    """

    first_step_s: float | None = None
    step_time_median_s: float | None = None
    step_time_p90_s: float | None = None
    examples_per_sec: float | None = None
    steps: int = 0
    trace_count: int = 0
    checkpoint_saves: int = 0
    checkpoint_save_median_s: float | None = None
    engine: str | None = None
    flops_per_step: float | None = None
    flops_per_sec: float | None = None
    peak_flops: float | None = None
    utilization: float | None = None

    def with_flops(self, flops_per_step: float | None, peak_flops: float | None) -> TimingReport:
        """This report with the FLOP fields filled from one step's FLOPs and the devices' peak.

        Args:
            flops_per_step: FLOPs of one training step, or None if unknown.
            peak_flops: Peak FLOP/s of the devices the run used, or None.

        Returns:
            A new report: `flops_per_sec` is `flops_per_step` over the median
            step time (None without either), `utilization` is `flops_per_sec`
            over `peak_flops` (None without either).
        """
        per_sec = None
        if flops_per_step is not None and self.step_time_median_s:
            per_sec = flops_per_step / self.step_time_median_s
        return dataclasses.replace(
            self,
            flops_per_step=flops_per_step,
            flops_per_sec=per_sec,
            peak_flops=peak_flops,
            utilization=None if per_sec is None or not peak_flops else per_sec / peak_flops,
        )

    def to_dict(self) -> dict[str, Any]:
        """Returns the report as a plain dict (JSON-serializable)."""
        return dataclasses.asdict(self)

    def summary(self) -> str:
        """Renders the report as a short two-column table.

        The engine first, where known; FLOPs per step, FLOP/s and the
        utilisation after examples/sec, where counted (`count_flops=True`).
        """
        rows = [] if self.engine is None else [("engine", self.engine)]
        rows += [
            ("steps", str(self.steps)),
            ("trace count", str(self.trace_count)),
            ("first step (trace+compile+run)", _format_seconds(self.first_step_s)),
            ("step time median", _format_seconds(self.step_time_median_s)),
            ("step time p90", _format_seconds(self.step_time_p90_s)),
            (
                "examples/sec",
                "n/a" if self.examples_per_sec is None else f"{self.examples_per_sec:,.1f}",
            ),
        ]
        if self.flops_per_step is not None:  # asked for and counted (`count_flops=True`)
            rows.append(("FLOPs per step", _format_flops(self.flops_per_step, "FLOP")))
            rows.append(("FLOP/s", _format_flops(self.flops_per_sec, "FLOP/s")))
        if self.utilization is not None:
            rows.append(
                ("utilisation", f"{self.utilization:.1%} of {_format_flops(self.peak_flops, 'FLOP/s')}")
            )
        if self.checkpoint_saves:
            rows.append(
                (
                    f"checkpoint save median ({self.checkpoint_saves} saves)",
                    _format_seconds(self.checkpoint_save_median_s),
                )
            )
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _format_flops(value: float | None, unit: str) -> str:
    """E.g. `_format_flops(1.234e12, "FLOP/s")` -> "1.23 TFLOP/s"."""
    if value is None:
        return "n/a"
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


@tf.autograph.experimental.do_not_convert
def describe_arguments(args: Any) -> dict[str, str]:
    """Describes a step's arguments as `{path: "dtype[shape]" or repr}`.

    Used at trace time, where tensors are symbolic: their dtype and shape are
    what decides whether `tf.function` retraces.
    """
    described = {}
    for path_parts, value in keras.tree.flatten_with_path(args):
        path = "".join(f"[{part!r}]" for part in path_parts)
        if isinstance(value, (tf.Tensor, tf.Variable)) or hasattr(value, "shape"):
            shape = getattr(value, "shape", ())
            rank_known = getattr(shape, "rank", 0) is not None  # a relaxed retrace may drop the rank
            dtype = getattr(getattr(value, "dtype", None), "name", str(getattr(value, "dtype", "")))
            described[path] = f"{dtype}{list(shape)}" if rank_known else f"{dtype}[unknown rank]"
        else:
            described[path] = f"python value {value!r}"
    return described


class TraceCounter:
    """Counts how often a step function traces and names what changed.

    `wrap(fn)` returns a function to hand to `tf.function`: its Python body
    runs only while tracing, so counting there costs nothing at run time.

    Args:
        name: The function's name, used in the retracing warning.
        argument_name: What the traced argument is called for users.
    """

    def __init__(self, name: str = "train_step", argument_name: str = "batch"):
        self.name = name
        self.argument_name = argument_name
        self.count = 0
        self._last_signature: dict[str, str] | None = None
        self._warned = False
        self._graphs: list[weakref.ref] = []  # the graph of each trace, held weakly

    def traced_graphs(self) -> list[tf.Graph]:
        """The graphs the function traced into, oldest first (those still alive: `tf.function` keeps them).

        What `tftrain.engine.flops` counts, so that counting never traces again.
        """
        graphs = [reference() for reference in self._graphs]
        return [graph for graph in graphs if graph is not None]

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Returns `fn` with trace counting around it."""

        def counted(*args):
            if not tf.executing_eagerly():
                self._record(args[0] if len(args) == 1 else args)
            return fn(*args)

        # TensorFlow's own retracing warning names the function by these.
        counted.__name__ = getattr(fn, "__name__", self.name)
        counted.__qualname__ = getattr(fn, "__qualname__", counted.__name__)
        return counted

    @tf.autograph.experimental.do_not_convert
    def _record(self, args: Any) -> None:
        signature = describe_arguments(args)
        changes = _signature_changes(self._last_signature, signature, self.argument_name)
        self._last_signature = signature
        self.count += 1
        self._graphs.append(weakref.ref(tf.compat.v1.get_default_graph()))  # the graph being traced
        if self.count >= RETRACE_WARNING_THRESHOLD and not self._warned:
            self._warned = True
            what = "; ".join(changes) if changes else "no argument changed (a new Python object or closure?)"
            warnings.warn(
                f"`{self.name}` has traced {self.count} times, which is slow. The last retrace "
                f"saw a change in {what}. Keep shapes and dtypes stable "
                "(e.g. `dataset.batch(..., drop_remainder=True)`), and pass changing Python "
                "numbers as tensors.",
                stacklevel=2,
            )


def _signature_changes(before: dict[str, str] | None, after: dict[str, str], argument_name: str) -> list[str]:
    if before is None:
        return []
    changes = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path, "missing"), after.get(path, "missing")
        if old != new:
            changes.append(f"{argument_name}{path}: {old} -> {new}")
    return changes


def batch_size_of(batch: Any) -> int | None:
    """The leading dimension of a batch's first tensor, if known on the host."""
    for value in tf.nest.flatten(batch):
        shape = getattr(value, "shape", None)
        if shape is not None and len(shape) > 0 and shape[0] is not None:
            return int(shape[0])
    return None


class StepTimer:
    """Times host calls; each call runs one or more training steps.

    Call `begin_call()` before a host call and `end_call(...)` once its
    outputs have been read on the host. Calls may overlap: a call started
    before the previous one's outputs were read (`Trainer.fit` reads a call's
    results after it has dispatched the next) is timed from that read, so
    each call's time is the interval between two reads, and the steady
    times add up to the wall time with no extra sync.
    """

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        """Forgets everything measured."""
        self.first_call_s: float | None = None
        self.step_times: list[float] = []
        self.steady_seconds = 0.0
        self.steady_examples = 0
        self.steady_examples_known = True
        self.steps = 0
        self.checkpoint_save_times: list[float] = []
        self._largest_batch: int | None = None  # the most examples a one-step call ran
        self._largest_mean_batch = 0.0  # the most examples per step of any call
        self._start: float | None = None
        self._in_flight = 0  # calls begun and not yet ended
        self._window = [0, 0, 0.0, True]  # steady steps, examples, seconds, examples known

    def begin_call(self) -> None:
        """Starts the clock for one host call (if another is in flight, its end starts this one's)."""
        if not self._in_flight:
            self._start = time.perf_counter()
        self._in_flight += 1

    def exclude(self, seconds: float) -> None:
        """Leaves `seconds` spent inside the current call out of its time (e.g. a callback hook)."""
        if self._start is not None:
            self._start += seconds

    def end_call(self, steps: int, examples: int | None, traced: bool) -> None:
        """Stops the clock and files the call.

        Args:
            steps: Training steps the call ran.
            examples: Examples those steps consumed, or None if unknown.
            traced: Whether the step function traced during the call; such
                calls are not steady state.
        """
        now = time.perf_counter()
        elapsed = now - self._start
        self._start = now  # a call still in flight is timed from here
        self._in_flight = max(self._in_flight - 1, 0)
        if steps <= 0:
            return
        self.steps += steps
        if examples is not None:
            if steps == 1:
                self._largest_batch = max(self._largest_batch or 0, examples)
            self._largest_mean_batch = max(self._largest_mean_batch, examples / steps)
        if self.first_call_s is None:
            self.first_call_s = elapsed
            return
        if traced:
            return
        self.step_times.append(elapsed / steps)
        self.steady_seconds += elapsed
        if examples is None:
            self.steady_examples_known = False
        else:
            self.steady_examples += examples
        self._window[0] += steps
        self._window[1] += examples or 0
        self._window[2] += elapsed
        self._window[3] = self._window[3] and examples is not None

    @property
    def full_batch_size(self) -> int | None:
        """The examples of a full training step, as this run's host calls showed them; None if unsure.

        The most examples a one-step call ran, provided no call averaged more
        examples per step (a k-step call says only its total). Calls whose
        examples were unknown are left out.
        """
        if self._largest_batch is None or self._largest_mean_batch > self._largest_batch:
            return None
        return self._largest_batch

    def record_checkpoint_save(self, seconds: float) -> None:
        """Files the wall time of one checkpoint save (kept apart from step times)."""
        self.checkpoint_save_times.append(seconds)

    def take_window(self) -> dict[str, float]:
        """Steady-state rates since the previous call (for periodic summaries).

        Returns:
            `steps_per_sec`, `examples_per_sec` (if the batch sizes were known)
            and `step_time_s` (mean seconds per step); empty if no steady-state
            call ran since the previous call.
        """
        steps, examples, seconds, examples_known = self._window
        self._window = [0, 0, 0.0, True]
        if steps == 0 or seconds <= 0:
            return {}
        rates = {"steps_per_sec": steps / seconds, "step_time_s": seconds / steps}
        if examples_known:
            rates["examples_per_sec"] = examples / seconds
        return rates

    def state_dict(self) -> dict[str, Any]:
        """What was measured, as JSON-serializable values (saved with checkpoints).

        At most the last `MAX_SAVED_STEP_TIMES` step times are kept.
        """
        return {
            "first_call_s": self.first_call_s,
            "step_times": self.step_times[-MAX_SAVED_STEP_TIMES:],
            "steady_seconds": self.steady_seconds,
            "steady_examples": self.steady_examples,
            "steady_examples_known": self.steady_examples_known,
            "steps": self.steps,
            "checkpoint_save_times": self.checkpoint_save_times[-MAX_SAVED_STEP_TIMES:],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from a `state_dict()` (a resumed run's report covers the whole run)."""
        self.reset()
        self.first_call_s = state["first_call_s"]
        self.step_times = list(state["step_times"])
        self.steady_seconds = float(state["steady_seconds"])
        self.steady_examples = int(state["steady_examples"])
        self.steady_examples_known = bool(state["steady_examples_known"])
        self.steps = int(state["steps"])
        # Absent in checkpoints written before save times were measured.
        self.checkpoint_save_times = list(state.get("checkpoint_save_times", []))

    def report(self, trace_count: int, engine: str | None = None) -> TimingReport:
        """Builds the report from what was measured.

        Args:
            trace_count: How many times the step function traced.
            engine: The name of the engine that ran (see `TimingReport.engine`).
        """
        median = p90 = throughput = None
        if self.step_times:
            median = statistics.median(self.step_times)
            p90 = float(np.percentile(self.step_times, 90))
            if self.steady_examples_known and self.steady_seconds > 0:
                throughput = self.steady_examples / self.steady_seconds
        return TimingReport(
            first_step_s=self.first_call_s,
            step_time_median_s=median,
            step_time_p90_s=p90,
            examples_per_sec=throughput,
            steps=self.steps,
            trace_count=trace_count,
            checkpoint_saves=len(self.checkpoint_save_times),
            checkpoint_save_median_s=(
                statistics.median(self.checkpoint_save_times) if self.checkpoint_save_times else None
            ),
            engine=engine,
        )


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
        hook = getattr(model, "_tftrain_timing_hook", None)
        if hook is None:
            hook = _install_timing_hook(model)
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
            steps=int(steps),
            examples=int(examples),
            traced=self._counter.count != self._traces_at_call_start,
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
