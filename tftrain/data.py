"""Input handling: turn what users pass into a `tf.data.Dataset`, plan the epochs, load named datasets."""

from __future__ import annotations

import dataclasses
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


# ------------------------------------------------------------------ named datasets

GENERATED_DATASETS = ("shapes", "synthetic")
"""Datasets made on this machine, with no download (`load("shapes")`, `load("synthetic")`)."""

SPLITS = {
    "cifar10": ("train", "test"),
    "cifar100": ("train", "test"),
    "stl10": ("train", "test", "unlabelled"),
    "fashion_mnist": ("train", "test"),
    "mnist": ("train", "test"),
    "imagenet2012": ("train", "validation", "test"),
    "shapes": ("train", "test"),
    "synthetic": ("train", "test"),
}
"""The splits `load` accepts for each known dataset name (imagenet2012's "test" reads "validation")."""

KNOWN_DATASETS = tuple(SPLITS)
"""Every name `load` and `info` accept."""

DEFAULT_IMAGE_SIZE = 32  # of the generated datasets


class DatasetUnavailableError(RuntimeError):
    """A tensorflow-datasets dataset is not prepared in its `data_dir` and could not be downloaded.

    Attributes:
        name: The dataset name.
        data_dir: The tensorflow-datasets data directory that was searched.
    """

    def __init__(self, message: str, *, name: str | None = None, data_dir: str | None = None):
        super().__init__(message)
        self.name = name
        self.data_dir = data_dir

    def __reduce__(self):
        return _unavailable_error, (str(self), self.name, self.data_dir)


def _unavailable_error(message: str, name: str | None, data_dir: str | None) -> DatasetUnavailableError:
    return DatasetUnavailableError(message, name=name, data_dir=data_dir)


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a dataset holds, known before reading it.

    Attributes:
        name: The dataset name, as given to `load`.
        num_classes: Number of label classes.
        image_shape: `(height, width, channels)` of the images `load` gives
            with the same `image_size`; height and width are None where
            images vary in size (imagenet2012 without `image_size`).
        splits: Split name -> number of examples, for every split `load`
            accepts.
    """

    name: str
    num_classes: int
    image_shape: tuple[int | None, int | None, int]
    splits: dict[str, int]


def _check_name_and_split(name: str, split: str | None = None) -> None:
    if name not in SPLITS:
        raise ValueError(
            f"Invalid value for argument `name`. Received: name={name!r}. Expected one of "
            f"{', '.join(KNOWN_DATASETS)} (shapes and synthetic are generated offline)."
        )
    if split is not None and split not in SPLITS[name]:
        raise ValueError(
            f"Invalid value for argument `split`. Received: split={split!r} for dataset "
            f"{name!r}. Expected one of {', '.join(SPLITS[name])}."
        )


def _check_optional_int(argument: str, value: Any, minimum: int) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
        raise ValueError(
            f"Invalid value for argument `{argument}`. Received: {argument}={value!r}. "
            f"Expected None or an integer >= {minimum}."
        )


def load(
    name: str,
    split: str = "train",
    *,
    data_dir: str | None = None,
    image_size: int | None = None,
    num_examples: int | None = None,
    manual_dir: str | None = None,
    shuffle_files: bool = False,
) -> tf.data.Dataset:
    """Loads a named image classification dataset as unbatched `(image, label)` pairs.

    tensorflow-datasets names ("cifar10", "cifar100", "stl10",
    "fashion_mnist", "mnist", "imagenet2012") are read from `data_dir`, and
    downloaded and prepared there first if they are missing and the download
    servers can be reached. "shapes" (a learnable set of drawn shapes) and
    "synthetic" (random data, for timing) are generated here, with no files.

    Args:
        name: One of `KNOWN_DATASETS`.
        split: "train" or "test"; stl10 also has "unlabelled" (label -1).
            imagenet2012 has "train" and "validation"; its "test" reads
            "validation" (tensorflow-datasets' imagenet2012 "test" split has
            no labels).
        data_dir: tensorflow-datasets data directory (default: its own,
            ~/tensorflow_datasets). Ignored by the generated datasets.
        image_size: Resize tfds images to `(image_size, image_size)`
            (bilinear with antialiasing, aspect ratio not kept, still uint8);
            None keeps their size. Size of the generated images (default 32;
            "shapes" needs at least 16).
        num_examples: Read only the first `num_examples` examples of the
            split (generated datasets: generate that many). None: all.
        manual_dir: imagenet2012 only: the directory holding
            ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar (default:
            `<data_dir>/downloads/manual`).
        shuffle_files: Read the tfds files in a random order.

    Returns:
        An unbatched `tf.data.Dataset` of `(image, label)`: uint8 images of
        shape `(height, width, channels)` (1 channel for mnist and
        fashion_mnist, 3 otherwise) and int64 scalar labels.

    Raises:
        ValueError: an unknown name or split, or a bad size or count.
        DatasetUnavailableError: a tfds dataset is not in `data_dir` and
            could not be downloaded (no network); the message says what to
            do instead.
    """
    _check_name_and_split(name, split)
    _check_optional_int("image_size", image_size, 1)
    _check_optional_int("num_examples", num_examples, 1)
    if name in GENERATED_DATASETS:
        from tftrain import shapes

        size = DEFAULT_IMAGE_SIZE if image_size is None else image_size
        if name == "shapes":
            return shapes.shapes_dataset(split, image_size=size, num_examples=num_examples)
        return shapes.synthetic_dataset(split, image_size=size, num_examples=num_examples)
    from tftrain import tfds_loading  # imports tensorflow_datasets

    return tfds_loading.load_tfds(
        name,
        split,
        data_dir=data_dir,
        image_size=image_size,
        num_examples=num_examples,
        manual_dir=manual_dir,
        shuffle_files=shuffle_files,
    )


def info(name: str, *, data_dir: str | None = None, image_size: int | None = None) -> DatasetInfo:
    """Describes a named dataset without reading or downloading it.

    For tensorflow-datasets names, classes and image shape come from the
    dataset's definition in the installed tensorflow-datasets, which works
    offline. Split sizes come from the prepared dataset in `data_dir` when
    it is there, otherwise from the sizes tensorflow-datasets publishes for
    the version it defines (see docs/data.md).

    Args:
        name: One of `KNOWN_DATASETS`.
        data_dir: tensorflow-datasets data directory, as for `load`.
        image_size: As for `load`: the image shape reported is the one `load`
            gives with this `image_size`.

    Returns:
        A `DatasetInfo`. For the generated datasets, `splits` holds their
        default sizes.

    Raises:
        ValueError: an unknown name or a bad `image_size`.
    """
    _check_name_and_split(name)
    _check_optional_int("image_size", image_size, 1)
    if name in GENERATED_DATASETS:
        from tftrain import shapes

        size = DEFAULT_IMAGE_SIZE if image_size is None else image_size
        num_classes = len(shapes.CLASS_NAMES) if name == "shapes" else 10
        return DatasetInfo(name, num_classes, (size, size, 3), dict(shapes.DEFAULT_NUM_EXAMPLES))
    from tftrain import tfds_loading  # imports tensorflow_datasets

    return tfds_loading.tfds_info(name, data_dir=data_dir, image_size=image_size)
