"""Where a pass over array inputs is, kept so a resumed run reads the rest of the pass as the killed run would have.

Keras shuffles array inputs inside its pipeline: each pass draws a new order
(`tf.random.shuffle` of the example indices), from the global seed if the
script set one, else at random. tf.data's checkpoint of such a pipeline keeps
its position but not that order (Keras marks the random op's state as not
saved), so a resumed run without a seed would read its pass in a new order:
some examples twice, others never. `EpochOrder` records each pass's order as
Keras draws it (a variable saved with every checkpoint), and replays a saved
order for the resumed pass; the later passes draw theirs as before.

`ArrayPosition` keeps the position in examples, not batches, so a run resumed
with another batch size goes on at the next unread example of the pass,
nothing skipped or read twice.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from tftrain.compat import keras_internals

__all__ = ["ArrayPosition", "EpochOrder", "examples_in"]


def examples_in(adapter: Any) -> int | None:
    """The examples in one pass of Keras's array adapter (None where it does not say)."""
    batch_size, num_batches = getattr(adapter, "batch_size", None), getattr(adapter, "num_batches", None)
    if batch_size is None or num_batches is None:
        return None
    partial = getattr(adapter, "partial_batch_size", None) or 0
    return num_batches * batch_size - (batch_size - partial if partial else 0)


class EpochOrder:
    """Records the order of each pass of shuffled array inputs, and replays a saved one.

    Args:
        adapter: Keras's array adapter, with `shuffle=True`.

    Attributes:
        permutation: The current pass's order (example indices), an int64
            variable written when the pass reads its first batch; saved with
            every checkpoint.
    """

    def __init__(self, adapter: Any):
        self.adapter = adapter
        self.num_samples = examples_in(adapter)
        with tf.init_scope():
            self.permutation = tf.Variable(
                tf.zeros([self.num_samples], tf.int64), trainable=False, name="epoch_order"
            )

    def recording_dataset(self) -> tf.data.Dataset | None:
        """Keras's pipeline, writing each pass's order to `permutation`; None where the installed Keras draws none.

        The orders drawn are the ones `model.fit` draws.
        """
        traced = []

        def record(drawn: tf.Tensor) -> tf.Tensor:
            traced.append(True)
            with tf.control_dependencies([self.permutation.assign(drawn)]):
                return tf.identity(drawn)

        dataset = self._dataset(record)
        return dataset if traced else None

    def replay_dataset(self, saved: np.ndarray) -> tf.data.Dataset:
        """Keras's pipeline for one pass in a saved order (e.g. the checkpoint's `permutation`), writing it to `permutation` too.

        Raises:
            ValueError: `saved` is not an order of this data's examples.
        """
        saved = np.asarray(saved, dtype=np.int64)
        if saved.shape != (self.num_samples,) or not np.array_equal(np.sort(saved), np.arange(self.num_samples)):
            raise ValueError(
                f"The saved order of the pass is not an order of this data's {self.num_samples} examples "
                f"(it holds {saved.size} indices). Expected the data the checkpoint was written with."
            )

        def replay(drawn: tf.Tensor) -> tf.Tensor:
            del drawn  # the saved order instead
            with tf.control_dependencies([self.permutation.assign(saved)]):
                return tf.constant(saved)

        return self._dataset(replay)

    def _dataset(self, order: Any) -> tf.data.Dataset:
        """Keras's pipeline with its order through `order`, its length stated as `tftrain.fit_inputs.inputs.adapt` states it."""
        dataset = keras_internals.array_dataset_with_order(self.adapter, self.num_samples, order)
        return dataset.apply(tf.data.experimental.assert_cardinality(self.adapter.num_batches))


class ArrayPosition:
    """Where a pass over array inputs is, in examples, and the rest of a pass from an example on.

    Args:
        adapter: Keras's array adapter of this call (its batch size may
            differ from the one of the run that wrote the checkpoint).

    Attributes:
        order: The recorded order of each pass where the arrays are
            shuffled (`EpochOrder`), else None (every pass reads in index order).
    """

    def __init__(self, adapter: Any):
        self.adapter = adapter
        self.batch_size = int(adapter.batch_size)
        self.num_samples = examples_in(adapter)
        self.order: EpochOrder | None = None
        self._offset = (0, 0)  # examples and batches of the pass read before the current iterator's first batch

    def start_pass(self) -> None:
        """A fresh pass starts: its iterator reads from its first example."""
        self._offset = (0, 0)

    @property
    def offset(self) -> tuple[int, int]:
        """The examples and batches of the current pass read before its iterator started ((0, 0) for a fresh pass)."""
        return self._offset

    def examples_read(self, batches_in_pass: int, offset: tuple[int, int] | None = None, batch_size: int | None = None) -> int:
        """Examples of a pass read once `batches_in_pass` of its batches were.

        Args:
            batches_in_pass: Batches read from the pass.
            offset: Where its iterator started (`offset`; None: this pass's).
            batch_size: Its batches' size (None: this call's).
        """
        examples, batches = offset if offset is not None else self._offset
        size = batch_size if batch_size is not None else self.batch_size
        return min(self.num_samples, examples + (batches_in_pass - batches) * size)

    def rest_of_pass(self, source: tf.data.Dataset, examples: int, batches_in_pass: int) -> tuple[tf.data.Dataset, int]:
        """The batches of a pass after its first `examples`, in this call's batch size, and how many there are.

        Args:
            source: The pass's batches from its first example (in its saved order).
            examples: Examples of the pass read before the resume.
            batches_in_pass: Batches the run had read from the pass, in its own
                batch size (what later positions count on from).

        Returns:
            The dataset of the rest of the pass, and its number of batches.
        """
        count = -(-(self.num_samples - examples) // self.batch_size)
        if examples % self.batch_size == 0:
            rest = source.skip(examples // self.batch_size)
        else:  # a new batch size: the batches start at the next unread example
            rest = source.unbatch().skip(examples).batch(self.batch_size)
            rest = rest.apply(tf.data.experimental.assert_cardinality(count))
        self._offset = (examples, batches_in_pass)
        return rest, count
