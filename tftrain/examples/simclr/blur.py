"""SimCLR's random gaussian blur: of one image, or of a batch with one sigma, as the reference blurs.

Seeds are as in `augment`: shape-`[2]` integer tensors, every draw stateless.
"""

from __future__ import annotations

import tensorflow as tf

from tftrain.examples.simclr.augment import (
    Seed,
    _as_seed,
    _check_probability,
    _check_size,
    _clip,
    _random_apply,
    _split,
)


def _gaussian_blur(images: tf.Tensor, kernel_size: int, sigma: tf.Tensor) -> tf.Tensor:
    """Blurs `[b, h, w, c]` images with a separable gaussian kernel of 2 * (kernel_size // 2) + 1 taps, zero padded."""
    radius = kernel_size // 2
    taps = tf.range(-radius, radius + 1, dtype=tf.float32)
    kernel = tf.exp(-tf.square(taps) / (2.0 * tf.square(sigma)))
    kernel /= tf.reduce_sum(kernel)
    channels = tf.shape(images)[-1]
    horizontal = tf.tile(tf.reshape(kernel, [1, -1, 1, 1]), [1, 1, channels, 1])
    vertical = tf.tile(tf.reshape(kernel, [-1, 1, 1, 1]), [1, 1, channels, 1])
    blurred = tf.nn.depthwise_conv2d(images, horizontal, [1, 1, 1, 1], padding="SAME")
    blurred = tf.nn.depthwise_conv2d(blurred, vertical, [1, 1, 1, 1], padding="SAME")
    return tf.ensure_shape(blurred, images.shape)


def _random_sigma(seed: tf.Tensor) -> tf.Tensor:
    return tf.random.stateless_uniform([], seed, 0.1, 2.0)


def random_blur(image: tf.Tensor, height: int, width: int, seed: Seed, p: float = 0.5) -> tf.Tensor:
    """With probability `p`, applies a gaussian blur with sigma drawn in [0.1, 2.0].

    The kernel size is `height // 10` made odd (as SimCLR's), so images under
    20 pixels high get a 1-tap kernel, which leaves them unchanged. SimCLR
    blurs batches (`batch_random_blur`); this is the same blur for one image.

    Args:
        image: A `[height, width, c]` float image in [0, 1].
        height: The image height (>= 8), which sets the kernel size.
        width: The image width (>= 8).
        seed: A shape-`[2]` integer seed.
        p: The probability of blurring.

    Returns:
        The image, float32, in [0, 1].

    Raises:
        ValueError: a size below 8, a bad `p` or a bad seed.
    """
    _check_size(height, width)
    _check_probability(p)
    image = tf.convert_to_tensor(image, tf.float32)

    def blur(x, seed):
        return _gaussian_blur(x[tf.newaxis], height // 10, _random_sigma(seed))[0]

    return _clip(_random_apply(blur, p, image, _as_seed(seed)))


def batch_random_blur(images: tf.Tensor, height: int, width: int, seed: Seed, p: float = 0.5) -> tf.Tensor:
    """Blurs each image of a batch with probability `p`, with one sigma for the batch, as SimCLR.

    SimCLR's reference draws the blur's sigma (in [0.1, 2.0]) once per batch
    of views and picks the images to blur one by one; so does this.

    Args:
        images: `[batch, height, width, c]` float images in [0, 1].
        height: The image height (>= 8), which sets the kernel size (`height // 10`, made odd).
        width: The image width (>= 8).
        seed: A shape-`[2]` integer seed.
        p: The probability of blurring each image.

    Returns:
        The images, float32, in [0, 1].

    Raises:
        ValueError: a size below 8, a bad `p` or a bad seed.
    """
    _check_size(height, width)
    _check_probability(p)
    images = tf.convert_to_tensor(images, tf.float32)
    sigma_seed, select_seed = _split(_as_seed(seed), 2)
    blurred = _gaussian_blur(images, height // 10, _random_sigma(sigma_seed))
    chosen = tf.random.stateless_uniform(tf.shape(images)[:1], select_seed) < p
    return _clip(tf.where(chosen[:, tf.newaxis, tf.newaxis, tf.newaxis], blurred, images))
