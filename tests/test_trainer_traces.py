"""The Trainer traces no more than Keras: each call's functions once, nothing the call does not run.

A model's `call` runs in Python only when something traces it (Keras's
symbolic build, a `tf.function`'s trace), so counting its calls under
`model.fit`/`evaluate`/`predict` and under the Trainer compares the work
each does before its first step. Keras without a strategy builds the
variables inside the first trace and so traces its train function twice;
the Trainer builds them symbolically first and traces once.
"""

import keras
import numpy as np
import pytest

import tftrain


class CallLog(keras.layers.Layer):
    """Passes its input through, noting each Python call's `training` flag."""

    def __init__(self, calls, **kwargs):
        super().__init__(**kwargs)
        self.note = calls.append  # a list attribute would be copied into Keras's tracked list

    def call(self, x, training=None):
        self.note("train" if training else "infer")
        return x


def model_calls(side, rows, **trainer_kwargs):
    """The model's Python calls in one fit (with validation), then one evaluate and one predict."""
    calls = []
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), CallLog(calls), keras.layers.Dense(3)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    rng = np.random.RandomState(0)
    x, y = rng.rand(rows, 6).astype("float32"), rng.randint(0, 3, rows)
    runner = model if side == "keras" else tftrain.Trainer(model, **trainer_kwargs)
    per_call = {}
    calls.clear()
    runner.fit(x, y, batch_size=4, epochs=2, validation_split=0.2, verbose=0)
    per_call["fit"], calls[:] = list(calls), []
    runner.evaluate(x, y, batch_size=4, verbose=0)
    per_call["evaluate"], calls[:] = list(calls), []
    runner.predict(x, batch_size=4, verbose=0)
    per_call["predict"] = list(calls)
    return per_call


@pytest.mark.parametrize("rows", [100, 102], ids=["full-batches", "partial-batch"])
@pytest.mark.parametrize("steps_per_loop", [1, 3, "auto"])
def test_each_call_traces_no_more_than_under_keras(rows, steps_per_loop):
    keras_calls = model_calls("keras", rows)
    trainer_calls = model_calls("trainer", rows, steps_per_loop=steps_per_loop)
    for call in ("fit", "evaluate", "predict"):
        assert len(trainer_calls[call]) <= len(keras_calls[call]), (call, trainer_calls, keras_calls)
    # One trace of the training step for the whole fit ("auto"'s probes and choice included).
    assert trainer_calls["fit"].count("train") == 1, trainer_calls
    # evaluate reuses the function fit's validation traced, as Keras does.
    assert trainer_calls["evaluate"] == keras_calls["evaluate"] == []
