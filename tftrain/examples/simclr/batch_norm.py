"""Batch normalization whose training gradient is the same bits in every run.

Keras's `BatchNormalization` differentiates its training-mode forward pass
automatically. Its input feeds three ops there (the batch mean, the variance
and the normalization), so the input's gradient is a sum of three terms: one
`AddN` of three tensors. TensorFlow's `AddN` kernel reuses an input's buffer
for its output when it can, and then moves that input to the front of the
sum; which input it can reuse depends on the order in which the executor ran
the other ops that read them. Floating-point addition is not associative, so
one step, from the same weights on the same batch, gives gradients that differ
in the last bits from call to call. On CPU (TF 2.21), the
demo's ResNet-18 repeated the same gradient call 30 times and about one call
in five differed (10.5% of the elements of the gradient at the last
block's second convolution), even with one inter-op and one intra-op thread
and with oneDNN off; two training runs with the same seed part after a few
steps. `tf.config.experimental.enable_op_determinism()` does not cover it.

`BatchNormalization` here computes the same forward pass and moving averages
as Keras's, and in training mode returns the gradient's closed form in one
expression (no sum of separately computed terms), so nothing depends on the
executor's order. In inference mode, with `synchronized=True` (statistics over
replicas), a mask or renorm, it is Keras's layer unchanged.
"""

from __future__ import annotations

import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="tftrain")
class BatchNormalization(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization` with a run-to-run identical training gradient.

    Same arguments, variables, checkpoints and forward values as Keras's layer
    (whose outputs it matches bit for bit); the training-mode gradient is the
    closed form
    `dx = gamma / sqrt(var + eps) * (dy - mean(dy) - x_hat * mean(dy * x_hat))`,
    `dgamma = sum(dy * x_hat)`, `dbeta = sum(dy)`, sums over every axis but
    the normalized one.
    """

    def call(self, inputs, training=None, mask=None):
        keras_path = self.synchronized or mask is not None or getattr(self, "renorm", False)
        if not (training and self.trainable) or keras_path:
            return super().call(inputs, training=training, mask=mask)
        # As Keras's layer: float16/bfloat16 inputs are normalized in float32.
        inputs = keras.ops.cast(inputs, keras.backend.result_type(inputs.dtype, "float32"))
        dtype = inputs.dtype
        rank = len(inputs.shape)
        channel_axis = self.axis % rank
        axes = [axis for axis in range(rank) if axis != channel_axis]
        stats_shape = [1 if axis in axes else -1 for axis in range(rank)]  # broadcasts over the batch
        channels = inputs.shape[channel_axis]
        # custom_gradient takes tensors: a layer without gamma (beta) scales by one (shifts by zero).
        scale = tf.cast(self.gamma, dtype) if self.scale else tf.ones([channels], dtype)
        offset = tf.cast(self.beta, dtype) if self.center else tf.zeros([channels], dtype)
        epsilon = self.epsilon

        @tf.custom_gradient
        def normalize(x, scale, offset):
            mean, variance = keras.ops.moments(x, axes=axes)
            outputs = keras.ops.batch_normalization(
                x,
                mean,
                variance,
                axis=channel_axis,
                offset=offset if self.center else None,
                scale=scale if self.scale else None,
                epsilon=epsilon,
            )

            def gradient(d_outputs, d_mean, d_variance):
                del d_mean, d_variance  # the statistics only feed the moving averages
                inverse_std = tf.math.rsqrt(variance + epsilon)
                x_hat = (x - tf.reshape(mean, stats_shape)) * tf.reshape(inverse_std, stats_shape)
                shape = tf.shape(x, out_type=tf.int64)
                count = tf.cast(tf.size(x, out_type=tf.int64) // shape[channel_axis], dtype)
                d_offset = tf.reduce_sum(d_outputs, axes)
                d_scale = tf.reduce_sum(d_outputs * x_hat, axes)
                d_x = tf.reshape(scale * inverse_std, stats_shape) * (
                    d_outputs
                    - tf.reshape(d_offset / count, stats_shape)
                    - x_hat * tf.reshape(d_scale / count, stats_shape)
                )
                return d_x, d_scale, d_offset

            return (outputs, mean, variance), gradient

        outputs, mean, variance = normalize(inputs, scale, offset)
        mean, variance = tf.stop_gradient(mean), tf.stop_gradient(variance)
        moving_mean = keras.ops.cast(self.moving_mean, dtype)
        moving_variance = keras.ops.cast(self.moving_variance, dtype)
        self.moving_mean.assign(moving_mean * self.momentum + mean * (1.0 - self.momentum))
        self.moving_variance.assign(moving_variance * self.momentum + variance * (1.0 - self.momentum))
        return keras.ops.cast(outputs, self.compute_dtype)
