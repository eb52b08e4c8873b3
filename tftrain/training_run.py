"""What happens around the step loop in one `Trainer.fit`: progress, checkpoints, summaries.

A `TrainingRun` counts the global step, stops on a non-finite loss, writes
TensorBoard summaries, runs the profiler window, and saves checkpoints every N
steps and at each epoch end. It also tells the loop where a host call must end
(a checkpoint or profiler edge), so a `steps_per_loop` call never jumps over one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tftrain import checkpoint as checkpoint_lib
from tftrain import data as data_lib
from tftrain import loops, summaries, timing


class NonFiniteLossError(FloatingPointError):
    """A training step produced a NaN or infinite loss; training stopped at that step."""


class TrainingRun:
    """Bookkeeping of one `fit` call around its step loop.

    Args:
        plan: The training data plan (for the iterator to checkpoint).
        progress: Where the run starts (restored or fresh).
        timer: The run's step timer, or None if timing is off.
        trace_count: Returns the training step's trace count so far.
        checkpointer: Saves checkpoints, or None.
        checkpoint_every_steps: Save every this many steps (None: epoch ends only).
        summaries_writer: Writes TensorBoard summaries, or None.
        profile: The profiler window, or None.
        optimizer: The optimizer whose learning rate is logged, or None.
        terminate_on_nan: Raise `NonFiniteLossError` on a non-finite loss.
    """

    def __init__(
        self,
        plan: data_lib.EpochPlan,
        progress: checkpoint_lib.Progress,
        *,
        timer: timing.StepTimer | None,
        trace_count,
        checkpointer: checkpoint_lib.Checkpointer | None = None,
        checkpoint_every_steps: int | None = None,
        summaries_writer: summaries.TrainingSummaries | None = None,
        profile: summaries.ProfileWindow | None = None,
        optimizer: Any = None,
        terminate_on_nan: bool = True,
    ):
        self.plan = plan
        self.progress = progress
        self.timer = timer
        self.trace_count = trace_count
        self.checkpointer = checkpointer
        self.checkpoint_every_steps = checkpoint_every_steps
        self.summaries = summaries_writer
        self.profile = profile
        self.optimizer = optimizer
        self.terminate_on_nan = terminate_on_nan
        self._trace_written = False
        self._saved_at_step: int | None = None
        self.traces_before = 0

    def steps_allowed(self, wanted: int) -> int:
        """`wanted`, shortened so that the host call ends at the next checkpoint or profiler edge."""
        done = self.progress.global_step
        edges = []
        if self.checkpointer is not None and self.checkpoint_every_steps:
            edges.append((done // self.checkpoint_every_steps + 1) * self.checkpoint_every_steps)
        if self.profile is not None:
            edges += [edge for edge in self.profile.boundaries if edge > done]
        for edge in edges:
            wanted = min(wanted, edge - done)
        return max(wanted, 1)

    def before_call(self) -> None:
        """Starts the profiler if its window begins with the coming step."""
        if self.profile is not None:
            self.profile.before_steps(self.progress.global_step)

    def after_call(self, result: loops.LoopResult, epoch_steps: int | None) -> None:
        """Files a host call: counts steps, checks the loss, writes summaries, saves.

        Args:
            result: What the call did.
            epoch_steps: Steps in the current epoch, if known (no step
                checkpoint is written at an epoch's last step: the epoch-end
                checkpoint follows).

        Raises:
            NonFiniteLossError: the last step's loss is NaN or infinite.
        """
        before = self.progress.global_step
        self.progress.global_step += result.steps
        self.progress.step_in_epoch += result.steps
        if result.nonfinite and self.terminate_on_nan:
            losses = {key: np.asarray(value).tolist() for key, value in result.logs.items() if loops.is_loss_key(key)}
            last_good = self.checkpointer.latest if self.checkpointer is not None else None
            raise NonFiniteLossError(
                f"Training stopped at step {self.progress.global_step} (epoch {self.progress.epoch + 1}, "
                f"step {self.progress.step_in_epoch} of the epoch): the loss is not finite: {losses}. "
                "No checkpoint was written for this step"
                + (f"; the last good checkpoint is {last_good}." if last_good else ".")
                + " Lower the learning rate, clip gradients (e.g. `clipnorm=` on the optimizer) or check "
                "the inputs of this step for NaN/Inf. Pass `terminate_on_nan=False` to train on."
            )
        if self.profile is not None:
            self.profile.after_steps(self.progress.global_step)
        if self.summaries is not None:
            self._write_step_summaries(before, result.logs)
        if self.checkpointer is not None and self.checkpoint_every_steps:
            crossed = self.progress.global_step // self.checkpoint_every_steps > before // self.checkpoint_every_steps
            if crossed and self.progress.step_in_epoch != epoch_steps:
                self.save()

    def _write_step_summaries(self, before: int, logs: Any) -> None:
        step = self.progress.global_step
        if not self._trace_written and self.timer is not None and self.timer.first_call_s is not None:
            self.summaries.on_trace(step, self.timer.first_call_s)
            self._trace_written = True
        if self.summaries.due(before, step):
            rates = self.timer.take_window() if self.timer is not None else {}
            self.summaries.on_steps(step, logs, learning_rate=summaries.learning_rate_of(self.optimizer), rates=rates)

    def end_epoch(self, epoch_logs: dict[str, Any]) -> None:
        """Moves the progress to the next epoch, writes its summaries and saves."""
        self.progress.epoch += 1
        self.progress.step_in_epoch = 0
        if self.summaries is not None:
            self.summaries.on_epoch_end(
                self.progress.global_step,
                epoch_logs,
                learning_rate=summaries.learning_rate_of(self.optimizer),
            )
        if self.checkpointer is not None:
            self.save()

    def save(self) -> str | None:
        """Writes a checkpoint of the current state (once per global step)."""
        if self._saved_at_step == self.progress.global_step and self.progress.step_in_epoch != 0:
            return None
        self.progress.batches_in_pass = self.plan.batches_in_pass(self.progress.step_in_epoch)
        timing_state = None
        if self.timer is not None:
            timing_state = {
                "timer": self.timer.state_dict(),
                "trace_count": self.trace_count() - self.traces_before,
            }
        path = self.checkpointer.save(self.progress, self.plan.next_iterator(), timing_state)
        self._saved_at_step = self.progress.global_step
        return path

    def close(self) -> None:
        """Stops the profiler and flushes the summaries (also after an error)."""
        if self.profile is not None:
            self.profile.close()
        if self.summaries is not None:
            self.summaries.close()
