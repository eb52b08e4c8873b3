"""What happens around the step loop in one `Trainer.fit`: progress, checkpoints, summaries.

A `TrainingRun` counts the global step, stops on a non-finite loss, writes
TensorBoard summaries, runs the profiler window, and saves checkpoints every N
steps and at each epoch end. It also tells the loop where a host call must end
(a checkpoint or profiler edge), so a `steps_per_loop` call never jumps over one.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from tftrain import checkpoint as checkpoint_lib
from tftrain import hooks, inputs, loops, summaries, timing


class NonFiniteLossError(FloatingPointError):
    """A training step produced a NaN or infinite loss; training stopped at that step."""


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What a `Trainer.fit` writes and guards around its steps (see `Trainer` for each field).

    Validated on construction; `model_dir` is created and checked for writing.

    Raises:
        TypeError, ValueError: a bad value, or an option that needs `model_dir` without it.
    """

    model_dir: str | None = None
    checkpoint_every_steps: int | None = None
    max_to_keep: int = 5
    summary_every_steps: int | None = None
    profile_steps: tuple[int, int] | None = None
    terminate_on_nan: bool = True

    def __post_init__(self):
        summaries.check_every_steps(self.checkpoint_every_steps, "checkpoint_every_steps")
        summaries.check_every_steps(self.summary_every_steps, "summary_every_steps")
        max_to_keep = self.max_to_keep
        if isinstance(max_to_keep, bool) or not isinstance(max_to_keep, int) or max_to_keep < 1:
            raise ValueError(
                f"Invalid value for argument `max_to_keep`. Received: max_to_keep={max_to_keep!r}. "
                "Expected an integer >= 1."
            )
        if not isinstance(self.terminate_on_nan, bool):
            raise TypeError(
                "Invalid value for argument `terminate_on_nan`. Received: "
                f"terminate_on_nan={self.terminate_on_nan!r}. Expected True or False."
            )
        object.__setattr__(self, "profile_steps", summaries.check_profile_steps(self.profile_steps))
        if self.model_dir is None:
            for name in ("checkpoint_every_steps", "summary_every_steps", "profile_steps"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"Invalid combination of arguments. Received: {name}={getattr(self, name)!r} with "
                        "model_dir=None. Expected a `model_dir` to write checkpoints, summaries and "
                        "profiles to."
                    )
        else:
            directory = checkpoint_lib.ensure_writable_directory(self.model_dir, "model_dir")
            object.__setattr__(self, "model_dir", directory)


def report_resume(message: str, verbose: int) -> None:
    """Logs where a run resumed (`tftrain` logger), and prints it unless `verbose` is 0."""
    logging.getLogger("tftrain").info(message)
    if verbose:
        print(message)


def start_run(
    options: RunOptions,
    *,
    model: Any,
    extra_state: Callable[[], dict[str, Any]],
    plan: inputs.EpochPlan,
    epochs: int,
    timer: timing.StepTimer | None,
    trace_counter: timing.TraceCounter,
    verbose: int = 1,
    worker: tuple[bool, str] = (True, "chief"),
) -> TrainingRun:
    """Sets up one `fit`: checkpoints, summaries, profiler; restores the latest checkpoint.

    Args:
        options: The run options.
        model: The model being trained (its optimizer's learning rate is logged).
        extra_state: Returns more trackables to checkpoint (a Trainer subclass's own state).
        plan: The training data plan; resumed at the checkpoint's data position.
        epochs: Epochs of the whole run (the target a resumed run trains up to).
        timer: The step timer (restored from the checkpoint), or None.
        trace_counter: The training step's trace counter.
        verbose: Print where a resumed run starts (it is logged either way).
        worker: `(is_chief, name)` of this process in a multi-worker run
            (`tftrain.distribute.worker_role`). Only the chief writes to
            `model_dir`; another worker restores the chief's checkpoints and
            saves its own copies (every worker must take part in a save) to
            `model_dir/workers/<name>`, removed when the run ends.

    Returns:
        The `TrainingRun`, at the restored progress (or at the start).

    Raises:
        ValueError: `profile_steps` ends after the run's last step, or a
            checkpoint exists but the model is not built to restore it.
        tftrain.checkpoint.CheckpointError: the checkpoint cannot be used.
    """
    total_steps = epochs * plan.steps if plan.steps is not None else None
    window = summaries.check_profile_steps(options.profile_steps, total_steps)
    progress = checkpoint_lib.Progress()
    checkpointer = writer = profile = None
    restored_traces = 0
    chief, worker_name = worker
    scratch_dir = None
    if options.model_dir is not None:
        checkpoints = f"{options.model_dir}/checkpoints"
        if not chief:
            scratch_dir = f"{options.model_dir}/workers/{worker_name}"
        checkpointer = checkpoint_lib.Checkpointer(
            checkpoints if chief else f"{scratch_dir}/checkpoints",
            lambda: checkpoint_lib.training_state(model, extra_state()),
            max_to_keep=options.max_to_keep if chief else 1,
            restore_directory=None if chief else checkpoints,
        )
        if checkpointer.latest is not None and not model.built:
            raise ValueError(
                f"Cannot resume from {checkpointer.latest}: the model is not built yet, so its variables "
                "do not exist to be restored. Expected a built model: call it once on a batch, or "
                "`model.build(input_shape)`, before `fit`."
            )
        restored = checkpointer.restore_latest(plan.next_iterator())
        if restored is not None:
            progress = restored
            plan.resume(progress.batches_in_pass, progress.step_in_epoch, checkpointer.iterator_restored)
            state = checkpointer.timing_state
            if state is not None and timer is not None:
                timer.load_state_dict(state["timer"])
                restored_traces = int(state["trace_count"])
            report_resume(
                f"tftrain: resumed from {checkpointer.latest} at step {progress.global_step} "
                f"(epoch {progress.epoch + 1}, step {progress.step_in_epoch} of the epoch).",
                verbose,
            )
        if chief:
            writer = summaries.TrainingSummaries(options.model_dir, every_steps=options.summary_every_steps)
            if window is not None:
                profile = summaries.ProfileWindow(f"{options.model_dir}/train", window)
    run = TrainingRun(
        plan,
        progress,
        timer=timer,
        trace_count=lambda: trace_counter.count,
        checkpointer=checkpointer,
        checkpoint_every_steps=options.checkpoint_every_steps,
        summaries_writer=writer,
        profile=profile,
        optimizer=getattr(model, "optimizer", None),
        terminate_on_nan=options.terminate_on_nan,
    )
    run.scratch_dir = scratch_dir
    run.resumed = progress.global_step > 0 or progress.epoch > 0
    run.traces_before = trace_counter.count - restored_traces
    if progress.global_step > 0:
        # The restored first call was the job's trace; this process's is not its first step.
        run._trace_written = True
        if profile is not None and progress.global_step > profile.start - 1:
            warnings.warn(
                f"profile_steps={options.profile_steps} starts at or before step {progress.global_step}, "
                "where this run resumes: nothing is profiled. Expected a window after the resume point.",
                stacklevel=3,
            )
    return run


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
        plan: inputs.EpochPlan,
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
        self.scratch_dir: str | None = None  # a non-chief worker's own checkpoints
        self.resumed = False  # whether the progress came from a checkpoint
        self.timer = timer
        self._trace_count = trace_count
        self.checkpointer = checkpointer
        self.checkpoint_every_steps = checkpoint_every_steps
        self.summaries = summaries_writer
        self.profile = profile
        self.optimizer = optimizer
        self.terminate_on_nan = terminate_on_nan
        self._trace_written = False
        self._saved_at_step: int | None = None
        self.traces_before = 0

    def trace_count(self) -> int:
        """Traces of the training step in this run (a resumed run adds the checkpointed count)."""
        return self._trace_count() - self.traces_before

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
            losses = {
                key: np.asarray(value).tolist()
                for key, value in result.logs.items()
                if loops.is_loss_key(key)
            }
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
            crossed = (
                self.progress.global_step // self.checkpoint_every_steps
                > before // self.checkpoint_every_steps
            )
            if crossed and self.progress.step_in_epoch != epoch_steps:
                self.save()

    def _write_step_summaries(self, before: int, logs: Any) -> None:
        step = self.progress.global_step
        if not self._trace_written and self.timer is not None and self.timer.first_call_s is not None:
            self.summaries.on_trace(step, self.timer.first_call_s)
            self._trace_written = True
        if self.summaries.due(before, step):
            rates = self.timer.take_window() if self.timer is not None else {}
            self.summaries.on_steps(
                step, logs, learning_rate=summaries.learning_rate_of(self.optimizer), rates=rates
            )

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
        # The iterator first: at an epoch end it starts the next pass, which has read no batch yet.
        iterator = self.plan.next_iterator()
        self.progress.batches_in_pass = self.plan.batches_in_pass(self.progress.step_in_epoch)
        timing_state = None
        if self.timer is not None:
            timing_state = {
                "timer": self.timer.state_dict(),
                "trace_count": self.trace_count(),
            }
        start = time.perf_counter()
        path = self.checkpointer.save(self.progress, iterator, timing_state)
        if self.timer is not None:
            self.timer.record_checkpoint_save(time.perf_counter() - start)
        self._saved_at_step = self.progress.global_step
        return path

    def close(self) -> None:
        """Stops the profiler, flushes the summaries and removes a worker's scratch checkpoints."""
        if self.profile is not None:
            self.profile.close()
        if self.summaries is not None:
            self.summaries.close()
        if self.scratch_dir is not None and tf.io.gfile.exists(self.scratch_dir):
            tf.io.gfile.rmtree(self.scratch_dir)


def run_pass(
    plan: inputs.EpochPlan,
    step_loop: loops.StepLoop,
    on_batch_begin: Callable[..., Any],
    on_batch_end: Callable[..., Any],
    *,
    steps_per_loop: int,
    timer: timing.StepTimer | None = None,
    run: TrainingRun | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> Any:
    """Runs one epoch (or one evaluation or prediction) of host calls; returns the last logs.

    With a `run` (training), the epoch starts at the run's step in the
    epoch (after a resume) and host calls end at checkpoint and profiler
    edges. `should_stop()` is asked after each call (e.g. `model.stop_training`).
    Every `on_batch_begin` is matched by an `on_batch_end`: where no count
    says where the data ends, the next batch is fetched before the hook.
    """
    target = plan.steps
    step = run.progress.step_in_epoch if run is not None else 0
    logs, data_ended = None, False
    try:
        iterator = plan.begin_epoch()
        while target is None or step < target:
            wanted = steps_per_loop
            if target is not None:
                wanted = min(wanted, target - step)
            left = plan.batches_left(step)
            if left is not None:
                if left <= 0:  # the pass ended before the epoch: no hook for a call with no step
                    data_ended = True
                    break
                wanted = min(wanted, left)
            if run is not None:
                wanted = run.steps_allowed(wanted)
                run.before_call()
            if timer is not None:
                timer.begin_call()
            first = None
            if plan.may_end_unannounced:
                first = step_loop.peek(iterator)  # part of the call's time: it fetched the first batch
                if not first.has_value():
                    data_ended = True
                    break
            hook_start = time.perf_counter()
            on_batch_begin(step)
            if timer is not None:
                timer.exclude(time.perf_counter() - hook_start)
            traces_before = step_loop.trace_counter.count
            result = step_loop(iterator, wanted, first)
            if timer is not None:
                hooks.block_until_ready(result.logs)
                timer.end_call(
                    result.steps, result.examples, traced=step_loop.trace_counter.count != traces_before
                )
            if run is not None:
                run.after_call(result, target)
            if result.steps:
                step += result.steps
                logs = result.logs
                on_batch_end(step - 1, logs)
            if result.steps < wanted:
                data_ended = True
                break
            if should_stop():
                break
    except BaseException:
        plan.close()
        raise
    plan.end_epoch(step, data_ended)
    return logs
