"""Data: the inputs of `fit`/`evaluate`/`predict`, and named datasets.

This package's public functions (`load`, `info`) give named datasets:
tensorflow-datasets with clear offline errors, and the generated `shapes`
and `synthetic`. Its modules:

- `inputs`: what `fit`/`evaluate`/`predict` accept, through Keras's own
  adapters.
- `distributed_data`: a `tf.distribute.DistributedDataset` input, read as
  distributed.
- `epoch_plan`: `EpochPlan`, the pass-by-pass plan over them (shaped like
  Keras's `EpochIterator`).
- `fit_checks`: checks of the data against the model and the call.
- `catalog`, `shapes`, `tfds_loading`: the named datasets.

May import: `tftrain.options`, `compat`, `errors`. Nothing above it.
"""

from __future__ import annotations

import tensorflow as tf

from tftrain.data.catalog import (
    DEFAULT_IMAGE_SIZE,
    KNOWN_DATASETS,
    PUBLISHED_SPLIT_SIZES,
    SHAPES_CLASS_NAMES,
    SPLITS,
    DatasetInfo,
)
from tftrain.errors import DatasetUnavailableError
from tftrain.options import check_int

__all__ = [
    "DEFAULT_IMAGE_SIZE",
    "GENERATED_DATASETS",
    "KNOWN_DATASETS",
    "PUBLISHED_SPLIT_SIZES",
    "SHAPES_CLASS_NAMES",
    "SPLITS",
    "DatasetInfo",
    "DatasetUnavailableError",
    "info",
    "load",
]

GENERATED_DATASETS = ("shapes", "synthetic")
"""Datasets made on this machine, with no download (`load("shapes")`, `load("synthetic")`)."""


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
    check_int("image_size", image_size, optional=True)
    check_int("num_examples", num_examples, optional=True)
    if name in GENERATED_DATASETS:
        from tftrain.data import shapes

        size = DEFAULT_IMAGE_SIZE if image_size is None else image_size
        if name == "shapes":
            return shapes.shapes_dataset(split, image_size=size, num_examples=num_examples)
        return shapes.synthetic_dataset(split, image_size=size, num_examples=num_examples)
    from tftrain.data import tfds_loading  # imports tensorflow_datasets

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
    check_int("image_size", image_size, optional=True)
    if name in GENERATED_DATASETS:
        from tftrain.data import shapes

        size = DEFAULT_IMAGE_SIZE if image_size is None else image_size
        num_classes = len(shapes.CLASS_NAMES) if name == "shapes" else 10
        return DatasetInfo(name, num_classes, (size, size, 3), dict(shapes.DEFAULT_NUM_EXAMPLES))
    from tftrain.data import tfds_loading  # imports tensorflow_datasets

    return tfds_loading.tfds_info(name, data_dir=data_dir, image_size=image_size)
