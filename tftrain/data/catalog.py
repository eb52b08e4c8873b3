"""The named datasets' shared definitions: names and splits, `DatasetInfo`, `SplitSizes`, `UnknownSplitError`.

Kept apart so that `tftrain.data` (the public catalog) and
`tftrain.data.tfds_loading` (its tensorflow-datasets half) both import them
without importing each other.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Iterator, Mapping

GENERATED_DATASETS = ("shapes", "synthetic")
"""Datasets made on this machine, with no download (`load("shapes")`, `load("synthetic")`).

Their splits are fixed ("train" and "test", no slices: use `num_examples`)."""

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
"""The splits of the datasets tftrain knows by name (`KNOWN_DATASETS`).

For the generated datasets these are their only splits. For the
tensorflow-datasets names they are the splits the published versions define
(imagenet2012's "test" reads "validation"), used to check a split before the
dataset is prepared; once it is, its own splits are the reference.
"""

KNOWN_DATASETS = tuple(SPLITS)
"""The dataset names tftrain knows without asking tensorflow-datasets: the
generated ones and the tfds names with published split sizes or split aliases.

Not a limit: `load` and `info` also accept any other tensorflow-datasets name
(with a config and version: "imagenet2012_subset/1pct", "cifar10:3.0.2"), and
any split string tensorflow-datasets reads ("train[:10%]", "train+test")."""

SPLIT_ALIASES = {"imagenet2012": {"test": "validation"}}
"""Dataset -> split name -> the split it reads (imagenet2012's "test" split has no labels)."""

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
        splits: Split name -> number of examples, for the dataset's splits
            (a `SplitSizes`: a split string such as "train[:10%]" can be
            looked up too).
    """

    name: str
    num_classes: int
    image_shape: tuple[int | None, int | None, int]
    splits: Mapping[str, int]


SHAPES_CLASS_NAMES = ("circle", "square", "triangle", "cross", "ring", "star", "frame", "half_disk")
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


class UnknownSplitError(KeyError, ValueError):
    """A split that the dataset does not have, or a split string that tensorflow-datasets cannot read.

    A `ValueError` (a bad argument of `load`) and a `KeyError` (a missing key
    of `DatasetInfo.splits`).
    """

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def base_name(name: str) -> str:
    """The dataset name without its config and version: "imagenet2012_subset/1pct:5.0.0" -> "imagenet2012_subset"."""
    return name.split("/")[0].split(":")[0]


_SPLIT_PIECE = re.compile(r"^\s*([^\[\]+\s]+)(.*)$")


def split_names(split: str) -> list[str]:
    """The split names a tensorflow-datasets split string reads: "train[:10%]+test" -> ["train", "test"]."""
    names = []
    for piece in split.split("+"):
        match = _SPLIT_PIECE.match(piece)
        names.append(match.group(1) if match else piece.strip())
    return names


def alias_split(name: str, split: str) -> str:
    """`split` with each split name replaced by the split it reads (`SPLIT_ALIASES`)."""
    aliases = SPLIT_ALIASES.get(base_name(name))
    if not aliases:
        return split
    pieces = []
    for piece in split.split("+"):
        match = _SPLIT_PIECE.match(piece)
        if match and match.group(1) in aliases:
            piece = aliases[match.group(1)] + match.group(2)
        pieces.append(piece.strip())
    return "+".join(pieces)


def is_plain_split(split: str) -> bool:
    """Whether `split` is one split name (no slice, no "+")."""
    return bool(re.fullmatch(r"[\w-]+", split))


def split_error(name: str, split: object, available: Iterable[str], reason: str = "") -> UnknownSplitError:
    """The error for a split `name` does not have: what was received, the splits it has, the syntax."""
    available = list(available)
    if not available:
        expected = (
            "Expected a split string tensorflow-datasets reads, such as 'train', 'train[:10%]' or "
            "'train+test' (https://www.tensorflow.org/datasets/splits)."
        )
    elif name in GENERATED_DATASETS:
        expected = (
            f"Expected one of {', '.join(available)} (a generated dataset's splits are fixed: no slices "
            'or "+"; pass num_examples to read fewer examples).'
        )
    else:
        expected = (
            f"Expected one of {', '.join(available)}, or a tensorflow-datasets split string over them "
            "such as 'train[:10%]', 'train[1000:]' or 'train+test' "
            "(https://www.tensorflow.org/datasets/splits)."
        )
    because = f" {reason.rstrip('.')}." if reason else ""
    return UnknownSplitError(
        f"Invalid value for argument `split`. Received: split={split!r} for dataset {name!r}.{because} "
        f"{expected}"
    )


def check_known_split(name: str, split: str) -> None:
    """Checks `split` against `SPLITS` for a name tftrain knows; other names pass.

    Generated datasets take only their split names; the known
    tensorflow-datasets names take split strings whose split names are
    theirs (slices are checked by tensorflow-datasets).

    Raises:
        UnknownSplitError: the split is not one of the dataset's.
    """
    known = SPLITS.get(name)
    if known is None:
        return
    if name in GENERATED_DATASETS or not isinstance(split, str):
        if split not in known:
            raise split_error(name, split, known)
        return
    missing = [piece for piece in split_names(split) if piece not in known]
    if missing:
        raise split_error(name, split, known, f"It has no split {', '.join(map(repr, missing))}")


class SplitSizes(Mapping[str, int]):
    """Split name -> number of examples, for a dataset's splits; looking up a split string works too.

    Iterating gives the dataset's own splits (and its aliases, such as
    imagenet2012's "test"). Looking up any split string the dataset reads
    ("train[:10%]", "train+test") gives its number of examples, as
    tensorflow-datasets counts it (`builder.info.splits[split].num_examples`).
    A split the dataset does not have raises `UnknownSplitError` (a
    `KeyError` and a `ValueError`) naming the ones it has.

    Args:
        sizes: The dataset's splits and their sizes.
        lookup: Number of examples of any other split string; raises
            `UnknownSplitError` (or `DatasetUnavailableError` where the sizes
            are not known until the dataset is prepared). None: only `sizes`.
    """

    def __init__(self, sizes: Mapping[str, int], lookup: Callable[[str], int] | None = None):
        self._sizes = {str(split): int(count) for split, count in sizes.items()}
        self._lookup = lookup

    def __getitem__(self, split: str) -> int:
        if split in self._sizes:
            return self._sizes[split]
        if self._lookup is not None and isinstance(split, str):
            return int(self._lookup(split))
        raise UnknownSplitError(
            f"Invalid split {split!r}. Expected one of {', '.join(self._sizes) or '(none known)'}."
        )

    def __contains__(self, split: object) -> bool:
        try:
            self[split]  # type: ignore[index]
        except Exception:  # any failed lookup: not a split this dataset reads
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self._sizes)

    def __len__(self) -> int:
        return len(self._sizes)

    def __repr__(self) -> str:
        return repr(self._sizes)
