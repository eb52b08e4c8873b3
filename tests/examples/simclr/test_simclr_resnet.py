"""The SimCLR ResNet v1 encoders: shapes, widths, batch norm settings, training mode."""

import keras
import numpy as np
import pytest

from tftrain.examples.simclr.resnet import feature_dim, resnet


@pytest.mark.parametrize("depth, expected", [(18, 64), (34, 64), (50, 256)])
def test_feature_dims_on_small_images(depth, expected):
    model = resnet(depth, width_multiplier=0.125)
    assert feature_dim(depth, 0.125) == expected
    assert model.output_shape == (None, expected)
    assert model.input_shape == (None, None, None, 3)
    assert model.name == f"resnet{depth}"
    for size in (32, 16):
        features = model(np.zeros((2, size, size, 3), "float32"))
        assert tuple(features.shape) == (2, expected)


def test_stems_and_fixed_input_shape():
    cifar = resnet(18, 0.125, cifar_stem=True, input_shape=(32, 32, 3))
    imagenet = resnet(18, 0.125, cifar_stem=False, input_shape=(32, 32, 3))
    # The CIFAR stem keeps 32x32 into the first group and downsamples 3 times: 4x4 at the end.
    assert cifar.get_layer("group4_block2_out").output.shape[1:3] == (4, 4)
    assert cifar.get_layer("stem_conv").kernel.shape == (3, 3, 3, 8)
    # The ImageNet stem: 7x7 stride 2, then a stride 2 max-pool: 8x8 into the first group, 1x1 at the end.
    assert imagenet.get_layer("stem_conv").kernel.shape == (7, 7, 3, 8)
    assert imagenet.get_layer("stem_pool").output.shape[1:3] == (8, 8)
    assert imagenet.get_layer("group4_block2_out").output.shape[1:3] == (1, 1)
    assert cifar.output_shape == imagenet.output_shape == (None, 64)
    odd = resnet(18, 0.125, cifar_stem=False, input_shape=(17, 17, 1), name="odd")
    assert odd.name == "odd" and odd.output_shape == (None, 64)


def test_widths_are_scaled_and_rounded():
    counts = [resnet(18, width).count_params() for width in (0.0625, 0.125, 0.25)]
    assert counts[0] < counts[1] < counts[2]
    assert feature_dim(18, 0.001) == 1 and feature_dim(50, 0.001) == 4
    assert feature_dim(18, 0.3) == round(512 * 0.3)
    assert feature_dim(18, 1.0) == 512 and feature_dim(50, 1.0) == 2048 and feature_dim(34, 2) == 1024
    tiny = resnet(18, 0.001)  # every layer has at least one channel
    assert tiny.output_shape == (None, 1)


def test_block_counts_and_bottlenecks():
    def convs(model):
        return [layer for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]

    # stem + 2 convs per basic block + one projection per group
    assert len(convs(resnet(18, 0.0625))) == 1 + 2 * 8 + 4
    assert len(convs(resnet(34, 0.0625))) == 1 + 2 * 16 + 4
    bottleneck = resnet(50, 0.0625)
    assert len(convs(bottleneck)) == 1 + 3 * 16 + 4
    assert bottleneck.get_layer("group1_block1_conv3").kernel.shape == (1, 1, 4, 16)


def test_batch_norm_settings():
    model = resnet(18, 0.125)
    norms = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert len(norms) == 1 + 2 * 8 + 4
    assert all(layer.momentum == 0.9 and not layer.synchronized for layer in norms)
    # The last batch norm of each residual branch starts at zero: each block starts as its shortcut.
    assert not np.any(model.get_layer("group2_block1_batch_normalization_2").gamma.numpy())
    assert np.all(model.get_layer("group2_block1_batch_normalization_1").gamma.numpy() == 1)
    # LARS excludes batch norm variables by path.
    for variable in model.trainable_variables:
        if variable.path.endswith(("gamma", "beta")):
            assert "batch_normalization" in variable.path
        else:
            assert "batch_normalization" not in variable.path and "bias" not in variable.path
    synced = resnet(18, 0.125, sync_batch_norm=True)
    norms = [layer for layer in synced.layers if isinstance(layer, keras.layers.BatchNormalization)]
    assert norms and all(layer.synchronized for layer in norms)
    features = synced(np.random.RandomState(0).rand(2, 16, 16, 3).astype("float32"), training=True)
    assert tuple(features.shape) == (2, 64)


def test_forward_in_training_mode_updates_batch_statistics():
    keras.utils.set_random_seed(0)
    model = resnet(18, 0.125)
    images = np.random.RandomState(0).rand(4, 16, 16, 3).astype("float32")
    stem_norm = model.get_layer("stem_batch_normalization")
    before = stem_norm.moving_mean.numpy().copy()
    train_features = model(images, training=True).numpy()
    assert not np.allclose(stem_norm.moving_mean.numpy(), before)
    eval_features = model(images, training=False).numpy()
    assert train_features.shape == eval_features.shape == (4, 64)
    assert np.all(np.isfinite(train_features)) and np.all(train_features >= 0)  # after a ReLU
    assert not np.allclose(train_features, eval_features)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(
        ValueError, match=r"Invalid value for argument `depth`.*\[18, 34, 50, 101, 152, 200\]"
    ):
        resnet(20)
    with pytest.raises(ValueError, match=r"\[18, 34, 50, 101, 152, 200\]"):
        feature_dim(20, 1.0)
    for width in (0, -1.0):
        with pytest.raises(ValueError, match="Invalid value for argument `width_multiplier`"):
            resnet(18, width)
    with pytest.raises(ValueError, match="Invalid value for argument `input_shape`"):
        resnet(18, 0.125, input_shape=(32, 32))
