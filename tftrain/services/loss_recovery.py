"""Recovery from loss blow-ups: roll back to the newest good state kept in memory, skip the bad batches, go on.

A blow-up is a training step whose loss (`loss` or `*_loss`) is NaN or
infinite, or above `NonFinitePolicy.loss_spike_threshold`. The engine stops
the host call right after that step (an in-graph test per step, as the NaN
guard's), so the same steps blow up however the steps are grouped into
calls. `LossRecovery` keeps the training state in memory (the model,
optimizer, metrics, seed generators and the Trainer's own state:
`RunState.keep_state`) at fixed global steps: every
`NonFinitePolicy.keep_every_steps` steps, at each epoch start and at each
checkpoint step, where host calls end. At a blow-up it restores the newest
kept state, while the global step and the data position go on: the batches
read since, the bad ones included, are not read again, so a rollback throws
away at most `keep_every_steps` steps. TF Model Garden's `RecoveryAction`
restores the same way, from a checkpoint.

The states kept, the steps that blow up and so every rollback depend on
global steps alone, not on where host calls start (`steps_per_loop="auto"`
may group steps differently from run to run), and every checkpoint step
keeps one, so a run killed and rerun on its `model_dir` (which resumes at a
checkpoint, with the rollback count saved in it) ends bit-identical to one
that was not killed. The state a run starts from is kept too (step 0's:
the initial weights are a good state), so a poisoned first batch is skipped
as any other.
"""

from __future__ import annotations

import logging
from typing import Any

import keras
import numpy as np

from tftrain import summaries
from tftrain.engine import graph_loops
from tftrain.errors import NonFiniteLossError
from tftrain.options import EngineOptions, NonFinitePolicy
from tftrain.services.protocol import EveryNSteps, RunState, Service

__all__ = ["AUTO_KEEP_EVERY_STEPS", "LossRecovery", "keep_every_steps_for"]

AUTO_KEEP_EVERY_STEPS = 4
"""The steps between kept states with `steps_per_loop="auto"` (its k is measured, so it cannot set them).

Each kept state ends a host call and costs about a third of a small MLP's
step (`tftrain.checkpoint.memory_snapshot`): every 4 steps is under a tenth
of the training time there, and much less for a larger model.
"""


def keep_every_steps_for(engine: EngineOptions) -> int:
    """The steps between kept states for an engine: its fixed steps per call, or `AUTO_KEEP_EVERY_STEPS`.

    A fixed k keeps a state every k global steps, where its calls end anyway
    (a blow-up throws away at most one call's steps); `"auto"` measures its
    k, which may differ from run to run, so the states kept cannot follow it.
    """
    return AUTO_KEEP_EVERY_STEPS if engine.auto else engine.fixed_steps


class LossRecovery(Service):
    """Keeps the training state at fixed steps; rolls back to the newest at a loss blow-up; stops after `max_rollbacks`.

    A state is kept before the host call that starts at a multiple of
    `nonfinite_policy.keep_every_steps`, at an epoch start or at a checkpoint step (the
    calls end there: `next_stop`), and when a resumed run starts; never at
    step 0. A rollback happens when a call's results are read
    (`RunState.roll_back`): every call's are read before the next call
    starts, so the call after a blow-up runs from the restored state. Each
    rollback is logged, printed (where `fit` prints progress) and written to
    TensorBoard.

    Args:
        nonfinite_policy: What a loss blow-up does (`on_nonfinite="rollback"`).
        optimizer: The optimizer whose learning rate `rollback_lr_factor` scales.
        checkpoint_every_steps: The run's checkpoint cadence (its steps keep
            a state too, so a resume from one rolls back as the run did), or None.
        verbose: The `fit` call's `verbose`: a rollback is printed unless 0.
        writer: TensorBoard writers (`rollbacks` is written at each one), or None.

    Raises:
        ValueError: `rollback_lr_factor` with an optimizer whose learning rate is a schedule.
    """

    name = "loss_recovery"
    reads_every_call = True

    def __init__(
        self,
        nonfinite_policy: NonFinitePolicy,
        *,
        optimizer: Any,
        checkpoint_every_steps: int | None = None,
        verbose: int = 1,
        writer: summaries.TrainingSummaries | None = None,
    ):
        if nonfinite_policy.rollback_lr_factor != 1 and not isinstance(
            getattr(optimizer, "learning_rate", None), keras.Variable
        ):
            raise ValueError(
                "Invalid combination of arguments. Received: rollback_lr_factor="
                f"{nonfinite_policy.rollback_lr_factor!r} with an optimizer whose learning rate is not a float variable "
                f"(a schedule or a callable: {type(getattr(optimizer, 'learning_rate', None)).__name__}). "
                "Expected a float learning rate to scale, or rollback_lr_factor=1.0."
            )
        self.nonfinite_policy = nonfinite_policy
        self.optimizer = optimizer
        self.verbose = verbose
        self.writer = writer
        self.cadences = (EveryNSteps(nonfinite_policy.keep_every_steps), EveryNSteps(checkpoint_every_steps))
        self.rollbacks: list[dict[str, Any]] = []  # one record per rollback, saved with checkpoints
        self._started = False
        self._kept_at: int | None = None  # the global step of the last `keep_state`
        self._steps_kept_in_epoch: int | None = None  # as saved in the checkpoint resumed from

    def next_stop(self, step: int) -> int | None:
        stops = [stop for stop in (cadence.next_stop(step) for cadence in self.cadences) if stop is not None]
        return min(stops)

    def before_call(self, run: RunState) -> None:
        progress = run.progress
        step, first = progress.global_step, not self._started
        self._started = True
        due = first or progress.step_in_epoch == 0 or self._at_cadence(step)
        if step == self._kept_at or not due:
            return
        self._kept_at = step
        if not run.keep_state(steps_kept_in_epoch=self._steps_kept_in_epoch if first else None):
            logging.getLogger("tftrain").warning(
                "tftrain: the training state at step %d holds NaN or infinite values: not kept; a "
                "rollback returns to the state kept at step %s.",
                step,
                getattr(run.kept_progress, "global_step", None),
            )

    def _at_cadence(self, step: int) -> bool:
        return any(cadence.reached(step - 1, step) for cadence in self.cadences)

    def results_read(self, run: RunState, result: Any) -> None:
        if not result.nonfinite:
            return
        step = run.progress.global_step
        losses = {key: _plain(value) for key, value in result.logs.items() if graph_loops.is_loss_key(key)}
        what = f"{_blow_up(losses, self.nonfinite_policy.loss_spike_threshold)}: {losses}"
        kept = run.kept_progress
        if kept is None:
            raise NonFiniteLossError(
                f"Training stopped at step {step}: {what}, and there is no good state to roll back to: the "
                "state the run started from held NaN or infinite values, and none was kept since (states "
                f"are kept where the run starts, every {self.nonfinite_policy.keep_every_steps} step(s) and "
                "at each epoch start). Check the initial (or restored) weights, or lower the learning rate."
            )
        if len(self.rollbacks) >= self.nonfinite_policy.max_rollbacks:
            raise NonFiniteLossError(
                f"Training stopped at step {step}: {what}, after {len(self.rollbacks)} "
                f"rollback(s), the most `max_rollbacks={self.nonfinite_policy.max_rollbacks}` allows "
                f"(at steps {[record['step'] for record in self.rollbacks]}). The last good state is "
                f"step {kept.global_step}'s; the last checkpoint is {run.latest_checkpoint()}. Lower the "
                "learning rate (or pass `rollback_lr_factor`), clip gradients, check the data, or allow "
                "more rollbacks."
            )
        # The rate in use, not the kept state's: factors compound over rollbacks to one state.
        learning_rate = summaries.learning_rate_of(self.optimizer)
        rollback = run.roll_back()
        if self.nonfinite_policy.rollback_lr_factor != 1:
            learning_rate *= self.nonfinite_policy.rollback_lr_factor
            self.optimizer.learning_rate = learning_rate
        else:
            learning_rate = summaries.learning_rate_of(self.optimizer)
        record = {
            "step": step,
            "epoch": run.progress.epoch,
            "restored_step": rollback.restored.global_step,
            "skipped_steps": rollback.steps_lost,
            "losses": losses,
            "learning_rate": learning_rate,
        }
        self.rollbacks.append(record)
        self._report(record, what, rollback.restored)
        if self.writer is not None:
            self.writer.write("train", step, {"rollbacks": float(len(self.rollbacks))})
            self.writer.flush()

    def _report(self, record: dict[str, Any], what: str, restored: Any) -> None:
        """Logs a rollback and, where `fit` prints progress, prints it as a Keras callback prints its notes."""
        rate = "" if record["learning_rate"] is None else f"; learning rate {record['learning_rate']:g}"
        message = (
            f"tftrain: rollback {len(self.rollbacks)} of at most {self.nonfinite_policy.max_rollbacks} at step "
            f"{record['step']} ({what}): restored the state kept at step {record['restored_step']} (epoch "
            f"{restored.epoch + 1}, step {restored.step_in_epoch} of the epoch); {record['skipped_steps']} "
            f"step(s) lost, the bad one included{rate}."
        )
        logging.getLogger("tftrain").warning(message)
        if self.verbose:
            print(f"\nEpoch {record['epoch'] + 1}: {message}", flush=True)

    def after_call(self, run: RunState, result: Any) -> None:
        self._steps_kept_in_epoch = run.steps_kept_in_epoch  # saved with a checkpoint of this step

    def end_epoch(self, run: RunState, logs: dict[str, Any]) -> None:
        self._steps_kept_in_epoch = run.steps_kept_in_epoch

    def state_dict(self) -> dict[str, Any]:
        return {"rollbacks": self.rollbacks, "steps_kept_in_epoch": self._steps_kept_in_epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rollbacks = list(state.get("rollbacks", []))
        self._steps_kept_in_epoch = state.get("steps_kept_in_epoch")


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
