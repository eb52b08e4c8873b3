"""The Keras conformance harness itself: the model rewrite, the routing, and how failures are judged."""

import warnings

import fetch
import keras
import numpy as np
import pytest
import routing
import run
from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

import tftrain

_MIXINS = """
from keras.src import layers
from keras.src.backend.tensorflow.trainer import TensorFlowTrainer as Trainer


class DenseModel(Trainer, layers.Dense):
    def __init__(self, units):
        layers.Dense.__init__(self, units=units, use_bias=False)
        Trainer.__init__(self)


class LayerModel(Trainer, layers.Layer):
    def __init__(self):
        layers.Layer.__init__(self)
        Trainer.__init__(self)
        self.dense = layers.Dense(2)

    def call(self, x):
        return self.dense(x)
"""


def test_mixin_test_models_become_keras_models_keeping_their_layer_methods():
    source, changed = fetch.make_keras_model(_MIXINS)
    assert changed == ["DenseModel", "LayerModel"]
    namespace: dict = {}
    exec(compile(source, "<mixins>", "exec"), namespace)
    dense, plain = namespace["DenseModel"](units=3), namespace["LayerModel"]()
    assert isinstance(dense, keras.Model) and isinstance(plain, keras.Model)
    assert type(dense).call is keras.layers.Dense.call  # the layer's, not keras.Model's
    assert dense(np.ones((2, 4), "float32")).shape == (2, 3)
    assert plain(np.ones((2, 4), "float32")).shape == (2, 2)


@pytest.fixture
def routed():
    routing.install()
    try:
        yield
    finally:
        routing.uninstall()
    assert TensorFlowTrainer.fit is routing._KERAS_METHODS["fit"]


def _model(**compile_kwargs):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", **compile_kwargs)
    return model


def test_fit_evaluate_predict_run_through_one_trainer_per_compile(routed):
    x, y = np.ones((8, 3), "float32"), np.ones((8, 1), "float32")
    model = _model(steps_per_execution=2, run_eagerly=True)
    history = model.fit(x, y, batch_size=4, epochs=2, verbose=0)
    trainer = routing.trainer_for(model)
    assert isinstance(trainer, tftrain.Trainer) and trainer.timing is not None  # the Trainer trained
    assert trainer.options.steps_per_loop == 2 and trainer.options.use_tf_function is False
    assert len(history.history["loss"]) == 2
    model.evaluate(x, y, verbose=0)
    model.predict(x, verbose=0)
    assert routing.trainer_for(model) is trainer
    model.compile(optimizer="sgd", loss="mse")
    assert routing.trainer_for(model) is not trainer


@pytest.mark.parametrize(
    "compile_kwargs, jit_compile",
    [
        (dict(), False),  # compile's "auto": off on this CPU machine
        (dict(jit_compile="auto"), False),
        (dict(jit_compile=True), True),
        (dict(jit_compile=True, run_eagerly=True), False),  # compile turns it off, with a warning
    ],
)
def test_the_trainer_gets_the_jit_compile_the_model_resolved(compile_kwargs, jit_compile):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _model(**compile_kwargs)
    settings = routing.engine_settings(model)
    assert settings["jit_compile"] is jit_compile is bool(model.jit_compile)
    assert tftrain.Trainer(model, **settings).options.jit_compile is jit_compile


def test_a_failure_counts_only_where_keras_itself_passes():
    through_trainer = {
        "a": {"outcome": "passed", "routed": 1},
        "b": {"outcome": "failed", "routed": 1},
        "c": {"outcome": "failed", "routed": 0},
    }
    under_keras = {"b": {"outcome": "passed"}, "c": {"outcome": "failed"}}
    unexplained, report = run.summarize(through_trainer, under_keras, full_baseline=False)
    assert unexplained == ["b"]
    assert "fail under Keras itself too: 1" in report


def test_known_differences_are_at_most_three_each_with_a_reason():
    assert len(run.KNOWN_DIFFERENCES) <= 3
    assert all(reason.strip() for reason in run.KNOWN_DIFFERENCES.values())
    assert set(run.KNOWN_DIFFERENCE_ERRORS) <= set(run.KNOWN_DIFFERENCES)


def test_a_listed_difference_counts_only_when_it_fails_as_listed():
    node = next(iter(run.KNOWN_DIFFERENCE_ERRORS))
    expected_error = run.KNOWN_DIFFERENCE_ERRORS[node]
    under_keras = {node: {"outcome": "passed"}}
    for error, is_listed in ((f"nan_guard.py:67: {expected_error}", True), ("AssertionError: 1 != 2", False)):
        through_trainer = {node: {"outcome": "failed", "routed": 1, "error": error}}
        unexplained, report = run.summarize(through_trainer, under_keras, full_baseline=False)
        assert unexplained == ([] if is_listed else [node])
        assert f"listed differences: {int(is_listed)}" in report
