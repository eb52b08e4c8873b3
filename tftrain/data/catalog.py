"""The named datasets' shared definitions: names and splits, `DatasetInfo`, `DatasetUnavailableError`.

Kept apart so that `tftrain.data` (the public catalog) and
`tftrain.data.tfds_loading` (its tensorflow-datasets half) both import them
without importing each other.
"""

from __future__ import annotations

import dataclasses

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


SHAPES_CLASS_NAMES = (
    "circle",
    "square",
    "triangle",
    "cross",
    "ring",
    "star",
    "frame",
    "half_disk",
)
"""Class names of the "shapes" dataset; label `i` is `SHAPES_CLASS_NAMES[i]`."""

PUBLISHED_SPLIT_SIZES = {
    "cifar10": {"train": 50_000, "test": 10_000},
    "cifar100": {"train": 50_000, "test": 10_000},
    "stl10": {"train": 5_000, "test": 8_000, "unlabelled": 100_000},
    "fashion_mnist": {"train": 60_000, "test": 10_000},
    "mnist": {"train": 60_000, "test": 10_000},
    "imagenet2012": {"train": 1_281_167, "validation": 50_000},
}
"""Examples per split, as tensorflow-datasets publishes them for the versions it
defines (cifar10 3.0.2, cifar100 3.0.2, stl10 1.0.0, fashion_mnist 3.0.1, mnist
3.0.1, imagenet2012 5.1.0): used by `tftrain.data.info` for a dataset that is not
prepared (its metadata holds no split sizes)."""
