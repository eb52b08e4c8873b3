"""FLOPs of one training step and the utilisation, for `trainer.timing` (`Trainer(count_flops=True)`).

After each `fit`, the training step's FLOPs are counted on the graph it
already traced into (`tftrain.engine.graph_flops`): the step's `TraceCounter`
keeps each trace's graph (weakly), so nothing is traced again, and since the
count is of the step alone, the k-step loop around it (`steps_per_loop=k`)
does not change it. Under a strategy the graph holds every local replica's
step: the count is per global step, all replicas (and workers) together.

A step traced with an unknown batch size (a partial last batch, a dataset
batched without `drop_remainder=True`) is counted for the run's full batch,
as its host calls showed it or Keras's data adapter knows it. A count that
cannot be made is None with a warning naming why: never a wrong number.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tftrain import distribute, timing
from tftrain.compat import tf_internals
from tftrain.engine import graph_flops
from tftrain.engine import peak_flops as peaks

__all__ = ["FlopCount", "per_replica_batch_size", "report_with_flops", "step_flops"]


@dataclasses.dataclass(frozen=True)
class FlopCount:
    """FLOPs of one step, or why there is no count.

    Attributes:
        flops: FLOPs of one training step (all replicas), or None.
        reason: Why `flops` is None (a sentence to warn with), else None.
    """

    flops: int | None
    reason: str | None = None


def _batch_arguments(graph: tf.Graph) -> list[tf.Tensor]:
    """The step's arguments that carry examples: dense tensors of rank >= 1 (unknown rank included)."""
    return [
        tensor
        for tensor in tf_internals.function_arguments(graph)
        if tensor.dtype not in (tf.resource, tf.variant) and tensor.shape.rank != 0
    ]


def _composite_arguments(graph: tf.Graph) -> bool:
    """Whether the step takes ragged or sparse tensors (their components' first dimension is not the batch)."""
    specs = tf.nest.flatten(getattr(graph, "structured_input_signature", None))
    composite = tf.RaggedTensorSpec | tf.SparseTensorSpec
    return any(isinstance(tf_internals.per_replica_spec(spec), composite) for spec in specs)


def _describe(tensors: list[tf.Tensor]) -> str:
    return ", ".join(f"{tensor.dtype.name}{tensor.shape}" for tensor in tensors[:4])


def step_flops(
    trace_counter: timing.TraceCounter, per_replica_batch: int | None, workers: int = 1
) -> FlopCount:
    """FLOPs of one training step, from the graphs its trace counter kept (the step is not traced again).

    A trace whose batch shapes are static (and, where `per_replica_batch` is
    known, of that size) is counted as traced; otherwise the newest trace with
    an unknown batch dimension is counted with `per_replica_batch` set there
    (every argument's first dimension is taken as the batch).

    Args:
        trace_counter: The step's counter (`StepRunner.trace_counter`).
        per_replica_batch: Examples per replica of a full step, or None if unknown.
        workers: Workers running the same step (the graph holds one worker's
            replicas; the count is of all of them).

    Returns:
        A `FlopCount`.
    """
    graphs = trace_counter.traced_graphs()
    if not graphs:
        return FlopCount(None, "the training step was never traced (no step ran)")
    try:
        static, relaxed = [], []
        for graph in graphs:
            leading = {tensor.shape[0] if tensor.shape.rank else None for tensor in _batch_arguments(graph)}
            if None in leading:
                relaxed.append(graph)
            elif per_replica_batch is None or leading <= {per_replica_batch}:
                static.append(graph)
        if static:
            return FlopCount(graph_flops.count_graph_flops(static[0]) * workers)
        if not relaxed:
            return FlopCount(
                None, f"no trace of the step has this run's batch size ({per_replica_batch} per replica)"
            )
        graph = relaxed[-1]
        unknown = [
            tensor for tensor in _batch_arguments(graph) if not tensor.shape.rank or tensor.shape[0] is None
        ]
        if per_replica_batch is None:
            return FlopCount(
                None,
                f"the step was traced with an unknown batch size ({_describe(unknown)}) and the run did not "
                "show a full batch: batch the dataset with `drop_remainder=True` to count FLOPs",
            )
        if _composite_arguments(graph) or any(tensor.shape.rank is None for tensor in unknown):
            return FlopCount(
                None, f"the step's batch has no static batch dimension to set ({_describe(unknown)})"
            )
        refined = {
            id(tensor): tf.TensorShape([per_replica_batch]).concatenate(tensor.shape[1:])
            for tensor in unknown
        }
        shapes = [refined.get(id(tensor), tensor.shape) for tensor in tf_internals.function_arguments(graph)]
        return FlopCount(graph_flops.count_graph_flops(graph, shapes) * workers)
    except ValueError as error:  # not countable: why
        return FlopCount(None, str(error))


def _local_replicas(strategy: tf.distribute.Strategy) -> int:
    return 1 if distribute.is_default_strategy(strategy) else len(strategy.extended.worker_devices)


def per_replica_batch_size(
    adapter: Any, timer: timing.StepTimer | None, strategy: tf.distribute.Strategy
) -> int | None:
    """Examples per replica of a full training step in this run, or None if unknown.

    From the run's host calls where they show it (`StepTimer.full_batch_size`,
    all local replicas together), else from Keras's data adapter (its
    `batch_size`: the global batch of array inputs, or a dataset's static one).
    """
    local = timer.full_batch_size if timer is not None else None
    if local is not None:
        replicas = _local_replicas(strategy)
        return local // replicas if local % replicas == 0 else None
    try:
        global_batch = getattr(adapter, "batch_size", None)
    except NotImplementedError:
        global_batch = None
    replicas = strategy.num_replicas_in_sync
    if isinstance(global_batch, int | np.integer) and global_batch % replicas == 0:
        return int(global_batch) // replicas
    return None


def report_with_flops(
    report: timing.TimingReport,
    trace_counter: timing.TraceCounter,
    *,
    model: keras.Model,
    strategy: tf.distribute.Strategy,
    per_replica_batch: int | None,
    peak_flops: float | None,
) -> timing.TimingReport:
    """`report` with its FLOP fields filled (`TimingReport.with_flops`); warns where a figure is unknown.

    Args:
        report: The fit's timing report.
        trace_counter: The training step's trace counter.
        model: The model (its `compute_dtype` picks the table's peak).
        strategy: The run's strategy.
        per_replica_batch: See `per_replica_batch_size`.
        peak_flops: The user's peak FLOP/s of all devices, or None for the table's.
    """
    workers = max(1, strategy.num_replicas_in_sync // _local_replicas(strategy))
    count = step_flops(trace_counter, per_replica_batch, workers)
    if count.flops is None:
        warnings.warn(f"`count_flops=True`, but FLOPs per step are unknown: {count.reason}.", stacklevel=2)
    if peak_flops is None:
        peak_flops, why = peaks.available_peak_flops(strategy, str(model.compute_dtype))
        if why is not None:
            warnings.warn(f"The utilisation is unknown: {why}.", stacklevel=2)
    return report.with_flops(None if count.flops is None else float(count.flops), peak_flops)
