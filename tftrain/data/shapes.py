"""Datasets generated offline: "shapes" (learnable images) and "synthetic" (random, for timing).

"shapes" is an image classification set drawn with NumPy: one filled or
outlined shape per image, in a random foreground colour on a random background
colour, at a random position, scale and rotation, with mild pixel noise.
Colours are drawn independently of the class, so only the shape tells the
class apart: a model has to learn shape (which is what colour augmentations,
as in SimCLR, are meant to teach).

Generation is deterministic: the same split, image size and count give the
same bytes, and fewer examples are a prefix of more. The "train" and "test"
splits come from different seeds.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tftrain.arguments import check_int
from tftrain.data.catalog import SHAPES_CLASS_NAMES as CLASS_NAMES

SPLITS = ("train", "test")
"""Splits of the generated datasets."""

DEFAULT_NUM_EXAMPLES = {"train": 10_000, "test": 2_000}
"""Examples per split when no count is given."""

MIN_IMAGE_SIZE = 16

_SEEDS = {"train": 0x5A3E_0001, "test": 0x5A3E_0002}
_SYNTHETIC_SEEDS = {"train": 0x5E7A_0001, "test": 0x5E7A_0002}
_BLOCK = 1024  # examples drawn per random block; a multiple of len(CLASS_NAMES)
_SCALE_RANGE = (0.18, 0.40)  # shape radius, as a fraction of the image size
_MIN_CONTRAST = 0.3  # luminance difference between foreground and background, in [0, 1]
_NOISE_STDDEV = 6.0  # pixel noise, in uint8 steps
_LUMA = np.array([0.299, 0.587, 0.114], np.float32)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(
            f"Invalid value for argument `split`. Received: split={split!r}. Expected one of {list(SPLITS)}."
        )


# ----------------------------------------------------------------- signed distances
# Each function maps coordinates (u, v) in the shape's own frame, where the
# shape fits in the unit disk, to an approximate signed distance to its outline
# (negative inside), in the same units.


def _box(u: np.ndarray, v: np.ndarray, half_u: float, half_v: float) -> np.ndarray:
    du = np.abs(u) - half_u
    dv = np.abs(v) - half_v
    outside = np.hypot(np.maximum(du, 0.0), np.maximum(dv, 0.0))
    return outside + np.minimum(np.maximum(du, dv), 0.0)


def _circle(u, v):
    return np.hypot(u, v) - 0.9


def _square(u, v):
    return _box(u, v, 0.68, 0.68)


def _triangle(u, v):
    # Equilateral, circumradius 1: three half-planes at distance 0.5 from the centre.
    sides = [np.cos(a) * u + np.sin(a) * v for a in (np.pi / 2, np.pi * 7 / 6, np.pi * 11 / 6)]
    return np.maximum(np.maximum(sides[0], sides[1]), sides[2]) - 0.5


def _cross(u, v):
    return np.minimum(_box(u, v, 0.95, 0.3), _box(u, v, 0.3, 0.95))


def _ring(u, v):
    return np.abs(np.hypot(u, v) - 0.68) - 0.26


def _star(u, v):
    # Five points: the radius goes linearly, with the angle, from 1 at a point to 0.42 between.
    sector = 2 * np.pi / 5
    t = np.mod(np.arctan2(v, u) + np.pi / 2, sector) / sector
    radius = 0.42 + 0.58 * np.abs(2.0 * t - 1.0)
    return (np.hypot(u, v) - radius) * 0.6


def _frame(u, v):
    return np.abs(_box(u, v, 0.68, 0.68) + 0.15) - 0.15


def _half_disk(u, v):
    # Radius 0.92, the flat side below the centre so the shape is centred.
    shifted = v + 0.37
    return np.maximum(np.hypot(u, shifted) - 0.92, -shifted)


_DISTANCES = (_circle, _square, _triangle, _cross, _ring, _star, _frame, _half_disk)


# ---------------------------------------------------------------------- sampling


def _draw_block(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random parameters of `_BLOCK` examples, in units independent of the image size."""
    num_classes = len(CLASS_NAMES)
    # Every run of `num_classes` examples holds each class once: balanced classes.
    labels = rng.permuted(np.tile(np.arange(num_classes), (_BLOCK // num_classes, 1)), axis=1)
    scale = rng.uniform(*_SCALE_RANGE, size=_BLOCK)
    centre = rng.uniform(size=(_BLOCK, 2)) * (1.0 - 2.0 * scale[:, None]) + scale[:, None]
    angle = rng.uniform(0.0, 2.0 * np.pi, size=_BLOCK)
    background = rng.uniform(size=(_BLOCK, 3)).astype(np.float32)
    foreground = rng.uniform(size=(_BLOCK, 3)).astype(np.float32)
    low_contrast = np.abs((foreground - background) @ _LUMA) < _MIN_CONTRAST
    while low_contrast.any():
        foreground[low_contrast] = rng.uniform(size=(int(low_contrast.sum()), 3))
        low_contrast = np.abs((foreground - background) @ _LUMA) < _MIN_CONTRAST
    return dict(
        labels=labels.reshape(-1).astype(np.int64),
        scale=scale,
        centre=centre,
        angle=angle,
        background=background,
        foreground=foreground,
        noise_seed=rng.integers(0, 2**63 - 1, size=_BLOCK),
    )


def _coverage(params: dict[str, np.ndarray], image_size: int) -> np.ndarray:
    """Foreground coverage in [0, 1] of each pixel, shape (N, S, S), anti-aliased over a pixel."""
    grid = (np.arange(image_size, dtype=np.float32) + 0.5) / image_size
    dx = grid[None, None, :] - params["centre"][:, 0, None, None].astype(np.float32)
    dy = grid[None, :, None] - params["centre"][:, 1, None, None].astype(np.float32)
    cos = np.cos(params["angle"]).astype(np.float32)[:, None, None]
    sin = np.sin(params["angle"]).astype(np.float32)[:, None, None]
    scale = params["scale"].astype(np.float32)[:, None, None]
    u = (dx * cos + dy * sin) / scale
    v = (dy * cos - dx * sin) / scale
    coverage = np.empty_like(u)
    for label, distance in enumerate(_DISTANCES):
        rows = params["labels"] == label
        if rows.any():
            pixels = distance(u[rows], v[rows]) * (scale[rows] * image_size)
            coverage[rows] = np.clip(0.5 - pixels, 0.0, 1.0)
    return coverage


def _render(params: dict[str, np.ndarray], image_size: int) -> np.ndarray:
    coverage = _coverage(params, image_size)[..., None]
    background = params["background"][:, None, None, :] * 255.0
    foreground = params["foreground"][:, None, None, :] * 255.0
    images = background + coverage * (foreground - background)
    shape = (image_size, image_size, 3)
    for i, seed in enumerate(params["noise_seed"]):
        noise_rng = np.random.default_rng(int(seed))
        images[i] += noise_rng.standard_normal(shape, dtype=np.float32) * _NOISE_STDDEV
    return np.clip(np.rint(images), 0, 255).astype(np.uint8)


def generate(split: str, num_examples: int, image_size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Generates "shapes" images and labels.

    Args:
        split: "train" or "test" (drawn from different seeds).
        num_examples: How many examples. The first n of a larger count are
            the same n examples.
        image_size: Height and width in pixels, at least 16.

    Returns:
        `(images, labels)`: uint8 images of shape `(num_examples, image_size,
        image_size, 3)` and int64 labels of shape `(num_examples,)`, indices
        into `CLASS_NAMES`. Each run of `len(CLASS_NAMES)` examples holds every
        class once.

    Raises:
        ValueError: an unknown split, `num_examples` < 1 or `image_size` < 16.
    """
    _check_split(split)
    check_int("num_examples", num_examples, 1)
    check_int("image_size", image_size, MIN_IMAGE_SIZE)
    images = np.empty((num_examples, image_size, image_size, 3), np.uint8)
    labels = np.empty((num_examples,), np.int64)
    for block, start in enumerate(range(0, num_examples, _BLOCK)):
        stop = min(start + _BLOCK, num_examples)
        params = _draw_block(np.random.default_rng([_SEEDS[split], block]))
        params = {key: value[: stop - start] for key, value in params.items()}
        labels[start:stop] = params["labels"]
        # Render in chunks to bound the float32 working memory.
        chunk = max(1, (1 << 21) // (image_size * image_size))
        for offset in range(0, stop - start, chunk):
            part = {key: value[offset : offset + chunk] for key, value in params.items()}
            images[start + offset : start + offset + len(part["labels"])] = _render(part, image_size)
    return images, labels


def shapes_dataset(split: str, image_size: int = 32, num_examples: int | None = None) -> tf.data.Dataset:
    """The "shapes" dataset as an unbatched `tf.data.Dataset` of `(image, label)`.

    Args:
        split: "train" or "test".
        image_size: Height and width in pixels, at least 16.
        num_examples: How many examples; default 10,000 for "train" and
            2,000 for "test".

    Returns:
        A dataset of `(uint8 image (image_size, image_size, 3), int64 label)`,
        generated in memory when this is called.

    Raises:
        ValueError: an unknown split, or a bad `image_size` / `num_examples`.
    """
    _check_split(split)
    num_examples = DEFAULT_NUM_EXAMPLES[split] if num_examples is None else num_examples
    images, labels = generate(split, num_examples, image_size)
    return tf.data.Dataset.from_tensor_slices((images, labels))


def synthetic_dataset(
    split: str,
    image_size: int = 32,
    num_examples: int | None = None,
    num_classes: int = 10,
    channels: int = 3,
) -> tf.data.Dataset:
    """Random images and labels of a fixed shape, for timing: nothing to learn.

    Each example is drawn when it is read (stateless random ops seeded by the
    split and the example's index), so large images cost no memory and the
    same split always gives the same data.

    Args:
        split: "train" or "test" (different seeds).
        image_size: Height and width in pixels.
        num_examples: How many examples; default 10,000 for "train" and
            2,000 for "test".
        num_classes: Labels are drawn uniformly from `[0, num_classes)`.
        channels: Image channels.

    Returns:
        An unbatched dataset of `(uint8 image (image_size, image_size,
        channels), int64 label)`.

    Raises:
        ValueError: an unknown split or a bad size or count.
    """
    _check_split(split)
    check_int("image_size", image_size, 1)
    check_int("num_classes", num_classes, 1)
    check_int("channels", channels, 1)
    num_examples = DEFAULT_NUM_EXAMPLES[split] if num_examples is None else num_examples
    check_int("num_examples", num_examples, 1)
    shape = (image_size, image_size, channels)
    split_seed = _SYNTHETIC_SEEDS[split]

    def make(index):
        seed = tf.stack([tf.constant(split_seed, tf.int64), index])
        image = tf.random.stateless_uniform(shape, seed, minval=0, maxval=256, dtype=tf.int32)
        label = tf.random.stateless_uniform(
            (), seed + [0, 1 << 40], minval=0, maxval=num_classes, dtype=tf.int64
        )
        return tf.cast(image, tf.uint8), label

    return tf.data.Dataset.range(num_examples).map(make, num_parallel_calls=tf.data.AUTOTUNE)
