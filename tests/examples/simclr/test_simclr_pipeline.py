"""SimCLR's input pipelines: two different views per image, one view for finetuning, plain eval images."""

import keras
import numpy as np
import pytest

from tftrain import data as data_lib
from tftrain.examples.simclr import augment, pipeline


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
    finetune = pipeline.train_view_fn(16, "finetune", color_jitter_strength=1.0, use_blur=True)
    pretrain = pipeline.train_view_fn(16, "pretrain", color_jitter_strength=1.0)
    for _ in range(10):
        np.testing.assert_allclose(finetune(image).numpy(), image[:16, :16], atol=1e-5)
    assert any(np.abs(pretrain(image).numpy() - image[:16, :16]).max() > 0.05 for _ in range(10))


def test_the_finetuning_pipeline_draws_no_colour_distortion(monkeypatch):
    def refused(*args, **kwargs):
        raise AssertionError("colour distortion in a finetuning view")

    monkeypatch.setattr(augment, "random_color_jitter", refused)
    monkeypatch.setattr(augment, "to_grayscale", refused)
    monkeypatch.setattr(augment, "random_blur", refused)
    _, features, _ = first_batch(is_training=True, train_mode="finetune", use_blur=True)
    assert features.shape == (8, 16, 16, 3)
