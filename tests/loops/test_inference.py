"""`predict` returns writable NumPy arrays, as `model.predict` does: one batch or many, under every engine."""

import keras
import numpy as np
import pytest

import tftrain


class TwoOutputs(keras.Model):
    """Predictions as a dict: a matrix per example and a scalar per example."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)

    def call(self, x):
        y = self.dense(x)
        return {"scores": y, "total": keras.ops.sum(y, axis=-1)}


@pytest.mark.parametrize("examples", [4, 10], ids=["one_batch", "many_batches"])
def test_predictions_are_writable_arrays_as_under_model_predict(engine, examples):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    x = np.random.RandomState(0).rand(examples, 3).astype("float32")
    expected = model.predict(x, batch_size=4, verbose=0)
    images = tftrain.Trainer(model, **engine).predict(x, batch_size=4, verbose=0)
    assert expected.flags.writeable and images.flags.writeable
    images *= 255.0  # in place, as a GAN example does after `model.predict`
    np.testing.assert_allclose(images, expected * 255.0, rtol=1e-5)


def test_every_output_of_a_structure_is_writable(engine):
    keras.utils.set_random_seed(0)
    model = TwoOutputs()
    x = np.random.RandomState(1).rand(10, 3).astype("float32")
    expected = model.predict(x, batch_size=4, verbose=0)
    outputs = tftrain.Trainer(model, **engine).predict(x, batch_size=4, verbose=0)
    for name in ("scores", "total"):
        assert outputs[name].flags.writeable and outputs[name].shape == expected[name].shape
        outputs[name] += 1.0
        np.testing.assert_allclose(outputs[name], expected[name] + 1.0, rtol=1e-5)
