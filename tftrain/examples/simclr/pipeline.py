"""SimCLR's input pipelines: two augmented views per image for pretraining, one for finetuning and eval.

Training pipelines hold no random state: the shuffle is seeded, and every
augmentation draw comes from stateless random ops seeded by the run's seed and
the example's position in the stream (`augment.seed_for`). Two runs with the
same seed read the same batches, and tf.data checkpoints the iterator
symbolically (positions and random states; no cache), so a resumed run
continues the exact stream. Training splits that fit in memory (the generated
datasets, and tensorflow-datasets splits of fixed-size images up to
`IN_MEMORY_MAX_BYTES`, such as CIFAR-10's) are held there: their order is
shuffled as indices, drawn per pass from the seed (`windowed_permutation`), and
each image read by its index, so a checkpoint holds a few positions (kilobytes)
instead of a shuffle buffer of images. Larger ones (ImageNet) go through
`tf.data.Dataset.shuffle`, whose buffer tf.data saves with each checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from tftrain import data as data_lib
from tftrain.examples.simclr import augment, blur

# Evaluation centre-crops only images larger than this (SimCLR's CIFAR-size images are used whole).
EVAL_CROP_MIN_SIZE = 32
# The independent random streams of a run: each example's views, each batch's blur, each pass's order.
VIEW_STREAM, BLUR_STREAM, SHUFFLE_STREAM = 0, 1, 2

IN_MEMORY_MAX_BYTES = 250 * 2**20
"""The largest training split (decoded images of one fixed shape) held in memory and shuffled by index.

tensorflow-datasets' own limit for its automatic in-memory cache, under
which the reference (which reads with that cache) holds a dataset in memory
too: CIFAR-10's 50,000 training images take 147 MiB."""


def shuffle_buffer_size(batch_size: int, image_size: int) -> int:
    """The reference's shuffle buffer: 50 batches of images of 32 px or less, 10 batches of larger ones."""
    return batch_size * (50 if image_size <= EVAL_CROP_MIN_SIZE else 10)


def windowed_permutation(count: int, buffer_size: int, seed: tf.Tensor) -> tf.Tensor:
    """The order of one pass over `count` elements through a shuffle buffer, drawn statelessly.

    The same distribution as `tf.data.Dataset.shuffle(buffer_size)`: each
    element comes out of a buffer that holds the next `buffer_size` elements
    not yet out (fewer once the input is read), uniformly drawn. It is
    computed at once, without a loop: while the input lasts, the k-th draw
    picks a slot, gives out what the slot holds (the input that last refilled
    it, or its first element) and refills it with input `buffer_size + k`;
    the buffer left at the end drains in a uniformly random order.

    Args:
        count: The number of elements.
        buffer_size: The shuffle buffer's size; `count` or more gives a
            uniformly random permutation.
        seed: A shape-`[2]` int64 seed (`augment.seed_for`).

    Returns:
        An int64 permutation of `range(count)`, shape `[count]`.
    """
    size = min(buffer_size, count)
    refills = count - size  # the draws made while the input lasts
    slot_seed, drain_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    if not refills:  # the whole input fits in the buffer
        return tf.random.experimental.stateless_shuffle(tf.range(count, dtype=tf.int64), drain_seed)
    slots = tf.random.stateless_uniform([refills], slot_seed, minval=0, maxval=size, dtype=tf.int64)
    # The draws grouped by slot, in time order: each one gives out the input put in by the one before.
    order = tf.argsort(slots, stable=True)
    by_slot = tf.gather(slots, order)
    refilled_with = size + tf.cast(order, tf.int64)
    after_another = tf.concat([[False], by_slot[1:] == by_slot[:-1]], axis=0)
    given = tf.where(after_another, tf.concat([[0], refilled_with[:-1]], axis=0), by_slot)
    first = tf.scatter_nd(order[:, None], given, [refills])
    # The buffer at the end: each slot holds the input that refilled it last, or its first element.
    last_in_slot = tf.concat([by_slot[1:] != by_slot[:-1], [True]], axis=0)
    held = tf.tensor_scatter_nd_update(
        tf.range(size, dtype=tf.int64),
        tf.boolean_mask(by_slot, last_in_slot)[:, None],
        tf.boolean_mask(refilled_with, last_in_slot),
    )
    return tf.concat([first, tf.random.experimental.stateless_shuffle(held, drain_seed)], axis=0)


def _held_in_memory(name: str, images: tf.data.Dataset) -> bool:
    """Whether a training split is read into memory and shuffled by index (see `IN_MEMORY_MAX_BYTES`)."""
    if name in data_lib.GENERATED_DATASETS:
        return True
    count = int(images.cardinality())
    image = images.element_spec[0]
    if count < 0 or not image.shape.is_fully_defined():  # unknown size, or images of varying sizes
        return False
    return count * image.shape.num_elements() * image.dtype.size <= IN_MEMORY_MAX_BYTES


def _shuffled_by_index(
    images: tf.data.Dataset, buffer_size: int, *, seed: int, repeat: bool
) -> tf.data.Dataset:
    """A split read once into memory as tensors, then shuffled through its indices.

    Each pass's order is `windowed_permutation`, seeded by the run's seed and
    the pass, and each example is gathered by its index: the iterator's state
    is the pass and the position in it (tf.data's buffers of batches are
    rebuilt on restore), never a shuffle buffer of images. All the examples
    are kept in memory, as a buffer of the whole dataset would (the demo's
    does); `synthetic` is then drawn once instead of at each read.
    """
    count = int(images.cardinality())
    examples = images.batch(count).get_single_element()

    def one_pass(epoch):
        order = windowed_permutation(count, buffer_size, augment.seed_for(seed, epoch, SHUFFLE_STREAM))
        return tf.data.Dataset.from_tensor_slices(order)

    def example(index):
        return tf.nest.map_structure(lambda tensor: tf.gather(tensor, index), examples)

    passes = tf.data.Dataset.counter() if repeat else tf.data.Dataset.range(1)
    indices = passes.flat_map(one_pass).apply(
        tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY if repeat else count)
    )
    return indices.map(example, num_parallel_calls=tf.data.AUTOTUNE)


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
    num_replicas: int = 1,
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
            image with probability 0.5, one sigma per replica's batch and view, as the reference.
        min_crop_area: The smallest random crop, as a fraction of the image.
        cache_dataset: Keep the decoded images in memory (the reference's
            `--cache_dataset`). A training split that fits in memory is held
            there with or without it (positions only in checkpoints); a
            larger one, and an eval split, get `Dataset.cache()`, which
            tf.data cannot checkpoint symbolically: each checkpoint of such a
            training run holds the iterator with the cache.
        data_dir: tensorflow-datasets data directory.
        num_examples: Use only the first examples of the split.
        repeat: Repeat forever (training to a step count).
        seed: The run's seed: the shuffle and every augmentation draw derive from it.
            A split held in memory has its order drawn from it statelessly
            (`windowed_permutation`, a buffer of `shuffle_buffer_size`);
            a larger one is shuffled by `tf.data.Dataset.shuffle` with it
            (which also reads the global seed).

        num_replicas: The replicas the global batch is split over (contiguous
            slices, as `tf.distribute` splits it). As the reference, which
            reads per-replica batches and blurs inside `strategy.run`, the
            shuffle buffer is sized from the per-replica batch and the blur's
            sigma is drawn per replica and view.

    Returns:
        The dataset, prefetched.
    """
    # Generated datasets are drawn at `image_size`; files are read at their own size.
    load_size = image_size if name in data_lib.GENERATED_DATASETS else None
    images = data_lib.load(name, split, data_dir=data_dir, image_size=load_size, num_examples=num_examples)
    if not is_training:
        if cache_dataset:
            images = images.cache()
        test_crop = image_size > EVAL_CROP_MIN_SIZE

        def eval_features(image, label):
            return augment.preprocess_image(image, image_size, image_size, test_crop=test_crop), label

        mapped = images.map(eval_features, num_parallel_calls=tf.data.AUTOTUNE)
        return mapped.batch(batch_size).prefetch(tf.data.AUTOTUNE)

    if num_replicas < 1 or batch_size % num_replicas:
        raise ValueError(
            f"Invalid value for argument `num_replicas`. Received: num_replicas={num_replicas} with "
            f"batch_size={batch_size}. Expected a number >= 1 that divides the batch size."
        )
    per_replica = batch_size // num_replicas
    buffer_size = shuffle_buffer_size(per_replica, image_size)
    if _held_in_memory(name, images):
        images = _shuffled_by_index(images, buffer_size, seed=seed, repeat=repeat)
    else:
        if cache_dataset:
            images = images.cache()
        images = images.shuffle(buffer_size, seed=seed, reshuffle_each_iteration=True)
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
        # One seed per replica's batch, from its first example's position in the stream.
        slices = []
        for replica in range(num_replicas):
            start = replica * per_replica
            part = features[start : start + per_replica]
            seeds = tf.random.experimental.stateless_split(
                augment.seed_for(seed, positions[start], BLUR_STREAM), 2
            )
            views = [
                blur.batch_random_blur(part[..., 3 * i : 3 * i + 3], image_size, image_size, seeds[i])
                for i in range(2)
            ]
            slices.append(tf.concat(views, axis=-1))
        return tf.concat(slices, axis=0), labels

    mapped = images.enumerate().map(training_features, num_parallel_calls=tf.data.AUTOTUNE)
    return mapped.batch(batch_size, drop_remainder=True).map(finish_batch).prefetch(tf.data.AUTOTUNE)
