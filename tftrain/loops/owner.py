"""What the loops need of the object that owns the steps (a `tftrain.Trainer`), as a protocol.

The loops never import the Trainer: they are typed against `StepOwner`,
which the Trainer implements.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import keras
import tensorflow as tf

from tftrain.options import RunOptions

if TYPE_CHECKING:
    from tftrain.loops.engines import Engines
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
    """

    model: keras.Model
    engines: Engines
    run_options: RunOptions
    measure_timing: bool
    global_step: tf.Variable
    services: tuple[Service, ...]

    @property
    def metrics(self) -> list[keras.metrics.Metric]:
        """Every metric a pass resets and reports."""

    def reset_metrics(self) -> None:
        """Resets every metric (each epoch and evaluation starts so)."""

    def checkpoint_state(self) -> dict[str, Any]:
        """The training state saved with every checkpoint besides the model and its optimizer."""

    def uses_model_step(self, kind: str) -> bool:
        """Whether the step of `kind` ("train", "eval", "predict") is the model's own, not the owner's."""
