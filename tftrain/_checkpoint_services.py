"""The services that write checkpoints: periodic and epoch-end saves, the best checkpoint, preemption.

Each follows the `tftrain._services.Service` protocol; `start_run` builds
them for a run with a `model_dir`.
"""

from __future__ import annotations

import signal
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from tftrain import _loops, timing
from tftrain import checkpoint as checkpoint_lib
from tftrain._services import PreemptedError, Service

if TYPE_CHECKING:
    from tftrain._training_run import TrainingRun


class CheckpointService(Service):
    """Saves checkpoints every N steps and at each epoch end; removes a worker's scratch copies at the end.

    Args:
        checkpointer: Writes the checkpoints.
        every_steps: Also save every this many steps (None: epoch ends only).
        timer: The step timer that records save times, or None.
        scratch_dir: A non-chief worker's own checkpoint directory, removed at `close`.
        save_iterator: Save the data iterator's state (False: the position
            is kept as a batch count alone, for a pipeline read in a fixed order).
    """

    name = "checkpoint"

    def __init__(
        self,
        checkpointer: checkpoint_lib.Checkpointer,
        every_steps: int | None,
        timer: timing.StepTimer | None,
        scratch_dir: str | None = None,
        *,
        save_iterator: bool = True,
    ):
        self.checkpointer = checkpointer
        self.save_iterator = save_iterator
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
        run.settle()  # a save waits for the loss check of the steps it holds
        progress = run.progress
        if self._saved_at_step == progress.global_step and progress.step_in_epoch != 0:
            return None
        # The iterator first: at an epoch end it starts the next pass, which has read no batch yet.
        iterator = run.plan.next_iterator()
        progress.batches_in_pass = run.plan.batches_in_pass(progress.step_in_epoch)
        start = time.perf_counter()
        path = self.checkpointer.save(
            progress,
            iterator if self.save_iterator else None,
            run.service_states(),
            number=progress.global_step,
        )
        if self.timer is not None:
            self.timer.record_checkpoint_save(time.perf_counter() - start)
        self._saved_at_step = progress.global_step
        return path

    def close(self) -> None:
        self.checkpointer.close()
        if self.scratch_dir is not None and tf.io.gfile.exists(self.scratch_dir):
            tf.io.gfile.rmtree(self.scratch_dir)


class BestCheckpointService(Service):
    """Keeps the checkpoint of the best epoch (or validation) by a monitored log, apart from the rotating ones.

    At each epoch end, and each validation every N steps, whose logs improve
    on the best `monitor` value so far, the run's state is saved to its own
    directory (one checkpoint, replaced
    only by a better one; never rotated away by the regular checkpoints). The
    best value is saved with the regular checkpoints, so a resumed run goes
    on comparing with it.

    Args:
        checkpointer: Writes to the best checkpoint's directory (`max_to_keep=1`).
        monitor: The log to watch, e.g. `"val_loss"`.
        mode: `"min"`, `"max"`, or `"auto"` (max for accuracy-like names, else min).

    Raises:
        ValueError: (at the first epoch end or validation) `monitor` is not among the logs.
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
            raise self._unknown(sorted(logs), "the epoch's logs")
        self._consider(run, float(logs[self.monitor]))

    def validated(self, run: TrainingRun, logs: dict[str, Any]) -> None:
        names = sorted(f"val_{key}" for key in logs)
        if self.monitor in names:
            self._consider(run, float(logs[self.monitor[len("val_") :]]))
        elif self.monitor.startswith("val_"):
            raise self._unknown(names, "the validation's logs")

    def _unknown(self, names: list[str], where: str) -> ValueError:
        return ValueError(
            f"Invalid value for argument `best_checkpoint_monitor`. Received: "
            f"best_checkpoint_monitor={self.monitor!r}, but {where} are {names}. "
            "Expected one of those names (validation logs need `validation_data`)."
        )

    def _consider(self, run: TrainingRun, value: float) -> None:
        if self.best is not None and not (value < self.best if self.mode == "min" else value > self.best):
            return
        self.best = value
        run.settle()
        progress = run.progress
        self.checkpointer.save(progress, None, run.service_states(), number=progress.global_step)

    def state_dict(self) -> dict[str, Any]:
        return {"monitor": self.monitor, "best": self.best}

    def close(self) -> None:
        self.checkpointer.close()

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
        self.checkpoints.checkpointer.sync()  # the process exits next: the save must be on disk
        raise preempted_error(run, self.received, path, signal.Signals(self.received).name)

    def close(self) -> None:
        self.signals.restore()
