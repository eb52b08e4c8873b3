"""How a training run's data position goes into its checkpoints, decided once per `fit`.

Saving a `tf.data` iterator normally writes its buffers: an in-memory
`.cache()` or a `.shuffle(n)` buffer is copied into every checkpoint (hundreds
of MB, most of a second per save). Three ways to keep the position, cheapest
first:

* `"symbolic"`: tf.data's symbolic checkpointing
  (`tf.data.Options.experimental_symbolic_checkpoint`) stores positions and
  random states only, and rebuilds buffers on restore. Used where every
  transformation of the pipeline supports it (batch, map, shuffle, repeat,
  prefetch, ... but not `cache`).
* `"position"`: for a deterministic pipeline that symbolic checkpointing
  cannot serve (a `.cache()` of data read in a fixed order), the checkpoint
  stores no iterator at all, and a resumed run skips the batches already read;
  the pass is the same every time, so resume stays exact.
* `"full"`: the iterator with its buffers (a `.cache()` after random
  transformations, say), as before; exact, at the cost of writing the buffers.
"""

from __future__ import annotations

import warnings
from typing import Any

import tensorflow as tf

from tftrain.checkpoint.validation import VARIABLE_SUFFIX
from tftrain.compat import tf_internals
from tftrain.fit_inputs.epoch_plan import EpochPlan

__all__ = ["FULL", "KEY", "POSITION", "SYMBOLIC", "DataPosition", "prepare", "saved_mode"]

SYMBOLIC, POSITION, FULL = "symbolic", "position", "full"

KEY = "data"
"""The data position's key in a checkpoint: its state among the services' states, its tensors under `data/`."""

_ORDER = "epoch_order"  # the order of a shuffled array pass, saved as `data/epoch_order`

# Dataset and op names (as in the pipeline's graph) whose output may differ
# from one pass, or one process, to the next: their pipelines are not read in
# a fixed order, so skipping batches would not find the same position.
_NONDETERMINISTIC_OPS = ("Random", "Shuffle", "Sampl", "PyFunc", "Generator", "DirectedInterleave")

# Dataset ops whose iterators tf.data cannot save symbolically (checked against
# TensorFlow by tests/checkpoint/test_data_position.py); a generator cannot be saved at all.
_NO_SYMBOLIC_CHECKPOINT = (
    "CacheDataset",
    "GeneratorDataset",
    "GroupByWindowDataset",
    "IgnoreErrorsDataset",
    "RebatchDataset",
    "SnapshotDataset",
    "WindowDataset",
)


def with_symbolic_checkpoint(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """The dataset with tf.data's symbolic checkpointing switched on (the data it yields is unchanged)."""
    options = tf.data.Options()
    options.experimental_symbolic_checkpoint = True
    return dataset.with_options(options)


def supports_symbolic_checkpoint(nodes: list[Any]) -> bool:
    """Whether every transformation of a pipeline (its graph's nodes) can save its iterator symbolically."""
    return not any(node.op.startswith(_NO_SYMBOLIC_CHECKPOINT) for node in nodes)


def reads_in_a_fixed_order(nodes: list[Any], options: tf.data.Options) -> bool:
    """Whether every pass over a pipeline yields the same batches in the same order, in any process.

    Conservative: any random op, shuffle, sampling, Python function or
    generator anywhere in the pipeline (its map functions included), or a
    transformation (or the pipeline) set to `deterministic=False`, counts as
    not fixed.
    """
    if options.deterministic is False:
        return False
    for node in nodes:
        if any(marker in node.op for marker in _NONDETERMINISTIC_OPS):
            return False
        if "deterministic" in node.attr and node.attr["deterministic"].s == b"false":
            return False
    return True


def prepare(dataset: tf.data.Dataset, saved_mode: str | None) -> tuple[str, tf.data.Dataset]:
    """The way a training pipeline's position is checkpointed, and the dataset to read it from.

    Args:
        dataset: The training dataset (iterated plainly, not distributed).
        saved_mode: The mode of the checkpoint the run resumes from (its
            iterator must be restored the way it was saved), or None for a
            new run: the cheapest exact mode is chosen.

    Returns:
        `(mode, dataset)`: the dataset is set to checkpoint symbolically in
        `"symbolic"` mode and unchanged otherwise.
    """
    mode = saved_mode
    if mode is None:
        nodes = tf_internals.dataset_graph_nodes(dataset)
        if supports_symbolic_checkpoint(nodes):
            mode = SYMBOLIC
        elif reads_in_a_fixed_order(nodes, dataset.options()):
            mode = POSITION
        else:
            mode = FULL
            _warn_buffers_saved(nodes)
    return mode, (with_symbolic_checkpoint(dataset) if mode == SYMBOLIC else dataset)


def _warn_buffers_saved(nodes: list[Any]) -> None:
    """Says, once per run, why each checkpoint will hold the pipeline's buffers, and how to avoid it."""
    if any(marker in node.op for node in nodes for marker in ("Generator", "PyFunc")):
        return  # tf.data cannot save such an iterator at all: the save warns instead
    blocking = sorted({node.op for node in nodes if node.op.startswith(_NO_SYMBOLIC_CHECKPOINT)})
    random = sorted({node.op for node in nodes if any(m in node.op for m in _NONDETERMINISTIC_OPS)})
    warnings.warn(
        f"The training pipeline has transformations tf.data cannot checkpoint symbolically "
        f"({', '.join(blocking)}) and does not read in a fixed order ({', '.join(random) or 'deterministic=False'}), "
        "so each checkpoint holds the data iterator with its buffers (a cache or shuffle buffer is "
        "written with every save; resume stays exact). To save positions only, drop `.cache()` over data "
        "that is in memory already, or cache to a file (`.cache(filename)`); see docs/checkpoints.md.",
        stacklevel=4,
    )


def saved_mode(states: dict[str, Any] | None) -> str | None:
    """The data checkpoint mode recorded in a checkpoint's service states (`"full"` if it predates modes)."""
    if states is None:
        return None
    return states.get(KEY, {}).get("checkpoint", FULL)


class DataPosition:
    """The training data's position in a run's checkpoints, saved and loaded as one piece of state.

    What a checkpoint holds of it, all under `KEY`: the mode and, for array
    inputs, where the pass's iterator started (`state_dict`, among the
    services' states); the order of a shuffled array pass (`variables`); the
    iterator itself, unless arrays keep their position in examples or the
    pipeline is read in a fixed order (`saved_iterator`).

    Args:
        plan: The training data's plan (its pipeline and position).
    """

    name = KEY

    def __init__(self, plan: EpochPlan):
        self.plan = plan
        self.mode: str | None = None  # None: distributed iterators (their position is never saved)
        self._dataset = plan.dataset  # as given: each `load` prepares it anew
        self._offset: tuple[int, int] = (0, 0)
        self._order: Any = None
        self._fresh_pass = False

    # ------------------------------------------------------------------- save

    def state_dict(self) -> dict[str, Any] | None:
        """The mode and, for arrays, where the pass's iterator started (JSON); None where nothing is saved."""
        if self.mode is None:
            return None
        state: dict[str, Any] = {"checkpoint": self.mode}
        if self.plan.position is not None:
            state["pass_offset"] = list(self.plan.position.offset)
        return state

    def variables(self) -> dict[str, Any]:
        """The data position's variables a checkpoint saves under `data/`: a shuffled array pass's order."""
        return {_ORDER: self.plan.order.permutation} if self.plan.order is not None else {}

    def saved_iterator(self, iterator: Any) -> Any:
        """The iterator a checkpoint saves, or None: arrays keep their position in examples, and a pipeline read in a fixed order is skipped to."""
        return iterator if self.mode != POSITION and self.plan.position is None else None

    # ------------------------------------------------------------------- load

    def load(self, validated: Any, *, fresh_pass: bool = False) -> Any:
        """Makes the pipeline keep its position as a checkpoint did; reads what its resume needs.

        Nothing is assigned: the iterator returned is restored with the model
        (`Checkpointer.restore`), and `resume` puts the plan at the position.

        Args:
            validated: The validated checkpoint (`ValidatedCheckpoint`), or
                None for a new run (the cheapest exact mode is chosen).
            fresh_pass: The run goes on at a fresh pass (the checkpoint's
                epoch is not resumed): no iterator is restored.

        Returns:
            The iterator whose saved state to restore, or None (arrays, whose
            position is kept in examples and their pass's order; a fresh pass).
        """
        states = validated.states if validated is not None else None
        if self.plan.plain_iterators:
            self.mode, self.plan.dataset = prepare(self._dataset, saved_mode(states))
        self._offset = tuple((states or {}).get(KEY, {}).get("pass_offset", (0, 0)))
        self._order, self._fresh_pass = None, fresh_pass
        if fresh_pass:
            return None
        if self.plan.position is None:
            return self.plan.next_iterator()
        if validated is not None and self.plan.order is not None:
            self._order = validated.tensor(f"{KEY}/{_ORDER}{VARIABLE_SUFFIX}")
        return None

    def resume(self, progress: Any, iterator_restored: bool, batch_size: int | None = None) -> None:
        """Puts the plan where the checkpoint's run was: arrays at their next unread example, an iterator where it was saved.

        Args:
            progress: The checkpoint's `Progress`.
            iterator_restored: Whether the iterator `load` returned was restored
                (else the pass restarts and skips the batches read).
            batch_size: The checkpointed run's batch size, where the new call's differs.

        Nothing is done where `load` was told the run goes on at a fresh pass.
        """
        if self._fresh_pass:
            return
        plan, batches, steps = self.plan, progress.batches_in_pass, progress.step_in_epoch
        if plan.position is None:
            plan.resume(batches, steps, iterator_restored)
            return
        examples = plan.position.examples_read(batches, self._offset, batch_size or plan.position.batch_size)
        plan.resume_at_example(examples, batches, steps, self._order)
