"""The SimCLR program's batch normalization: Keras's values, a gradient that is the same in every call."""

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf

from tftrain.examples.simclr import batch_norm, resnet


def _pair(**kwargs):
    """Keras's layer and tftrain's, built for (8, 4, 4, 6) inputs with the same random variables."""
    layers = [keras.layers.BatchNormalization(**kwargs), batch_norm.BatchNormalization(**kwargs)]
    rng = np.random.default_rng(0)
    values = None
    for layer in layers:
        layer.build((8, 4, 4, 6))
        if values is None:
            values = [rng.normal(1.0, 0.3, v.shape).astype("float32") for v in layer.weights]
        for variable, value in zip(layer.weights, values, strict=True):
            variable.assign(value)
    return layers


def _gradients(layer, x, upstream):
    with tf.GradientTape() as tape:
        tape.watch(x)
        outputs = layer(x, training=True)
        loss = tf.reduce_sum(outputs * upstream)
    return outputs, tape.gradient(loss, [x, *layer.trainable_weights])


@pytest.mark.parametrize("center, scale", [(True, True), (False, True), (True, False)])
def test_training_matches_keras_values_and_gradients(center, scale):
    keras_layer, layer = _pair(center=center, scale=scale, momentum=0.9, epsilon=1e-5)
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(2.0, 3.0, (8, 4, 4, 6)).astype("float32"))
    upstream = tf.constant(rng.normal(size=(8, 4, 4, 6)).astype("float32"))
    expected_outputs, expected_grads = _gradients(keras_layer, x, upstream)
    outputs, grads = _gradients(layer, x, upstream)
    # The forward pass and the moving averages are Keras's, bit for bit.
    np.testing.assert_array_equal(outputs.numpy(), expected_outputs.numpy())
    for name in ("moving_mean", "moving_variance"):
        np.testing.assert_array_equal(getattr(layer, name).numpy(), getattr(keras_layer, name).numpy())
    # The gradient is the same maths, summed in another order.
    assert len(grads) == len(expected_grads) == 1 + int(center) + int(scale)
    for got, expected in zip(grads, expected_grads, strict=True):
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=2e-5, atol=2e-6)


def test_matrix_inputs_and_inference_are_keras_behaviour():
    keras_layer, layer = keras.layers.BatchNormalization(), batch_norm.BatchNormalization()
    x = tf.constant(np.random.default_rng(2).normal(size=(16, 5)).astype("float32"))
    for training in (True, False):
        np.testing.assert_array_equal(
            layer(x, training=training).numpy(), keras_layer(x, training=training).numpy()
        )
    np.testing.assert_array_equal(layer.moving_variance.numpy(), keras_layer.moving_variance.numpy())


def test_mixed_precision_inputs_are_normalized_in_float32():
    layer = batch_norm.BatchNormalization(dtype="mixed_float16")
    keras_layer = keras.layers.BatchNormalization(dtype="mixed_float16")
    x = tf.constant(np.random.default_rng(3).normal(size=(8, 2, 2, 3)), tf.float16)
    outputs = layer(x, training=True)
    assert outputs.dtype == tf.float16
    np.testing.assert_array_equal(outputs.numpy(), keras_layer(x, training=True).numpy())


def _addn_inputs(layer_class):
    """How many AddN ops of each input count the training gradient of one batch norm holds."""
    layer = layer_class()
    layer.build((8, 4, 4, 6))

    @tf.function
    def gradient(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=True)
        return tape.gradient(y, [x, *layer.trainable_weights])

    graph = gradient.get_concrete_function(tf.TensorSpec((8, 4, 4, 6))).graph
    return collections.Counter(len(op.inputs) for op in graph.get_operations() if op.type == "AddN")


def test_the_gradient_sums_no_separately_computed_terms():
    # Keras's autodiff gradient sums three terms for the input; TF's AddN reorders them by buffer reuse.
    assert max(_addn_inputs(keras.layers.BatchNormalization), default=0) >= 3
    assert max(_addn_inputs(batch_norm.BatchNormalization), default=0) < 3


def test_the_demo_encoders_gradient_is_the_same_in_every_call():
    # With Keras's batch norm about one call in five differed here (the demo's encoder and batch).
    keras.utils.set_random_seed(0)
    encoder = resnet.resnet(18, 0.125, cifar_stem=True, input_shape=(32, 32, 3))
    images = tf.constant(np.random.default_rng(0).uniform(size=(512, 32, 32, 3)).astype("float32"))
    optimizer = keras.optimizers.SGD(0.5)

    @tf.function
    def gradients():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(encoder(images, training=True)))
        return tape.gradient(loss, encoder.trainable_variables)

    @tf.function
    def apply(grads):
        optimizer.apply_gradients(zip(grads, encoder.trainable_variables, strict=True))

    for _ in range(2):  # away from the zero-initialised gammas, whose gradients are exact
        apply(gradients())
    first = [g.numpy() for g in gradients()]
    for _ in range(15):
        again = gradients()
        for expected, got in zip(first, again, strict=True):
            np.testing.assert_array_equal(got.numpy(), expected)
