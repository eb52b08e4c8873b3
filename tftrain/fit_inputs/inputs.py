"""Input handling: what `fit`, `evaluate` and `predict` take, as a `tf.data.Dataset`, and the epochs over it.

`adapt` runs Keras's own input adapters (the code `model.fit` runs), so the
Trainer accepts exactly what `model.fit` accepts: NumPy arrays and tensors
(nested in dicts, lists and tuples), ragged and sparse tensors,
`tf.data.Dataset`, a `tf.distribute.DistributedDataset` (read as distributed:
`tftrain.fit_inputs.distributed_data`), `keras.utils.PyDataset` (with its workers and
multiprocessing) and Python generators, with `batch_size`, `shuffle`,
`sample_weight` and `class_weight` applied as Keras applies them.
`tftrain.fit_inputs.epoch_plan.EpochPlan` decides which iterator each epoch reads and
how many steps it runs.
"""

from __future__ import annotations

import dataclasses
import types
import warnings
from typing import Any

import keras
import tensorflow as tf

from tftrain.arguments import check_int
from tftrain.compat import keras_internals
from tftrain.fit_inputs.distributed_data import DistributedData

INPUT_KINDS = ("dataset", "distributed", "arrays", "py_dataset", "generator")
"""The kinds of input `adapt` tells apart (`AdaptedInput.kind`)."""

_EXPECTED_INPUTS = (
    "Expected NumPy arrays or tensors (alone, or in a list, tuple or dict), a tf.data.Dataset "
    "(or a tf.distribute.DistributedDataset), a keras.utils.PyDataset or a Python generator, as "
    "keras.Model.fit takes."
)


def keras_step_limit(steps: int | None, steps_argument: str) -> int | None:
    """`steps`, capped by `keras.config.set_max_steps_per_epoch` as Keras caps it (with its warning)."""
    maximum = keras.config.max_steps_per_epoch()
    if maximum and (not steps or maximum < steps):
        warnings.warn(f"Limiting {steps_argument} to {maximum}", stacklevel=3)
        return maximum
    return steps


def keras_epoch_limit(epochs: int) -> int:
    """`epochs`, capped by `keras.config.set_max_epochs` as Keras caps it (with its warning)."""
    maximum = keras.config.max_epochs()
    if maximum and maximum < epochs:
        warnings.warn(f"Limiting epochs to {maximum}", stacklevel=3)
        return maximum
    return epochs


def input_kind(x: Any) -> str:
    """Which of `INPUT_KINDS` `x` is (anything that is not a dataset, PyDataset or generator is "arrays")."""
    if isinstance(x, tf.data.Dataset):
        return "dataset"
    if isinstance(x, tf.distribute.DistributedDataset):
        return "distributed"
    if isinstance(x, keras_internals.py_dataset_class()):
        return "py_dataset"
    if isinstance(x, types.GeneratorType):
        return "generator"
    return "arrays"


def read_to_adapt(x: Any) -> bool:
    """Whether Keras's adapter reads `x` to learn its structure: a PyDataset, a generator, or another iterable source.

    Arrays (NumPy, tensors, nests of them) and `tf.data` datasets are adapted
    without reading an element.
    """
    kind = input_kind(x)
    if kind in ("py_dataset", "generator"):
        return True
    if kind != "arrays":
        return False
    return not all(
        hasattr(leaf, "shape") or isinstance(leaf, int | float | bool | str) for leaf in tf.nest.flatten(x)
    )


@dataclasses.dataclass(frozen=True)
class AdaptedInput:
    """An input of `fit`/`evaluate`/`predict`, adapted as Keras adapts it.

    Attributes:
        dataset: The batches, as a `tf.data.Dataset` (for a distributed
            dataset, a `DistributedData`: its per-replica spec and iterators).
        adapter: Keras's data adapter (its `on_epoch_begin`/`on_epoch_end`
            run a PyDataset's workers and hooks).
        kind: One of `INPUT_KINDS`.
        steps: Steps per pass asked for (`steps_per_epoch`/`steps`, after the
            `keras.config` limit), or None for one pass over the data.
        argument: The argument the input came from, for error messages.
        steps_argument: The argument that set `steps`, for error messages.
    """

    dataset: tf.data.Dataset | DistributedData
    adapter: Any
    kind: str
    steps: int | None
    argument: str = "x"
    steps_argument: str = "steps_per_epoch"


def _check_batched(dataset: tf.data.Dataset | DistributedData, argument: str) -> None:
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
    checked: bool = False,
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
        checked: `batch_size` and `steps` were checked already (the same `fit` arguments before).

    Returns:
        An `AdaptedInput`.

    Raises:
        TypeError: `x` is of a type `model.fit` does not take.
        ValueError: what `model.fit` rejects (e.g. `y` with a dataset, `class_weight`
            with several outputs), an unbatched dataset, or a PyDataset whose
            `__getitem__` raises (the error names the index).
    """
    if not checked:
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
    if kind == "distributed":
        data = _adapt_distributed(x, y, sample_weight, class_weight, steps, argument, steps_argument)
        if from_limit and 0 < data.dataset.cardinality() < steps:
            data = dataclasses.replace(data, steps=data.dataset.cardinality())
        return data
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
    return AdaptedInput(dataset, adapter, kind, steps, argument=argument, steps_argument=steps_argument)


def _adapt_distributed(
    x: Any,
    y: Any,
    sample_weight: Any,
    class_weight: dict[int, float] | None,
    steps: int | None,
    argument: str,
    steps_argument: str,
) -> AdaptedInput:
    """A `tf.distribute.DistributedDataset`, read as it is (as Keras's dataset adapter passes it on).

    Not through `get_data_adapter`: Keras 3.7 does not recognise a
    `distribute_datasets_from_function` dataset there, and its adapter would
    only pass the dataset on. Its checks of `y` and `sample_weight` are made
    here, in its words.
    """
    given = {"y": (y, "the targets"), "sample_weight": (sample_weight, "the sample weights")}
    for name, (value, description) in given.items():
        if value is not None:
            raise ValueError(
                f"When providing `{argument}` as a tf.distribute.DistributedDataset, `{name}` should not be "
                f"passed. Instead, {description} should be included as part of the dataset."
            )
    if class_weight is not None:
        raise ValueError(
            f"Invalid combination of arguments. Received: class_weight with `{argument}` a "
            f"{type(x).__name__}, whose batches cannot be mapped once distributed. Expected the "
            "class weights applied before distributing (a `sample_weight` part of each batch, "
            "`(x, y, sample_weight)`), or the tf.data.Dataset itself with class_weight."
        )
    data = DistributedData(x)
    _check_batched(data, argument)
    return AdaptedInput(data, None, "distributed", steps, argument=argument, steps_argument=steps_argument)


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
