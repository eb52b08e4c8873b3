"""Preemption of a single-process run: on a signal, a checkpoint at the step reached, then `PreemptedError`."""

from __future__ import annotations

import signal
import threading
import warnings
from typing import Any

from tftrain.errors import PreemptedError
from tftrain.services.checkpointing import CheckpointService
from tftrain.services.protocol import RunState, Service


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
        try:
            for number in signals:
                self._previous[number] = signal.signal(number, self._record)
        except BaseException:
            self.restore()  # the handlers installed before the failure
            raise

    def _record(self, number: int, frame: Any) -> None:
        del frame
        self.received = number

    def restore(self) -> None:
        """Reinstalls the handlers that were there before."""
        for number, previous in self._previous.items():
            signal.signal(number, previous)
        self._previous.clear()


def preempted_error(run: RunState, signal_number: int | None, path: str | None, cause: str) -> PreemptedError:
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
    use `tftrain.services.multiworker_preemption` instead.

    Args:
        signals: The signals that mean "preempted" (e.g. `(signal.SIGTERM,)`).
        checkpoints: The run's checkpoint service (it writes the last checkpoint).
    """

    name = "preemption"

    def __init__(self, signals: tuple[int, ...], checkpoints: CheckpointService):
        self.checkpoints = checkpoints
        self.signals = SignalRecorder(signals)
        self.stopped = False  # the run stopped on a signal, its checkpoint on disk

    @property
    def received(self) -> int | None:
        """The preemption signal that arrived, or None."""
        return self.signals.received

    def before_call(self, run: RunState) -> None:
        if self.received is not None:
            self._stop(run)

    def after_call(self, run: RunState, result: Any) -> None:
        # Where the epoch ends (its last step, the budget) it ends first; its checkpoint is the last one.
        if self.received is not None and not run.epoch_ending:
            self._stop(run)

    def end_epoch(self, run: RunState, logs: dict[str, Any]) -> None:
        if self.received is not None:
            self._stop(run, saved=True)

    def _stop(self, run: RunState, saved: bool = False) -> None:
        # The process exits next: the last checkpoint must be on disk.
        path = self.checkpoints.latest if saved else self.checkpoints.save(run, wait=True)
        self.stopped = True
        raise preempted_error(run, self.received, path, signal.Signals(self.received).name)

    def close(self) -> None:
        self.signals.restore()
