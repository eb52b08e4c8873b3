"""A Trainer's engines are kept across calls and built again after `model.compile`, as Keras's functions are.

Keras caches the model's train, test and predict functions and its `compile`
resets them: the fine-tuning recipe (train a head on a frozen base, unfreeze,
compile again, train on) depends on it. Each test runs the same script under
`model.fit` and under one Trainer and compares what user code sees.
"""

import keras
import numpy as np
import pytest
from helpers import ENGINES

import tftrain


def data():
    rng = np.random.RandomState(0)
    return rng.rand(64, 6).astype("float32"), rng.randint(0, 3, 64)


def frozen_base_model():
    keras.utils.set_random_seed(0)
    base = keras.layers.Dense(4, activation="relu", name="base")
    model = keras.Sequential([keras.Input((6,)), base, keras.layers.Dense(3, name="head")])
    base.trainable = False
    model.compile(keras.optimizers.SGD(0.1), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, base


def fine_tune(runner_of, engine=None):
    """Head on a frozen base, then the base unfrozen and compiled again; returns the model and each call's results."""
    model, base = frozen_base_model()
    runner = runner_of(model)
    x, y = data()
    results = {"head": runner.fit(x, y, batch_size=16, epochs=1, verbose=0).history}
    frozen_kernel = base.kernel.numpy().copy()
    base.trainable = True
    model.compile(
        keras.optimizers.SGD(0.05),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    results["fine-tune"] = runner.fit(x, y, batch_size=16, epochs=2, verbose=0).history
    results["evaluate"] = runner.evaluate(x, y, batch_size=16, verbose=0, return_dict=True)
    results["base moved"] = bool(np.abs(base.kernel.numpy() - frozen_kernel).max() > 0)
    return model, results


@pytest.mark.parametrize("engine", ["graph", "loop3", "xla"])
def test_compiling_again_rebuilds_the_engines_as_fit_rebuilds_its_functions(engine):
    keras_model, keras_results = fine_tune(lambda model: model)
    trainer_model, trainer_results = fine_tune(lambda model: tftrain.Trainer(model, **ENGINES[engine]))
    assert keras_results["base moved"] and trainer_results["base moved"]
    assert trainer_results.keys() == keras_results.keys()
    assert trainer_results["evaluate"].keys() == keras_results["evaluate"].keys() == {"loss", "accuracy"}
    for call in ("head", "fine-tune"):
        np.testing.assert_allclose(trainer_results[call]["loss"], keras_results[call]["loss"], rtol=1e-5)
    for trainer_weight, keras_weight in zip(
        trainer_model.get_weights(), keras_model.get_weights(), strict=True
    ):
        np.testing.assert_allclose(trainer_weight, keras_weight, rtol=1e-5, atol=1e-6)


def test_without_a_new_compile_every_engine_is_kept():
    model, _ = frozen_base_model()
    trainer = tftrain.Trainer(model)
    x, y = data()
    trainer.fit(x, y, batch_size=16, epochs=1, validation_split=0.25, verbose=0)
    trainer.predict(x, batch_size=16, verbose=0)
    built = {kind: trainer.engines.loop(kind) for kind in ("train", "eval", "predict")}
    trainer.fit(x, y, batch_size=16, epochs=1, validation_split=0.25, verbose=0)
    trainer.evaluate(x, y, batch_size=16, verbose=0)
    trainer.predict(x, batch_size=16, verbose=0)
    assert all(trainer.engines.loop(kind) is loop for kind, loop in built.items())
    assert built["train"].trace_counter.count == 1
