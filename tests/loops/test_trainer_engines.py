"""A Trainer's engines are kept across calls and built again after `model.compile`, as Keras's functions are.

Keras caches the model's train, test and predict functions and its `compile`
resets them: the fine-tuning recipe (train a head on a frozen base, unfreeze,
compile again, train on) depends on it. Each test runs the same script under
`model.fit` and under one Trainer and compares what user code sees.
"""

import types

import keras
import numpy as np
import pytest
from helpers import ENGINES

import tftrain
from tftrain.engine import model_setup
from tftrain.loops import preparation, trainer_engines


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
    built = {kind: trainer.engines.runner(kind) for kind in ("train", "eval", "predict")}
    trainer.fit(x, y, batch_size=16, epochs=1, validation_split=0.25, verbose=0)
    trainer.evaluate(x, y, batch_size=16, verbose=0)
    trainer.predict(x, batch_size=16, verbose=0)
    assert all(trainer.engines.runner(kind) is loop for kind, loop in built.items())
    assert built["train"].trace_counter.count == 1


def test_a_recompile_is_checked_again_even_where_its_new_objects_take_the_freed_ids(monkeypatch):
    model, _ = frozen_base_model()
    trainer = tftrain.Trainer(model)
    checked = []
    check = model_setup.check_compiled_for
    monkeypatch.setattr(model_setup, "check_compiled_for", lambda *args: checked.append(args[1]) or check(*args))
    for module in (preparation, trainer_engines):  # every object at one id, as a freed object's id is reused
        monkeypatch.setattr(module, "id", lambda value: 0, raising=False)
    preparation.check_step(trainer, "train")
    preparation.check_step(trainer, "train")
    assert checked == ["train_step"]
    model.compile(keras.optimizers.SGD(0.05), "mse")
    preparation.check_step(trainer, "train")
    assert checked == ["train_step", "train_step"]


def test_what_was_checked_is_kept_for_the_latest_calls_only():
    checked = trainer_engines.CheckedOnce(limit=2)
    for epochs in (1, 2, 3):
        checked.add_arguments(preparation.FitArguments(epochs=epochs), epochs)
    assert checked.arguments(preparation.FitArguments(epochs=1)) is None
    assert checked.arguments(preparation.FitArguments(epochs=3, class_weight={0: 1.0})) is None
    assert checked.arguments(preparation.FitArguments(epochs=3)) == 3


def test_a_check_on_what_cannot_be_a_key_runs_every_time():
    checked, runs = trainer_engines.CheckedOnce(), []
    unhashable = [types.SimpleNamespace(spec=None)]  # no hash, as the element spec of an attrs batch
    model = keras.Sequential([keras.layers.Dense(1)])
    for _ in range(2):
        checked.once(unhashable, model, lambda: runs.append(1))
        checked.add_arguments(unhashable, "resolved")
    assert len(runs) == 2 and checked.arguments(unhashable) is None


class StepReplacer(keras.callbacks.Callback):
    """Wraps the model's step of one kind in `set_model` and resets its function, as `tftrain.callbacks.Timing` does."""

    def __init__(self, kind):
        super().__init__()
        self.kind, self.calls = kind, 0

    def set_model(self, model):
        super().set_model(model)
        step_name, function = {
            "train": ("train_step", "train_function"),
            "test": ("test_step", "test_function"),
            "predict": ("predict_step", "predict_function"),
        }[self.kind]
        original = getattr(model, step_name)

        def step(data):
            self.calls += 1  # once per trace under tf.function, once per step eagerly
            return original(data)

        setattr(model, step_name, step)
        setattr(model, function, None)


def second_call_with_replacer(runner_of, kind, engine):
    """A first fit/evaluate/predict, then a second one given a `StepReplacer`: how often its step ran."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    model.compile(
        keras.optimizers.SGD(0.1),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        run_eagerly=engine == "eager",
    )
    runner = runner_of(model)
    x, y = data()
    call = {
        "train": lambda callbacks: runner.fit(x, y, batch_size=16, verbose=0, callbacks=callbacks),
        "test": lambda callbacks: runner.evaluate(x, y, batch_size=16, verbose=0, callbacks=callbacks),
        "predict": lambda callbacks: runner.predict(x, batch_size=16, verbose=0, callbacks=callbacks),
    }[kind]
    call(None)
    replacer = StepReplacer(kind)
    call([replacer])
    return replacer.calls


@pytest.mark.parametrize("kind", ["train", "test", "predict"])
@pytest.mark.parametrize("engine", ["eager", "graph", "loop3"])
def test_a_callback_that_resets_a_function_gets_the_step_rebuilt_as_under_keras(kind, engine):
    under_keras = second_call_with_replacer(lambda model: model, kind, engine)
    under_trainer = second_call_with_replacer(lambda model: tftrain.Trainer(model, **ENGINES[engine]), kind, engine)
    assert under_keras >= 1  # Keras rebuilt its function around the new step
    assert under_trainer >= 1  # and so does the Trainer: the new step runs
    if engine == "eager":
        assert under_trainer == under_keras == 4  # every step of the 4 batches


def test_model_fit_after_the_trainer_builds_its_own_functions():
    model, _ = frozen_base_model()
    trainer = tftrain.Trainer(model)
    x, y = data()
    trainer.fit(x, y, batch_size=16, verbose=0)
    trainer.evaluate(x, y, batch_size=16, verbose=0)
    trainer.predict(x, batch_size=16, verbose=0)
    built = trainer.engines.runners["train"]
    history = model.fit(x, y, batch_size=16, verbose=0)  # Keras's own functions, built on first use
    assert len(history.history["loss"]) == 1
    assert np.isfinite(model.evaluate(x, y, batch_size=16, verbose=0))
    assert model.predict(x, batch_size=16, verbose=0).shape == (64, 3)
    trainer.fit(x, y, batch_size=16, verbose=0)  # Keras's function in the attribute: built again
    assert trainer.engines.runners["train"] is not built
