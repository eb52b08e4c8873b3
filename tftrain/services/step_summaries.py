"""`tf.summary` inside the training step: the default writer, step and cadence during `fit`.

A traced step captures the default summary writer and the `record_if`
condition when it is traced, so both (and the variables the condition reads)
belong to the Trainer, made once and kept across its `fit` calls; a fit's
`InStepSummaryService` only enters them while it runs. The writer's event
file is open only during a fit: closed when the fit ends (returns or
raises), a new one opened by the next.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from tftrain.checkpoint.layout import ModelDirLayout
from tftrain.compat import tf_internals
from tftrain.services.protocol import RunState, Service


class InStepSummaries:
    """The writer (`log_dir/train`) and the record condition of summaries written inside training steps.

    Steps are recorded at every multiple of `every_steps` and at the last
    step of each epoch (or of a step budget), where the Trainer's own
    summaries are written too.

    Args:
        log_dir: The run's directory (`model_dir`).
        global_step: The run's global step variable, incremented before each step.
        every_steps: The summary cadence in steps, or None (epoch ends only).
    """

    def __init__(self, log_dir: str, global_step: tf.Variable, every_steps: int | None):
        self.log_dir = ModelDirLayout(log_dir).train
        with tf.init_scope():
            self.writer = tf.summary.create_file_writer(self.log_dir)
            self.record_at = tf.Variable(-1, dtype=tf.int64, trainable=False, name="summary_record_at")
        self.global_step = global_step
        self.every_steps = every_steps
        self._file_open = True

    def open(self) -> None:
        """Opens a new event file where the last fit closed its own."""
        if not self._file_open:
            with tf.init_scope():
                tf_internals.reopen_summary_file(self.writer, self.log_dir)
            self._file_open = True

    def close(self) -> None:
        """Writes what is pending and closes the event file (the writer serves the next fit)."""
        if self._file_open:
            self._file_open = False
            with tf.init_scope():
                try:
                    self.writer.flush()
                finally:
                    tf_internals.close_summary_file(self.writer)

    def should_record(self) -> tf.Tensor:
        """Whether the current step records its summaries (read in the graph at each step)."""
        step = tf.convert_to_tensor(self.global_step)
        due = tf.equal(step, self.record_at)
        if self.every_steps:
            due = tf.logical_or(due, tf.equal(step % self.every_steps, 0))
        return due


class InStepSummaryService(Service):
    """Sets the default writer, step and `record_if` for a fit's training steps; restores them at the end.

    Args:
        state: The Trainer's `InStepSummaries`.
    """

    name = "step_summaries"

    def __init__(self, state: InStepSummaries):
        self.state = state
        self._record_at: int | None = None
        self._contexts = contextlib.ExitStack()
        state.open()
        self._contexts.enter_context(state.writer.as_default(step=state.global_step))
        self._contexts.enter_context(tf.summary.record_if(state.should_record))

    def before_call(self, run: RunState) -> None:
        end = None
        if run.epoch_steps is not None:
            end = run.progress.global_step - run.progress.step_in_epoch + run.epoch_steps
        if run.total_steps is not None:
            end = run.total_steps if end is None else min(end, run.total_steps)
        end = -1 if end is None else end
        if end != self._record_at:  # one assignment per epoch, not per call
            self.state.record_at.assign(end)
            self._record_at = end

    def close(self) -> None:
        self._contexts.close()
        self.state.close()
