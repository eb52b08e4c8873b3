"""Data: the named datasets the programs load.

This package's public functions (`load`, `info`) give named datasets:
tensorflow-datasets with clear offline errors, and the generated `shapes`
and `synthetic`. Its modules:

- `catalog`: the names, splits and sizes tftrain knows, and `DatasetInfo`.
- `shapes`: the generated `shapes` and `synthetic` datasets.
- `tfds_loading`: any tensorflow-datasets image-classification dataset
  (imported only when one is loaded).

What `fit`, `evaluate` and `predict` take is `tftrain.fit_inputs`,
independent of this package.

May import: `tftrain.options`, `arguments`, `compat`, `errors`. Nothing above it.
"""

from __future__ import annotations

import tensorflow as tf

from tftrain.arguments import check_int
from tftrain.data.catalog import (
    DEFAULT_IMAGE_SIZE,
    GENERATED_DATASETS,
    KNOWN_DATASETS,
    PUBLISHED_SPLIT_SIZES,
    SHAPES_CLASS_NAMES,
    SPLIT_ALIASES,
    SPLITS,
    DatasetInfo,
    SplitSizes,
    UnknownSplitError,
    check_known_split,
    split_error,
)
from tftrain.errors import DatasetUnavailableError

__all__ = [
    "DEFAULT_IMAGE_SIZE",
    "GENERATED_DATASETS",
    "KNOWN_DATASETS",
    "PUBLISHED_SPLIT_SIZES",
    "SHAPES_CLASS_NAMES",
    "SPLITS",
    "SPLIT_ALIASES",
    "DatasetInfo",
    "DatasetUnavailableError",
    "SplitSizes",
    "UnknownSplitError",
    "check_name",
    "info",
    "load",
]


def _check_name_type(name: object) -> None:
    if not isinstance(name, str) or not name.strip():
        raise ValueError(
            f"Invalid value for argument `name`. Received: name={name!r}. Expected a dataset name: "
            f"{' or '.join(map(repr, GENERATED_DATASETS))} (generated offline), or a "
            "tensorflow-datasets name such as 'cifar10' or 'imagenet2012_subset/1pct'."
        )


def check_name(name: str, *, data_dir: str | None = None) -> None:
    """Checks that `load` knows the dataset `name`, without reading it.

    The generated datasets and `KNOWN_DATASETS` pass at once, without
    importing tensorflow-datasets. Any other name is looked up in
    tensorflow-datasets' registry (`tfds.list_builders()`, with its config:
    "imagenet2012_subset/1pct"), or else must be a dataset prepared in
    `data_dir`, as `tfds.builder` finds them.

    Args:
        name: A dataset name, as for `load`.
        data_dir: tensorflow-datasets data directory, as for `load`.

    Raises:
        ValueError: tensorflow-datasets does not know the name (the message
            suggests close names), or its config or version.
    """
    _check_name_type(name)
    if name in KNOWN_DATASETS:
        return
    from tftrain.data import tfds_loading  # imports tensorflow_datasets

    tfds_loading.check_tfds_name(name, data_dir=data_dir)


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

    Any tensorflow-datasets name of an image classification dataset (an
    "image" and a class "label" feature) is read from `data_dir`, as
    google-research/simclr reads `--dataset`: "cifar10", "imagenet2012",
    with a config "imagenet2012_subset/1pct", with a version "cifar10:3.0.2".
    A dataset missing there is downloaded and prepared first if its download
    servers can be reached. "shapes" (a learnable set of drawn shapes) and
    "synthetic" (random data, for timing) are generated here, with no files.

    Args:
        name: A tensorflow-datasets name, or "shapes" or "synthetic".
        split: For tensorflow-datasets, any split string the dataset reads:
            a split name ("train", "test"; stl10's "unlabelled" has label -1)
            or a slice or sum of splits ("train[:10%]", "train[1000:]",
            "train+test"; https://www.tensorflow.org/datasets/splits).
            imagenet2012's "test" reads "validation" (tensorflow-datasets'
            imagenet2012 "test" split has no labels), also in slices. The
            generated datasets have "train" and "test" only.
        data_dir: tensorflow-datasets data directory (default: its own,
            ~/tensorflow_datasets). Ignored by the generated datasets.
        image_size: Resize tfds images to `(image_size, image_size)`
            (bilinear with antialiasing, aspect ratio not kept, still uint8);
            None keeps their size. Size of the generated images (default 32;
            "shapes" needs at least 16).
        num_examples: Read only the first `num_examples` examples of the
            split, also of a sliced one ("train[10%:]" with 100: the first
            100 of that slice). Generated datasets: generate that many.
            None: all.
        manual_dir: imagenet2012 only: the directory holding
            ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar (default:
            `<data_dir>/downloads/manual`).
        shuffle_files: Read the tfds files in a random order.

    Returns:
        An unbatched `tf.data.Dataset` of `(image, label)`: uint8 images of
        shape `(height, width, channels)` (1 channel for mnist and
        fashion_mnist, 3 otherwise) and int64 scalar labels. Nothing is
        cached: tensorflow-datasets' automatic in-memory cache of small
        datasets is off, because tf.data cannot checkpoint a cached
        iterator symbolically and every checkpoint of a training run would
        then hold the whole decoded dataset. Call `.cache()` on the result to
        keep it in memory anyway (each epoch then skips decoding; the
        checkpoints hold the cache).

    Raises:
        ValueError: an unknown name (close names suggested), a dataset that
            is not image classification, or a bad size or count.
        UnknownSplitError: a split the dataset does not have, or a split
            string tensorflow-datasets cannot read (a `ValueError`); the
            message names the dataset's splits.
        DatasetUnavailableError: a tfds dataset is not in `data_dir` and
            could not be downloaded (no network); the message says how to
            prepare it.
    """
    check_name(name, data_dir=data_dir)
    if name in GENERATED_DATASETS:
        check_known_split(name, split)
    check_int("image_size", image_size, optional=True)
    check_int("num_examples", num_examples, optional=True)
    if name in GENERATED_DATASETS:
        from tftrain.data import shapes

        size = DEFAULT_IMAGE_SIZE if image_size is None else image_size
        make = shapes.shapes_dataset if name == "shapes" else shapes.synthetic_dataset
        return make(split, image_size=size, num_examples=num_examples)
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
    it is there (`builder.info.splits`), otherwise, for `KNOWN_DATASETS`,
    from the sizes tensorflow-datasets publishes for the version it defines
    (see docs/data.md). `splits` also answers for split strings:
    `info("cifar10").splits["train[:10%]"]` is 5000.

    Args:
        name: A dataset name, as for `load`.
        data_dir: tensorflow-datasets data directory, as for `load`.
        image_size: As for `load`: the image shape reported is the one `load`
            gives with this `image_size`.

    Returns:
        A `DatasetInfo`. For the generated datasets, `splits` holds their
        default sizes. Looking up a split the dataset does not have raises
        `UnknownSplitError`; looking up a split of a dataset that is not
        prepared and whose sizes tftrain does not know raises
        `DatasetUnavailableError`, saying how to prepare it.

    Raises:
        ValueError: an unknown name, a dataset that is not image
            classification, or a bad `image_size`.
    """
    check_name(name, data_dir=data_dir)
    check_int("image_size", image_size, optional=True)
    if name in GENERATED_DATASETS:
        from tftrain.data import shapes

        size = DEFAULT_IMAGE_SIZE if image_size is None else image_size
        num_classes = len(shapes.CLASS_NAMES) if name == "shapes" else 10
        sizes = SplitSizes(shapes.DEFAULT_NUM_EXAMPLES, lambda split: _generated_split(name, split))
        return DatasetInfo(name, num_classes, (size, size, 3), sizes)
    from tftrain.data import tfds_loading  # imports tensorflow_datasets

    return tfds_loading.tfds_info(name, data_dir=data_dir, image_size=image_size)


def _generated_split(name: str, split: str) -> int:
    """`SplitSizes` lookup of a generated dataset's split it does not hold: always an error."""
    raise split_error(name, split, SPLITS[name])
