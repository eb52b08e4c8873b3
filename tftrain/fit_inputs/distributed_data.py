"""A `tf.distribute.DistributedDataset` as input: read as distributed, under the strategy that made it.

Keras's `fit` takes a dataset distributed already
(`strategy.experimental_distribute_dataset(...)` or
`strategy.distribute_datasets_from_function(...)`) and iterates it as it is
(`TFEpochIterator`). `DistributedData` lets the Trainer's loops read it the
same way: it has what they read from a dataset (`element_spec` of one
replica's batch, `cardinality()`, `skip(n)`), and `iterate` makes its
iterators (distributed iterators, never a re-distribution).

Such an iterator cannot be checkpointed (TensorFlow cannot save distributed
iterators): a run resumed from `model_dir` starts a new pass and skips the
batches already seen (`skip`), as for the Trainer's own distributed iterators.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from tftrain import distribute
from tftrain.compat import tf_internals

__all__ = ["DistributedData", "check_strategy", "iterate"]


class DistributedData:
    """A `tf.distribute.DistributedDataset` with the parts of a `tf.data.Dataset` that the loops read.

    Args:
        distributed: The distributed dataset (of either kind).
        skipped: Batches each new iterator skips first (a resumed run's position).
    """

    def __init__(self, distributed: Any, skipped: int = 0):
        self.distributed = distributed
        self.skipped = skipped
        self.strategy: tf.distribute.Strategy = tf_internals.distributed_dataset_strategy(distributed)

    @property
    def element_spec(self) -> Any:
        """One replica's batch, with its batch size unknown (the global batch is split already)."""

        def relaxed(spec: Any) -> Any:
            shape = getattr(spec, "shape", None)
            if isinstance(spec, tf.TensorSpec) and shape is not None and shape.rank:
                return tf.TensorSpec([None, *shape[1:]], spec.dtype, spec.name)
            return spec

        per_replica = tf.nest.map_structure(tf_internals.per_replica_spec, self.distributed.element_spec)
        return tf.nest.map_structure(relaxed, per_replica)

    def cardinality(self) -> int:
        """Steps per pass (left after `skipped`), or `tf.data`'s unknown/infinite constants.

        A `distribute_datasets_from_function` dataset of several replicas
        reports the batches of one input pipeline, and each step reads one
        per replica: its length is unknown (the end is found by reading).
        """
        count = self._count()
        if count < 0:
            return count
        if self._count_is_per_pipeline():
            return tf.data.UNKNOWN_CARDINALITY
        return max(count - self.skipped, 0)

    def announced_steps(self) -> int | None:
        """The steps Keras's `fit` takes this data to have, where that is not its length (else None).

        Keras takes the count of a `distribute_datasets_from_function` dataset
        of several replicas (one input pipeline's batches) as the steps
        (`params["steps"]`, the progress bar's total), and warns when the
        data runs out before them; the Trainer reports the same count.
        """
        count = self._count()
        return max(count - self.skipped, 0) if count > 0 and self._count_is_per_pipeline() else None

    def _count(self) -> int:
        return int(self.distributed.cardinality)  # a number, not a method, on a DistributedDataset

    def _count_is_per_pipeline(self) -> bool:
        return tf_internals.made_from_function(self.distributed) and self.strategy.num_replicas_in_sync > 1

    def skip(self, count: int) -> DistributedData:
        """The same data, whose iterators first skip `count` batches (as `tf.data.Dataset.skip`)."""
        return DistributedData(self.distributed, self.skipped + count)

    def __iter__(self) -> Iterator[Any]:
        iterator = iter(self.distributed)
        for _ in range(self.skipped):
            try:
                next(iterator)
            except StopIteration:  # skipped past the end: the pass is empty
                break
        return iterator

    def __repr__(self) -> str:
        return f"DistributedData({type(self.distributed).__name__}, skipped={self.skipped})"


def iterate(data: DistributedData) -> Iterator[Any]:
    """A new distributed iterator over `data` (the `make_iterator` of its `EpochPlan`)."""
    return iter(data)


def check_strategy(data: DistributedData, strategy: tf.distribute.Strategy, argument: str) -> None:
    """Raises unless `data` holds one value per replica of `strategy`.

    The steps run with `strategy.run` on each batch, which must hold one value
    per replica of that strategy. As under Keras's `fit`, a dataset of
    another strategy with as many replicas runs under the Trainer's strategy,
    and a dataset of one replica (plain tensors) feeds any strategy of one
    replica (a `MirroredStrategy(["CPU:0"])` dataset for a model built
    outside any scope). Other replica counts fail under `fit` deep inside
    TensorFlow; here they are a clear error first.

    Raises:
        ValueError: naming both strategies and the fix.
    """
    if data.strategy is strategy:
        return
    if data.strategy.num_replicas_in_sync == strategy.num_replicas_in_sync:
        return
    if distribute.is_default_strategy(strategy):
        trainers = "the default strategy of one replica (no `strategy=`, and a model built outside any scope)"
    else:
        trainers = _described(strategy)
    raise ValueError(
        f"Invalid value for argument `{argument}`. Received: a {type(data.distributed).__name__} of another "
        f"strategy than the Trainer's: it was distributed by {_described(data.strategy)}, and the Trainer "
        f"runs under {trainers}. Expected a dataset distributed by a strategy of as many replicas as the "
        "Trainer's, best its own (`Trainer(..., strategy=strategy)` with the strategy whose "
        "`experimental_distribute_dataset` or `distribute_datasets_from_function` made it), or the "
        "`tf.data.Dataset` itself, which the Trainer distributes."
    )


def _described(strategy: tf.distribute.Strategy) -> str:
    replicas = strategy.num_replicas_in_sync
    return f"a {type(strategy).__name__} of {replicas} replica{'' if replicas == 1 else 's'} (id {id(strategy):#x})"
