"""The NaN guard: stops training at the first step whose loss is NaN or infinite."""

from __future__ import annotations

from typing import Any

import numpy as np

from tftrain.engine import graph_loops
from tftrain.errors import NonFiniteLossError
from tftrain.services.protocol import RunState, Service


class NonFiniteGuard(Service):
    """Stops training at the first step whose loss (`loss` or `*_loss`) is NaN or infinite.

    It acts when a call's results are read (a call read one call late is
    checked then, before any checkpoint holds its steps).
    """

    name = "nan_guard"

    def results_read(self, run: RunState, result: Any) -> None:
        if not result.nonfinite:
            return
        progress = run.progress
        losses = {
            key: np.asarray(value).tolist()
            for key, value in result.logs.items()
            if graph_loops.is_loss_key(key)
        }
        last_good = run.latest_checkpoint()
        raise NonFiniteLossError(
            f"Training stopped at step {progress.global_step} (epoch {progress.epoch + 1}, "
            f"step {progress.step_in_epoch} of the epoch): the loss is not finite: {losses}. "
            "No checkpoint was written for this step"
            + (f"; the last good checkpoint is {last_good}." if last_good else ".")
            + " Lower the learning rate, clip gradients (e.g. `clipnorm=` on the optimizer) or check "
            "the inputs of this step for NaN/Inf. Pass `terminate_on_nan=False` to train on."
        )
