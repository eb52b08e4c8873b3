"""Run the same code under `model.fit`/`evaluate`/`predict` and under the Trainer, and compare.

Keras is the reference: every comparison runs Keras itself on a twin model
(same seed, same data) rather than asserting an expected value.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from helpers import ENGINES

import tftrain

_HOOKS = (
    "on_train_begin",
    "on_train_end",
    "on_epoch_begin",
    "on_epoch_end",
    "on_train_batch_begin",
    "on_train_batch_end",
    "on_test_begin",
    "on_test_end",
    "on_test_batch_begin",
    "on_test_batch_end",
    "on_predict_begin",
    "on_predict_end",
    "on_predict_batch_begin",
    "on_predict_batch_end",
)


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_describe(v)}" for k, v in sorted(value.items())) + "}"
    return type(value).__name__


class Recorder(keras.callbacks.Callback):
    """Records every hook call: (hook, index, log keys and value types), and the log values.

    Attributes:
        events: `(hook, index, description of the logs)` per call.
        values: `(hook, index, logs)` per call, numbers as floats.
    """

    def __init__(self):
        super().__init__()
        self.events: list[tuple[str, Any, str]] = []
        self.values: list[tuple[str, Any, dict[str, Any]]] = []
        self.params_seen: dict[str, Any] | None = None

    def _record(self, hook: str, index: Any, logs: Any) -> None:
        description = "None" if logs is None else _describe(logs)
        self.events.append((hook, index, description))
        numbers = {}
        for key, value in (logs or {}).items():
            if isinstance(value, int | float | np.floating):
                numbers[key] = float(value)
        self.values.append((hook, index, numbers))

    def set_params(self, params):
        super().set_params(params)
        self.params_seen = dict(params)


def _make_hook(hook: str, takes_index: bool):
    if takes_index:

        def method(self, index, logs=None):
            self._record(hook, index, logs)

    else:

        def method(self, logs=None):
            self._record(hook, None, logs)

    method.__name__ = hook
    return method


for _hook in _HOOKS:
    setattr(Recorder, _hook, _make_hook(_hook, "batch" in _hook or "epoch" in _hook))


ENGINE_COMPILE = {
    "eager": dict(run_eagerly=True),
    "graph": dict(),
    "xla": dict(jit_compile=True),
    "loop3": dict(steps_per_execution=3),
    "xla_loop3": dict(jit_compile=True, steps_per_execution=3),
    "loop4": dict(steps_per_execution=4),
    "xla_loop4": dict(jit_compile=True, steps_per_execution=4),
}
"""`model.compile` arguments that make Keras run each engine of `helpers.ENGINES` (and k=4)."""

ENGINE_TRAINER = {
    **ENGINES,
    "loop4": dict(steps_per_loop=4),
    "xla_loop4": dict(jit_compile=True, steps_per_loop=4),
}
"""The Trainer's arguments for the same engines (k=4: calls that a 3-step cycle, e.g. gradient accumulation, does not divide)."""


def compile_for(model: keras.Model, engine: str, compile_kwargs: dict[str, Any]) -> None:
    """Compiles the Keras reference model for `engine` (jit off unless XLA)."""
    settings = dict(jit_compile=False)
    settings.update(ENGINE_COMPILE[engine])
    model.compile(**compile_kwargs, **settings)


def weights_close(a: keras.Model, b: keras.Model, atol: float = 1e-5) -> None:
    for left, right in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_allclose(left, right, atol=atol, rtol=1e-5)


def history_close(a: dict[str, list[float]], b: dict[str, list[float]], rtol: float = 1e-5) -> None:
    assert sorted(a) == sorted(b), (sorted(a), sorted(b))
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=rtol, atol=1e-6, err_msg=key)


# Keras before 3.11 passed a k-step call's first index to `on_*_batch_end`; the
# Trainer (and Keras since 3.11) pass its last. Older Keras is compared without them.
_KERAS_END_INDEX_IS_LAST = tuple(int(part) for part in keras.__version__.split(".")[:2]) >= (3, 11)


def _comparable(events: list[tuple[str, Any, str]]) -> list[tuple[str, Any, str]]:
    if _KERAS_END_INDEX_IS_LAST:
        return events
    return [(hook, None if hook.endswith("batch_end") else index, logs) for hook, index, logs in events]


def same_hooks(keras_recorder: Recorder, trainer_recorder: Recorder) -> None:
    """The hook sequences agree in names and indices (log values aside: e.g. predict's outputs)."""
    assert [event[:2] for event in _comparable(trainer_recorder.events)] == [
        event[:2] for event in _comparable(keras_recorder.events)
    ]


def same_events(keras_recorder: Recorder, trainer_recorder: Recorder, rtol: float = 1e-5) -> None:
    """The full hook sequences agree: names, indices, log keys, value types and values, and params."""
    assert _comparable(trainer_recorder.events) == _comparable(keras_recorder.events)
    assert trainer_recorder.params_seen == keras_recorder.params_seen
    for (hook, index, expected), (_, _, got) in zip(
        keras_recorder.values, trainer_recorder.values, strict=True
    ):
        assert sorted(got) == sorted(expected), (hook, index)
        for key in expected:
            np.testing.assert_allclose(
                got[key], expected[key], rtol=rtol, atol=1e-6, err_msg=f"{hook} {index} {key}"
            )


def fit_both(
    make_model,
    compile_kwargs: dict[str, Any],
    engine: str = "graph",
    *,
    data_args: tuple = (),
    fit_kwargs: dict[str, Any] | None = None,
    callbacks=None,
    trainer_kwargs: dict[str, Any] | None = None,
    seed: int = 0,
):
    """Fits twin models, one with `model.fit` and one with `Trainer.fit`.

    Args:
        make_model: Returns a fresh, seeded model (the same weights each call).
        compile_kwargs: `compile` arguments (built fresh for each model by the caller's lambda).
        engine: A key of `ENGINE_TRAINER`.
        data_args: Positional arguments of `fit` (e.g. `(x, y)`); a callable
            returns them fresh (for generators).
        fit_kwargs: Keyword arguments of `fit`; a callable `validation_data`
            is called for each side, after `data_args`.
        callbacks: A function returning the callbacks for one run (called twice).
        trainer_kwargs: More Trainer arguments.
        seed: Set before each fit, so shuffling and dropout draw the same.

    Returns:
        `(keras_model, keras_history, keras_recorder, trainer_model, trainer_history, trainer_recorder)`.
    """
    fit_kwargs = dict(fit_kwargs or {})
    fit_kwargs.setdefault("verbose", 0)
    results = []
    for side in ("keras", "trainer"):
        model = make_model()
        recorder = Recorder()
        extra = list(callbacks()) if callbacks else []
        args = data_args() if callable(data_args) else data_args
        side_kwargs = dict(fit_kwargs)
        if callable(side_kwargs.get("validation_data")):  # fresh for each side, made after `data_args`
            side_kwargs["validation_data"] = side_kwargs["validation_data"]()
        keras.utils.set_random_seed(seed)
        if side == "keras":
            compile_for(model, engine, compile_kwargs())
            history = model.fit(*args, callbacks=[recorder, *extra], **side_kwargs)
        else:
            model.compile(**compile_kwargs(), jit_compile=False)
            trainer = tftrain.Trainer(model, **ENGINE_TRAINER[engine], **(trainer_kwargs or {}))
            history = trainer.fit(*args, callbacks=[recorder, *extra], **side_kwargs)
        results += [model, history, recorder]
    return tuple(results)
