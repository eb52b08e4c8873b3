"""The NaN guard: stops training at the first step whose loss is NaN or infinite.

Where a `fit` call's callbacks hold Keras's `TerminateOnNaN`, that callback
decides instead (it stops training or raises, as under `model.fit`) and the
guard steps aside: it raises nothing, and the run writes no checkpoint from
the first non-finite step on (`RunState.nonfinite_step`).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from tftrain.engine import graph_loops
from tftrain.errors import NonFiniteLossError
from tftrain.options import NonFinitePolicy
from tftrain.services.protocol import RunState, Service


class NonFiniteGuard(Service):
    """Stops training at the first step whose loss (`loss` or `*_loss`) is NaN or infinite.

    It acts when a call's results are read (a call read one call late is
    checked then, before any checkpoint holds its steps).

    Args:
        nonfinite_policy: The `fit` call's policy. Where its callbacks decide
            (Keras's `TerminateOnNaN`), raise nothing (the run's checkpoints
            stop at the first non-finite step) and warn once if `checkpoints`
            are skipped from there. Its spike threshold is named in the error.
        checkpoints: The run writes checkpoints (it has a `model_dir`).
    """

    name = "nan_guard"

    def __init__(self, nonfinite_policy: NonFinitePolicy, *, checkpoints: bool = False):
        self.nonfinite_policy = nonfinite_policy
        self.checkpoints = checkpoints
        self._warned = False

    def results_read(self, run: RunState, result: Any) -> None:
        if not result.nonfinite:
            return
        if self.nonfinite_policy.callbacks_decide:
            if self.checkpoints and not self._warned:
                self._warned = True
                last = run.progress.global_step
                where = f"step {last}" if result.steps <= 1 else f"steps {last - result.steps + 1} to {last}"
                last_good = run.latest_checkpoint()
                warnings.warn(
                    f"A training loss is NaN or infinite ({where}): no checkpoint is written for the rest "
                    "of this fit call"
                    + (f"; the last good one is {last_good}" if last_good else "")
                    + ". The callbacks' `TerminateOnNaN` decides whether training stops, in place of the "
                    "Trainer's NaN guard.",
                    stacklevel=2,
                )
            return
        progress = run.progress
        losses = {
            key: np.asarray(value).tolist()
            for key, value in result.logs.items()
            if graph_loops.is_loss_key(key)
        }
        last_good = run.latest_checkpoint()
        finite = all(np.all(np.isfinite(np.asarray(value, dtype=np.float64))) for value in losses.values())
        limit = self.nonfinite_policy.loss_limit
        what = "the loss is not finite"
        if finite and limit is not None:
            what = f"a loss is above loss_spike_threshold={limit:g}"
        raise NonFiniteLossError(
            f"Training stopped at step {progress.global_step} (epoch {progress.epoch + 1}, "
            f"step {progress.step_in_epoch} of the epoch): {what}: {losses}. "
            "No checkpoint was written for this step"
            + (f"; the last good checkpoint is {last_good}." if last_good else ".")
            + " Lower the learning rate, clip gradients (e.g. `clipnorm=` on the optimizer) or check "
            "the inputs of this step for NaN/Inf. Pass `on_nonfinite='rollback'` to go back to the last "
            "good checkpoint and skip these batches, or `terminate_on_nan=False` to train on."
        )
