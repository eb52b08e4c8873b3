"""SimCLR's input pipelines: two augmented views per image for pretraining, one for finetuning and eval.

Training pipelines hold no random state: the shuffle is seeded, and every
augmentation draw comes from stateless random ops seeded by the run's seed and
the example's position in the stream (`augment.seed_for`). Two runs with the
same seed read the same batches, and tf.data checkpoints the iterator
symbolically (positions, random states and the shuffle buffer, no cache), so a resumed run
continues the exact stream.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from tftrain import data as data_lib
from tftrain.examples.simclr import augment, blur

# Evaluation centre-crops only images larger than this (SimCLR's CIFAR-size images are used whole).
EVAL_CROP_MIN_SIZE = 32
# The independent random streams of a run: each example's views, each batch's blur.
VIEW_STREAM, BLUR_STREAM = 0, 1


def shuffle_buffer_size(batch_size: int, image_size: int) -> int:
    """The reference's shuffle buffer: 50 batches of images of 32 px or less, 10 batches of larger ones."""
    return batch_size * (50 if image_size <= EVAL_CROP_MIN_SIZE else 10)


def train_view_fn(
    image_size: int,
    train_mode: str = "pretrain",
    *,
    color_jitter_strength: float = 1.0,
    min_crop_area: float = 0.08,
) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """The augmentation of one training view, as SimCLR's reference applies it per mode.

    Pretraining: random crop, flip, colour jitter and grayscale (when
    `color_jitter_strength > 0`); the blur is applied per batch
    (`blur.batch_random_blur`). Finetuning: random crop and flip only, as
    the reference's finetuning input.

    Args:
        image_size: The output height and width.
        train_mode: "pretrain" or "finetune".
        color_jitter_strength: SimCLR's colour distortion strength (pretraining).
        min_crop_area: The smallest random crop, as a fraction of the image.

    Returns:
        A function from one image (uint8 or float in [0, 1], 1 or 3 channels,
        of any size) and a shape-`[2]` seed to one
        `[image_size, image_size, 3]` float32 view.
    """

    def view(image, seed):
        return augment.preprocess_image(
            image,
            image_size,
            image_size,
            is_training=True,
            color_distort=train_mode == "pretrain",
            seed=seed,
            color_jitter_strength=color_jitter_strength,
            min_crop_area=min_crop_area,
        )

    return view


def build_dataset(
    name: str,
    split: str,
    *,
    batch_size: int,
    image_size: int,
    is_training: bool,
    train_mode: str = "pretrain",
    color_jitter_strength: float = 1.0,
    use_blur: bool = False,
    min_crop_area: float = 0.08,
    cache_dataset: bool = False,
    data_dir: str | None = None,
    num_examples: int | None = None,
    repeat: bool = False,
    seed: int = 0,
) -> tf.data.Dataset:
    """A batched dataset of `(features, labels)` for SimCLR.

    tensorflow-datasets images are read at their own size: training crops
    from the original image and resizes the crop to `image_size` (no resize to
    a square first), evaluation centre-crops it above 32 px, as the reference.

    Args:
        name: A `tftrain.data.load` dataset name.
        split: The split to read.
        batch_size: The global batch size (training batches are all full).
        image_size: The output height and width; eval centre-crops 87.5%
            first only above 32 px (smaller images are used whole, as in SimCLR).
        is_training: Augment and shuffle; drop a last partial batch.
        train_mode: "pretrain" stacks two augmented views on the channel axis
            (`[B, H, W, 6]`); "finetune" gives one (`[B, H, W, 3]`), cropped
            and flipped only (no colour distortion or blur).
        color_jitter_strength: SimCLR's colour distortion strength (pretraining only).
        use_blur: Random Gaussian blur (pretraining only): each view of each
            image with probability 0.5, one sigma per batch and view, as the reference.
        min_crop_area: The smallest random crop, as a fraction of the image.
        cache_dataset: Keep the decoded images in memory after the first pass
            (the reference's `--cache_dataset`; for small datasets). tf.data
            cannot checkpoint a cache symbolically: each checkpoint then holds
            the iterator with the cache.
        data_dir: tensorflow-datasets data directory.
        num_examples: Use only the first examples of the split.
        repeat: Repeat forever (training to a step count).
        seed: The run's seed: the shuffle and every augmentation draw derive from it.

    Returns:
        The dataset, prefetched.
    """
    # Generated datasets are drawn at `image_size`; files are read at their own size.
    load_size = image_size if name in data_lib.GENERATED_DATASETS else None
    images = data_lib.load(name, split, data_dir=data_dir, image_size=load_size, num_examples=num_examples)
    if cache_dataset:
        images = images.cache()
    if not is_training:
        test_crop = image_size > EVAL_CROP_MIN_SIZE

        def eval_features(image, label):
            return augment.preprocess_image(image, image_size, image_size, test_crop=test_crop), label

        mapped = images.map(eval_features, num_parallel_calls=tf.data.AUTOTUNE)
        return mapped.batch(batch_size).prefetch(tf.data.AUTOTUNE)

    images = images.shuffle(
        shuffle_buffer_size(batch_size, image_size), seed=seed, reshuffle_each_iteration=True
    )
    if repeat:
        images = images.repeat()
    view = train_view_fn(
        image_size, train_mode, color_jitter_strength=color_jitter_strength, min_crop_area=min_crop_area
    )
    pretrain = train_mode == "pretrain"

    def training_features(position, example):
        image, label = example
        if not pretrain:
            return position, view(image, augment.seed_for(seed, position, VIEW_STREAM)), label
        seeds = tf.random.experimental.stateless_split(augment.seed_for(seed, position, VIEW_STREAM), 2)
        return position, tf.concat([view(image, seeds[0]), view(image, seeds[1])], axis=-1), label

    def finish_batch(positions, features, labels):
        if not (use_blur and pretrain):
            return features, labels
        # One seed per batch, from its first example's position in the stream.
        seeds = tf.random.experimental.stateless_split(augment.seed_for(seed, positions[0], BLUR_STREAM), 2)
        views = [
            blur.batch_random_blur(features[..., 3 * i : 3 * i + 3], image_size, image_size, seeds[i])
            for i in range(2)
        ]
        return tf.concat(views, axis=-1), labels

    mapped = images.enumerate().map(training_features, num_parallel_calls=tf.data.AUTOTUNE)
    batched = mapped.batch(batch_size, drop_remainder=True).map(finish_batch)
    return batched.prefetch(tf.data.AUTOTUNE)
