"""SimCLR's input pipelines: two different views per image, one view for finetuning, plain eval images,
seeded and checkpointable training streams, the ImageNet crop from the original image."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tftrain import data as data_lib
from tftrain.checkpoint import data_position
from tftrain.compat import tf_internals
from tftrain.examples.simclr import augment, blur, pipeline


def first_batch(**kwargs):
    args = dict(batch_size=8, image_size=16, num_examples=20)
    dataset = pipeline.build_dataset("shapes", "train", **{**args, **kwargs})
    features, labels = next(iter(dataset))
    return dataset, features.numpy(), labels.numpy()


def test_pretraining_gives_two_different_views_even_under_a_global_seed():
    keras.utils.set_random_seed(0)
    dataset, features, labels = first_batch(is_training=True, color_jitter_strength=1.0)
    assert features.shape == (8, 16, 16, 6) and features.dtype == np.float32
    assert labels.shape == (8,)
    assert 0.0 <= features.min() and features.max() <= 1.0
    assert not any(np.allclose(view[..., :3], view[..., 3:]) for view in features)
    assert len(list(dataset)) == 2  # 20 examples: partial batches dropped in training


def test_finetuning_gives_one_view():
    _, features, _ = first_batch(is_training=True, train_mode="finetune")
    assert features.shape == (8, 16, 16, 3)


@pytest.mark.parametrize("name", ["shapes"])
def test_eval_images_are_deterministic_and_keep_the_last_batch(name):
    dataset, first, _ = first_batch(is_training=False)
    _, again, _ = first_batch(is_training=False)
    np.testing.assert_array_equal(first, again)
    assert first.shape == (8, 16, 16, 3)
    assert sum(len(labels) for _, labels in dataset) == 20


@pytest.mark.parametrize("size", [16, 32])
def test_eval_leaves_images_of_32_px_or_less_whole(size):
    # As the reference: no centre crop (and so no upsampling) at CIFAR size and below.
    dataset = pipeline.build_dataset(
        "shapes", "test", batch_size=8, image_size=size, is_training=False, num_examples=8
    )
    features, _ = next(iter(dataset))
    images = np.stack(
        [image for image, _ in data_lib.load("shapes", "test", image_size=size, num_examples=8)]
    )
    np.testing.assert_allclose(features.numpy(), images / 255.0, atol=1e-6)


def test_eval_centre_crops_images_above_32_px():
    dataset = pipeline.build_dataset(
        "shapes", "test", batch_size=4, image_size=40, is_training=False, num_examples=4
    )
    features, _ = next(iter(dataset))
    images = np.stack([image for image, _ in data_lib.load("shapes", "test", image_size=40, num_examples=4)])
    assert features.shape == (4, 40, 40, 3)
    assert np.abs(features.numpy() - images / 255.0).max() > 0.1


def test_finetuning_views_are_cropped_and_flipped_only():
    # A crop or a flip of a one-colour image is the same image; colour jitter or grayscale is not.
    image = np.broadcast_to(np.array([0.8, 0.3, 0.1], np.float32), (20, 20, 3))
    finetune = pipeline.train_view_fn(16, "finetune", color_jitter_strength=1.0)
    pretrain = pipeline.train_view_fn(16, "pretrain", color_jitter_strength=1.0)
    seeds = [augment.seed_for(0, i) for i in range(10)]
    for seed in seeds:
        np.testing.assert_allclose(finetune(image, seed).numpy(), image[:16, :16], atol=1e-5)
    assert any(np.abs(pretrain(image, seed).numpy() - image[:16, :16]).max() > 0.05 for seed in seeds)


def test_the_finetuning_pipeline_draws_no_colour_distortion(monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError("colour distortion in a finetuning view")

    monkeypatch.setattr(augment, "random_color_jitter", refused)
    monkeypatch.setattr(augment, "to_grayscale", refused)
    monkeypatch.setattr(blur, "random_blur", refused)
    monkeypatch.setattr(blur, "batch_random_blur", refused)
    _, features, _ = first_batch(is_training=True, train_mode="finetune", use_blur=True)
    assert features.shape == (8, 16, 16, 3)


def training_batches(count, **kwargs):
    args = dict(batch_size=8, image_size=24, num_examples=20, is_training=True, repeat=True, seed=3)
    dataset = pipeline.build_dataset("shapes", "train", **{**args, **kwargs})
    return [features.numpy() for features, _ in dataset.take(count)]


def test_the_same_seed_gives_the_same_batches_and_another_seed_others():
    first = training_batches(4, use_blur=True)
    again = training_batches(4, use_blur=True)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    other = training_batches(1, use_blur=True, seed=4)
    assert not np.allclose(first[0], other[0])
    assert not np.allclose(first[0], first[3])  # the stream goes on: later epochs draw new views


def test_blur_is_applied_per_batch_and_leaves_the_views_draws_alone():
    # The blur has its own random stream: the views it leaves alone are exactly the unblurred ones.
    plain = np.concatenate(training_batches(3, use_blur=False))
    blurred = np.concatenate(training_batches(3, use_blur=True))
    views = lambda x: np.concatenate([x[..., :3], x[..., 3:]])  # noqa: E731
    same = [np.array_equal(a, b) for a, b in zip(views(plain), views(blurred), strict=True)]
    assert 0.2 < np.mean(same) < 0.8  # p = 0.5 per view


@pytest.mark.parametrize("num_replicas", [1, 2, 4])
def test_blur_draws_one_sigma_per_replica_and_view_as_the_reference(num_replicas):
    # The reference blurs inside strategy.run: each replica's slice of the global batch has its own
    # draws, seeded from the position of the slice's first example (batch 0 holds positions 0..7).
    plain = training_batches(1, use_blur=False, num_replicas=num_replicas)[0]
    blurred = training_batches(1, use_blur=True, num_replicas=num_replicas)[0]
    per_replica = 8 // num_replicas
    for start in range(0, 8, per_replica):
        seeds = tf.random.experimental.stateless_split(augment.seed_for(3, start, pipeline.BLUR_STREAM), 2)
        for view in range(2):
            channels = slice(3 * view, 3 * view + 3)
            expected = blur.batch_random_blur(
                plain[start : start + per_replica, ..., channels], 24, 24, seeds[view]
            )
            np.testing.assert_array_equal(
                blurred[start : start + per_replica, ..., channels], expected.numpy()
            )


def test_the_shuffle_buffer_is_sized_from_the_per_replica_batch(monkeypatch):
    sizes = []
    real = pipeline.shuffle_buffer_size
    monkeypatch.setattr(pipeline, "shuffle_buffer_size", lambda b, s: sizes.append((b, s)) or real(b, s))
    training_batches(1, num_replicas=2)
    assert sizes == [(4, 24)]
    with pytest.raises(ValueError, match="num_replicas=3 with batch_size=8"):
        training_batches(1, num_replicas=3)


def test_the_training_iterator_checkpoints_symbolically_and_resumes_the_exact_stream(tmp_path):
    def dataset():
        built = pipeline.build_dataset(
            "shapes",
            "train",
            batch_size=8,
            image_size=24,
            num_examples=20,
            is_training=True,
            repeat=True,
            use_blur=True,
            seed=3,
        )
        mode, prepared = data_position.prepare(built, None)
        assert mode == data_position.SYMBOLIC  # no stateful op, no cache: no full iterator state
        return prepared

    expected = [features.numpy() for features, _ in dataset().take(7)]
    iterator = iter(dataset())
    for _ in range(4):  # into the second pass over the 20 examples
        next(iterator)
    path = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "data"))
    resumed = iter(dataset())
    tf.train.Checkpoint(iterator=resumed).read(path).assert_consumed()
    for want in expected[4:]:
        np.testing.assert_array_equal(next(resumed)[0].numpy(), want)


@pytest.mark.parametrize("count, buffer_size", [(60, 8), (60, 59), (60, 60), (60, 200), (1, 4)])
def test_the_windowed_permutation_draws_each_element_from_a_buffer_of_the_next_ones(count, buffer_size):
    order = pipeline.windowed_permutation(count, buffer_size, augment.seed_for(7, 0)).numpy()
    assert order.dtype == np.int64 and sorted(order) == list(range(count))
    # Replays a shuffle buffer of `buffer_size`: every element given out must be in it.
    buffer, unread = set(range(min(buffer_size, count))), min(buffer_size, count)
    for element in order:
        assert element in buffer
        buffer.remove(element)
        if unread < count:
            buffer.add(unread)
            unread += 1
    again = pipeline.windowed_permutation(count, buffer_size, augment.seed_for(7, 0)).numpy()
    np.testing.assert_array_equal(order, again)
    if count > 1:
        other = pipeline.windowed_permutation(count, buffer_size, augment.seed_for(7, 1)).numpy()
        assert not np.array_equal(order, other)


def test_the_windowed_permutation_draws_uniformly_from_the_buffer():
    # A 6-element buffer over 30 elements, 600 seeds: the first draw is any of the first 6 alike, and
    # the last element, read at the 24th draw, leaves (with the drained buffer) at any of the last 6 alike.
    orders = np.stack(
        [pipeline.windowed_permutation(30, 6, augment.seed_for(0, i)).numpy() for i in range(600)]
    )
    last_out = np.argmax(orders == 29, axis=1) - 24
    assert last_out.min() >= 0
    for counts in (np.bincount(orders[:, 0], minlength=6), np.bincount(last_out, minlength=6)):
        assert len(counts) == 6 and counts.min() > 60 and counts.max() < 140  # 100 expected, sd ~9


# Buffers of 200 images at 32 px (the whole split, as the demo's) and 40 at 40 px (a window of it).
@pytest.mark.parametrize("name, image_size", [("shapes", 32), ("shapes", 40), ("synthetic", 32)])
def test_a_generated_dataset_s_checkpoint_holds_positions_not_images(tmp_path, name, image_size):
    count, batch_size = 60, 4

    def dataset():
        built = pipeline.build_dataset(
            name,
            "train",
            batch_size=batch_size,
            image_size=image_size,
            num_examples=count,
            is_training=True,
            repeat=True,
            seed=3,
        )
        return data_position.prepare(built, None)

    mode, prepared = dataset()
    assert mode == data_position.SYMBOLIC
    expected = [labels.numpy() for _, labels in prepared.take(30)]
    # Each pass gives every example once, in a new order.
    first, second = np.concatenate(expected[:15]), np.concatenate(expected[15:])
    source = np.array(
        [label for _, label in data_lib.load(name, "train", image_size=image_size, num_examples=count)]
    )
    np.testing.assert_array_equal(np.sort(first), np.sort(source))
    np.testing.assert_array_equal(np.sort(second), np.sort(source))
    assert not np.array_equal(first, second)

    iterator = iter(prepared)
    for _ in range(20):  # into the second pass
        next(iterator)
    path = tf.train.Checkpoint(iterator=iterator).write(str(tmp_path / "data"))
    saved = sum(file.stat().st_size for file in tmp_path.iterdir() if file.name.startswith("data"))
    # A shuffle buffer of images would hold min(buffer, count) images; positions are a fraction of one batch.
    batch_bytes = batch_size * image_size * image_size * 3
    assert (
        saved < batch_bytes < min(pipeline.shuffle_buffer_size(batch_size, image_size), count) * batch_bytes
    )
    resumed = iter(dataset()[1])
    tf.train.Checkpoint(iterator=resumed).read(path).assert_consumed()
    for want in expected[20:]:
        np.testing.assert_array_equal(next(resumed)[1].numpy(), want)


def test_no_cache_unless_asked():
    def ops(**kwargs):
        dataset = pipeline.build_dataset(
            "shapes", "train", batch_size=8, image_size=16, num_examples=20, **kwargs
        )
        return {node.op for node in tf_internals.dataset_graph_nodes(dataset)}

    for is_training in (True, False):
        assert not any(op.startswith("CacheDataset") for op in ops(is_training=is_training))
    assert any(op.startswith("CacheDataset") for op in ops(is_training=False, cache_dataset=True))
    # A training split in memory already (shuffled by index) needs no cache: its checkpoints hold positions.
    assert not any(op.startswith("CacheDataset") for op in ops(is_training=True, cache_dataset=True))
    # One too large for memory is cached where asked (tests/examples/simclr/test_simclr_tfds_checkpoint.py).


def test_files_are_cropped_from_the_original_image(monkeypatch):
    # A 48x96 image (tfds reads such at their own size): no resize to a square before the crop.
    original = np.random.RandomState(0).randint(0, 256, (1, 48, 96, 3)).astype("uint8")
    sizes = []

    def load(name, split, *, data_dir=None, image_size=None, num_examples=None):
        sizes.append(image_size)
        return tf.data.Dataset.from_tensor_slices((original, np.zeros([1], np.int64)))

    monkeypatch.setattr(pipeline.data_lib, "load", load)

    def build(**kwargs):
        return pipeline.build_dataset("imagenet2012", "train", batch_size=1, image_size=40, **kwargs)

    features, _ = next(iter(build(is_training=True, seed=5, min_crop_area=0.2)))
    seeds = tf.unstack(tf.random.experimental.stateless_split(augment.seed_for(5, 0), 2))
    view = pipeline.train_view_fn(40, min_crop_area=0.2)
    np.testing.assert_array_equal(features[0], tf.concat([view(original[0], s) for s in seeds], axis=-1))
    features, _ = next(iter(build(is_training=False)))
    np.testing.assert_array_equal(features[0], augment.preprocess_image(original[0], 40, 40))
    assert sizes == [None, None]
