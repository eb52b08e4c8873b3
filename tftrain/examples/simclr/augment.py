"""SimCLR's image augmentations, as `tf.data`-friendly functions on single images.

Images are float32 `[height, width, 3]` tensors with values in [0, 1] (use
`preprocess_image` to convert uint8 or 1-channel images first). Every function
works eagerly and inside `tf.data.Dataset.map`, and returns a clipped image.
Colour jitter is SimCLR v2's ("simclrv2"): brightness is a random factor.
The blur, applied to batches of views, is in `blur.py`.

Every random function takes a `seed`: a shape-`[2]` integer tensor (or a
pair of ints), as `tf.random.stateless_uniform` does. Each choice inside
(crop box, flip, jitter order and factors, grayscale) derives from it
with stateless ops, so the same image and seed always give the same view, and
a `tf.data` pipeline built on them holds no random state: its iterator can be
checkpointed, and a run replays its stream exactly. Give each view its own
seed (`seed_for` derives one from a run's seed and a position in the stream).
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

# A stateless seed: a shape-[2] integer tensor, or a pair of ints.
Seed = tf.Tensor | tuple[int, int]
# The smallest output height/width the crop and blur are meant for.
MIN_SIZE = 8
# The fraction of the image the evaluation center crop keeps.
CROP_PROPORTION = 0.875


def _check_size(height: int, width: int) -> None:
    for argument, value in (("height", height), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < MIN_SIZE:
            raise ValueError(
                f"Invalid value for argument `{argument}`. Received: {argument}={value!r}. "
                f"Expected an integer >= {MIN_SIZE}: smaller images are too small to crop and blur."
            )


def _check_probability(p: float) -> None:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise ValueError(f"Invalid value for argument `p`. Received: p={p!r}. Expected a float in [0, 1].")


def _check_range(argument: str, value, upper: float | None) -> tuple[float, float]:
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        low = high = float("nan")
    if not (0 < low <= high <= (upper or float("inf"))):
        bound = f" <= {upper}" if upper is not None else ""
        raise ValueError(
            f"Invalid value for argument `{argument}`. Received: {argument}={value!r}. "
            f"Expected (low, high) with 0 < low <= high{bound}."
        )
    return low, high


def _as_seed(seed: Seed) -> tf.Tensor:
    seed = tf.convert_to_tensor(seed)
    if not seed.dtype.is_integer or seed.shape.rank != 1 or seed.shape[0] not in (2, None):
        raise ValueError(
            f"Invalid value for argument `seed`. Received: seed={seed!r}. Expected a shape-[2] integer "
            "tensor or a pair of ints, e.g. `seed_for(run_seed, position)`."
        )
    return tf.cast(seed, tf.int64)


def _split(seed: tf.Tensor, num: int) -> list[tf.Tensor]:
    return tf.unstack(tf.random.experimental.stateless_split(seed, num))


def seed_for(run_seed: int | tf.Tensor, position: int | tf.Tensor, stream: int = 0) -> tf.Tensor:
    """A stateless seed for one position of a random stream, derived from a run's seed.

    Args:
        run_seed: The run's integer seed.
        position: The position in the stream (an int64 counter, e.g. from
            `tf.data.Dataset.enumerate`).
        stream: Tells apart independent streams of one run (e.g. the views
            of each image and the blur of each batch).

    Returns:
        A shape-`[2]` int64 seed for `tf.random.stateless_*` ops.
    """
    base = tf.stack([tf.cast(run_seed, tf.int64), tf.cast(stream, tf.int64)])
    return tf.random.experimental.stateless_fold_in(base, tf.cast(position, tf.int64))


Transform = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]  # (image, seed) -> image


def _random_apply(func: Transform, p: float, image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Returns `func(image, seed')` with probability `p`, else `image`."""
    if p <= 0:
        return image
    coin_seed, func_seed = _split(seed, 2)
    if p >= 1:
        return func(image, func_seed)
    coin = tf.random.stateless_uniform([], coin_seed)
    return tf.cond(coin < p, lambda: func(image, func_seed), lambda: image)


def _clip(image: tf.Tensor) -> tf.Tensor:
    return tf.clip_by_value(image, 0.0, 1.0)


def _resize(image: tf.Tensor, height: int, width: int) -> tf.Tensor:
    """Resizes with bicubic interpolation, unless the static size is already right."""
    if tuple(image.shape[:2]) == (height, width):
        return image
    return tf.image.resize(image, [height, width], method="bicubic")


def random_crop_with_resize(
    image: tf.Tensor,
    height: int,
    width: int,
    seed: Seed,
    area_range: tuple[float, float] = (0.08, 1.0),
    aspect_ratio_range: tuple[float, float] = (3 / 4, 4 / 3),
) -> tf.Tensor:
    """Crops a random box of the image and resizes it to `height` x `width`.

    The "Inception" crop: the box covers a random fraction of the image area
    in `area_range`, at a random aspect ratio in `aspect_ratio_range` times
    the output's.

    Args:
        image: A `[h, w, c]` float image, of any size.
        height: The output height (>= 8).
        width: The output width (>= 8).
        seed: A shape-`[2]` integer seed.
        area_range: The (min, max) fraction of the image area to keep.
        aspect_ratio_range: The (min, max) width / height of the box, over the output's.

    Returns:
        A `[height, width, c]` float32 image in [0, 1].

    Raises:
        ValueError: a size below 8, a bad range or a bad seed.
    """
    _check_size(height, width)
    seed = _as_seed(seed)
    area_range = _check_range("area_range", area_range, upper=1.0)
    low, high = _check_range("aspect_ratio_range", aspect_ratio_range, upper=None)
    image = tf.convert_to_tensor(image, tf.float32)
    aspect = width / height
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image),
        bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
        seed=seed,
        min_object_covered=0.1,
        aspect_ratio_range=(low * aspect, high * aspect),
        area_range=area_range,
        max_attempts=100,
        use_image_if_no_bounding_boxes=True,
    )
    image = tf.slice(image, begin, size)
    return _clip(tf.image.resize(image, [height, width], method="bicubic"))


def _color_transforms(strength: float) -> list[Transform]:
    """Brightness, contrast, saturation and hue jitter (0.8s, 0.8s, 0.8s, 0.2s)."""
    amount = 0.8 * strength
    low, high = max(1.0 - amount, 0.0), 1.0 + amount
    hue = min(0.2 * strength, 0.5)
    return [
        lambda x, seed: x * tf.random.stateless_uniform([], seed, low, high),  # brightness
        lambda x, seed: tf.image.stateless_random_contrast(x, low, high, seed),
        lambda x, seed: tf.image.stateless_random_saturation(x, low, high, seed),
        lambda x, seed: tf.image.stateless_random_hue(x, hue, seed),
    ]


def random_color_jitter(
    image: tf.Tensor, seed: Seed, strength: float = 1.0, p: float = 0.8, random_order: bool = True
) -> tf.Tensor:
    """With probability `p`, jitters brightness, contrast, saturation and hue.

    The factors are drawn in [1 - 0.8s, 1 + 0.8s] (floored at 0) for
    brightness (multiplicative, SimCLR v2 style), contrast and saturation, and
    the hue shift in [-0.2s, 0.2s] (at most 0.5), where s is `strength`. The
    image is clipped to [0, 1] after each transform.

    Args:
        image: A `[h, w, 3]` float image in [0, 1].
        seed: A shape-`[2]` integer seed.
        strength: The jitter strength s (>= 0; 0 leaves the image as is).
        p: The probability of jittering.
        random_order: Apply the four transforms in a random order (else in
            the order above).

    Returns:
        The image, float32, in [0, 1].

    Raises:
        ValueError: a negative strength, a bad `p` or a bad seed.
    """
    if isinstance(strength, bool) or not isinstance(strength, (int, float)) or strength < 0:
        raise ValueError(
            f"Invalid value for argument `strength`. Received: strength={strength!r}. Expected >= 0."
        )
    _check_probability(p)
    seed = _as_seed(seed)
    image = tf.convert_to_tensor(image, tf.float32)
    if strength == 0:
        return _clip(image)
    transforms = _color_transforms(strength)

    def jitter(x, seed):
        order_seed, *seeds = _split(seed, len(transforms) + 1)
        if not random_order:
            for transform, transform_seed in zip(transforms, seeds, strict=True):
                x = _clip(transform(x, transform_seed))
            return x
        order = tf.argsort(tf.random.stateless_uniform([len(transforms)], order_seed))
        for i in range(len(transforms)):
            branches = [lambda t=t, ts=ts, x=x: t(x, ts) for t, ts in zip(transforms, seeds, strict=True)]
            x = _clip(tf.ensure_shape(tf.switch_case(order[i], branches), image.shape))
        return x

    return _clip(_random_apply(jitter, p, image, seed))


def to_grayscale(image: tf.Tensor, seed: Seed, p: float = 0.2) -> tf.Tensor:
    """With probability `p`, replaces the image by its luminance in all 3 channels.

    Args:
        image: A `[h, w, 3]` float image in [0, 1].
        seed: A shape-`[2]` integer seed.
        p: The probability of converting.

    Returns:
        The image, float32, in [0, 1], still with 3 channels.

    Raises:
        ValueError: a bad `p` or a bad seed.
    """
    _check_probability(p)
    image = tf.convert_to_tensor(image, tf.float32)
    gray = lambda x, seed: tf.tile(tf.image.rgb_to_grayscale(x), [1, 1, 3])  # noqa: E731
    return _clip(_random_apply(gray, p, image, _as_seed(seed)))


def preprocess_for_train(
    image: tf.Tensor,
    height: int,
    width: int,
    seed: Seed,
    color_jitter_strength: float = 1.0,
    crop: bool = True,
    flip: bool = True,
    min_crop_area: float = 0.08,
) -> tf.Tensor:
    """SimCLR's training augmentation of one view (the blur is applied per batch: `blur.batch_random_blur`).

    Random crop and resize, random left-right flip, then colour jitter
    (p = 0.8) and grayscale (p = 0.2) when `color_jitter_strength > 0`.

    Args:
        image: A `[h, w, 3]` float image in [0, 1], of any size.
        height: The output height (>= 8).
        width: The output width (>= 8).
        seed: A shape-`[2]` integer seed; every draw of the view derives from it.
        color_jitter_strength: The colour jitter strength; 0 for none.
        crop: Whether to random-crop (else the image is only resized).
        flip: Whether to flip left-right at random.
        min_crop_area: The smallest crop, as a fraction of the image area
            (0.08 in the paper).

    Returns:
        A `[height, width, 3]` float32 image in [0, 1].

    Raises:
        ValueError: a size below 8, a negative strength or a bad seed.
    """
    _check_size(height, width)
    crop_seed, flip_seed, jitter_seed, gray_seed = _split(_as_seed(seed), 4)
    image = tf.convert_to_tensor(image, tf.float32)
    if crop:
        image = random_crop_with_resize(image, height, width, crop_seed, area_range=(min_crop_area, 1.0))
    else:
        image = _resize(image, height, width)
    if flip:
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    if color_jitter_strength:
        image = random_color_jitter(image, jitter_seed, strength=color_jitter_strength)
        image = to_grayscale(image, gray_seed)
    return _clip(tf.reshape(image, [height, width, 3]))


def _center_crop(image: tf.Tensor, height: int, width: int, crop_proportion: float) -> tf.Tensor:
    """Center-crops `crop_proportion` of the image at the output's aspect ratio, then resizes.

    (SimCLR's code inverts the aspect ratio; the same for its square outputs.)
    """
    image_height, image_width = tf.unstack(tf.shape(image)[:2])
    float_height = tf.cast(image_height, tf.float32)
    float_width = tf.cast(image_width, tf.float32)
    aspect = width / height
    # The image's limiting side sets the crop: a wider output than the image keeps its full width.
    crop_height = crop_proportion * tf.minimum(float_height, float_width / aspect)
    crop_width = crop_proportion * tf.minimum(float_width, float_height * aspect)
    crop_height = tf.clip_by_value(tf.cast(tf.math.rint(crop_height), tf.int32), 1, image_height)
    crop_width = tf.clip_by_value(tf.cast(tf.math.rint(crop_width), tf.int32), 1, image_width)
    offset_height = (image_height - crop_height + 1) // 2
    offset_width = (image_width - crop_width + 1) // 2
    image = tf.image.crop_to_bounding_box(image, offset_height, offset_width, crop_height, crop_width)
    return tf.image.resize(image, [height, width], method="bicubic")


def preprocess_for_eval(image: tf.Tensor, height: int, width: int, crop: bool = True) -> tf.Tensor:
    """SimCLR's deterministic evaluation preprocessing.

    Args:
        image: A `[h, w, 3]` float image in [0, 1], of any size.
        height: The output height (>= 8).
        width: The output width (>= 8).
        crop: Whether to center-crop 87.5% of the image before resizing.

    Returns:
        A `[height, width, 3]` float32 image in [0, 1].

    Raises:
        ValueError: a size below 8.
    """
    _check_size(height, width)
    image = tf.convert_to_tensor(image, tf.float32)
    image = _center_crop(image, height, width, CROP_PROPORTION) if crop else _resize(image, height, width)
    return _clip(tf.reshape(image, [height, width, 3]))


def _to_float_rgb(image: tf.Tensor) -> tf.Tensor:
    """Converts an integer image to float32 in [0, 1] and a 1-channel image to 3 channels."""
    image = tf.convert_to_tensor(image)
    if image.shape.rank == 2:
        image = image[..., tf.newaxis]
    if image.shape.rank is not None and image.shape.rank != 3:
        raise ValueError(
            f"Invalid value for argument `image`. Received: an image of shape {image.shape}. "
            "Expected [height, width, channels] (or [height, width])."
        )
    image = tf.image.convert_image_dtype(image, tf.float32)
    channels = image.shape[-1]
    if channels not in (1, 3, None):
        raise ValueError(
            f"Invalid value for argument `image`. Received: an image with {channels} channels. "
            "Expected 1 or 3 channels."
        )
    tiled = tf.cond(tf.shape(image)[-1] == 1, lambda: tf.tile(image, [1, 1, 3]), lambda: image)
    return tf.ensure_shape(tiled, [None, None, 3])


def preprocess_image(
    image: tf.Tensor,
    height: int,
    width: int,
    is_training: bool = False,
    color_distort: bool = True,
    test_crop: bool = True,
    *,
    seed: Seed | None = None,
    color_jitter_strength: float = 1.0,
    min_crop_area: float = 0.08,
) -> tf.Tensor:
    """Preprocesses one image for SimCLR training (one random view) or evaluation.

    Integer images become float32 in [0, 1]; 1-channel (or 2-D) images get 3
    equal channels, so MNIST-like datasets work as they are.

    Args:
        image: A `[h, w, c]` (c = 1 or 3) or `[h, w]` image, integer or float in [0, 1].
        height: The output height (>= 8).
        width: The output width (>= 8).
        is_training: Random augmentation (True) or the evaluation crop.
        color_distort: Whether training applies colour jitter and grayscale.
        test_crop: Whether evaluation center-crops before resizing.
        seed: Training only: a shape-`[2]` integer seed for the view's draws.
        color_jitter_strength: The colour jitter strength when `color_distort`.
        min_crop_area: Training only: the smallest random crop, as a fraction of the image.

    Returns:
        A `[height, width, 3]` float32 image in [0, 1].

    Raises:
        ValueError: a size below 8, an image that is not 2-D or 3-D with
            1 or 3 channels, or training without a seed.
    """
    image = _to_float_rgb(image)
    if is_training:
        if seed is None:
            raise ValueError(
                "Invalid value for argument `seed`. Received: seed=None with is_training=True. Expected "
                "a shape-[2] integer seed for the view's random draws, e.g. `seed_for(run_seed, position)`."
            )
        strength = color_jitter_strength if color_distort else 0.0
        return preprocess_for_train(
            image, height, width, seed, color_jitter_strength=strength, min_crop_area=min_crop_area
        )
    return preprocess_for_eval(image, height, width, crop=test_crop)
