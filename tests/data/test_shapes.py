"""Tests for `tftrain.data.shapes`: the generated "shapes" and "synthetic" datasets."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tftrain.data import shapes

NUM_CLASSES = len(shapes.CLASS_NAMES)
LUMA = np.array([0.299, 0.587, 0.114])


def luminance(images):
    return images.astype(np.float64) @ LUMA


# ------------------------------------------------------------------------ shapes


def test_class_names():
    assert len(shapes.CLASS_NAMES) >= 6
    assert len(set(shapes.CLASS_NAMES)) == len(shapes.CLASS_NAMES)
    assert {"circle", "square", "triangle", "cross", "ring"} <= set(shapes.CLASS_NAMES)


def test_dtypes_shapes_and_labels():
    images, labels = shapes.generate("train", 40, image_size=24)
    assert images.dtype == np.uint8 and images.shape == (40, 24, 24, 3)
    assert labels.dtype == np.int64 and labels.shape == (40,)
    assert labels.min() >= 0 and labels.max() < NUM_CLASSES
    # Images use the uint8 range, not [0, 1]: light and dark pixels both occur.
    assert images.max() > 200 and images.min() < 50


def test_deterministic():
    first = shapes.generate("test", 50, image_size=20)
    second = shapes.generate("test", 50, image_size=20)
    assert first[0].tobytes() == second[0].tobytes()
    np.testing.assert_array_equal(first[1], second[1])


def test_fewer_examples_are_a_prefix_of_more():
    many_images, many_labels = shapes.generate("train", 1100)  # crosses a random block boundary
    few_images, few_labels = shapes.generate("train", 1030)
    np.testing.assert_array_equal(few_images, many_images[:1030])
    np.testing.assert_array_equal(few_labels, many_labels[:1030])


def test_train_and_test_are_disjoint():
    train, _ = shapes.generate("train", 400)
    test, _ = shapes.generate("test", 400)
    train_bytes = {image.tobytes() for image in train}
    assert len(train_bytes) == 400  # no duplicates within a split either
    assert not train_bytes & {image.tobytes() for image in test}


@pytest.mark.parametrize("num_examples", [8 * 50, 803])
def test_classes_are_balanced(num_examples):
    _, labels = shapes.generate("train", num_examples)
    counts = np.bincount(labels, minlength=NUM_CLASSES)
    assert counts.max() - counts.min() <= 1
    # and not in a fixed cyclic order
    assert not np.array_equal(labels[:NUM_CLASSES], labels[NUM_CLASSES : 2 * NUM_CLASSES])


@pytest.mark.parametrize("image_size", [16, 17, 33, 64])
def test_any_size_draws_a_visible_shape_inside_the_image(image_size):
    images, labels = shapes.generate("test", 64, image_size=image_size)
    assert images.shape == (64, image_size, image_size, 3)
    # Shapes stay inside the image: the corners always show the background.
    corner = luminance(images[:, :1, :1, :])
    foreground = np.abs(luminance(images) - corner) > 40
    fraction = foreground.mean(axis=(1, 2))
    assert fraction.min() > 0.01, "a shape is missing or has no contrast"
    assert fraction.max() < 0.6, "a shape covers most of the image"
    assert not foreground[:, 0, 0].any() and not foreground[:, -1, -1].any()


def test_scale_position_and_colours_vary():
    images, labels = shapes.generate("train", 400)
    circles = images[labels == shapes.CLASS_NAMES.index("circle")]
    corner = luminance(circles[:, :1, :1, :])
    foreground = np.abs(luminance(circles) - corner) > 40
    areas = foreground.mean(axis=(1, 2))
    assert areas.max() > 2 * areas.min()  # scale varies
    rows = [np.nonzero(mask.any(axis=1))[0].mean() for mask in foreground]
    assert np.ptp(rows) > 8  # position varies
    backgrounds = circles[:, 0, 0, :].astype(float)
    assert backgrounds.std(axis=0).min() > 40  # background colours vary in every channel


def test_mild_noise():
    images, _ = shapes.generate("train", 20)
    # Neighbouring background pixels differ a little (noise), not a lot.
    corner = images[:, :4, :4, :].astype(float)
    spread = corner.std(axis=(1, 2)).mean()
    assert 1.0 < spread < 15.0


def test_colour_does_not_predict_the_class():
    train_images, train_labels = shapes.generate("train", 4000)
    test_images, test_labels = shapes.generate("test", 2000)

    def mean_colour(images):
        return images.reshape(len(images), -1, 3).mean(axis=1)

    means = np.stack([mean_colour(train_images)[train_labels == k].mean(axis=0) for k in range(NUM_CLASSES)])
    distances = ((mean_colour(test_images)[:, None, :] - means[None]) ** 2).sum(axis=-1)
    accuracy = (distances.argmin(axis=1) == test_labels).mean()
    chance = 1 / NUM_CLASSES
    assert accuracy < chance + 0.04, f"mean colour predicts the class: accuracy {accuracy:.3f}"


class PerImageStandardization(keras.layers.Layer):
    """Removes each image's mean and contrast: colour carries no class information anyway."""

    def call(self, images):
        centred = images - tf.reduce_mean(images, axis=[1, 2, 3], keepdims=True)
        return centred / (tf.math.reduce_std(centred, axis=[1, 2, 3], keepdims=True) + 1.0)


def test_learnable_by_a_tiny_cnn():
    train_images, train_labels = shapes.generate("train", 3200, image_size=16)
    test_images, test_labels = shapes.generate("test", 400, image_size=16)
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((16, 16, 3)),
            PerImageStandardization(),
            keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
            keras.layers.MaxPool2D(),
            keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
            keras.layers.MaxPool2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(NUM_CLASSES),
        ]
    )
    model.compile(
        keras.optimizers.Adam(3e-3),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    model.fit(train_images, train_labels, batch_size=32, epochs=4, verbose=0)
    _, accuracy = model.evaluate(test_images, test_labels, verbose=0)
    # About 0.6 after these few seconds (chance: 0.125); a 32x32 CNN trained for 90 s reaches 0.96.
    assert accuracy > 0.4, f"test accuracy {accuracy:.3f}; chance is {1 / NUM_CLASSES:.3f}"


def test_shapes_dataset_matches_generate():
    dataset = shapes.shapes_dataset("test", image_size=16, num_examples=12)
    assert dataset.element_spec == (
        tf.TensorSpec((16, 16, 3), tf.uint8),
        tf.TensorSpec((), tf.int64),
    )
    images, labels = shapes.generate("test", 12, image_size=16)
    got = list(dataset.as_numpy_iterator())
    assert len(got) == 12
    np.testing.assert_array_equal(np.stack([x for x, _ in got]), images)
    np.testing.assert_array_equal([y for _, y in got], labels)


def test_shapes_dataset_default_sizes():
    assert shapes.DEFAULT_NUM_EXAMPLES == {"train": 10_000, "test": 2_000}
    assert int(shapes.shapes_dataset("test").cardinality()) == 2_000


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(split="validation", num_examples=4), "split"),
        (dict(split="train", num_examples=0), "num_examples"),
        (dict(split="train", num_examples=4, image_size=15), "image_size"),
        (dict(split="train", num_examples=4, image_size=32.0), "image_size"),
    ],
)
def test_generate_rejects_bad_arguments(kwargs, argument):
    with pytest.raises(ValueError, match=f"Invalid value for argument `{argument}`"):
        shapes.generate(**kwargs)


# --------------------------------------------------------------------- synthetic


def test_synthetic_dataset():
    dataset = shapes.synthetic_dataset("train", image_size=8, num_examples=300, num_classes=4, channels=1)
    assert dataset.element_spec == (tf.TensorSpec((8, 8, 1), tf.uint8), tf.TensorSpec((), tf.int64))
    assert int(dataset.cardinality()) == 300
    images, labels = map(np.stack, zip(*dataset.as_numpy_iterator(), strict=True))
    assert images.shape == (300, 8, 8, 1) and labels.shape == (300,)
    assert set(np.unique(labels)) == {0, 1, 2, 3}
    assert images.min() < 10 and images.max() > 245
    assert 100 < images.mean() < 155  # uniform over [0, 255]
    assert len({image.tobytes() for image in images}) == 300


def test_synthetic_is_deterministic_per_split():
    def read(split):
        return list(shapes.synthetic_dataset(split, image_size=4, num_examples=5).as_numpy_iterator())

    first, again, test = read("train"), read("train"), read("test")
    for (a, la), (b, lb) in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
        assert la == lb
    assert not any(np.array_equal(a, b) for (a, _), (b, _) in zip(first, test, strict=True))


def test_synthetic_default_size_and_errors():
    assert int(shapes.synthetic_dataset("test").cardinality()) == 2_000
    assert shapes.synthetic_dataset("test").element_spec[0].shape == (32, 32, 3)
    with pytest.raises(ValueError, match="`split`"):
        shapes.synthetic_dataset("validation")
    with pytest.raises(ValueError, match="`num_classes`"):
        shapes.synthetic_dataset("train", num_classes=0)
