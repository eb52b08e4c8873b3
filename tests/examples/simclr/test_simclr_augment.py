"""SimCLR's augmentations: shapes, ranges, randomness, seeded determinism, and tf.data graphs."""

import numpy as np
import pytest
import tensorflow as tf

from tftrain.examples.simclr import augment, blur


def rand_image(height, width, channels=3, seed=0):
    return np.random.RandomState(seed).rand(height, width, channels).astype("float32")


def smooth_image(size=32, seed=0):
    """A colourful image with structure, so that crops and colour changes show."""
    rng = np.random.RandomState(seed)
    y, x = np.mgrid[0:size, 0:size] / size
    channels = [np.sin(2 * np.pi * (a * x + b * y) + c) for a, b, c in rng.rand(3, 3) * 3]
    return (0.5 + 0.4 * np.stack(channels, axis=-1)).astype("float32")


def seed(i):
    return augment.seed_for(7, i)


def check_image(image, height, width):
    assert image.dtype == tf.float32
    assert tuple(image.shape) == (height, width, 3)
    values = image.numpy()
    assert values.min() >= 0.0 and values.max() <= 1.0


@pytest.mark.parametrize(
    "in_shape, out_size",
    [((32, 32, 3), (32, 32)), ((16, 16, 3), (16, 16)), ((40, 24, 3), (16, 16)), ((28, 28, 3), (24, 20))],
)
def test_train_and_eval_shapes_and_ranges(in_shape, out_size):
    image = rand_image(*in_shape)
    height, width = out_size
    check_image(augment.preprocess_for_train(image, height, width, seed(0)), height, width)
    check_image(
        augment.preprocess_for_train(image, height, width, seed(1), crop=False, flip=False), height, width
    )
    check_image(augment.preprocess_for_eval(image, height, width), height, width)
    check_image(augment.preprocess_for_eval(image, height, width, crop=False), height, width)
    check_image(augment.random_crop_with_resize(image, height, width, seed(2)), height, width)
    view = augment.preprocess_for_train(image, height, width, seed(3))
    check_image(blur.random_blur(view, height, width, seed(4), p=1.0), height, width)


def test_preprocess_image_converts_uint8_and_single_channel():
    rng = np.random.RandomState(0)
    mnist_like = rng.randint(0, 256, (28, 28, 1)).astype("uint8")
    for is_training in (True, False):
        out = augment.preprocess_image(mnist_like, 28, 28, is_training=is_training, seed=seed(0))
        check_image(out, 28, 28)
        assert np.allclose(out[..., 0], out[..., 1]) and np.allclose(out[..., 0], out[..., 2])
    # Eval without a crop is only the dtype conversion: uint8 / 255, tiled.
    plain = augment.preprocess_image(mnist_like, 28, 28, test_crop=False).numpy()
    np.testing.assert_allclose(plain[..., 1], mnist_like[..., 0] / 255.0, atol=1e-6)
    out = augment.preprocess_image(
        rng.randint(0, 256, (20, 20)).astype("uint8"), 16, 16, is_training=True, seed=seed(1)
    )
    check_image(out, 16, 16)
    rgb = augment.preprocess_image(
        rng.randint(0, 256, (32, 32, 3)).astype("uint8"),
        16,
        16,
        is_training=True,
        seed=seed(2),
        color_jitter_strength=0.5,
    )
    check_image(rgb, 16, 16)
    with pytest.raises(ValueError, match="Expected 1 or 3 channels"):
        augment.preprocess_image(np.zeros((16, 16, 4), "uint8"), 16, 16)


def test_training_augmentation_changes_images():
    image = smooth_image(32)
    first, second = (augment.preprocess_for_train(image, 32, 32, seed(i)).numpy() for i in range(2))
    assert not np.allclose(first, second)
    assert not np.allclose(first, image)
    crops = [augment.random_crop_with_resize(image, 32, 32, seed(i)).numpy() for i in range(3)]
    assert not np.allclose(crops[0], crops[1]) or not np.allclose(crops[1], crops[2])
    jittered = [augment.random_color_jitter(image, seed(i), p=1.0).numpy() for i in range(2)]
    assert not np.allclose(jittered[0], image) and not np.allclose(jittered[0], jittered[1])
    fixed_order = augment.random_color_jitter(image, seed(0), p=1.0, random_order=False).numpy()
    assert not np.allclose(fixed_order, image)


def test_color_distort_and_flip_flags():
    # A constant colour survives crops, flips and resizes: only the colour jitter changes it.
    orange = np.broadcast_to(np.array([0.9, 0.5, 0.1], "float32"), (24, 24, 3))
    for i in range(3):
        plain = augment.preprocess_image(orange, 16, 16, is_training=True, color_distort=False, seed=seed(i))
        plain = plain.numpy()
        np.testing.assert_allclose(plain, orange[:16, :16], atol=1e-5)
    distorted = [
        augment.preprocess_image(orange, 16, 16, is_training=True, seed=seed(i)).numpy() for i in range(5)
    ]
    assert any(not np.allclose(view, orange[:16, :16], atol=1e-3) for view in distorted)
    # Without a crop or colour, the only randomness is the left-right flip.
    image = smooth_image(16)
    views = [
        augment.preprocess_for_train(image, 16, 16, seed(i), color_jitter_strength=0.0, crop=False).numpy()
        for i in range(20)
    ]
    assert all(np.array_equal(v, image) or np.array_equal(v, image[:, ::-1]) for v in views)
    assert any(np.array_equal(v, image) for v in views) and any(
        np.array_equal(v, image[:, ::-1]) for v in views
    )
    unflipped = augment.preprocess_for_train(
        image, 16, 16, seed(0), color_jitter_strength=0.0, crop=False, flip=False
    )
    np.testing.assert_array_equal(unflipped.numpy(), image)


def test_probabilities_zero_and_one():
    image = smooth_image(16)
    np.testing.assert_array_equal(augment.random_color_jitter(image, seed(0), p=0.0).numpy(), image)
    np.testing.assert_array_equal(augment.to_grayscale(image, seed(0), p=0.0).numpy(), image)
    np.testing.assert_array_equal(blur.random_blur(image, 40, 40, seed(0), p=0.0).numpy(), image)
    np.testing.assert_array_equal(
        augment.random_color_jitter(image, seed(0), strength=0.0, p=1.0).numpy(), image
    )
    # p = 0.5 picks both outcomes over a few seeds.
    outcomes = {
        bool(np.allclose(augment.to_grayscale(image, seed(i), p=0.5).numpy(), image)) for i in range(30)
    }
    assert outcomes == {True, False}


def test_grayscale_gives_equal_channels():
    image = smooth_image(16)
    gray = augment.to_grayscale(image, seed(0), p=1.0).numpy()
    assert gray.shape == (16, 16, 3)
    np.testing.assert_allclose(gray[..., 0], gray[..., 1])
    np.testing.assert_allclose(gray[..., 0], gray[..., 2])
    luminance = image @ np.array([0.2989, 0.587, 0.114], "float32")
    np.testing.assert_allclose(gray[..., 0], luminance, atol=1e-3)


def test_eval_preprocessing_is_deterministic_and_crops_the_center():
    image = rand_image(40, 40)
    first = augment.preprocess_for_eval(image, 16, 16).numpy()
    second = augment.preprocess_for_eval(image, 16, 16).numpy()
    np.testing.assert_array_equal(first, second)
    # 87.5% of 40 is 35 pixels, offset 3: the same as cropping by hand and resizing.
    by_hand = tf.clip_by_value(tf.image.resize(image[3:38, 3:38], [16, 16], method="bicubic"), 0, 1)
    np.testing.assert_allclose(first, by_hand.numpy(), atol=1e-6)
    # A tall output keeps its own aspect ratio: 35 rows by rint(17.5) = 18 columns, centered.
    tall = augment.preprocess_for_eval(image, 16, 8).numpy()
    by_hand = tf.clip_by_value(tf.image.resize(image[3:38, 11:29], [16, 8], method="bicubic"), 0, 1)
    np.testing.assert_allclose(tall, by_hand.numpy(), atol=1e-6)
    wide = augment.preprocess_for_eval(image, 8, 16).numpy()
    by_hand = tf.clip_by_value(tf.image.resize(image[11:29, 3:38], [8, 16], method="bicubic"), 0, 1)
    np.testing.assert_allclose(wide, by_hand.numpy(), atol=1e-6)


def test_blur_smooths_and_roughly_preserves_the_mean():
    image = rand_image(64, 64, seed=3)
    inner = (slice(8, -8), slice(8, -8))
    stds = []
    for i in range(5):
        blurred = blur.random_blur(image, 64, 64, seed(i), p=1.0).numpy()
        assert blurred.shape == (64, 64, 3)
        assert abs(blurred.mean() - image.mean()) < 0.03  # zero padding darkens the border a little
        assert abs(blurred[inner].mean() - image[inner].mean()) < 0.01
        stds.append(blurred[inner].std() / image[inner].std())
    # Noise averages out (sigma near 0.1 is almost the identity, so not on every draw).
    assert max(stds) <= 1.0 + 1e-4 and min(stds) < 0.8


def test_batch_blur_draws_one_sigma_per_batch_and_picks_images_with_p():
    # As the reference: one sigma for the whole batch, each image blurred or not on its own.
    images = np.stack([rand_image(40, 40, seed=3)] * 64)
    for i in range(4):
        out = blur.batch_random_blur(images, 40, 40, seed(i)).numpy()
        assert out.shape == images.shape and out.min() >= 0.0 and out.max() <= 1.0
        blurred = [not np.array_equal(view, images[0]) for view in out]
        assert 10 < sum(blurred) < 54  # p = 0.5 of 64
        distinct = {view.tobytes() for view, changed in zip(out, blurred, strict=True) if changed}
        assert len(distinct) == 1  # equal inputs, one sigma: equal outputs
    always = blur.batch_random_blur(images, 40, 40, seed(0), p=1.0).numpy()
    single = blur.random_blur(images[0], 40, 40, seed(9), p=1.0).numpy()
    assert not np.array_equal(always[0], single)  # another seed, another sigma
    np.testing.assert_array_equal(blur.batch_random_blur(images, 40, 40, seed(0), p=0.0), images)


def test_the_same_seed_gives_the_same_view_and_another_seed_another():
    image = smooth_image(32)
    for fn in (
        lambda s: augment.preprocess_for_train(image, 24, 24, s),
        lambda s: augment.random_color_jitter(image, s, p=1.0),
        lambda s: augment.random_crop_with_resize(image, 24, 24, s),
        lambda s: blur.random_blur(image, 32, 32, s, p=1.0),
    ):
        np.testing.assert_array_equal(fn(seed(5)).numpy(), fn(seed(5)).numpy())
        np.testing.assert_array_equal(fn((3, 4)).numpy(), fn(tf.constant([3, 4], tf.int32)).numpy())
        assert not np.array_equal(fn(seed(5)).numpy(), fn(seed(6)).numpy())
    a, b = augment.seed_for(1, 5), augment.seed_for(1, 5, stream=1)
    assert not np.array_equal(a, b) and not np.array_equal(a, augment.seed_for(2, 5))


def test_the_pipeline_functions_hold_no_stateful_random_op():
    # A stateful op (RandomUniformInt, ...) would make the tf.data iterator impossible to checkpoint.
    image = tf.TensorSpec([None, None, 3], tf.uint8)

    @tf.function(input_signature=[image, tf.TensorSpec([2], tf.int64)])
    def view(image, seed):
        out = augment.preprocess_image(image, 16, 16, is_training=True, seed=seed)
        return blur.batch_random_blur(out[tf.newaxis], 24, 24, seed)

    graph = view.get_concrete_function().graph.as_graph_def()
    ops = {node.op for node in graph.node} | {
        node.op for function in graph.library.function for node in function.node_def
    }
    assert any(op.startswith("Stateless") for op in ops)
    stateful = {op for op in ops if ("Random" in op or op.startswith("Sample")) and "Stateless" not in op}
    assert not stateful


def test_works_in_dataset_map_with_static_shapes():
    images = np.random.RandomState(0).randint(0, 256, (6, 28, 28, 1)).astype("uint8")

    def two_views(position, image):
        seeds = tf.unstack(tf.random.experimental.stateless_split(augment.seed_for(0, position), 2))
        return tuple(augment.preprocess_image(image, 16, 16, is_training=True, seed=s) for s in seeds)

    dataset = tf.data.Dataset.from_tensor_slices(images).enumerate().map(two_views).batch(3)
    assert dataset.element_spec[0].shape.as_list() == [None, 16, 16, 3]
    batches = list(dataset)
    assert len(batches) == 2
    view1, view2 = batches[0]
    assert view1.shape == (3, 16, 16, 3) and view1.dtype == tf.float32
    assert not np.allclose(view1.numpy(), view2.numpy())

    # Images of unknown size (e.g. decoded JPEGs) also come out with a static shape.
    ragged = tf.data.Dataset.from_generator(
        lambda: (rand_image(h, w) for h, w in [(20, 30), (33, 17)]),
        output_signature=tf.TensorSpec([None, None, None], tf.float32),
    )
    for is_training in (True, False):
        mapped = ragged.map(
            lambda image, t=is_training: augment.preprocess_image(image, 16, 16, t, seed=seed(0))
        )
        assert mapped.element_spec.shape.as_list() == [16, 16, 3]
        for image in mapped:
            check_image(image, 16, 16)


def test_too_small_or_bad_arguments_are_clear_errors():
    image = rand_image(16, 16)
    with pytest.raises(ValueError, match="Invalid value for argument `height`.*too small"):
        augment.preprocess_for_train(image, 4, 16, seed(0))
    with pytest.raises(ValueError, match="Invalid value for argument `width`"):
        augment.preprocess_for_eval(image, 16, 7)
    with pytest.raises(ValueError, match="Invalid value for argument `height`"):
        blur.random_blur(image, 6, 16, seed(0))
    with pytest.raises(ValueError, match="Invalid value for argument `p`"):
        augment.to_grayscale(image, seed(0), p=1.5)
    with pytest.raises(ValueError, match="Invalid value for argument `strength`"):
        augment.random_color_jitter(image, seed(0), strength=-1.0)
    with pytest.raises(ValueError, match="Invalid value for argument `area_range`"):
        augment.random_crop_with_resize(image, 16, 16, seed(0), area_range=(0.5, 1.5))
    with pytest.raises(
        ValueError, match="Invalid value for argument `seed`.*Expected a shape-\\[2\\] integer"
    ):
        augment.preprocess_for_train(image, 16, 16, [0.5, 1.0])
    with pytest.raises(ValueError, match="Invalid value for argument `seed`.*Received: seed=None"):
        augment.preprocess_image(image, 16, 16, is_training=True)


def test_jitter_applies_each_transform_once_in_random_or_fixed_order(monkeypatch):
    # Stand-in transforms that do not commute, so the order shows in the result.
    fakes = [lambda x, s: x * 0.5, lambda x, s: x + 0.25, lambda x, s: tf.square(x), lambda x, s: 1.0 - x]
    monkeypatch.setattr(augment, "_color_transforms", lambda strength: fakes)
    image = np.full((8, 8, 3), 0.6, "float32")
    fixed = 1.0 - (0.6 * 0.5 + 0.25) ** 2
    for i in range(3):
        out = augment.random_color_jitter(image, seed(i), p=1.0, random_order=False).numpy()
        np.testing.assert_allclose(out, fixed, rtol=1e-6)
    outcomes = {
        round(float(augment.random_color_jitter(image, seed(i), p=1.0).numpy()[0, 0, 0]), 5)
        for i in range(30)
    }
    assert len(outcomes) > 3


def test_two_views_of_one_position_in_one_map_are_independent():
    # Each view gets its own seed, split from the example's position's seed.
    images = np.random.RandomState(0).rand(120, 8, 8, 3).astype("float32")

    def two_views(position, image):
        seeds = tf.unstack(tf.random.experimental.stateless_split(augment.seed_for(0, position), 2))
        jittered = [augment.random_color_jitter(image, s, p=1.0) for s in seeds]
        blurred = [blur.random_blur(image, 40, 40, s, p=1.0) for s in seeds]
        return tf.stack(jittered), tf.stack(blurred)

    dataset = tf.data.Dataset.from_tensor_slices(images).enumerate().map(two_views).batch(120)
    jittered, blurred = next(iter(dataset))
    for views in (jittered.numpy(), blurred.numpy()):
        differences = np.abs(views[:, 0] - views[:, 1]).reshape(120, -1).max(axis=1)
        assert np.all(differences > 1e-6)  # a shared seed would make some pairs (nearly) identical


def test_train_colour_distortion_includes_grayscale_sometimes():
    image = smooth_image(16)
    views = [
        augment.preprocess_for_train(image, 16, 16, seed(i), crop=False, flip=False).numpy()
        for i in range(40)
    ]
    gray = [
        np.allclose(v[..., 0], v[..., 1], atol=1e-5) and np.allclose(v[..., 0], v[..., 2], atol=1e-5)
        for v in views
    ]
    assert any(gray) and not all(gray)  # p = 0.2
