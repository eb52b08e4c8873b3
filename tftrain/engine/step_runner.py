"""Turn a step function into an engine: eager, `tf.function`, XLA, or a k-step loop.

One place decides how a step runs (as Keras's `make_train_function` does):
`make_runner(step_fn, options, strategy)` returns a `StepRunner` whose call runs
up to `num_steps` steps on an iterator and reports how many ran. The step is
written once; only the wrapping differs between engines. `StepRunner.dispatch`
starts a call without waiting for the device; the returned `PendingCall`
reads its results once, when asked, so a caller can read call n after it has
dispatched call n+1 (the k-step loop itself is in `tftrain.engine.graph_loops`).
"""

from __future__ import annotations

import dataclasses
import functools
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from tftrain import distribute, timing
from tftrain.compat import keras_internals, tf_internals
from tftrain.engine import graph_loops, step_outputs
from tftrain.engine.calls import LoopResult, PendingCall, block_until_ready
from tftrain.fit_inputs import inputs
from tftrain.options import UNTESTED, EngineOptions, NonFinitePolicy

StepFn = Callable[[Any], Any]


def _reduce_outputs(outputs: Any, strategy: tf.distribute.Strategy) -> Any:
    """Per-replica step logs -> one value each (the mean over all replicas).

    A worker with one device gets plain tensors back from `strategy.run`, not
    `DistributedValues`; they are reduced too, or each worker of a multi-worker
    run would log only its own replicas' values.
    """

    def reduce(value):
        if isinstance(value, tf.distribute.DistributedValues | tf.Tensor | tf.Variable):
            return strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None)
        return value

    return tf.nest.map_structure(reduce, outputs)


def _tensor_logs(step_fn: StepFn) -> StepFn:
    """`step_fn`, the Python numbers among its logs made tensors, which `strategy.reduce` needs.

    Keras before 3.14 returns Python floats from `model.train_step` when it
    runs eagerly (`get_metrics_result` converts them).
    """

    def step(batch):
        return tf.nest.map_structure(
            lambda value: (
                tf.convert_to_tensor(value) if isinstance(value, int | float | np.generic) else value
            ),
            step_fn(batch),
        )

    return step


def _host_batch_size(batch: Any, strategy: tf.distribute.Strategy) -> int | None:
    """Examples in a batch as known on the host (all local replicas), or None."""
    first = tf.nest.flatten(batch)[0]
    if not isinstance(first, tf.distribute.DistributedValues):
        return timing.batch_size_of(first)
    sizes = [timing.batch_size_of(part) for part in strategy.experimental_local_results(first)]
    return None if None in sizes else sum(sizes)


def _nonfinite_on_host(logs: Any, loss_limit: float | None = None) -> bool:
    """Whether a loss log is NaN or infinite (or above `loss_limit`), tested on the host."""
    for value in graph_loops.loss_logs(logs):
        value = np.asarray(value, dtype=np.float64)
        if not np.all(np.isfinite(value)) or (loss_limit is not None and np.any(value > loss_limit)):
            return True
    return False


_SINGLE_STEP = (None, "iterator", "batch")


class StepRunner:
    """Runs up to `num_steps` steps on an iterator per call.

    With a `single_step` (the step is a `tf.function`) and one step per call
    on a plain `tf.data` iterator whose batches are known to be there, a call
    runs `graph_loops.make_single_step` through its concrete function: the
    batch is read in the graph (`"iterator"`), or in Python and the whole
    call compiled with XLA (`"batch"`).

    `nonfinite_policy` says what a non-finite loss does to a call: where it
    `stops`, the call ends at that step (and at a loss above its
    `loss_limit`); where it `flags` (see `past_nonfinite`), every step runs
    and the call's `LoopResult.nonfinite` says whether any had a non-finite
    loss; otherwise (`UNTESTED`) no loss is tested.

    The path a call takes (the collecting or the plain k-step loop in the
    graph, the compiled single step, or the host loop) is chosen once, when
    the loop is built; `dispatch` only calls it. What depends on the iterator
    (whether the single step can read its batches, whether collected outputs
    are dense) is decided on its first call and cached.

    Attributes:
        step: The compiled single step (`batch -> logs`).
        trace_counter: Counts traces of the step.
        in_graph: Whether the steps of one call run inside one `tf.function`.
        nonfinite_policy: What a non-finite loss does to a call (`tftrain.options.NonFinitePolicy`).
    """

    def __init__(
        self,
        step: StepFn,
        trace_counter: timing.TraceCounter,
        in_graph: bool,
        strategy: tf.distribute.Strategy,
        *,
        nonfinite_policy: NonFinitePolicy = UNTESTED,
        collect: bool = False,
        single_step: str | None = None,
    ):
        if single_step not in _SINGLE_STEP:
            raise ValueError(
                f"Invalid StepRunner arguments. Received: single_step={single_step!r}. "
                f"Expected single_step in {_SINGLE_STEP}."
            )
        self.step = step
        self.trace_counter = trace_counter
        self.strategy = strategy
        self.nonfinite_policy = nonfinite_policy
        self.collect = collect
        self.in_graph = in_graph
        self._single_step_kind = single_step
        self._loop_traces = 0
        self._graph_loop = None
        if in_graph and collect:
            self._graph_loop = graph_loops.make_collecting_graph_loop(step, strategy)
        elif in_graph:
            self._graph_loop = graph_loops.make_graph_loop(
                step, strategy, self._count_trace, nonfinite_policy=nonfinite_policy
            )
        self._single_step = None
        self._single_step_on_batch = single_step == "batch"  # the XLA single step takes the batch, not the iterator
        if single_step is not None and not in_graph and not collect:
            self._single_step = graph_loops.make_single_step(
                step, self._count_trace, nonfinite_policy=nonfinite_policy, jit_compile=self._single_step_on_batch
            )
        # Per iterator, held weakly (a finished pass's iterator and its buffers are
        # freed): the concrete functions by call kind (`_concrete`), and whether
        # the single step suits it.
        self._concrete_calls: dict[Any, tuple[Any, Any]] = {}
        self._suits: tuple[Any, bool] | None = None
        self._dense_by_input: dict[str, bool] = {}  # collect: whether a step's outputs suit the graph loop
        self._num_steps_cache: dict[int, tf.Tensor] = {}
        self._not_halted = tf.constant(False)  # `halted` for a call after a read one
        self._pipelines = self._graph_loop is not None and not collect
        # The call path, chosen once here (as Keras's `make_train_function`
        # chooses its function once); `dispatch` only calls it.
        self._host_call = self._choose_host_call()
        self._call = self._choose_call()

    def _choose_call(self) -> Callable[..., PendingCall]:
        """The path every call of this engine takes: `(iterator, num_steps, first, available, halted)`."""
        if self._graph_loop is not None:
            return self._collecting_call if self.collect else self._graph_call
        if self._single_step is not None:
            return self._single_or_host_call
        return self._host_call

    def _choose_host_call(self) -> Callable[..., PendingCall]:
        """How this engine runs steps from the host: flagging, guarding or neither, as it was built."""
        if self.nonfinite_policy.flags:
            return self._flagging_host_call
        if self.nonfinite_policy.stops and not self.collect:
            return self._guarded_host_call
        return self._plain_host_call

    def _count_trace(self) -> None:
        self._loop_traces += 1

    def past_nonfinite(self) -> StepRunner:
        """A training engine on the same compiled step whose calls run past a non-finite loss, flagging it.

        Each call runs all its steps (as `model.fit` does); its
        `LoopResult.nonfinite` says whether any of them had a NaN or infinite
        loss, and the next call runs. For a `fit` whose callbacks decide what
        a NaN does (Keras's `TerminateOnNaN`). The step is not traced again;
        the loop around it traces on its first call.
        """
        return StepRunner(
            self.step,
            self.trace_counter,
            self.in_graph,
            self.strategy,
            nonfinite_policy=dataclasses.replace(self.nonfinite_policy, callbacks_decide=True),
            collect=self.collect,
            single_step=self._single_step_kind,
        )

    @property
    def traces(self) -> int:
        """Traces of the step and of the loop around it (a call that traced is not steady state)."""
        return self.trace_counter.count + self._loop_traces

    @property
    def pipelines(self) -> bool:
        """Whether a call can be dispatched before the previous call's results are read (`dispatch`'s `after`)."""
        return self._pipelines

    def _dense_outputs(self, iterator: Any) -> bool:
        concrete = self.step.get_concrete_function(iterator.element_spec)
        specs = tf.nest.flatten(tf.nest.map_structure(tf.type_spec_from_value, concrete.structured_outputs))
        return all(type(spec) is tf.TensorSpec for spec in specs)

    @staticmethod
    def peek(iterator: Iterator[Any]) -> Any:
        """The iterator's next batch as a `tf.experimental.Optional` (empty at the end of the data).

        For data whose end no count announces: the caller learns whether a
        step can run before it calls a batch hook, and passes the Optional
        on as `first` so the batch is trained on, not lost.
        """
        return iterator.get_next_as_optional()

    def _count(self, num_steps: int) -> tf.Tensor:
        # A cached tensor: passing a fresh Python int would retrace each call.
        count = self._num_steps_cache.get(num_steps)
        if count is None:
            count = self._num_steps_cache[num_steps] = tf.constant(num_steps, tf.int32)
        return count

    def __call__(self, iterator: Iterator[Any], num_steps: int, first: Any = None) -> LoopResult:
        """Runs the steps and reads their results (`dispatch(...).result()`).

        Args:
            iterator: A `tf.data` (or distributed) iterator.
            num_steps: The most steps to run; fewer run if the data ends.
            first: A non-empty Optional from `peek`: the first step's batch.

        Returns:
            A `LoopResult`.
        """
        return self.dispatch(iterator, num_steps, first).result()

    def dispatch(
        self,
        iterator: Iterator[Any],
        num_steps: int,
        first: Any = None,
        *,
        available: bool = False,
        after: PendingCall | None = None,
    ) -> PendingCall:
        """Starts the steps without waiting for the device; `result()` of the returned call reads them.

        Args:
            iterator: A `tf.data` (or distributed) iterator.
            num_steps: The most steps to run; fewer run if the data ends.
            first: A non-empty Optional from `peek`: the first step's batch.
            available: The caller knows the iterator holds `num_steps` more
                batches (then each step fetches its batch directly).
            after: The previous call, if its results may still be unread:
                this call runs no step if that one stopped at a non-finite
                loss (needs `pipelines`; otherwise that call is read first).

        Returns:
            A `PendingCall`.
        """
        halted = self._not_halted
        if after is not None and not after.done:
            if after.halted is not None and self._pipelines:
                halted = after.halted  # the graph loop skips its steps if that call halted
            else:
                after.result()  # no in-graph way to skip this call after a non-finite one: read it now
        return self._call(iterator, num_steps, first, available, halted)

    def _graph_call(
        self, iterator: Any, num_steps: int, first: Any, available: bool, halted: tf.Tensor
    ) -> PendingCall:
        """The k-step loop in the graph; its result is read when asked (it pipelines)."""
        # The host knows the batches are there: each step reads its batch directly.
        counted = available and first is None and isinstance(iterator, tf.data.Iterator)
        args = (iterator, self._count(num_steps), halted, first, counted)
        counts, nonfinite, outputs = self._concrete(
            ("loop", first is not None, counted), iterator, self._graph_loop, *args
        )(*args)

        def read() -> LoopResult:
            steps, examples, flagged = (int(value) for value in counts.numpy())
            if steps == 0:
                return LoopResult(0, 0, None)
            logs = outputs if not isinstance(outputs, tf.experimental.Optional) else outputs.get_value()
            return LoopResult(steps, examples, logs, bool(flagged))

        logs = outputs if not isinstance(outputs, tf.experimental.Optional) else None
        return PendingCall(read, num_steps if counted and logs is not None else None, logs, nonfinite)

    def _collecting_call(
        self, iterator: Any, num_steps: int, first: Any, available: bool, halted: tf.Tensor
    ) -> PendingCall:
        """The collecting k-step loop in the graph, or the host loop for outputs it cannot hold."""
        # Per iterator (cached by element spec): a TensorArray holds dense tensors
        # only, so other outputs are joined on the host.
        key = repr(iterator.element_spec)
        dense = self._dense_by_input.get(key)
        if dense is None:
            dense = self._dense_by_input[key] = self._dense_outputs(iterator)
        if not dense:
            return self._host_call(iterator, num_steps, first, available, halted)
        # The host knows the batches are there: each step reads its batch directly.
        counted = available and first is None and isinstance(iterator, tf.data.Iterator)
        args = (iterator, self._count(num_steps), first, counted)
        steps, examples, outputs = self._concrete(
            ("collect", first is not None, counted), iterator, self._graph_loop, *args
        )(*args)
        return PendingCall(lambda: _collected(steps, examples, outputs), None, None)

    def _single_or_host_call(
        self, iterator: Any, num_steps: int, first: Any, available: bool, halted: tf.Tensor
    ) -> PendingCall:
        """The compiled single step where it can read the batch, else the host loop."""
        # Per iterator (cached in `_single_step_suits`): whether the graph can read its batches.
        if num_steps == 1 and (available or first is not None) and self._single_step_suits(iterator):
            return self._single_call(iterator, first)
        return self._host_call(iterator, num_steps, first, available, halted)

    def _single_step_suits(self, iterator: Any) -> bool:
        """Whether the in-graph single step can run on this iterator (a plain `tf.data` one, batched)."""
        if not isinstance(iterator, tf.data.Iterator):
            return False
        if self._suits is None or self._suits[0]() is not iterator:  # decided once per iterator
            first_spec = tf.nest.flatten(iterator.element_spec)[0]
            suits = type(first_spec) is tf.TensorSpec and first_spec.shape.rank not in (None, 0)
            self._suits = (weakref.ref(iterator), suits)
        return self._suits[1]

    def _concrete(self, key: Any, iterator: Any, function: Any, *trace_args: Any) -> Any:
        """`function`'s concrete function for `trace_args`, kept while the iterator is the same.

        A `tf.function` call matches its arguments against its traces again at
        every call, which costs more host time than a step of a small model
        (docs/benchmarks.md); calling the concrete function skips that. `key`
        names the call's kind and its Python arguments (a trace exists per value).
        """
        cached = self._concrete_calls.get(key)
        if cached is None or cached[0]() is not iterator:
            cached = (weakref.ref(iterator), function.get_concrete_function(*trace_args))
            self._concrete_calls[key] = cached
        return cached[1]

    def _single_call(self, iterator: tf.data.Iterator, first: Any) -> PendingCall:
        if self._single_step_on_batch:
            batch = next(iterator) if first is None else first.get_value()
            # Traced on the iterator's spec: a short last batch needs no new trace.
            counts, logs = self._concrete("single", iterator, self._single_step, iterator.element_spec)(batch)
        else:
            key = ("single", first is not None)
            counts, logs = self._concrete(key, iterator, self._single_step, iterator, first)(iterator, first)

        def read() -> LoopResult:
            _, examples, flagged = (int(value) for value in counts.numpy())
            return LoopResult(1, examples, logs, bool(flagged))

        return PendingCall(read, 1, logs)

    def _flagging_host_call(
        self, iterator: Any, num_steps: int, first: Any, available: bool, halted: tf.Tensor
    ) -> PendingCall:
        """Host steps that run past a non-finite loss; the result says whether any step had one."""
        result, seen = self._host_loop(iterator, num_steps, first)
        return PendingCall(lambda: _waited(result)._replace(nonfinite=bool(seen)), result.steps, result.logs)

    def _guarded_host_call(
        self, iterator: Any, num_steps: int, first: Any, available: bool, halted: tf.Tensor
    ) -> PendingCall:
        """Host steps that stop at a non-finite loss; the last step's loss is tested with the result."""
        result, _ = self._host_loop(iterator, num_steps, first)
        if not result.steps or result.nonfinite:
            return PendingCall(lambda: _waited(result), result.steps, result.logs)
        # The last step's loss is read with the result: that read is the call's one wait for the device.
        return PendingCall(
            lambda: result._replace(nonfinite=_nonfinite_on_host(result.logs, self.nonfinite_policy.loss_limit)),
            result.steps,
            result.logs,
        )

    def _plain_host_call(
        self, iterator: Any, num_steps: int, first: Any, available: bool, halted: tf.Tensor
    ) -> PendingCall:
        """Host steps with no loss test at the end of the call."""
        result, _ = self._host_loop(iterator, num_steps, first)
        return PendingCall(lambda: _waited(result), result.steps, result.logs)

    def _host_loop(self, iterator: Iterator[Any], num_steps: int, first: Any) -> tuple[LoopResult, Any]:
        """Runs the steps from the host: the result, and (where the policy `flags`) whether any loss was not finite.

        The flag is a tensor, read with the result: testing each step's loss
        does not wait for the device. Where the policy `stops`, each step's
        loss but the last is tested on the host (the last one's with the
        call's result, `_guarded_host_call`).
        """
        policy = self.nonfinite_policy
        flags, stops, loss_limit = policy.flags, policy.stops, policy.loss_limit
        steps, examples, logs, collected, collect = 0, 0, None, [], self.collect
        seen = tf.constant(False) if flags else None
        for index in range(num_steps):
            if first is not None:
                batch, first = first.get_value(), None
            else:
                try:
                    batch = next(iterator)
                except (StopIteration, tf.errors.OutOfRangeError):
                    break
            logs = self.step(batch)
            steps += 1
            if collect:
                collected.append(logs)
            size = _host_batch_size(batch, self.strategy)
            examples = None if examples is None or size is None else examples + size
            if flags:
                seen = tf.logical_or(seen, tf.logical_not(graph_loops.finite_in_graph(logs)))
            if stops and index + 1 < num_steps and _nonfinite_on_host(logs, loss_limit):
                return LoopResult(steps, examples, logs, True), seen
        return LoopResult(steps, examples, collected if collect else logs), seen


def _waited(result: LoopResult) -> LoopResult:
    block_until_ready(result.logs)
    return result


def _collected(steps: tf.Tensor, examples: tf.Tensor, outputs: Any) -> LoopResult:
    steps = int(steps)
    return LoopResult(0, 0, None) if steps == 0 else LoopResult(steps, int(examples), [outputs])


def _keras_batch(step_fn: StepFn) -> StepFn:
    """The step, given batches as Keras's steps get them (empty Optionals as None)."""

    @functools.wraps(step_fn)
    def step(batch):
        return step_fn(inputs.optionals_to_none(batch))

    return step


def _counted(step_fn: StepFn, step_counter: tf.Variable) -> StepFn:
    """The step, preceded by one increment of the step counter (once per step, not per replica)."""

    @functools.wraps(step_fn)
    def step(batch):
        step_counter.assign_add(1)
        return step_fn(batch)

    return step


def make_runner(
    step_fn: StepFn,
    options: EngineOptions,
    strategy: tf.distribute.Strategy | None = None,
    name: str = "train_step",
    nonfinite_policy: NonFinitePolicy = UNTESTED,
    collect: bool = False,
    step_counter: tf.Variable | None = None,
    autograph: bool = False,
    single_device: bool | None = None,
) -> StepRunner:
    """Builds the engine for one step function.

    Args:
        step_fn: `batch -> dict of logs` (with `collect`: `batch -> predictions`), written for one replica.
        options: The engine.
        strategy: Runs the step on each replica (`strategy.run`) and averages
            per-replica outputs. None means the current strategy.
        name: The step's name for trace warnings.
        nonfinite_policy: What a training call does at a step whose loss (a
            `loss` or `*_loss` log) blows up: where it `stops`, the call
            stops right after that step and flags it in the result (an
            in-graph check inside a k-step loop); where it `flags`, every
            step runs and the result flags any. `UNTESTED`: no loss is tested.
        collect: Keep every step's outputs, not only the last (`predict`):
            replica outputs are concatenated in example order rather than
            averaged, and a k-step call joins its steps' outputs in the graph.
        step_counter: An integer variable (the run's global step) incremented
            in the graph before each step, so `tf.summary` calls inside the
            step see the number of the step they belong to (1-based).
        autograph: `step_fn` is user code that may need AutoGraph (Python
            control flow on tensors): under `tf.function` it is converted,
            once, here. The library's own code around it never is (every
            `tf.function` of the engine has `autograph=False`, as Keras marks
            its step and loop functions `do_not_convert`).
        single_device: Whether `strategy` is the default strategy, where the
            caller resolved it once (`Engines.default_strategy`); None: asked here.

    Returns:
        A `StepRunner`.

    Raises:
        ValueError: XLA was asked for under a strategy over several CPU devices.
        TypeError: (when the step traces, or at its first eager call) the
            step returns something else than a dict of logs, or, with
            `collect`, None among its predictions (`tftrain.engine.step_outputs`).
    """
    strategy = strategy or tf.distribute.get_strategy()
    counter = timing.TraceCounter(name)
    in_graph = options.in_graph_loop
    label = step_outputs.step_label(step_fn, name)
    if autograph and options.use_tf_function:
        step_fn = tf_internals.autograph_converted(step_fn)
    step_fn = step_outputs.returns_checked(_keras_batch(step_fn), label, predictions=collect)

    # Without a strategy, `strategy.run` only adds host work (autograph
    # conversion, replica-context push/pop), which is felt in eager mode.
    def runner(step: StepFn, single_step: str | None = None) -> StepRunner:
        return StepRunner(
            step, counter, in_graph, strategy, nonfinite_policy=nonfinite_policy, collect=collect,
            single_step=single_step,
        )  # fmt: skip

    if single_device is None:
        single_device = distribute.is_default_strategy(strategy)
    if single_device:
        step = counter.wrap(step_fn if step_counter is None else _counted(step_fn, step_counter))
        if not options.use_tf_function:
            return runner(step)
        step = tf.function(step, reduce_retracing=True, jit_compile=options.jit_compile, autograph=False)
        return runner(step, "batch" if options.jit_compile else "iterator")

    devices = strategy.extended.worker_devices
    if options.jit_compile and len(devices) > 1 and all("CPU" in device.upper() for device in devices):
        raise ValueError(
            "Invalid combination of arguments. Received: jit_compile=True with a strategy over "
            f"{len(devices)} CPU devices ({', '.join(devices)}). XLA cannot run one replica per "
            "logical CPU device: TensorFlow places every compiled replica on the first CPU, away "
            "from its variables. Expected jit_compile=False here; XLA works under a strategy "
            "over GPUs or TPUs, or on one CPU device."
        )
    # XLA compiles the per-replica step: a cluster cannot span the replicas'
    # devices, so `strategy.run` and the cross-replica reduction stay outside it.
    replica_step = step_fn if collect else _tensor_logs(step_fn)
    if options.jit_compile:
        replica_step = tf.function(step_fn, reduce_retracing=True, jit_compile=True, autograph=False)

    def replicated_step(batch):
        outputs = strategy.run(replica_step, args=(batch,))
        if collect:
            return keras_internals.concat_replica_outputs(outputs, strategy)
        return _reduce_outputs(outputs, strategy)

    # Counted in the cross-replica context, outside `strategy.run`: once per step, not per replica.
    step = counter.wrap(replicated_step if step_counter is None else _counted(replicated_step, step_counter))
    if options.use_tf_function:
        step = tf.function(step, reduce_retracing=True, autograph=False)
    return runner(step)
