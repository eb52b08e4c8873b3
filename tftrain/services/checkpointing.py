"""Checkpoint saves: every N steps and at each epoch end."""

from __future__ import annotations

import os
import time
from typing import Any

import tensorflow as tf

from tftrain import timing
from tftrain.checkpoint import Checkpointer
from tftrain.checkpoint.data_position import DataPosition
from tftrain.services.protocol import EveryNSteps, RunState, Service


class CheckpointService(Service):
    """Saves checkpoints every N steps and at each epoch end; removes a worker's scratch copies at the end.

    Other services that must save now (a preemption) call `save(run, wait=True)`.
    Nothing is saved once a step of the run had a non-finite loss
    (`RunState.nonfinite_step`: a `fit` whose `TerminateOnNaN` callback
    decides what a NaN does).

    Args:
        checkpointer: Writes the checkpoints.
        every_steps: Also save every this many steps (None: epoch ends only).
        timer: The step timer that records save times, or None.
        scratch_dir: A non-chief worker's own checkpoint directory, removed at `close`.
        data: The training data's position: it says what a checkpoint saves
            of the data (the iterator, a shuffled array pass's order). None:
            the iterator, where `tf.data` can save it.
    """

    name = "checkpoint"

    def __init__(
        self,
        checkpointer: Checkpointer,
        every_steps: int | None,
        timer: timing.StepTimer | None,
        scratch_dir: str | None = None,
        *,
        data: DataPosition | None = None,
    ):
        self.checkpointer = checkpointer
        self.data = data
        self.when = EveryNSteps(every_steps)
        self.timer = timer
        self.scratch_dir = scratch_dir
        self._saved_at_step: int | None = None

    @property
    def directory(self) -> str:
        """Where this process writes its checkpoints."""
        return self.checkpointer.directory

    @property
    def latest(self) -> str | None:
        """The newest checkpoint this process wrote (waits for a pending asynchronous write)."""
        self.checkpointer.sync()
        return self.checkpointer.manager.latest_checkpoint

    def shared_path(self, path: str) -> str:
        """The run's copy of a checkpoint this process wrote (a non-chief worker's is the chief's)."""
        return os.path.join(self.checkpointer.restore_directory, os.path.basename(path))

    def next_stop(self, step: int) -> int | None:
        return self.when.next_stop(step)

    def after_call(self, run: RunState, result: Any) -> None:
        step = run.progress.global_step
        # No step checkpoint where the epoch ends (its last step, the budget): its checkpoint follows.
        if self.when.reached(step - result.steps, step) and not run.epoch_ending:
            self.save(run)

    def end_epoch(self, run: RunState, logs: dict[str, Any]) -> None:
        self.save(run)

    def save(self, run: RunState, *, wait: bool = False) -> str | None:
        """Writes a checkpoint of the run as it is now (once per global step).

        Args:
            run: The run.
            wait: Return only once the checkpoint is on disk (an asynchronous
                write completes first); the process may exit next.

        Returns:
            The checkpoint's path (the one already written at this step, if
            any). Once a step of the run had a non-finite loss, nothing is
            written: the last checkpoint written before it (None if none).
        """
        run.settle()  # a save waits for the loss check of the steps it holds
        progress = run.progress
        if run.nonfinite_step is not None:  # no checkpoint holds a non-finite step's state
            path = self.latest
        elif self._saved_at_step == progress.global_step and progress.step_in_epoch != 0:
            path = self.latest
        else:
            iterator, progress.batches_in_pass = run.data_position()
            start = time.perf_counter()
            data = self.data
            path = self.checkpointer.save(
                progress,
                data.saved_iterator(iterator) if data is not None else iterator,
                run.service_states(),
                number=progress.global_step,
                data_state=data.variables() if data is not None else None,
            )
            if self.timer is not None:
                self.timer.record_checkpoint_save(time.perf_counter() - start)
            self._saved_at_step = progress.global_step
        if wait:
            self.checkpointer.sync()
        return path

    def close(self) -> None:
        self.checkpointer.close()
        if self.scratch_dir is not None and tf.io.gfile.exists(self.scratch_dir):
            tf.io.gfile.rmtree(self.scratch_dir)
