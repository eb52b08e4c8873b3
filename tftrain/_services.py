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

import signal
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from tftrain import _loops, summaries, timing

if TYPE_CHECKING:
    from tftrain import checkpoint as checkpoint_lib
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
            if isinstance(service, SummaryService):
                service.validation_at(step, logs)


class NonFiniteGuard(Service):
    """Stops training at the first step whose loss (`loss` or `*_loss`) is NaN or infinite."""

    name = "nan_guard"

    def after_call(self, run: TrainingRun, result: _loops.LoopResult) -> None:
        if not result.nonfinite:
            return
        progress = run.progress
        losses = {
            key: np.asarray(value).tolist() for key, value in result.logs.items() if _loops.is_loss_key(key)
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

    def validation_at(self, step: int, logs: dict[str, Any]) -> None:
        """Writes a validation taken at global step `step` (`step_*` scalars of the validation run)."""
        self.writer.write(
            summaries.VALIDATION_RUN,
            step,
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


class CheckpointService(Service):
    """Saves checkpoints every N steps and at each epoch end; removes a worker's scratch copies at the end.

    Args:
        checkpointer: Writes the checkpoints.
        every_steps: Also save every this many steps (None: epoch ends only).
        timer: The step timer that records save times, or None.
        scratch_dir: A non-chief worker's own checkpoint directory, removed at `close`.
    """

    name = "checkpoint"

    def __init__(
        self,
        checkpointer: checkpoint_lib.Checkpointer,
        every_steps: int | None,
        timer: timing.StepTimer | None,
        scratch_dir: str | None = None,
    ):
        self.checkpointer = checkpointer
        self.every_steps = every_steps
        self.timer = timer
        self.scratch_dir = scratch_dir
        self._saved_at_step: int | None = None

    def next_stop(self, step: int) -> int | None:
        if not self.every_steps:
            return None
        return (step // self.every_steps + 1) * self.every_steps

    def after_call(self, run: TrainingRun, result: _loops.LoopResult) -> None:
        if not self.every_steps:
            return
        step = run.progress.global_step
        crossed = step // self.every_steps > (step - result.steps) // self.every_steps
        # No step checkpoint at an epoch's last step: the epoch-end checkpoint follows.
        if crossed and run.progress.step_in_epoch != run.epoch_steps:
            self.save(run)

    def end_epoch(self, run: TrainingRun, logs: dict[str, Any]) -> None:
        self.save(run)

    def save(self, run: TrainingRun) -> str | None:
        """Writes a checkpoint of the run as it is now (once per global step)."""
        progress = run.progress
        if self._saved_at_step == progress.global_step and progress.step_in_epoch != 0:
            return None
        # The iterator first: at an epoch end it starts the next pass, which has read no batch yet.
        iterator = run.plan.next_iterator()
        progress.batches_in_pass = run.plan.batches_in_pass(progress.step_in_epoch)
        start = time.perf_counter()
        path = self.checkpointer.save(progress, iterator, run.service_states(), number=progress.global_step)
        if self.timer is not None:
            self.timer.record_checkpoint_save(time.perf_counter() - start)
        self._saved_at_step = progress.global_step
        return path

    def close(self) -> None:
        if self.scratch_dir is not None and tf.io.gfile.exists(self.scratch_dir):
            tf.io.gfile.rmtree(self.scratch_dir)


class BestCheckpointService(Service):
    """Keeps the checkpoint of the best epoch by a monitored log, apart from the rotating ones.

    At each epoch end whose logs improve on the best `monitor` value so far,
    the run's state is saved to its own directory (one checkpoint, replaced
    only by a better one; never rotated away by the regular checkpoints). The
    best value is saved with the regular checkpoints, so a resumed run goes
    on comparing with it.

    Args:
        checkpointer: Writes to the best checkpoint's directory (`max_to_keep=1`).
        monitor: The log to watch, e.g. `"val_loss"`.
        mode: `"min"`, `"max"`, or `"auto"` (max for accuracy-like names, else min).

    Raises:
        ValueError: (at the first epoch end) `monitor` is not among the logs.
    """

    name = "best_checkpoint"

    def __init__(self, checkpointer: checkpoint_lib.Checkpointer, monitor: str, mode: str = "auto"):
        self.checkpointer = checkpointer
        self.monitor = monitor
        if mode == "auto":
            mode = "max" if any(part in monitor for part in ("acc", "auc", "precision", "recall")) else "min"
        self.mode = mode
        self.best: float | None = None

    def end_epoch(self, run: TrainingRun, logs: dict[str, Any]) -> None:
        if self.monitor not in logs:
            if self.monitor.startswith("val_") and not any(key.startswith("val_") for key in logs):
                return  # no validation in this epoch (validation_freq)
            raise ValueError(
                f"Invalid value for argument `best_checkpoint_monitor`. Received: "
                f"best_checkpoint_monitor={self.monitor!r}, but the epoch's logs are {sorted(logs)}. "
                "Expected one of those names (validation logs need `validation_data`)."
            )
        value = float(logs[self.monitor])
        if self.best is not None and not (value < self.best if self.mode == "min" else value > self.best):
            return
        self.best = value
        progress = run.progress
        self.checkpointer.save(progress, None, run.service_states(), number=progress.global_step)

    def state_dict(self) -> dict[str, Any]:
        return {"monitor": self.monitor, "best": self.best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("monitor") == self.monitor:
            self.best = state.get("best")


class SignalRecorder:
    """Records preemption signals while a run lasts; `restore` puts the previous handlers back.

    The handlers only note the signal (the run acts on it at a host-call
    boundary). Python delivers signals to the main thread only: from another
    thread, nothing is installed (warned).

    Args:
        signals: The signals that mean "preempted" (e.g. `(signal.SIGTERM,)`).

    Attributes:
        received: The last signal that arrived, or None.
    """

    def __init__(self, signals: tuple[int, ...], stacklevel: int = 5):
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            warnings.warn(
                "fit runs outside the main thread, where Python cannot install signal handlers: a "
                f"preemption signal ({', '.join(signal.Signals(s).name for s in signals)}) stops the process "
                "without a last checkpoint. Run fit in the main thread to checkpoint on preemption.",
                stacklevel=stacklevel,
            )
            return
        for number in signals:
            self._previous[number] = signal.signal(number, self._record)

    def _record(self, number: int, frame: Any) -> None:
        del frame
        self.received = number

    def restore(self) -> None:
        """Reinstalls the handlers that were there before."""
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous.clear()


def preempted_error(
    run: TrainingRun, signal_number: int | None, path: str | None, cause: str
) -> PreemptedError:
    """The `PreemptedError` of a run stopped at its current step after saving `path`."""
    progress = run.progress
    return PreemptedError(
        f"Training stopped on {cause} at step {progress.global_step} (epoch {progress.epoch + 1}, "
        f"step {progress.step_in_epoch} of the epoch), after saving {path}. Run the same fit "
        "on the same model_dir to resume exactly there.",
        signal_number=signal_number,
        step=progress.global_step,
        checkpoint=path,
    )


class PreemptionService(Service):
    """Stops a single-process run on a preemption signal with a checkpoint at the step reached.

    While the run lasts, the signals' handlers only record the signal: the host
    call in flight finishes, a checkpoint is saved at that step (a save in
    progress completes first, so the previous checkpoint is never damaged), and
    `PreemptedError` is raised. A signal during an epoch's last call lets the
    epoch end (validation, callbacks, the epoch checkpoint) first. The previous
    handlers are restored at `close` (see `SignalRecorder`). Multi-worker runs
    use `tftrain._multiworker_preemption` instead.

    Args:
        signals: The signals that mean "preempted" (e.g. `(signal.SIGTERM,)`).
        checkpoints: The run's checkpoint service (it writes the last checkpoint).
    """

    name = "preemption"

    def __init__(self, signals: tuple[int, ...], checkpoints: CheckpointService):
        self.checkpoints = checkpoints
        self.signals = SignalRecorder(signals)

    @property
    def received(self) -> int | None:
        """The preemption signal that arrived, or None."""
        return self.signals.received

    def before_call(self, run: TrainingRun) -> None:
        if self.received is not None:
            self._stop(run)

    def after_call(self, run: TrainingRun, result: _loops.LoopResult) -> None:
        # At an epoch's last step the epoch ends first; its checkpoint is the last one.
        if self.received is not None and run.progress.step_in_epoch != run.epoch_steps:
            self._stop(run)

    def end_epoch(self, run: TrainingRun, logs: dict[str, Any]) -> None:
        if self.received is not None:
            self._stop(run, saved=True)

    def _stop(self, run: TrainingRun, saved: bool = False) -> None:
        path = self.checkpoints.checkpointer.latest if saved else self.checkpoints.save(run)
        path = path or self.checkpoints.checkpointer.latest
        raise preempted_error(run, self.received, path, signal.Signals(self.received).name)

    def close(self) -> None:
        self.signals.restore()
