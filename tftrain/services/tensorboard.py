"""TensorBoard summaries of a run: every N steps, at epoch ends, after validations, and the trace time."""

from __future__ import annotations

from typing import Any

from tftrain import summaries, timing
from tftrain.services.protocol import EveryNSteps, RunState, Service


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
        self.when = EveryNSteps(writer.every_steps)
        self.timer = timer
        self.optimizer = optimizer
        self._trace_written = trace_written

    def next_stop(self, step: int) -> int | None:
        return self.when.next_stop(step)

    def after_call(self, run: RunState, result: Any) -> None:
        self.after_steps(run.progress.global_step - result.steps, run.progress.global_step, result.logs)

    def after_steps(self, before: int, step: int, logs: Any) -> None:
        """Writes what is due after the training steps `before + 1` to `step`."""
        if not self._trace_written and self.timer is not None and self.timer.first_call_s is not None:
            self.writer.on_trace(step, self.timer.first_call_s)
            self._trace_written = True
        if self.when.reached(before, step):
            rates = self.timer.take_window() if self.timer is not None else {}
            self.writer.on_steps(
                step, logs, learning_rate=summaries.learning_rate_of(self.optimizer), rates=rates
            )

    def end_epoch(self, run: RunState, logs: dict[str, Any]) -> None:
        self.epoch_end_at(run.progress.global_step, logs)

    def validated(self, run: RunState, logs: dict[str, Any]) -> None:
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
