"""Recovery from loss blow-ups: roll back to the last good checkpoint, skip the bad batches, go on.

A blow-up is a training step whose loss (`loss` or `*_loss`) is NaN or
infinite, or above `RecoveryPolicy.loss_spike_threshold`. The engine stops
the host call right after that step (an in-graph test per step, as the NaN
guard's), so the same steps blow up however the steps are grouped into
calls. `LossRecovery` then restores the model, optimizer, metrics and the
Trainer's own state from the run's newest checkpoint, while the global step
and the data position go on: the batches read since that checkpoint,
the bad ones included, are not read again. TF Model Garden's
`RecoveryAction` restores the same way; it keeps no count in checkpoints.

Each rollback is deterministic (the same checkpoint, the same data after it),
and the count is saved with every checkpoint, so a run killed and rerun on
its `model_dir` ends bit-identical to one that was not killed.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable
from typing import Any

import keras
import numpy as np

from tftrain import summaries
from tftrain.engine import graph_loops
from tftrain.errors import NonFiniteLossError
from tftrain.options import check_int
from tftrain.services.checkpointing import CheckpointService
from tftrain.services.protocol import RunState, Service

__all__ = ["LossRecovery", "RecoveryPolicy"]

_ON_NONFINITE = ("stop", "rollback")


@dataclasses.dataclass(frozen=True)
class RecoveryPolicy:
    """What a loss blow-up does (the `Trainer` arguments of the same names).

    Attributes:
        on_nonfinite: `"stop"`: raise `NonFiniteLossError` at the first
            blow-up (the NaN guard, with `terminate_on_nan`). `"rollback"`:
            restore the last good checkpoint and go on past the batches that
            caused it (needs `model_dir`; a run with no checkpoint yet saves
            one before its first step, so there is always one to return to).
        loss_spike_threshold: A loss log above this is a blow-up too (None:
            NaN and infinity only). It is tested on the step's logs, as
            `fit` reports them: for a compiled Keras model the `loss` log is
            the epoch's running mean, a custom `train_step` reports what it
            returns.
        max_rollbacks: Rollbacks allowed in a run (the count is saved in
            checkpoints); the next blow-up raises `NonFiniteLossError`.
        rollback_lr_factor: After each rollback, multiply the optimizer's
            learning rate by this (1.0: leave it). Needs a float learning
            rate, not a schedule. The scaled rate is saved with the next
            checkpoint, so a resume continues with it.

    Raises:
        ValueError, TypeError: a bad value, or a combination that cannot work.
    """

    on_nonfinite: str = "stop"
    loss_spike_threshold: float | None = None
    max_rollbacks: int = 3
    rollback_lr_factor: float = 1.0

    def __post_init__(self):
        if self.on_nonfinite not in _ON_NONFINITE:
            raise ValueError(
                f"Invalid value for argument `on_nonfinite`. Received: on_nonfinite={self.on_nonfinite!r}. "
                "Expected 'stop' (raise NonFiniteLossError) or 'rollback' (restore the last good "
                "checkpoint and go on)."
            )
        threshold = self.loss_spike_threshold
        if threshold is not None and (
            isinstance(threshold, bool)
            or not isinstance(threshold, int | float)
            or not math.isfinite(threshold)
        ):
            raise ValueError(
                "Invalid value for argument `loss_spike_threshold`. Received: "
                f"loss_spike_threshold={threshold!r}. Expected a finite number (a loss above it is a "
                "blow-up), or None."
            )
        check_int("max_rollbacks", self.max_rollbacks, minimum=0)
        factor = self.rollback_lr_factor
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor <= 1:
            raise ValueError(
                "Invalid value for argument `rollback_lr_factor`. Received: "
                f"rollback_lr_factor={factor!r}. Expected a number in (0, 1]: the learning rate is "
                "multiplied by it after each rollback (1.0 leaves it)."
            )

    @property
    def rollback(self) -> bool:
        """Whether a blow-up rolls back (else it stops)."""
        return self.on_nonfinite == "rollback"

    def check(self, *, model_dir: str | None, terminate_on_nan: bool) -> None:
        """Checks the policy against the run options it works with.

        Raises:
            ValueError: `"rollback"` without `model_dir` or with
                `terminate_on_nan=False`, or a spike threshold with nothing
                that tests it.
        """
        if self.rollback and model_dir is None:
            raise ValueError(
                "Invalid combination of arguments. Received: on_nonfinite='rollback' with model_dir=None. "
                "Expected a `model_dir`: a rollback restores the run's last good checkpoint."
            )
        if not terminate_on_nan and (self.rollback or self.loss_spike_threshold is not None):
            raise ValueError(
                "Invalid combination of arguments. Received: terminate_on_nan=False with "
                f"on_nonfinite={self.on_nonfinite!r}, loss_spike_threshold={self.loss_spike_threshold!r}. "
                "Expected terminate_on_nan=True: with it off no step's loss is tested."
            )


class LossRecovery(Service):
    """Rolls back to the run's newest checkpoint at a loss blow-up; stops after `max_rollbacks`.

    It acts when a host call's results are read (`RunState.roll_back`), and
    asks that every call's results are read before the next call starts,
    so the call after a blow-up runs from the restored state.

    Args:
        policy: The recovery policy (`on_nonfinite="rollback"`).
        checkpoints: The run's checkpoint service: a run with no checkpoint
            saves one before its first step.
        optimizer: The optimizer whose learning rate `rollback_lr_factor` scales.
        reset_metrics: Resets the training metrics (a rollback to a
            checkpoint of an earlier epoch, or of an epoch's start).
        writer: TensorBoard writers (`rollbacks` is written at each one), or None.

    Raises:
        ValueError: `rollback_lr_factor` with an optimizer whose learning rate is a schedule.
    """

    name = "loss_recovery"
    reads_every_call = True

    def __init__(
        self,
        policy: RecoveryPolicy,
        checkpoints: CheckpointService,
        *,
        optimizer: Any,
        reset_metrics: Callable[[], None],
        writer: summaries.TrainingSummaries | None = None,
    ):
        if policy.rollback_lr_factor != 1 and not isinstance(
            getattr(optimizer, "learning_rate", None), keras.Variable
        ):
            raise ValueError(
                "Invalid combination of arguments. Received: rollback_lr_factor="
                f"{policy.rollback_lr_factor!r} with an optimizer whose learning rate is not a float variable "
                f"(a schedule or a callable: {type(getattr(optimizer, 'learning_rate', None)).__name__}). "
                "Expected a float learning rate to scale, or rollback_lr_factor=1.0."
            )
        self.policy = policy
        self.checkpoints = checkpoints
        self.optimizer = optimizer
        self.reset_metrics = reset_metrics
        self.writer = writer
        self.rollbacks: list[dict[str, Any]] = []  # one record per rollback, saved with checkpoints
        self._started = False

    def before_call(self, run: RunState) -> None:
        if self._started:
            return
        self._started = True
        if run.latest_checkpoint() is None:
            self.checkpoints.save(run)  # a good state to return to before the first step

    def results_read(self, run: RunState, result: Any) -> None:
        if not result.nonfinite:
            return
        step = run.progress.global_step
        losses = {key: _plain(value) for key, value in result.logs.items() if graph_loops.is_loss_key(key)}
        what = _blow_up(losses, self.policy.loss_spike_threshold)
        if len(self.rollbacks) >= self.policy.max_rollbacks:
            raise NonFiniteLossError(
                f"Training stopped at step {step}: {what}: {losses}, after {len(self.rollbacks)} "
                f"rollback(s), the most `max_rollbacks={self.policy.max_rollbacks}` allows "
                f"(at steps {[record['step'] for record in self.rollbacks]}). The last good checkpoint is "
                f"{run.latest_checkpoint()}. Lower the learning rate (or pass `rollback_lr_factor`), clip "
                "gradients, check the data, or allow more rollbacks."
            )
        # The rate in use, not the checkpoint's: factors compound over rollbacks to one checkpoint.
        learning_rate = summaries.learning_rate_of(self.optimizer)
        path, restored = run.roll_back()
        if restored.epoch != run.progress.epoch or restored.step_in_epoch == 0:
            self.reset_metrics()  # the checkpoint's metrics are another epoch's
        if self.policy.rollback_lr_factor != 1:
            learning_rate *= self.policy.rollback_lr_factor
            self.optimizer.learning_rate = learning_rate
        else:
            learning_rate = summaries.learning_rate_of(self.optimizer)
        record = {
            "step": step,
            "restored_step": restored.global_step,
            "skipped_steps": step - restored.global_step,
            "losses": losses,
            "learning_rate": learning_rate,
        }
        self.rollbacks.append(record)
        logging.getLogger("tftrain").warning(
            "tftrain: rollback %d of at most %d at step %d (%s: %s): restored %s (step %d); %d batch(es) "
            "read since skipped%s.",
            len(self.rollbacks),
            self.policy.max_rollbacks,
            step,
            what,
            losses,
            path,
            restored.global_step,
            record["skipped_steps"],
            "" if learning_rate is None else f"; learning rate {learning_rate:g}",
        )
        if self.writer is not None:
            self.writer.write("train", step, {"rollbacks": float(len(self.rollbacks))})
            self.writer.flush()

    def state_dict(self) -> dict[str, Any]:
        return {"rollbacks": self.rollbacks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rollbacks = list(state.get("rollbacks", []))


def _plain(value: Any) -> Any:
    """A loss as JSON can hold it (its state is saved in checkpoints): NaN and infinities as strings."""
    array = np.asarray(value, dtype=np.float64)
    if array.ndim:
        return [_plain(item) for item in array]
    return float(array) if np.isfinite(array) else str(float(array))


def _flat(values: Any) -> list[Any]:
    flat = []
    for value in values:
        flat.extend(_flat(value) if isinstance(value, list) else [value])
    return flat


def _blow_up(losses: dict[str, Any], threshold: float | None) -> str:
    """Names the blow-up: a NaN/infinite loss, or one above the spike threshold."""
    values = np.asarray([float(value) for value in _flat(losses.values())], dtype=np.float64)
    if np.all(np.isfinite(values)) and threshold is not None:
        return f"the loss is above loss_spike_threshold={threshold:g}"
    return "the loss is not finite"
