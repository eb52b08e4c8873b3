"""ResNet v1 encoders (18 to 200 layers, optional squeeze-excitation and selective kernels) for SimCLR."""

from __future__ import annotations

import math

import keras

from tftrain.examples.simclr import batch_norm

# Blocks per group and whether the blocks are bottlenecks.
DEPTHS = {
    18: ((2, 2, 2, 2), False),
    34: ((3, 4, 6, 3), False),
    50: ((3, 4, 6, 3), True),
    101: ((3, 4, 23, 3), True),
    152: ((3, 8, 36, 3), True),
    200: ((3, 24, 36, 3), True),
}
GROUP_FILTERS = (64, 128, 256, 512)
BATCH_NORM_MOMENTUM = 0.9
BATCH_NORM_EPSILON = 1e-5
SK_MIN_DIM = 32  # the selective kernel's smallest attention width, as the reference


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
        depth: 18, 34, 50, 101, 152 or 200.
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
    """Adds named layers to a functional graph; layers made while `trainable` is False are frozen."""

    def __init__(self, sync_batch_norm: bool, batch_norm_decay: float, se_ratio: float, sk_ratio: float):
        self.sync_batch_norm = sync_batch_norm
        self.batch_norm_decay = batch_norm_decay
        self.se_ratio = se_ratio
        self.sk_ratio = sk_ratio
        self.trainable = True

    def conv(self, x, filters: int, kernel_size: int, strides: int, name: str, use_bias: bool = False):
        # Strided convolutions pad explicitly, so the output size does not depend on the input's parity.
        if strides > 1:
            x = self.pad(x, kernel_size - 1, f"{name}_pad")
        return keras.layers.Conv2D(
            filters,
            kernel_size,
            strides=strides,
            padding="same" if strides == 1 else "valid",
            use_bias=use_bias,
            kernel_initializer=keras.initializers.VarianceScaling(),
            trainable=self.trainable,
            name=name,
        )(x)

    def pad(self, x, pad_total: int, name: str):
        return keras.layers.ZeroPadding2D(((pad_total // 2, pad_total - pad_total // 2),) * 2, name=name)(x)

    def batch_norm(self, x, name: str, relu: bool = True, zero_gamma: bool = False):
        # Every name contains "batch_normalization": LARS excludes these variables by path.
        layer = batch_norm.BatchNormalization(
            momentum=self.batch_norm_decay,
            epsilon=BATCH_NORM_EPSILON,
            gamma_initializer="zeros" if zero_gamma else "ones",
            synchronized=self.sync_batch_norm,
            name=name,
        )
        x = layer(x)
        if not self.trainable:
            # As the reference under tf.keras 2, where a frozen block's own batch norm layer stays
            # trainable: in training it normalizes with the batch's statistics and updates its moving
            # averages; only its gamma and beta are left out of the trained variables.
            for variable in layer.trainable_weights:
                variable.trainable = False
        return keras.layers.ReLU(name=f"{name}_relu")(x) if relu else x

    def squeeze_excite(self, x, filters: int, name: str):
        """Squeeze-and-excitation (Hu et al.): channels rescaled by a gate of their global means."""
        squeezed = keras.layers.GlobalAveragePooling2D(keepdims=True, name=f"{name}_se_pool")(x)
        squeezed = self.conv(squeezed, max(1, int(filters * self.se_ratio)), 1, 1, f"{name}_se_reduce", True)
        squeezed = keras.layers.ReLU(name=f"{name}_se_relu")(squeezed)
        gate = self.conv(squeezed, x.shape[-1], 1, 1, f"{name}_se_expand", use_bias=True)
        gate = keras.layers.Activation("sigmoid", name=f"{name}_se_gate")(gate)
        return keras.layers.Multiply(name=f"{name}_se_scale")([x, gate])

    def selective_kernel(self, x, filters: int, strides: int, name: str):
        """Selective kernel convolution (Li et al.): two 3x3 streams mixed by a softmax attention."""
        x = self.conv(x, 2 * filters, 3, strides, f"{name}_sk_conv")
        x = self.batch_norm(x, f"{name}_sk_batch_normalization")
        streams = keras.ops.stack(keras.ops.split(x, 2, axis=-1))  # [2, B, H, W, filters]
        summary = keras.ops.mean(keras.ops.sum(streams, axis=0), axis=(1, 2), keepdims=True)
        summary = self.conv(summary, max(int(filters * self.sk_ratio), SK_MIN_DIM), 1, 1, f"{name}_sk_reduce")
        summary = self.batch_norm(summary, f"{name}_sk_reduce_batch_normalization")
        mixing = self.conv(summary, 2 * filters, 1, 1, f"{name}_sk_mix")
        mixing = keras.ops.softmax(keras.ops.stack(keras.ops.split(mixing, 2, axis=-1)), axis=0)
        return keras.ops.sum(streams * mixing, axis=0)

    def shortcut(self, x, out_filters: int, strides: int, name: str):
        """The projection shortcut; with selective kernels ResNet-D's (average pool, then 1x1 conv)."""
        if self.sk_ratio > 0:
            if strides > 1:
                x = self.pad(x, 1, f"{name}_projection_pad")
            x = keras.layers.AveragePooling2D(
                2,
                strides=strides,
                padding="same" if strides == 1 else "valid",
                name=f"{name}_projection_pool",
            )(x)
            strides = 1
        x = self.conv(x, out_filters, 1, strides, f"{name}_projection_conv")
        return self.batch_norm(x, f"{name}_projection_batch_normalization", relu=False)

    def block(self, x, filters: int, strides: int, bottleneck: bool, projection: bool, name: str):
        """A residual block; the last batch norm starts at zero, so the block starts as the identity."""
        out_filters = 4 * filters if bottleneck else filters
        shortcut = self.shortcut(x, out_filters, strides, name) if projection else x
        if bottleneck:
            x = self.conv(x, filters, 1, 1, f"{name}_conv1")
            x = self.batch_norm(x, f"{name}_batch_normalization_1")
            if self.sk_ratio > 0:
                x = self.selective_kernel(x, filters, strides, f"{name}_conv2")
            else:
                x = self.conv(x, filters, 3, strides, f"{name}_conv2")
                x = self.batch_norm(x, f"{name}_batch_normalization_2")
            x = self.conv(x, out_filters, 1, 1, f"{name}_conv3")
            x = self.batch_norm(x, f"{name}_batch_normalization_3", relu=False, zero_gamma=True)
        else:
            x = self.conv(x, filters, 3, strides, f"{name}_conv1")
            x = self.batch_norm(x, f"{name}_batch_normalization_1")
            x = self.conv(x, filters, 3, 1, f"{name}_conv2")
            x = self.batch_norm(x, f"{name}_batch_normalization_2", relu=False, zero_gamma=True)
        if self.se_ratio > 0:
            x = self.squeeze_excite(x, filters, name)
        x = keras.layers.Add(name=f"{name}_add")([x, shortcut])
        return keras.layers.ReLU(name=f"{name}_out")(x)

    def stem(self, x, width: int, cifar_stem: bool):
        if cifar_stem:
            x = self.conv(x, width, 3, 1, "stem_conv")
            return self.batch_norm(x, "stem_batch_normalization")
        if self.sk_ratio > 0:  # ResNet-D's stem: three 3x3 convolutions
            x = self.conv(x, max(1, width // 2), 3, 2, "stem_conv_a")
            x = self.batch_norm(x, "stem_batch_normalization_a")
            x = self.conv(x, max(1, width // 2), 3, 1, "stem_conv_b")
            x = self.batch_norm(x, "stem_batch_normalization_b")
            x = self.conv(x, width, 3, 1, "stem_conv")
        else:
            x = self.conv(x, width, 7, 2, "stem_conv")
        x = self.batch_norm(x, "stem_batch_normalization")
        return keras.layers.MaxPooling2D(3, strides=2, padding="same", name="stem_pool")(x)


def resnet(
    depth: int = 18,
    width_multiplier: float = 1.0,
    cifar_stem: bool = True,
    input_shape: tuple[int, int, int] | None = None,
    sync_batch_norm: bool = False,
    batch_norm_decay: float = BATCH_NORM_MOMENTUM,
    se_ratio: float = 0.0,
    sk_ratio: float = 0.0,
    fine_tune_after_block: int = -1,
    name: str | None = None,
) -> keras.Model:
    """Builds a ResNet v1 encoder that outputs globally average-pooled features.

    As SimCLR's reference: each residual block's last batch norm starts at
    gamma 0 (each block starts as its shortcut).

    Args:
        depth: 18 or 34 (basic blocks) or 50, 101, 152, 200 (bottleneck blocks).
        width_multiplier: Multiplies every layer's channels (64, 128, 256, 512
            per group); fractional values are rounded, to at least 1 channel.
        cifar_stem: True: a 3x3 stride-1 convolution and no max-pool (small
            images); False: the ImageNet stem, a 7x7 stride-2 convolution and a
            3x3 stride-2 max-pool.
        input_shape: The (height, width, channels) of the input images; None
            for (None, None, 3), any image size.
        sync_batch_norm: Whether batch statistics are computed over all
            replicas (`BatchNormalization(synchronized=True)`).
        batch_norm_decay: The batch norms' moving-average momentum.
        se_ratio: > 0: a squeeze-and-excitation gate at the end of each block's
            residual branch, `filters * se_ratio` wide.
        sk_ratio: > 0: selective kernel convolutions in the bottlenecks
            (attention `max(filters * sk_ratio, 32)` wide) and ResNet-D's stem
            and projection shortcuts, as the reference (SimCLRv2).
        fine_tune_after_block: -1: every layer trains. 0..4: the stem and the
            block groups up to that one (4: all) are frozen (their variables
            are not trained and no gradient flows into them; their batch
            norms, as the reference's under tf.keras 2, still normalize with
            the batch's statistics in training and update their averages).
        name: The model's name; default `resnet{depth}`.

    Returns:
        A `keras.Model` from images `(batch, height, width, channels)` to
        features `(batch, feature_dim(depth, width_multiplier))`.

    Raises:
        ValueError: an unsupported depth, a width_multiplier <= 0, an
            `input_shape` that is not 3 dimensions, or a
            `fine_tune_after_block` outside -1..4.
    """
    _check(depth, width_multiplier)
    input_shape = (None, None, 3) if input_shape is None else input_shape
    if len(tuple(input_shape)) != 3:
        raise ValueError(
            f"Invalid value for argument `input_shape`. Received: input_shape={input_shape!r}. "
            "Expected (height, width, channels) or None."
        )
    if isinstance(fine_tune_after_block, bool) or fine_tune_after_block not in range(-1, 5):
        raise ValueError(
            "Invalid value for argument `fine_tune_after_block`. Received: "
            f"fine_tune_after_block={fine_tune_after_block!r}. Expected an integer in -1..4 "
            "(-1: train every layer)."
        )
    blocks_per_group, bottleneck = DEPTHS[depth]
    build = _Builder(sync_batch_norm, batch_norm_decay, se_ratio, sk_ratio)
    build.trainable = fine_tune_after_block == -1

    inputs = keras.Input(tuple(input_shape), name="images")
    x = build.stem(inputs, _width(64, width_multiplier), cifar_stem)
    for group, (blocks, filters) in enumerate(zip(blocks_per_group, GROUP_FILTERS, strict=True), start=1):
        if fine_tune_after_block == group - 1:  # the frozen part ends here
            x = keras.ops.stop_gradient(x)
            build.trainable = True
        filters = _width(filters, width_multiplier)
        for block in range(blocks):
            strides = 2 if group > 1 and block == 0 else 1
            x = build.block(
                x, filters, strides, bottleneck, projection=block == 0, name=f"group{group}_block{block + 1}"
            )
    if fine_tune_after_block == 4:
        x = keras.ops.stop_gradient(x)
    features = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, features, name=name or f"resnet{depth}")
