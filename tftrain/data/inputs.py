"""Input handling: what `fit`, `evaluate` and `predict` take, as a `tf.data.Dataset`, and the epochs over it.

`adapt` runs Keras's own input adapters (the code `model.fit` runs), so the
Trainer accepts exactly what `model.fit` accepts: NumPy arrays and tensors
(nested in dicts, lists and tuples), ragged and sparse tensors,
`tf.data.Dataset`, `keras.utils.PyDataset` (with its workers and
multiprocessing) and Python generators, with `batch_size`, `shuffle`,
`sample_weight` and `class_weight` applied as Keras applies them.
`EpochPlan` decides which iterator each epoch reads and how many steps it runs.
"""

from __future__ import annotations

import dataclasses
import types
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import keras
import tensorflow as tf

from tftrain.compat import keras_internals
from tftrain.options import check_int

INPUT_KINDS = ("dataset", "arrays", "py_dataset", "generator")
"""The kinds of input `adapt` tells apart (`AdaptedInput.kind`)."""

_EXPECTED_INPUTS = (
    "Expected NumPy arrays or tensors (alone, or in a list, tuple or dict), a tf.data.Dataset, "
    "a keras.utils.PyDataset or a Python generator, as keras.Model.fit takes."
)


def keras_step_limit(steps: int | None, steps_argument: str) -> int | None:
    """`steps`, capped by `keras.config.set_max_steps_per_epoch` as Keras caps it (with its warning)."""
    limit = getattr(keras.config, "max_steps_per_epoch", None)  # Keras >= 3.10
    maximum = limit() if limit is not None else None
    if maximum and (not steps or maximum < steps):
        warnings.warn(f"Limiting {steps_argument} to {maximum}", stacklevel=3)
        return maximum
    return steps


def keras_epoch_limit(epochs: int) -> int:
    """`epochs`, capped by `keras.config.set_max_epochs` as Keras caps it (with its warning)."""
    limit = getattr(keras.config, "max_epochs", None)  # Keras >= 3.10
    maximum = limit() if limit is not None else None
    if maximum and maximum < epochs:
        warnings.warn(f"Limiting epochs to {maximum}", stacklevel=3)
        return maximum
    return epochs


def input_kind(x: Any) -> str:
    """Which of `INPUT_KINDS` `x` is (anything that is not a dataset, PyDataset or generator is "arrays")."""
    if isinstance(x, tf.data.Dataset | tf.distribute.DistributedDataset):
        return "dataset"
    if isinstance(x, keras_internals.py_dataset_class()):
        return "py_dataset"
    if isinstance(x, types.GeneratorType):
        return "generator"
    return "arrays"


@dataclasses.dataclass(frozen=True)
class AdaptedInput:
    """An input of `fit`/`evaluate`/`predict`, adapted as Keras adapts it.

    Attributes:
        dataset: The batches, as a `tf.data.Dataset`.
        adapter: Keras's data adapter (its `on_epoch_begin`/`on_epoch_end`
            run a PyDataset's workers and hooks).
        kind: One of `INPUT_KINDS`.
        steps: Steps per pass asked for (`steps_per_epoch`/`steps`, after the
            `keras.config` limit), or None for one pass over the data.
        argument: The argument the input came from, for error messages.
        steps_argument: The argument that set `steps`, for error messages.
    """

    dataset: tf.data.Dataset
    adapter: Any
    kind: str
    steps: int | None
    argument: str = "x"
    steps_argument: str = "steps_per_epoch"


def _check_batched(dataset: tf.data.Dataset, argument: str) -> None:
    """A batched dataset has a leading batch axis on every tensor; a scalar means it is not batched."""
    for spec in tf.nest.flatten(dataset.element_spec):
        shape = getattr(spec, "shape", None)
        if shape is not None and shape.rank == 0:
            raise ValueError(
                f"Invalid value for argument `{argument}`: the tf.data.Dataset yields single examples, "
                f"not batches (its element_spec holds a scalar: {dataset.element_spec}). Expected a "
                "batched dataset: batch it with `dataset.batch(batch_size)`."
            )


def _py_dataset_error(x: Any, error: Exception, argument: str) -> Exception:
    """Names the first index of a PyDataset that fails, for an error raised while Keras read its first batches."""
    length = x.num_batches
    count = keras_internals.batches_read_for_spec()
    for index in range(count if length is None else min(count, length)):
        try:
            x[index]
        except Exception as failure:  # the user's own __getitem__ may raise anything
            return ValueError(
                f"Invalid value for argument `{argument}`: `{type(x).__name__}.__getitem__({index})` raised "
                f"{type(failure).__name__}: {failure}. Expected each index below the PyDataset's "
                "`num_batches` to return a batch `(x,)`, `(x, y)` or `(x, y, sample_weight)`."
            )
    return error


def adapt(
    x: Any,
    y: Any = None,
    sample_weight: Any = None,
    *,
    batch_size: int | None = None,
    steps: int | None = None,
    shuffle: bool | str = False,
    class_weight: dict[int, float] | None = None,
    argument: str = "x",
    steps_argument: str = "steps_per_epoch",
) -> AdaptedInput:
    """Adapts `fit`/`evaluate`/`predict` inputs with Keras's own adapters.

    Args:
        x: The inputs, or a dataset/PyDataset/generator of whole batches.
        y: Targets, for array inputs only.
        sample_weight: Per-example weights, for array inputs only.
        batch_size: Batch size for array inputs (Keras's default: 32, or what
            `steps` implies). A dataset, PyDataset or generator is batched
            already: a `batch_size` given with one is ignored with a warning.
        steps: Steps per pass; None means one whole pass.
        shuffle: For arrays: shuffle each pass (`"batch"`: shuffle in batch-sized chunks).
        class_weight: Class index -> weight, turned into sample weights.
        argument: The argument's name, for error messages.
        steps_argument: The name of the steps argument, for error messages.

    Returns:
        An `AdaptedInput`.

    Raises:
        TypeError: `x` is of a type `model.fit` does not take.
        ValueError: what `model.fit` rejects (e.g. `y` with a dataset, `class_weight`
            with several outputs), an unbatched dataset, or a PyDataset whose
            `__getitem__` raises (the error names the index).
    """
    check_int("batch_size", batch_size, optional=True)
    check_int(steps_argument, steps, optional=True)
    limited = keras_step_limit(steps, steps_argument)
    steps, from_limit = limited, limited != steps
    kind = input_kind(x)
    if x is None:
        raise TypeError(
            f"Invalid value for argument `{argument}`. Received: {argument}=None. {_EXPECTED_INPUTS}"
        )
    if kind != "arrays" and batch_size is not None:
        warnings.warn(
            f"`batch_size={batch_size}` is ignored: `{argument}` is a {type(x).__name__}, which yields "
            "whole batches. Batch the data itself (e.g. `dataset.batch(n)`).",
            stacklevel=3,
        )
        batch_size = None
    if isinstance(x, tf.distribute.DistributedDataset):
        raise TypeError(
            f"Invalid value for argument `{argument}`. Received: a {type(x).__name__} (a dataset distributed "
            "already). Expected the tf.data.Dataset itself: the Trainer distributes it over its strategy's "
            "replicas (`Trainer(..., strategy=...)`)."
        )
    if kind == "dataset":
        _check_batched(x, argument)
    try:
        adapter = keras_internals.get_data_adapter(
            x=x,
            y=y,
            sample_weight=sample_weight,
            batch_size=batch_size,
            steps_per_epoch=steps,
            shuffle=shuffle,
            class_weight=class_weight,
        )
    except ValueError as error:
        if str(error).startswith("Unrecognized data type"):
            raise TypeError(
                f"Invalid value for argument `{argument}`. Received: an object of type {type(x).__name__}. "
                f"{_EXPECTED_INPUTS}"
            ) from None
        raise
    try:
        dataset = adapter.get_tf_dataset()
    except Exception as error:
        if kind == "py_dataset":
            raise _py_dataset_error(x, error, argument) from error
        raise
    num_batches = adapter.num_batches
    if int(dataset.cardinality()) == tf.data.UNKNOWN_CARDINALITY:
        # Keras knows the length (arrays, a PyDataset's len, or a PyDataset without
        # one never ends); tell tf.data, so the loop need not look ahead for the
        # end, progress bars know the total, and endless data needs steps.
        if num_batches is not None:
            dataset = dataset.apply(tf.data.experimental.assert_cardinality(num_batches))
        elif kind == "py_dataset":
            dataset = dataset.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
    if from_limit and 0 < int(dataset.cardinality()) < steps:
        steps = int(dataset.cardinality())  # keras.config's cap is an upper bound, not a request
    return AdaptedInput(
        dataset=dataset,
        adapter=adapter,
        kind=kind,
        steps=steps,
        argument=argument,
        steps_argument=steps_argument,
    )


def split_validation(
    x: Any, y: Any, sample_weight: Any, validation_split: float
) -> tuple[tuple[Any, Any, Any], tuple[Any, Any, Any]]:
    """`fit`'s `validation_split`: the last fraction of array inputs becomes validation data.

    Args:
        x, y, sample_weight: The training arrays (as given to `fit`).
        validation_split: The fraction, in `[0, 1)`.

    Returns:
        `((x, y, sample_weight), (val_x, val_y, val_sample_weight))`.

    Raises:
        ValueError: `x` is a dataset, PyDataset or generator (their examples
            cannot be split off without reading them).
    """
    kind = input_kind(x)
    if kind != "arrays":
        raise ValueError(
            f"Invalid combination of arguments. Received: validation_split={validation_split!r} with `x` a "
            f"{type(x).__name__}. Expected validation_split only with array inputs (NumPy arrays or "
            "tensors), which can be split; pass `validation_data=` for a dataset, PyDataset or generator."
        )
    return keras_internals.train_validation_split((x, y, sample_weight), validation_split)


def optionals_to_none(batch: Any) -> Any:
    """Empty `tf.experimental.Optional` parts of a batch -> None, as Keras's steps see them.

    Keras's generator adapter yields an empty Optional where a generator
    yielded None (e.g. `(x, y, None)`); Keras's `fit` hands the step None.
    """
    return tf.nest.map_structure(
        lambda part: None if isinstance(part, tf.experimental.Optional) else part, batch
    )


def examples_in_batch(batch: Any) -> tf.Tensor:
    """In-graph count of the examples in one (per-replica) batch: its first part's rows."""
    first = tf.nest.flatten(batch, expand_composites=False)[0]
    if isinstance(first, tf.RaggedTensor):
        return tf.cast(first.nrows(), tf.int64)
    if isinstance(first, tf.SparseTensor):
        return tf.cast(first.dense_shape[0], tf.int64)
    return tf.cast(tf.shape(first)[0], tf.int64)


class EpochPlan:
    """Decides which iterator each epoch reads and how many steps it runs.

    Mirrors `keras.Model.fit`: without `steps_per_epoch` every epoch is one
    full pass on a fresh iterator; with it, one iterator continues across
    epochs, and a finite dataset starts a new pass once all its batches were
    seen (an epoch cut short by the end of the data warns, as in Keras).

    Args:
        data: The adapted input (or a batched `tf.data.Dataset`).
        make_iterator: Dataset -> iterator (plain, or distributed).

    Raises:
        ValueError: an empty or infinite dataset without `steps_per_epoch`,
            or `steps_per_epoch` past the end of a finite dataset.
    """

    def __init__(
        self,
        data: AdaptedInput | tf.data.Dataset,
        make_iterator: Callable[[tf.data.Dataset], Iterator[Any]] = iter,
    ):
        if isinstance(data, tf.data.Dataset):
            data = AdaptedInput(dataset=data, adapter=None, kind="dataset", steps=None)
        dataset, steps_per_epoch = data.dataset, data.steps
        argument, steps_argument = data.argument, data.steps_argument
        cardinality = int(dataset.cardinality())
        if cardinality == 0:
            raise ValueError(
                f"Invalid value for argument `{argument}`: the dataset is empty (cardinality 0). "
                "Expected at least one batch; check filters, `take`, or a batch size larger "
                "than the data with `drop_remainder=True`."
            )
        if cardinality == tf.data.INFINITE_CARDINALITY and steps_per_epoch is None:
            raise ValueError(
                f"Invalid value for argument `{argument}`: the data never ends (an infinite dataset or "
                f"PyDataset), so an epoch never ends. Received: {steps_argument}=None. Expected "
                f"{steps_argument}=<number of steps>, or finite data."
            )
        if cardinality > 0 and steps_per_epoch is not None and steps_per_epoch > cardinality:
            raise ValueError(
                f"Invalid value for argument `{steps_argument}`. Received: "
                f"{steps_argument}={steps_per_epoch}, but `{argument}` has only {cardinality} "
                f"batches. Expected {steps_argument} <= {cardinality}, or "
                "`dataset.repeat()` to read it more than once."
            )
        self.data = data
        self.dataset = dataset
        self.steps_per_epoch = steps_per_epoch
        self.argument = argument
        self.single_pass = data.kind == "generator"
        self._make_iterator = make_iterator
        self._batches_per_pass = cardinality if cardinality > 0 else None
        # Whether a pass may end where no count says so (a generator, a filtered
        # dataset): the loop then checks for a next batch before a batch hook.
        self.may_end_unannounced = cardinality == tf.data.UNKNOWN_CARDINALITY
        self._iterator: Iterator[Any] | None = None
        self._seen_in_pass = 0
        self._in_epoch = False

    @property
    def steps(self) -> int | None:
        """Steps in the coming epoch, or None while unknown."""
        if self.steps_per_epoch is not None:
            return self.steps_per_epoch
        return self._batches_per_pass

    def batches_left(self, steps_this_epoch: int) -> int | None:
        """Batches left in the current pass (None while its length is unknown)."""
        if self._batches_per_pass is None or self._iterator is None:
            return None
        return self._batches_per_pass - self._seen_in_pass - steps_this_epoch

    @property
    def plain_iterators(self) -> bool:
        """Whether the iterators are `tf.data` iterators of `dataset` (not distributed ones)."""
        return self._make_iterator is iter

    def begin_epoch(self) -> Iterator[Any]:
        """Starts an epoch (a PyDataset's `on_epoch_begin`); returns the iterator it reads from."""
        if self.data.adapter is not None and not self._in_epoch:
            self._in_epoch = True  # first: `close` must end the epoch even if the hook raises
            self.data.adapter.on_epoch_begin()
        self._in_epoch = True
        return self.next_iterator()

    def reset(self) -> None:
        """Makes the next epoch a fresh pass from the first batch, as Keras's epoch iterator `reset()`.

        Keras resets before training and before each evaluation, which also runs
        the adapter's `on_epoch_end` (a PyDataset shuffling there reshuffles).
        """
        self.close()
        self._iterator = None
        self._seen_in_pass = 0
        if self.data.adapter is not None:
            self.data.adapter.on_epoch_end()

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

    def end_epoch(self, steps_run: int, data_ended: bool, *, cut: bool = False) -> None:
        """Records how the epoch went (and runs a PyDataset's `on_epoch_end`).

        Args:
            steps_run: Steps the epoch ran (before a resume too).
            data_ended: Whether the iterator ran out of batches.
            cut: The epoch stopped short of its end and goes on later (a step
                budget reached mid-epoch): the pass and its iterator are kept.

        Raises:
            ValueError: the very first pass yielded no batch at all.
        """
        self.close()
        if cut:
            return
        known_pass = self._batches_per_pass
        self._seen_in_pass += steps_run
        if data_ended:
            if self._seen_in_pass == 0:
                raise ValueError(
                    f"Invalid value for argument `{self.argument}`: the data yielded no "
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
            if known_pass is not None and self._seen_in_pass >= known_pass:
                # Keras's epoch iterator starts the next pass's iterator when a pass
                # ends, and the next epoch starts another: made here too, a
                # reshuffling dataset's later epochs get the orders they get under fit.
                self._make_iterator(self.dataset)
        elif self._batches_per_pass is not None and self._seen_in_pass >= self._batches_per_pass:
            self._iterator = None

    def close(self) -> None:
        """Ends the epoch for the adapter (a PyDataset's `on_epoch_end`, stopping its workers)."""
        if self._in_epoch and self.data.adapter is not None:
            self.data.adapter.on_epoch_end()
        self._in_epoch = False
