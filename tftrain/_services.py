"""The services around the outer training loop: one small protocol, one concern each.

A `TrainingRun` (`tftrain._training_run`) owns the run's progress and calls
its services in order. Each service says at which global step the loop must
stop next (so a k-step host call never jumps its boundary), acts after each
host call and at each epoch end, may keep state that is saved with the
checkpoint, and releases what it holds at `close`. The NaN guard, the
profiler window, timing, TensorBoard summaries and checkpointing are services;
`tftrain.callbacks` drives the same services from `keras.Model.fit`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tftrain import _graph_loops, _loops, summaries, timing

if TYPE_CHECKING:
    from tftrain._training_run import TrainingRun


class NonFiniteLossError(FloatingPointError):
    """A training step produced a NaN or infinite loss; training stopped at that step."""


class PreemptedError(RuntimeError):
    """Training stopped on a preemption signal (e.g. SIGTERM) after saving a checkpoint at that step.

    Rerunning the same `fit` on the same `model_dir` resumes from that
    checkpoint exactly. A job script typically catches it and exits, so the
    scheduler restarts it.

    Attributes:
        signal_number: The signal that arrived (in a multi-worker run, the
            one that reached a worker first; every worker reports it), or
            None if it could not be learnt from the worker it reached.
        step: The global step at which the run stopped (the same on every worker).
        checkpoint: The checkpoint written for that step (in a multi-worker
            run, the chief's, in `model_dir/checkpoints`).
    """

    def __init__(self, message: str, *, signal_number: int | None, step: int, checkpoint: str | None):
        super().__init__(message)
        self.signal_number = signal_number
        self.step = step
        self.checkpoint = checkpoint


class Service:
    """The protocol of a service; every method has a do-nothing default.

    Attributes:
        name: The key of the service's state in a checkpoint.
    """

    name = "service"

    def next_stop(self, step: int) -> int | None:
        """The next global step after `step` at which a host call must end, or None."""
        del step
        return None

    def before_call(self, run: TrainingRun) -> None:
        """Runs before a host call, at `run.progress`."""

    def after_call(self, run: TrainingRun, result: _loops.LoopResult) -> None:
        """Runs after a host call; `run.progress` already counts its steps."""

    def end_epoch(self, run: TrainingRun, logs: dict[str, Any]) -> None:
        """Runs at an epoch end, after the epoch's callbacks, with its (Python) logs."""

    def validated(self, run: TrainingRun, logs: dict[str, Any]) -> None:
        """Runs after a validation every N steps (`PeriodicValidation`), with its logs (no `val_` prefix)."""

    def state_dict(self) -> dict[str, Any] | None:
        """JSON-serializable state saved with each checkpoint, or None."""
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from a state saved by `state_dict` (on resume)."""

    def close(self) -> None:
        """Releases what the service holds (writers, the profiler, scratch files)."""


class StepBudget(Service):
    """Ends the run at a total number of training steps (a k-step call never passes it)."""

    name = "step_budget"

    def __init__(self, total_steps: int):
        self.total_steps = total_steps

    def next_stop(self, step: int) -> int | None:
        return self.total_steps if step < self.total_steps else None


class PeriodicValidation(Service):
    """Validates every N training steps, mid-epoch included (beyond `fit`'s per-epoch validation).

    Args:
        every_steps: Validate at each multiple of this many global steps.
        validate: Runs one validation (its callback hooks included) and
            returns its logs (without the `val_` prefix).
        history: Where each validation is recorded: `"step"` -> the global
            steps, `"val_<name>"` -> the values (`History.step_history`).
    """

    name = "periodic_validation"

    def __init__(self, every_steps: int, validate: Any, history: dict[str, list[Any]]):
        self.every_steps = every_steps
        self.validate = validate
        self.history = history

    def next_stop(self, step: int) -> int | None:
        return (step // self.every_steps + 1) * self.every_steps

    def after_call(self, run: TrainingRun, result: _loops.LoopResult) -> None:
        step = run.progress.global_step
        if step % self.every_steps:
            return
        logs = self.validate()
        self.history.setdefault("step", []).append(step)
        for key, value in logs.items():
            self.history.setdefault(f"val_{key}", []).append(value)
        for service in run.services:
            service.validated(run, logs)


class NonFiniteGuard(Service):
    """Stops training at the first step whose loss (`loss` or `*_loss`) is NaN or infinite."""

    name = "nan_guard"

    def after_call(self, run: TrainingRun, result: _loops.LoopResult) -> None:
        if not result.nonfinite:
            return
        progress = run.progress
        losses = {
            key: np.asarray(value).tolist()
            for key, value in result.logs.items()
            if _graph_loops.is_loss_key(key)
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


class ProfilerService(Service):
    """Runs the TensorFlow profiler over a window of training steps (`summaries.ProfileWindow`)."""

    name = "profiler"

    def __init__(self, window: summaries.ProfileWindow):
        self.window = window

    def next_stop(self, step: int) -> int | None:
        edges = [edge for edge in self.window.boundaries if edge > step]
        return min(edges) if edges else None

    def before_call(self, run: TrainingRun) -> None:
        self.window.before_steps(run.progress.global_step)

    def after_call(self, run: TrainingRun, result: _loops.LoopResult) -> None:
        self.window.after_steps(run.progress.global_step)

    def close(self) -> None:
        self.window.close()


class TimingService(Service):
    """Keeps the step timer's measurements (if timing is on) and the trace count across a resume."""

    name = "timing"

    def __init__(self, timer: timing.StepTimer | None, trace_counter: timing.TraceCounter):
        self.timer = timer
        self.trace_counter = trace_counter
        self._traces_before = trace_counter.count

    def trace_count(self) -> int:
        """Traces of the training step in this run (a resumed run adds the checkpointed count)."""
        return self.trace_counter.count - self._traces_before

    def state_dict(self) -> dict[str, Any] | None:
        if self.timer is None:
            return None
        return {"timer": self.timer.state_dict(), "trace_count": self.trace_count()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.timer is None:
            return
        self.timer.load_state_dict(state["timer"])
        self._traces_before = self.trace_counter.count - int(state["trace_count"])


class SummaryService(Service):
    """Writes TensorBoard summaries: every N steps, at epoch ends, and the first call's trace time.

    Args:
        writer: The event-file writers.
        timer: The step timer whose rates are written, or None.
        optimizer: The optimizer whose learning rate is written, or None.
        trace_written: Whether the trace time was written already (a resumed run's was).
    """

    name = "summaries"

    def __init__(
        self,
        writer: summaries.TrainingSummaries,
        timer: timing.StepTimer | None,
        optimizer: Any,
        *,
        trace_written: bool = False,
    ):
        self.writer = writer
        self.timer = timer
        self.optimizer = optimizer
        self._trace_written = trace_written

    def next_stop(self, step: int) -> int | None:
        every = self.writer.every_steps
        return (step // every + 1) * every if every else None

    def after_call(self, run: TrainingRun, result: _loops.LoopResult) -> None:
        self.after_steps(run.progress.global_step - result.steps, run.progress.global_step, result.logs)

    def after_steps(self, before: int, step: int, logs: Any) -> None:
        """Writes what is due after the training steps `before + 1` to `step`."""
        if not self._trace_written and self.timer is not None and self.timer.first_call_s is not None:
            self.writer.on_trace(step, self.timer.first_call_s)
            self._trace_written = True
        if self.writer.due(before, step):
            rates = self.timer.take_window() if self.timer is not None else {}
            self.writer.on_steps(
                step, logs, learning_rate=summaries.learning_rate_of(self.optimizer), rates=rates
            )

    def end_epoch(self, run: TrainingRun, logs: dict[str, Any]) -> None:
        self.epoch_end_at(run.progress.global_step, logs)

    def validated(self, run: TrainingRun, logs: dict[str, Any]) -> None:
        """Writes a validation taken at the run's step (`step_*` scalars of the validation run)."""
        self.writer.write(
            summaries.VALIDATION_RUN,
            run.progress.global_step,
            {f"step_{key}": value for key, value in summaries.scalars(logs).items()},
        )
        self.writer.flush()

    def epoch_end_at(self, step: int, logs: dict[str, Any]) -> None:
        """Writes an epoch's logs, learning rate and speed (since the last write) at global step `step`."""
        rates = self.timer.take_window() if self.timer is not None else {}
        self.writer.on_epoch_end(
            step, logs, learning_rate=summaries.learning_rate_of(self.optimizer), rates=rates
        )

    def close(self) -> None:
        self.writer.close()
