"""pytest plugin: every Keras model's `fit`, `evaluate` and `predict` run through `tftrain.Trainer`.

Loaded with `-p routing` when Keras's fetched tests run. With
`TFTRAIN_CONFORMANCE=trainer` (the default), `Model.fit(...)`,
`Model.evaluate(...)` and `Model.predict(...)` call the same method of one
`tftrain.Trainer` per compiled model, with every argument as given; the
model's `run_eagerly`, `jit_compile` and `steps_per_execution` become the
Trainer's `use_tf_function`, `jit_compile` and `steps_per_loop` (a new Trainer
is made when they change, or when the model is compiled again). With
`TFTRAIN_CONFORMANCE=keras`, Keras's own methods run: the baseline.

Either way, with `TFTRAIN_CONFORMANCE_RESULTS=path.json`, each test's outcome
and how many calls were routed are written there.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import weakref

import keras
from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
from keras.src.trainers.trainer import Trainer as KerasTrainer

import tftrain

MODE = os.environ.get("TFTRAIN_CONFORMANCE", "trainer")
if MODE not in ("trainer", "keras"):
    raise ValueError(f"TFTRAIN_CONFORMANCE={MODE!r}: expected 'trainer' or 'keras'.")
ROUTED_METHODS = ("fit", "evaluate", "predict")

_trainers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_inside = threading.local()
_routed_calls = [0]


def engine_settings(model: keras.Model) -> dict:
    """The Trainer's engine arguments for the engine `model.fit` would run.

    `model.jit_compile` is what `compile` resolved (its `"auto"` included;
    None where Keras found a layer without XLA), read as Keras's train
    function reads it; an eager model never compiles with XLA.
    """
    eager = bool(getattr(model, "run_eagerly", False))
    return {
        "use_tf_function": not eager,
        "jit_compile": bool(getattr(model, "jit_compile", False)) and not eager,
        "steps_per_loop": int(getattr(model, "steps_per_execution", 1) or 1),
    }


def trainer_for(model: keras.Model) -> tftrain.Trainer:
    """The model's Trainer: made at its first routed call after each `compile`."""
    settings = engine_settings(model)
    entry = _trainers.get(model)
    if entry is None or entry[0] != settings:
        entry = (settings, tftrain.Trainer(model, **settings))
        _trainers[model] = entry
    return entry[1]


def _routed(name):
    keras_method = _KERAS_METHODS[name]

    @functools.wraps(keras_method)
    def method(self, *args, **kwargs):
        if getattr(_inside, "depth", 0) or not isinstance(self, keras.Model):
            return keras_method(self, *args, **kwargs)
        _routed_calls[0] += 1
        _inside.depth = 1
        try:
            return getattr(trainer_for(self), name)(*args, **kwargs)
        finally:
            _inside.depth = 0

    return method


def _forgetting_compile(keras_compile):
    @functools.wraps(keras_compile)
    def compile(self, *args, **kwargs):
        _trainers.pop(self, None)
        return keras_compile(self, *args, **kwargs)

    return compile


_KERAS_METHODS = {name: getattr(TensorFlowTrainer, name) for name in ROUTED_METHODS}
_KERAS_COMPILE = KerasTrainer.compile


def install() -> None:
    """Routes `fit`, `evaluate` and `predict` of every Keras model through a Trainer."""
    for name in ROUTED_METHODS:
        setattr(TensorFlowTrainer, name, _routed(name))
    KerasTrainer.compile = _forgetting_compile(_KERAS_COMPILE)


def uninstall() -> None:
    """Gives Keras its own `fit`, `evaluate`, `predict` and `compile` back."""
    for name, method in _KERAS_METHODS.items():
        setattr(TensorFlowTrainer, name, method)
    KerasTrainer.compile = _KERAS_COMPILE
    _trainers.clear()


def pytest_configure(config):
    if MODE == "trainer":
        install()


class _Results:
    def __init__(self):
        self.outcomes: dict[str, dict] = {}

    def record(self, report) -> None:
        entry = self.outcomes.setdefault(report.nodeid, {"outcome": "passed", "routed": 0})
        if report.failed:
            entry["outcome"] = "failed"
            entry.setdefault("error", str(report.longrepr).splitlines()[-1][:300] if report.longrepr else "")
        elif report.skipped and entry["outcome"] == "passed":
            entry["outcome"] = "skipped"


_results = _Results()


def pytest_runtest_setup(item):
    _routed_calls[0] = 0


def pytest_collectreport(report):
    if report.failed:
        _results.record(report)


def pytest_runtest_logreport(report):
    _results.record(report)
    if report.when == "teardown":
        _results.outcomes[report.nodeid]["routed"] = _routed_calls[0]


def pytest_sessionfinish(session):
    path = os.environ.get("TFTRAIN_CONFORMANCE_RESULTS")
    if path:
        with open(path, "w") as f:
            json.dump(_results.outcomes, f, indent=0, sort_keys=True)
