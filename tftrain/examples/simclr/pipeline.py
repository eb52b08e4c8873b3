"""SimCLR's input pipelines: two augmented views per image for pretraining, one for finetuning and eval."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from tftrain import data as data_lib
from tftrain.examples.simclr import augment

# Evaluation centre-crops only images larger than this (SimCLR's CIFAR-size images are used whole).
EVAL_CROP_MIN_SIZE = 32


def train_view_fn(
    image_size: int,
    train_mode: str = "pretrain",
    *,
    color_jitter_strength: float = 1.0,
    use_blur: bool = False,
    min_crop_area: float = 0.08,
) -> Callable[[tf.Tensor], tf.Tensor]:
    """The augmentation of one training view, as SimCLR's reference applies it per mode.

    Pretraining: random crop, flip, colour jitter and grayscale (when
    `color_jitter_strength > 0`), blur (with `use_blur`). Finetuning: random
    crop and flip only, as the reference's finetuning input.

    Args:
        image_size: The output height and width.
        train_mode: "pretrain" or "finetune".
        color_jitter_strength: SimCLR's colour distortion strength (pretraining).
        use_blur: Random Gaussian blur (pretraining).
        min_crop_area: The smallest random crop, as a fraction of the image.

    Returns:
        A function from one image (uint8 or float in [0, 1], 1 or 3 channels)
        to one `[image_size, image_size, 3]` float32 view; call it once per view.
    """
    pretrain = train_mode == "pretrain"

    # Called twice per image, not wrapped in one tf.function: under a global
    # seed, two calls of one traced function would draw the same randomness.
    def view(image):
        image = tf.image.convert_image_dtype(image, tf.float32)
        if image.shape[-1] == 1:
            image = tf.image.grayscale_to_rgb(image)
        return augment.preprocess_for_train(
            image,
            image_size,
            image_size,
            color_jitter_strength=color_jitter_strength if pretrain else 0.0,
            blur=use_blur and pretrain,
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
    seed: int | None = None,
) -> tf.data.Dataset:
    """A batched dataset of `(features, labels)` for SimCLR.

    Args:
        name: A `tftrain.data.load` dataset name.
        split: The split to read.
        batch_size: The global batch size (training batches are all full).
        image_size: Images are resized to this size; eval centre-crops 87.5%
            first only above 32 px (smaller images are used whole, as in SimCLR).
        is_training: Augment and shuffle; drop a last partial batch.
        train_mode: "pretrain" stacks two augmented views on the channel axis
            (`[B, H, W, 6]`); "finetune" gives one (`[B, H, W, 3]`), cropped
            and flipped only (no colour distortion or blur).
        color_jitter_strength: SimCLR's colour distortion strength (pretraining only).
        use_blur: Random Gaussian blur (pretraining only).
        min_crop_area: The smallest random crop, as a fraction of the image.
        cache_dataset: Keep the decoded images in memory after the first pass
            (the reference's `--cache_dataset`; for small datasets).
        data_dir: tensorflow-datasets data directory.
        num_examples: Use only the first examples of the split.
        repeat: Repeat forever (training to a step count).
        seed: Shuffle seed.

    Returns:
        The dataset, prefetched.
    """
    images = data_lib.load(name, split, data_dir=data_dir, image_size=image_size, num_examples=num_examples)
    if cache_dataset:
        images = images.cache()
    if is_training:
        images = images.shuffle(10 * batch_size, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        images = images.repeat()

    augmented = train_view_fn(
        image_size,
        train_mode,
        color_jitter_strength=color_jitter_strength,
        use_blur=use_blur,
        min_crop_area=min_crop_area,
    )

    def training_features(image, label):
        if train_mode == "pretrain":
            return tf.concat([augmented(image), augmented(image)], axis=-1), label
        return augmented(image), label

    test_crop = image_size > EVAL_CROP_MIN_SIZE

    def eval_features(image, label):
        return (
            augment.preprocess_image(image, image_size, image_size, is_training=False, test_crop=test_crop),
            label,
        )

    mapped = images.map(
        training_features if is_training else eval_features, num_parallel_calls=tf.data.AUTOTUNE
    )
    return mapped.batch(batch_size, drop_remainder=is_training).prefetch(tf.data.AUTOTUNE)
