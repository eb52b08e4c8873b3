"""ResNet v1 encoders (18, 34, 50) for SimCLR, in Keras 3 functional style."""

from __future__ import annotations

import math

import keras

# Blocks per group and whether the blocks are bottlenecks.
DEPTHS = {18: ((2, 2, 2, 2), False), 34: ((3, 4, 6, 3), False), 50: ((3, 4, 6, 3), True)}
GROUP_FILTERS = (64, 128, 256, 512)
BATCH_NORM_MOMENTUM = 0.9
BATCH_NORM_EPSILON = 1e-5


def _check(depth: int, width_multiplier: float) -> None:
    if isinstance(depth, bool) or depth not in DEPTHS:
        raise ValueError(
            f"Invalid value for argument `depth`. Received: depth={depth!r}. "
            f"Expected one of {sorted(DEPTHS)}."
        )
    if (
        isinstance(width_multiplier, bool)
        or not isinstance(width_multiplier, (int, float))
        or not math.isfinite(width_multiplier)
        or width_multiplier <= 0
    ):
        raise ValueError(
            "Invalid value for argument `width_multiplier`. Received: "
            f"width_multiplier={width_multiplier!r}. Expected a number > 0."
        )


def _width(filters: int, width_multiplier: float) -> int:
    return max(1, int(math.floor(filters * width_multiplier + 0.5)))


def feature_dim(depth: int, width_multiplier: float) -> int:
    """Returns the size of the pooled features of `resnet(depth, width_multiplier)`.

    Args:
        depth: 18, 34 or 50.
        width_multiplier: The channel multiplier (> 0).

    Returns:
        512 * width_multiplier (basic blocks) or 4 * 512 * width_multiplier
        (bottlenecks), rounded as the layers are.

    Raises:
        ValueError: an unsupported depth or a width_multiplier <= 0.
    """
    _check(depth, width_multiplier)
    bottleneck = DEPTHS[depth][1]
    return _width(GROUP_FILTERS[-1], width_multiplier) * (4 if bottleneck else 1)


class _Builder:
    """Adds named conv / batch-norm layers to a functional graph."""

    def __init__(self, sync_batch_norm: bool, zero_init_residual: bool = True):
        self.sync_batch_norm = sync_batch_norm
        self.zero_init_residual = zero_init_residual

    def conv(self, x, filters: int, kernel_size: int, strides: int, name: str):
        # Strided convolutions pad explicitly, so the output size does not depend on the input's parity.
        if strides > 1:
            pad_total = kernel_size - 1
            x = keras.layers.ZeroPadding2D(
                ((pad_total // 2, pad_total - pad_total // 2),) * 2, name=f"{name}_pad"
            )(x)
        return keras.layers.Conv2D(
            filters,
            kernel_size,
            strides=strides,
            padding="same" if strides == 1 else "valid",
            use_bias=False,
            kernel_initializer=keras.initializers.VarianceScaling(),
            name=name,
        )(x)

    def batch_norm(self, x, name: str, relu: bool = True, zero_gamma: bool = False):
        # Every name contains "batch_normalization": LARS excludes these variables by path.
        x = keras.layers.BatchNormalization(
            momentum=BATCH_NORM_MOMENTUM,
            epsilon=BATCH_NORM_EPSILON,
            gamma_initializer="zeros" if zero_gamma and self.zero_init_residual else "ones",
            synchronized=self.sync_batch_norm,
            name=name,
        )(x)
        return keras.layers.ReLU(name=f"{name}_relu")(x) if relu else x

    def block(self, x, filters: int, strides: int, bottleneck: bool, projection: bool, name: str):
        """A residual block; the last batch norm starts at zero, so the block starts as the identity."""
        out_filters = 4 * filters if bottleneck else filters
        shortcut = x
        if projection:
            shortcut = self.conv(x, out_filters, 1, strides, f"{name}_projection_conv")
            shortcut = self.batch_norm(shortcut, f"{name}_projection_batch_normalization", relu=False)
        if bottleneck:
            x = self.conv(x, filters, 1, 1, f"{name}_conv1")
            x = self.batch_norm(x, f"{name}_batch_normalization_1")
            x = self.conv(x, filters, 3, strides, f"{name}_conv2")
            x = self.batch_norm(x, f"{name}_batch_normalization_2")
            x = self.conv(x, out_filters, 1, 1, f"{name}_conv3")
            x = self.batch_norm(x, f"{name}_batch_normalization_3", relu=False, zero_gamma=True)
        else:
            x = self.conv(x, filters, 3, strides, f"{name}_conv1")
            x = self.batch_norm(x, f"{name}_batch_normalization_1")
            x = self.conv(x, filters, 3, 1, f"{name}_conv2")
            x = self.batch_norm(x, f"{name}_batch_normalization_2", relu=False, zero_gamma=True)
        x = keras.layers.Add(name=f"{name}_add")([x, shortcut])
        return keras.layers.ReLU(name=f"{name}_out")(x)


def resnet(
    depth: int = 18,
    width_multiplier: float = 1.0,
    cifar_stem: bool = True,
    input_shape: tuple[int, int, int] | None = None,
    sync_batch_norm: bool = False,
    zero_init_residual: bool = True,
    name: str | None = None,
) -> keras.Model:
    """Builds a ResNet v1 encoder that outputs globally average-pooled features.

    Args:
        depth: 18 or 34 (basic blocks) or 50 (bottleneck blocks).
        width_multiplier: Multiplies every layer's channels (64, 128, 256, 512
            per group); fractional values are rounded, to at least 1 channel.
        cifar_stem: True: a 3x3 stride-1 convolution and no max-pool (small
            images); False: the ImageNet stem, a 7x7 stride-2 convolution and a
            3x3 stride-2 max-pool.
        input_shape: The (height, width, channels) of the input images; None
            for (None, None, 3), any image size.
        sync_batch_norm: Whether batch statistics are computed over all
            replicas (`BatchNormalization(synchronized=True)`).
        zero_init_residual: Start each block's last batch norm at gamma 0, so
            blocks begin as identities (the reference's choice, good for long
            runs); False learns faster in short, narrow CPU runs.
        name: The model's name; default `resnet{depth}`.

    Returns:
        A `keras.Model` from images `(batch, height, width, channels)` to
        features `(batch, feature_dim(depth, width_multiplier))`.

    Raises:
        ValueError: an unsupported depth, a width_multiplier <= 0, or an
            `input_shape` that is not 3 dimensions.
    """
    _check(depth, width_multiplier)
    if input_shape is None:
        input_shape = (None, None, 3)
    if len(tuple(input_shape)) != 3:
        raise ValueError(
            f"Invalid value for argument `input_shape`. Received: input_shape={input_shape!r}. "
            "Expected (height, width, channels) or None."
        )
    blocks_per_group, bottleneck = DEPTHS[depth]
    build = _Builder(sync_batch_norm, zero_init_residual)

    inputs = keras.Input(tuple(input_shape), name="images")
    stem_filters = _width(64, width_multiplier)
    if cifar_stem:
        x = build.conv(inputs, stem_filters, 3, 1, "stem_conv")
        x = build.batch_norm(x, "stem_batch_normalization")
    else:
        x = build.conv(inputs, stem_filters, 7, 2, "stem_conv")
        x = build.batch_norm(x, "stem_batch_normalization")
        x = keras.layers.MaxPooling2D(3, strides=2, padding="same", name="stem_pool")(x)
    for group, (blocks, filters) in enumerate(zip(blocks_per_group, GROUP_FILTERS, strict=True), start=1):
        filters = _width(filters, width_multiplier)
        for block in range(blocks):
            strides = 2 if group > 1 and block == 0 else 1
            x = build.block(
                x, filters, strides, bottleneck, projection=block == 0, name=f"group{group}_block{block + 1}"
            )
    features = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, features, name=name or f"resnet{depth}")
