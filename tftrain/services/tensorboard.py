"""TensorBoard summaries of a run: every N steps, at epoch ends, after validations, and the trace time."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tftrain import summaries, timing
from tftrain.checkpoint.files import error_line
from tftrain.services.protocol import EveryNSteps, RunState, Service


class WriteGuard:
    """Runs a run's TensorBoard writes until one fails: that one is warned, and the run writes no more.

    Training goes on: the checkpoint saved next says whether the directory
    can still be written (its error stops the run).

    Args:
        log_dir: The directory written, for the warning.
    """

    def __init__(self, log_dir: str):
        self.log_dir = log_dir
        self.failed = False

    def run(self, write: Callable[[], None]) -> None:
        """Runs `write` unless a write failed before; a failure is warned once."""
        if self.failed:
            return
        try:
            write()
        except (tf.errors.OpError, OSError) as error:
            self.failed = True
            warnings.warn(
                f"TensorBoard summaries cannot be written to {self.log_dir} ({error_line(error)}); "
                "this run writes no more of them. Training goes on: the next checkpoint save stops the "
                "run if the directory cannot be written.",
                stacklevel=3,
            )


class SummaryService(Service):
    """Writes TensorBoard summaries: every N steps, at epoch ends, and the first call's trace time.

    A write that fails (a full disk, a removed directory) is warned once and
    ends the run's summaries; training goes on, and the checkpoint saved next
    says whether the directory can still be written (its error stops the run).

    Args:
        writer: The event-file writers.
        timer: The step timer whose rates are written, or None.
        optimizer: The optimizer whose learning rate is written, or None.
        trace_written: Whether the trace time was written already (a run resumed
            after step 0 wrote it: its first call is not the job's first).
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
        self.when = EveryNSteps(writer.every_steps)
        self.timer = timer
        self.optimizer = optimizer
        self._trace_written = trace_written
        self._guard = WriteGuard(writer.log_dir)

    def _write(self, write: Callable[[], None]) -> None:
        self._guard.run(write)

    def next_stop(self, step: int) -> int | None:
        return self.when.next_stop(step)

    def after_call(self, run: RunState, result: Any) -> None:
        self.after_steps(run.progress.global_step - result.steps, run.progress.global_step, result.logs)

    def after_steps(self, before: int, step: int, logs: Any) -> None:
        """Writes what is due after the training steps `before + 1` to `step`."""
        if not self._trace_written and self.timer is not None and self.timer.first_call_s is not None:
            first_call_s = self.timer.first_call_s
            if before == 0:  # a run resumed after step 0 wrote its trace time already
                self._write(lambda: self.writer.on_trace(step, first_call_s))
            self._trace_written = True
        if self.when.reached(before, step):
            rates = self.timer.take_window() if self.timer is not None else {}
            learning_rate = summaries.learning_rate_of(self.optimizer)
            self._write(lambda: self.writer.on_steps(step, logs, learning_rate=learning_rate, rates=rates))

    def end_epoch(self, run: RunState, logs: dict[str, Any]) -> None:
        self.epoch_end_at(run.progress.global_step, logs)

    def validated(self, run: RunState, logs: dict[str, Any]) -> None:
        """Writes a validation taken at the run's step (`step_*` scalars of the validation run)."""
        values = {f"step_{key}": value for key, value in summaries.scalars(logs).items()}
        step = run.progress.global_step

        def write() -> None:
            self.writer.write(summaries.VALIDATION_RUN, step, values)
            self.writer.flush()

        self._write(write)

    def epoch_end_at(self, step: int, logs: dict[str, Any]) -> None:
        """Writes an epoch's logs, learning rate and speed (since the last write) at global step `step`."""
        rates = self.timer.take_window() if self.timer is not None else {}
        learning_rate = summaries.learning_rate_of(self.optimizer)
        self._write(lambda: self.writer.on_epoch_end(step, logs, learning_rate=learning_rate, rates=rates))

    def close(self) -> None:
        self._write(self.writer.flush)
        try:
            self.writer.close()
        except (tf.errors.OpError, OSError):
            pass  # what could not be flushed is warned above
