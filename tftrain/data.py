"""Input handling: turn what users pass into a `tf.data.Dataset` and plan the epochs."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

DEFAULT_BATCH_SIZE = 32

_ARRAY_TYPES = (np.ndarray, tf.Tensor)


def _is_array(value: Any) -> bool:
    return isinstance(value, _ARRAY_TYPES)


def as_dataset(
    data: Any,
    *,
    argument: str,
    batch_size: int | None = None,
    shuffle: bool = False,
) -> tf.data.Dataset:
    """Returns `data` as a batched `tf.data.Dataset`.

    Args:
        data: A `tf.data.Dataset` (already batched), or NumPy arrays / tensors:
            `x`, `(x,)`, `(x, y)` or `(x, y, sample_weight)`; `x` may be a dict
            of arrays.
        argument: The caller's argument name, for error messages.
        batch_size: Batch size for arrays (default 32). Not allowed with a
            Dataset, which is batched already.
        shuffle: Shuffle arrays each pass (as `model.fit` does for training).

    Returns:
        A `tf.data.Dataset` of batches.

    Raises:
        TypeError: `data` is neither a Dataset nor arrays.
        ValueError: arrays of different lengths, or a bad `batch_size`.
    """
    if isinstance(data, tf.data.Dataset):
        if batch_size is not None:
            raise ValueError(
                f"Invalid value for argument `batch_size`. Received: batch_size={batch_size!r} "
                f"with a tf.data.Dataset as `{argument}`. Expected batch_size=None: batch the "
                "dataset itself with `dataset.batch(n)`."
            )
        return data
    if batch_size is None:
        batch_size = DEFAULT_BATCH_SIZE
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(
            f"Invalid value for argument `batch_size`. Received: batch_size={batch_size!r}. "
            "Expected an integer >= 1."
        )
    if isinstance(data, list):
        data = tuple(data)
    parts = data if isinstance(data, tuple) else (data,)
    leaves = tf.nest.flatten(parts)
    if not parts or len(parts) > 3 or not leaves or not all(_is_array(v) for v in leaves):
        kinds = ", ".join(sorted({type(v).__name__ for v in leaves})) or type(data).__name__
        raise TypeError(
            f"Invalid value for argument `{argument}`. Received: an object of type "
            f"{type(data).__name__} (holding {kinds}). Expected a tf.data.Dataset, or NumPy "
            "arrays/tensors as x, (x, y) or (x, y, sample_weight)."
        )
    lengths = {int(v.shape[0]) if len(v.shape) else -1 for v in leaves}
    if len(lengths) != 1 or -1 in lengths:
        raise ValueError(
            f"Invalid value for argument `{argument}`. Received arrays with leading dimensions "
            f"{sorted(lengths)}. Expected every array to have the same number of examples "
            "along axis 0."
        )
    (num_examples,) = lengths
    dataset = tf.data.Dataset.from_tensor_slices(parts if len(parts) > 1 else parts[0])
    if shuffle:
        dataset = dataset.shuffle(max(num_examples, 1), reshuffle_each_iteration=True)
    return dataset.batch(batch_size)


def count_batches(dataset: tf.data.Dataset) -> int | None:
    """Batches per pass, or None if TensorFlow cannot tell (or it is infinite)."""
    cardinality = int(dataset.cardinality())
    return cardinality if cardinality >= 0 else None


class EpochPlan:
    """Decides which iterator each epoch reads and how many steps it runs.

    Mirrors `keras.Model.fit`: without `steps_per_epoch` every epoch is one
    full pass on a fresh iterator; with it, one iterator continues across
    epochs, and a finite dataset starts a new pass once all its batches were
    seen (an epoch cut short by the end of the data warns, as in Keras).

    Args:
        dataset: The batched dataset.
        steps_per_epoch: Steps per epoch, or None for one pass.
        argument: The caller's argument name, for error messages.

    Raises:
        ValueError: an empty or infinite dataset without `steps_per_epoch`,
            a bad `steps_per_epoch`, or one past the end of a finite dataset.
    """

    def __init__(
        self,
        dataset: tf.data.Dataset,
        steps_per_epoch: int | None,
        argument: str = "train_data",
        steps_argument: str = "steps_per_epoch",
        make_iterator=iter,
    ):
        if steps_per_epoch is not None and (
            isinstance(steps_per_epoch, bool) or not isinstance(steps_per_epoch, int) or steps_per_epoch < 1
        ):
            raise ValueError(
                f"Invalid value for argument `{steps_argument}`. Received: "
                f"{steps_argument}={steps_per_epoch!r}. Expected None (one pass over the data) "
                "or an integer >= 1."
            )
        cardinality = int(dataset.cardinality())
        if cardinality == 0:
            raise ValueError(
                f"Invalid value for argument `{argument}`: the dataset is empty (cardinality 0). "
                "Expected at least one batch; check filters, `take`, or a batch size larger "
                "than the data with `drop_remainder=True`."
            )
        if cardinality == tf.data.INFINITE_CARDINALITY and steps_per_epoch is None:
            raise ValueError(
                f"Invalid value for argument `{argument}`: the dataset repeats forever, so an "
                f"epoch never ends. Received: {steps_argument}=None. Expected "
                f"{steps_argument}=<number of steps>, or a finite dataset."
            )
        if cardinality > 0 and steps_per_epoch is not None and steps_per_epoch > cardinality:
            raise ValueError(
                f"Invalid value for argument `{steps_argument}`. Received: "
                f"{steps_argument}={steps_per_epoch}, but `{argument}` has only {cardinality} "
                f"batches. Expected {steps_argument} <= {cardinality}, or "
                "`dataset.repeat()` to read it more than once."
            )
        self.dataset = dataset
        self.steps_per_epoch = steps_per_epoch
        self.argument = argument
        self._make_iterator = make_iterator
        self._batches_per_pass = cardinality if cardinality > 0 else None
        self._iterator: Iterator[Any] | None = None
        self._seen_in_pass = 0

    @property
    def steps(self) -> int | None:
        """Steps in the coming epoch, or None while unknown."""
        if self.steps_per_epoch is not None:
            return self.steps_per_epoch
        return self._batches_per_pass

    def begin_epoch(self) -> Iterator[Any]:
        """Returns the iterator the coming epoch reads from."""
        return self.next_iterator()

    def next_iterator(self) -> Iterator[Any]:
        """The iterator the next training step reads from (starting a new pass if due).

        A checkpoint saves this iterator: at an epoch end it is the next
        epoch's fresh iterator, whose creation advanced the dataset's
        reshuffling seeds exactly as an uninterrupted run's does.
        """
        if self._iterator is None:
            self._iterator = self._make_iterator(self.dataset)
            self._seen_in_pass = 0
        return self._iterator

    def batches_in_pass(self, steps_this_epoch: int) -> int:
        """Batches read from the current pass, given the steps run in the current epoch (all of them)."""
        return self._seen_in_pass + steps_this_epoch

    def resume(self, batches_in_pass: int, steps_in_epoch: int, iterator_restored: bool) -> None:
        """Continues a checkpointed run at its data position.

        Args:
            batches_in_pass: Batches the checkpointed run had read from its pass.
            steps_in_epoch: Steps it had run in its current epoch.
            iterator_restored: Whether `next_iterator()`'s state was restored
                from the checkpoint. If not, the pass restarts and skips
                `batches_in_pass` batches (`dataset.skip`).
        """
        if not iterator_restored and batches_in_pass > 0:
            self._iterator = self._make_iterator(self.dataset.skip(batches_in_pass))
        self._seen_in_pass = batches_in_pass - steps_in_epoch

    def end_epoch(self, steps_run: int, data_ended: bool) -> None:
        """Records how the epoch went.

        Args:
            steps_run: Steps the epoch ran (before a resume too).
            data_ended: Whether the iterator ran out of batches.

        Raises:
            ValueError: the very first pass yielded no batch at all.
        """
        self._seen_in_pass += steps_run
        if data_ended:
            if self._seen_in_pass == 0:
                raise ValueError(
                    f"Invalid value for argument `{self.argument}`: the dataset yielded no "
                    "batches. Expected at least one batch; check filters or `take`."
                )
            if self._batches_per_pass is None:
                self._batches_per_pass = self._seen_in_pass
            if self.steps_per_epoch is not None:
                warnings.warn(
                    f"`{self.argument}` ran out of data after {steps_run} of "
                    f"{self.steps_per_epoch} steps in this epoch; the next epoch starts a new "
                    "pass. Use `dataset.repeat()` to avoid short epochs.",
                    stacklevel=3,
                )
            self._iterator = None
        elif self.steps_per_epoch is None:
            self._iterator = None  # every epoch is a fresh pass
        elif (
            self.steps_per_epoch is not None
            and self._batches_per_pass is not None
            and self._seen_in_pass >= self._batches_per_pass
        ):
            self._iterator = None
