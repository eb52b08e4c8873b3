"""The in-graph engine: up to `num_steps` steps of a step function in one `tf.function` call.

`make_graph_loop` builds one `tf.while_loop` over the iterator whose body is
the step and as little else as the features allow. Two choices are made when
the loop traces, each the cheaper one where it is safe:

- Where the batches come from. `counted=True`: the host knows the iterator
  holds `num_steps` more batches (a plain `tf.data` iterator of a pass of known
  length, or of endless data), so each iteration calls `get_next()` at its
  start, as a hand-written `tf.range` loop does: no `Optional` per batch, no
  `tf.cond` per step, and no batch is fetched that is not trained on.
  Otherwise the next batch is peeked as an `Optional`, fetched only when it
  will be used, so the data may end inside the call (Keras's
  `multi_step_on_iterator` works this way).
- How the last step's logs are carried. Dense logs of a fixed shape are plain
  loop variables (zeros before the first step); other logs are boxed in an
  `Optional` each step.

Once per call, not per step: the example count where the batch size is
static (steps x batch size), the non-finite test of the last step's logs, and
packing steps, examples and that test into one tensor, so that the host reads
a call's result with one transfer. Per step, where the `NonFinitePolicy`
`stops`, only the loss's `is_finite` test remains: the loop stops right after
the first non-finite step. Where it `flags` instead (a `fit` whose callbacks
decide, Keras's `TerminateOnNaN`), every step runs and the test of each is
kept: the call flags whether any of its steps had a non-finite loss.

The loop also takes `halted`: the non-finite flag of a previous call whose
result the host has not read yet. A call dispatched after a non-finite one
runs no step, so reading results one call late (`StepRunner.dispatch`) trains
exactly the steps a synchronous loop would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tftrain.fit_inputs import inputs
from tftrain.options import NonFinitePolicy

StepFn = Callable[[Any], Any]


def is_loss_key(key: str) -> bool:
    """Whether a log is a loss the non-finite guard watches: `loss` or `*_loss`."""
    return key == "loss" or key.endswith("_loss")


def loss_logs(logs: Any) -> list[Any]:
    """The values of a step's loss logs (`loss`, `*_loss`); none unless the logs are a dict."""
    if not isinstance(logs, dict):
        return []
    return [value for key, value in logs.items() if isinstance(key, str) and is_loss_key(key)]


def finite_in_graph(logs: Any, loss_limit: float | None = None) -> tf.Tensor:
    """In-graph: whether every loss in the logs is finite (a scalar loss costs one op).

    With `loss_limit`, a loss above it counts as not finite too (a blow-up:
    `Trainer(loss_spike_threshold=...)`).
    """
    checks = []
    for value in loss_logs(logs):
        value = tf.convert_to_tensor(value)
        if not value.dtype.is_floating:
            continue  # an integer loss cannot be NaN or infinite
        finite = tf.math.is_finite(value)
        if loss_limit is not None:
            finite = tf.logical_and(finite, value <= tf.cast(loss_limit, value.dtype))
        checks.append(finite if value.shape.rank == 0 else tf.reduce_all(finite))
    if not checks:
        return tf.constant(True)
    return checks[0] if len(checks) == 1 else tf.reduce_all(tf.stack(checks))


def examples_in(batch: Any, strategy: tf.distribute.Strategy) -> tf.Tensor:
    """In-graph count of the examples in a batch (its first tensor's rows, all local replicas)."""
    parts = strategy.experimental_local_results(tf.nest.flatten(batch)[0])
    return tf.add_n([inputs.examples_in_batch(part) for part in parts])


def static_batch_size(element_spec: Any) -> int | None:
    """The examples per batch if every batch has the same, known size (plain iterators only)."""
    first = tf.nest.flatten(element_spec)[0]
    if type(first) is not tf.TensorSpec or first.shape.rank in (None, 0):
        return None
    return first.shape[0]


def plain_logs_spec(output_spec: Any) -> list[tf.TensorSpec] | None:
    """The flat specs of a step's logs if they can be plain loop variables (dense, fixed shape), else None."""
    specs = tf.nest.flatten(output_spec)
    for spec in specs:
        if type(spec) is not tf.TensorSpec or not spec.shape.is_fully_defined():
            return None
        if not (spec.dtype.is_floating or spec.dtype.is_integer or spec.dtype == tf.bool):
            return None
    return specs


def make_graph_loop(
    step: StepFn,
    strategy: tf.distribute.Strategy,
    on_trace: Callable[[], None],
    *,
    nonfinite_policy: NonFinitePolicy,
):
    """A `tf.function` `(iterator, num_steps, halted, peeked=None, counted=False) -> (counts, nonfinite, logs)`.

    Args:
        step: The compiled step (`batch -> logs`).
        strategy: The strategy the batches are distributed by (for the example count).
        on_trace: Called each time the loop traces (not the step: its own counter counts it).
        nonfinite_policy: Where it `stops`, stop right after a step whose
            loss is not finite (or above its `loss_limit`). Where it `flags`,
            run every step, and flag in `counts[2]` whether any step's loss
            was not finite; the returned `nonfinite` stays False, so the next
            call runs.

    The returned `counts` is an int64 vector `[steps, examples, nonfinite]`;
    `nonfinite` (a bool) is the last step's test, to pass on as the next
    call's `halted`; `logs` are the last step's logs, as a structure when
    they are carried plainly or as an `Optional` otherwise.
    """
    stops, loss_limit = nonfinite_policy.stops, nonfinite_policy.loss_limit

    def loop(iterator, num_steps, halted, peeked=None, counted=False):
        on_trace()
        concrete = step.get_concrete_function(iterator.element_spec)
        output_spec = tf.nest.map_structure(tf.type_spec_from_value, concrete.structured_outputs)
        plain = plain_logs_spec(output_spec)
        batch_size = (
            static_batch_size(iterator.element_spec) if isinstance(iterator, tf.data.Iterator) else None
        )
        steps_to_run = tf.where(halted, 0, num_steps)
        counted = counted and plain is not None  # the NaN test in the condition reads plain logs

        def carry(logs):
            if plain is not None:
                return tf.nest.flatten(logs)
            return [tf.experimental.Optional.from_value(logs)]

        def carried_logs(carried):
            if plain is not None:
                return tf.nest.pack_sequence_as(output_spec, carried)
            return carried[0].get_value()

        def count(examples, batch):
            return examples if batch_size is not None else examples + examples_in(batch, strategy)

        def flagged(rest, logs):
            """Where the policy `flags`, the loop variable `seen` (first of `rest`), updated with this step's test."""
            if not nonfinite_policy.flags:
                return []
            return [tf.logical_or(rest[0], tf.logical_not(finite_in_graph(logs, loss_limit)))]

        if counted:

            def cond(i, examples, *rest):
                del examples
                going = i < steps_to_run
                if stops:  # the logs carried before the first step are placeholders, not a step's
                    tested = tf.logical_or(tf.equal(i, 0), finite_in_graph(carried_logs(rest), loss_limit))
                    return tf.logical_and(going, tested)
                return going

            def body(i, examples, *rest):
                batch = iterator.get_next()
                logs = step(batch)
                return (i + 1, count(examples, batch), *flagged(rest, logs), *carry(logs))

        else:

            def cond(i, examples, next_batch, *rest):
                del i, examples, rest
                return next_batch.has_value()

            def body(i, examples, next_batch, *rest):
                batch = next_batch.get_value()
                logs = step(batch)
                going = i + 1 < steps_to_run
                if stops:
                    going = tf.logical_and(going, finite_in_graph(logs, loss_limit))
                # Fetch a batch only if it will be used: a fetched batch that is not trained on is lost.
                following = tf.cond(going, iterator.get_next_as_optional, lambda: _empty(iterator))
                return (i + 1, count(examples, batch), following, *flagged(rest, logs), *carry(logs))

        if plain is not None:
            initial_logs = [tf.zeros(spec.shape, spec.dtype) for spec in plain]
        else:
            initial_logs = [tf.experimental.Optional.empty(output_spec)]
        if nonfinite_policy.flags:
            initial_logs = [tf.constant(False), *initial_logs]  # `seen`, before the logs
        if counted:
            loop_vars = [tf.constant(0), tf.constant(0, tf.int64), *initial_logs]
        else:
            if peeked is None:
                first = tf.cond(steps_to_run > 0, iterator.get_next_as_optional, lambda: _empty(iterator))
            else:
                first = tf.cond(halted, lambda: _empty(iterator), lambda: peeked)
            loop_vars = [tf.constant(0), tf.constant(0, tf.int64), first, *initial_logs]
        outputs = tf.while_loop(cond, body, loop_vars=loop_vars)
        steps, examples, carried = outputs[0], outputs[1], outputs[2 if counted else 3 :]
        if batch_size is not None:
            examples = tf.cast(steps, tf.int64) * batch_size
        if nonfinite_policy.flags:
            seen, carried = carried[0], carried[1:]
            logs = carried_logs(carried) if plain is not None else carried[0]
            counts = tf.stack([tf.cast(steps, tf.int64), examples, tf.cast(seen, tf.int64)])
            return counts, tf.constant(False), logs
        if plain is not None:
            logs = carried_logs(carried)
            nonfinite = tf.logical_not(finite_in_graph(logs, loss_limit)) if stops else tf.constant(False)
            nonfinite = tf.logical_and(steps > 0, nonfinite)
        else:
            logs = carried[0]
            nonfinite = tf.constant(False)
            if stops:
                nonfinite = tf.cond(
                    logs.has_value(),
                    lambda: tf.logical_not(finite_in_graph(logs.get_value(), loss_limit)),
                    lambda: False,
                )
        counts = tf.stack([tf.cast(steps, tf.int64), examples, tf.cast(nonfinite, tf.int64)])
        return counts, nonfinite, logs

    return tf.function(loop, reduce_retracing=True, autograph=False)


def make_single_step(
    step: StepFn,
    on_trace: Callable[[], None],
    *,
    nonfinite_policy: NonFinitePolicy,
    jit_compile: bool = False,
):
    """A `tf.function` for one step per host call that returns `(counts, logs)`.

    For a plain `tf.data` iterator at one step per call, where the host knows
    the batch is there (a counted pass, or a batch peeked as `peeked`), as
    the k-step loop's `counted` path does. The example count and the
    non-finite test come back packed in `counts` (as the k-step loop's), so
    the host reads a call's result with one transfer. The caller calls its
    concrete function directly (see `StepRunner`), skipping `tf.function`'s
    per-call argument matching.

    Without `jit_compile` the function is `(iterator, peeked=None)`: it reads
    the batch in the graph, so the host also skips rebuilding the batch's
    structure after `next(iterator)`. With it, the function is `(batch)`,
    compiled whole with XLA: a compiled step called from a graph that reads
    the batch costs more host CPU than the compiled function called on a
    batch fetched in Python (docs/benchmarks.md).

    Args:
        step: The compiled step (`batch -> logs`).
        on_trace: Called each time the function traces.
        nonfinite_policy: Where it `stops` or `flags`, test the step's loss
            (against its `loss_limit` too); the flag is `counts[2]` (one step
            per call: there is nothing to stop).
        jit_compile: The step is XLA-compiled (see above).

    The returned `counts` is an int64 vector `[1, examples, nonfinite]`.
    """

    tested, loss_limit = nonfinite_policy.stops or nonfinite_policy.flags, nonfinite_policy.loss_limit

    def counted_step(batch, batch_size):
        logs = step(batch)
        nonfinite = tf.logical_not(finite_in_graph(logs, loss_limit)) if tested else tf.constant(False)
        examples = (
            tf.constant(batch_size, tf.int64) if batch_size is not None else inputs.examples_in_batch(batch)
        )
        return tf.stack([tf.constant(1, tf.int64), examples, tf.cast(nonfinite, tf.int64)]), logs

    if jit_compile:

        def one_step_on_batch(batch):
            on_trace()
            return counted_step(batch, None)

        return tf.function(one_step_on_batch, reduce_retracing=True, jit_compile=True, autograph=False)

    def one_step(iterator, peeked=None):
        on_trace()
        batch = iterator.get_next() if peeked is None else peeked.get_value()
        return counted_step(batch, static_batch_size(iterator.element_spec))

    return tf.function(one_step, reduce_retracing=True, autograph=False)


def _empty(iterator: Any) -> tf.experimental.Optional:
    return tf.experimental.Optional.empty(iterator.element_spec)


def make_collecting_graph_loop(step: StepFn, strategy: tf.distribute.Strategy):
    """A `tf.function` that runs up to `num_steps` steps and returns all their outputs, joined.

    For `predict`: each output leaf goes into a `tf.TensorArray`, joined along
    the example axis at the end of the call (stacked for scalars), so a call
    of k steps returns one chunk of k batches' predictions.

    The function is `(iterator, num_steps, peeked=None, counted=False)`. With
    `counted` (the caller knows the iterator holds `num_steps` more batches,
    as the k-step loop's `counted` path) each step reads its batch directly;
    otherwise the loop carries an Optional and reads a batch only if a step
    will run on it. The counted loop traces in about half the time (no
    `tf.cond`, no Optional), which a first `predict` pays.
    """

    def loop(iterator, num_steps, peeked=None, counted=False):
        concrete = step.get_concrete_function(iterator.element_spec)
        specs = tf.nest.flatten(tf.nest.map_structure(tf.type_spec_from_value, concrete.structured_outputs))

        def collected(i, examples, arrays, batch):
            outputs = tf.nest.flatten(step(batch))
            arrays = [array.write(i, output) for array, output in zip(arrays, outputs, strict=True)]
            return i + 1, examples + examples_in(batch, strategy), arrays

        arrays = [tf.TensorArray(spec.dtype, size=0, dynamic_size=True, infer_shape=False) for spec in specs]
        if counted:
            steps, examples, arrays = tf.while_loop(
                lambda i, examples, arrays: i < num_steps,
                lambda i, examples, arrays: collected(i, examples, arrays, iterator.get_next()),
                loop_vars=[tf.constant(0), tf.constant(0, tf.int64), arrays],
            )
        else:

            def cond(i, examples, arrays, next_batch):
                del examples, arrays
                return tf.logical_and(i < num_steps, next_batch.has_value())

            def body(i, examples, arrays, next_batch):
                i_next, examples, arrays = collected(i, examples, arrays, next_batch.get_value())
                following = tf.cond(
                    i_next < num_steps, iterator.get_next_as_optional, lambda: _empty(iterator)
                )
                return i_next, examples, arrays, following

            first = (
                peeked
                if peeked is not None
                else tf.cond(num_steps > 0, iterator.get_next_as_optional, lambda: _empty(iterator))
            )
            steps, examples, arrays, _ = tf.while_loop(
                cond, body, loop_vars=[tf.constant(0), tf.constant(0, tf.int64), arrays, first]
            )
        joined = [
            array.stack() if spec.shape.rank == 0 else array.concat()
            for array, spec in zip(arrays, specs, strict=True)
        ]
        return steps, examples, tf.nest.pack_sequence_as(concrete.structured_outputs, joined)

    return tf.function(loop, reduce_retracing=True, autograph=False)
