"""Recovery from loss blow-ups: roll back to the newest good state kept in memory, skip the bad batches, go on.

A blow-up is a training step whose loss (`loss` or `*_loss`) is NaN or
infinite, or above `RecoveryPolicy.loss_spike_threshold`. The engine stops
the host call right after that step (an in-graph test per step, as the NaN
guard's), so the same steps blow up however the steps are grouped into
calls. `LossRecovery` keeps the training state in memory (the model,
optimizer, metrics, seed generators and the Trainer's own state:
`RunState.keep_state`) at fixed global steps: every
`RecoveryPolicy.keep_every_steps` steps, at each epoch start and at each
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
that was not killed. The state a run starts from (step 0) is not a good
state: a blow-up before the first state kept is an error, not a restart
from the initial weights.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import keras
import numpy as np

from tftrain import summaries
from tftrain.arguments import check_int, check_left_at_default
from tftrain.engine import graph_loops
from tftrain.errors import NonFiniteLossError
from tftrain.options import EngineOptions
from tftrain.services.protocol import EveryNSteps, RunState, Service

__all__ = ["AUTO_KEEP_EVERY_STEPS", "LossRecovery", "RecoveryPolicy", "keep_every_steps_for"]

_ON_NONFINITE = ("stop", "rollback")

AUTO_KEEP_EVERY_STEPS = 4
"""The steps between kept states with `steps_per_loop="auto"` (its k is measured, so it cannot set them).

Each kept state ends a host call and costs about a third of a small MLP's
step (`tftrain.checkpoint.memory_snapshot`): every 4 steps is under a tenth
of the training time there, and much less for a larger model.
"""


@dataclasses.dataclass(frozen=True)
class RecoveryPolicy:
    """What a loss blow-up does (the `Trainer` arguments of the same names).

    Attributes:
        on_nonfinite: `"stop"`: raise `NonFiniteLossError` at the first
            blow-up (the NaN guard, with `terminate_on_nan`). `"rollback"`:
            restore the newest good state kept in memory and go on past the
            batches that caused it (needs `model_dir`, whose checkpoints
            record the rollbacks).
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
        keep_every_steps: Global steps between the states kept in memory for
            a rollback (a blow-up throws away at most this many steps). The
            `Trainer` derives it from `steps_per_loop` (`keep_every_steps_for`).

    Raises:
        ValueError, TypeError: a bad value, or a combination that cannot work
            (`max_rollbacks` or `rollback_lr_factor` other than the default
            with `"stop"`).
    """

    on_nonfinite: str = "stop"
    loss_spike_threshold: float | None = None
    max_rollbacks: int = 3
    rollback_lr_factor: float = 1.0
    keep_every_steps: int = 1

    def __post_init__(self):
        if self.on_nonfinite not in _ON_NONFINITE:
            raise ValueError(
                f"Invalid value for argument `on_nonfinite`. Received: on_nonfinite={self.on_nonfinite!r}. "
                "Expected 'stop' (raise NonFiniteLossError) or 'rollback' (restore the last good "
                "state and go on)."
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
        check_int("keep_every_steps", self.keep_every_steps)
        if not self.rollback:
            check_left_at_default(
                self,
                ("max_rollbacks", "rollback_lr_factor"),
                received=f"on_nonfinite={self.on_nonfinite!r}",
                expected="on_nonfinite='rollback' (they act at each rollback)",
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
                "Expected a `model_dir`: its checkpoints record the rollbacks, so a rerun resumes them exactly."
            )
        if not terminate_on_nan and (self.rollback or self.loss_spike_threshold is not None):
            raise ValueError(
                "Invalid combination of arguments. Received: terminate_on_nan=False with "
                f"on_nonfinite={self.on_nonfinite!r}, loss_spike_threshold={self.loss_spike_threshold!r}. "
                "Expected terminate_on_nan=True: with it off no step's loss is tested."
            )


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
    `policy.keep_every_steps`, at an epoch start or at a checkpoint step (the
    calls end there: `next_stop`), and when a resumed run starts; never at
    step 0. A rollback happens when a call's results are read
    (`RunState.roll_back`): every call's are read before the next call
    starts, so the call after a blow-up runs from the restored state. Each
    rollback is logged, printed (where `fit` prints progress) and written to
    TensorBoard.

    Args:
        policy: The recovery policy (`on_nonfinite="rollback"`).
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
        policy: RecoveryPolicy,
        *,
        optimizer: Any,
        checkpoint_every_steps: int | None = None,
        verbose: int = 1,
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
        self.optimizer = optimizer
        self.verbose = verbose
        self.writer = writer
        self.cadences = (EveryNSteps(policy.keep_every_steps), EveryNSteps(checkpoint_every_steps))
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
        if step == 0 or step == self._kept_at or not due:  # step 0: the initial state is no good state
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
        what = f"{_blow_up(losses, self.policy.loss_spike_threshold)}: {losses}"
        kept = run.kept_progress
        if kept is None:
            raise NonFiniteLossError(
                f"Training stopped at step {step}: {what}, and there is no good state to roll back to: no "
                f"step of this run was kept before it (states are kept every {self.policy.keep_every_steps} "
                "step(s) and at each epoch start, from the first step on; the state at step 0 is the "
                "initial one, and restarting from it would throw away the run). Check the first batches "
                "and the initial weights, or lower the learning rate."
            )
        if len(self.rollbacks) >= self.policy.max_rollbacks:
            raise NonFiniteLossError(
                f"Training stopped at step {step}: {what}, after {len(self.rollbacks)} "
                f"rollback(s), the most `max_rollbacks={self.policy.max_rollbacks}` allows "
                f"(at steps {[record['step'] for record in self.rollbacks]}). The last good state is "
                f"step {kept.global_step}'s; the last checkpoint is {run.latest_checkpoint()}. Lower the "
                "learning rate (or pass `rollback_lr_factor`), clip gradients, check the data, or allow "
                "more rollbacks."
            )
        # The rate in use, not the kept state's: factors compound over rollbacks to one state.
        learning_rate = summaries.learning_rate_of(self.optimizer)
        rollback = run.roll_back()
        if self.policy.rollback_lr_factor != 1:
            learning_rate *= self.policy.rollback_lr_factor
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
            f"tftrain: rollback {len(self.rollbacks)} of at most {self.policy.max_rollbacks} at step "
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
