"""What the loops need of the object that owns the steps (a `tftrain.Trainer`), as a protocol.

The loops never import the Trainer: they are typed against `StepOwner`,
which the Trainer implements.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Protocol

import keras
import tensorflow as tf

from tftrain.options import NonFinitePolicy, RunOptions

if TYPE_CHECKING:
    from tftrain.loops.trainer_engines import Engines
    from tftrain.services.protocol import Service


class StepOwner(Protocol):
    """The steps, their state and options that a fit, evaluation or prediction loop runs.

    Attributes:
        model: The model trained.
        engines: One engine per kind of step, built once.
        run_options: What a fit writes and guards around its steps.
        measure_timing: Whether host calls are timed.
        global_step: The run's global step variable.
        services: The user's own services, added to every fit's.
        nonfinite_policy: What a loss blow-up does (stop, or roll back); a
            `fit` call takes it with its callbacks (`FitCall.nonfinite_policy`).
        ema_decay: The decay of the optimizer's moving average of the
            weights that evaluation uses (`averaged_weights`), or None.
    """

    model: keras.Model
    engines: Engines
    run_options: RunOptions
    measure_timing: bool
    global_step: tf.Variable
    services: tuple[Service, ...]
    nonfinite_policy: NonFinitePolicy
    ema_decay: float | None

    def averaged_weights(self) -> contextlib.AbstractContextManager[None]:
        """A block in which the model holds the weights evaluation uses (the EMA averages with `ema_decay`)."""

    @property
    def metrics(self) -> list[keras.metrics.Metric]:
        """Every metric a pass resets and reports."""

    def reset_metrics(self) -> None:
        """Resets every metric (each epoch and evaluation starts so)."""

    def checkpoint_state(self) -> dict[str, Any]:
        """The training state saved with every checkpoint besides the model and its optimizer."""

    def uses_model_step(self, kind: str) -> bool:
        """Whether the step of `kind` ("train", "eval", "predict") is the model's own, not the owner's."""


class TrackedAttributes:
    """The Keras objects a step owner's attributes hold: a Trainer subclass's own training state.

    A GAN's second optimizer, its own metrics: assigned as attributes, they
    are tracked as Keras tracks a layer's attributes, so `checkpoint_state`
    and `metrics` need no scan of the instance.
    """

    TYPES = (keras.optimizers.Optimizer, keras.Model, tf.Variable, keras.Variable, keras.metrics.Metric)
    UNTRACKED = frozenset({"model", "_global_step"})  # saved by the checkpoint itself

    def __init__(self):
        self._by_name: dict[str, Any] = {}

    def assigned(self, name: str, value: Any) -> None:
        """Notes an assignment (tracked if it is a Keras object of the owner's own)."""
        self._by_name.pop(name, None)
        if name not in self.UNTRACKED and isinstance(value, self.TYPES):
            self._by_name[name] = value

    def deleted(self, name: str) -> None:
        """Notes an attribute's deletion."""
        self._by_name.pop(name, None)

    def metrics(self) -> list[keras.metrics.Metric]:
        """The metrics among the attributes."""
        return [value for value in self._by_name.values() if isinstance(value, keras.metrics.Metric)]

    def checkpoint_state(self, model: keras.Model) -> dict[str, Any]:
        """Each tracked object but `model` as `owner_<name>`, and the metrics' variables as `owner_metrics`."""
        state: dict[str, Any] = {}
        metric_variables = []
        for name, value in sorted(self._by_name.items()):
            if isinstance(value, keras.metrics.Metric):
                metric_variables += list(value.variables)
            elif value is not model:
                state[f"owner_{name}"] = value
        if metric_variables:
            state["owner_metrics"] = metric_variables
        return state
