"""Starting one `Trainer.fit`: the progress it resumes from and the services around its steps.

`start_run` builds a `tftrain.loops.training_run.TrainingRun` from the frozen
`RunOptions`: the progress (restored from the latest checkpoint, or from
`resume_from`), and the services (`tftrain.services.protocol`) that stop on a
non-finite loss, run the profiler window, keep the timing, write TensorBoard
summaries and save checkpoints, in the order they run after each host call.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tftrain import checkpoint as checkpoint_lib
from tftrain import distribute, summaries, timing
from tftrain.checkpoint import data_position
from tftrain.checkpoint.writer_lock import WriterLock
from tftrain.data import inputs
from tftrain.loops.training_run import TrainingRun
from tftrain.options import RunOptions, check_profile_steps
from tftrain.services.best_checkpoint import BestCheckpointService
from tftrain.services.checkpointing import CheckpointService
from tftrain.services.data_position import DataCheckpointService
from tftrain.services.multiworker_preemption import multiworker_preemption
from tftrain.services.nan_guard import NonFiniteGuard
from tftrain.services.preemption import PreemptionService
from tftrain.services.profiler import ProfilerService
from tftrain.services.protocol import Service
from tftrain.services.step_budget import StepBudget
from tftrain.services.step_summaries import InStepSummaries, InStepSummaryService
from tftrain.services.tensorboard import SummaryService
from tftrain.services.timing_state import TimingService
from tftrain.services.writer_lock import WriterLockService

__all__ = ["report_resume", "start_run"]


@dataclasses.dataclass(frozen=True)
class _RunPlace:
    """Where a run happens: this process's role, and whether other worker processes take part."""

    worker: tuple[bool, str] = (True, "chief")  # (is_chief, name): `tftrain.distribute.worker_role`
    single_process: bool = True
    cluster_resolver: Any = None  # multi-worker runs agree on a preemption step through it

    @classmethod
    def of(cls, strategy: tf.distribute.Strategy | None) -> _RunPlace:
        if strategy is None:
            return cls()
        return cls(
            distribute.worker_role(strategy),
            distribute.num_workers(strategy) == 1,
            getattr(strategy, "cluster_resolver", None),
        )


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
    strategy: tf.distribute.Strategy | None = None,
    total_steps: int | None = None,
    extra_services: tuple[Service, ...] = (),
    global_step: tf.Variable | None = None,
    in_step_summaries: Callable[[], InStepSummaries | None] | None = None,
) -> TrainingRun:
    """Sets up one `fit`: builds its services and restores the latest checkpoint.

    Args:
        options: The run options.
        model: The model being trained (its optimizer's learning rate is logged).
        extra_state: Returns more trackables to checkpoint (a Trainer subclass's own state).
        plan: The training data plan; resumed at the checkpoint's data position.
        epochs: Epochs of the whole run (the target a resumed run trains up to).
        timer: The step timer (restored from the checkpoint), or None.
        trace_counter: The training step's trace counter.
        verbose: Print where a resumed run starts (it is logged either way).
        strategy: The run's strategy (None: one process). In a multi-worker
            run only the chief writes to `model_dir`; another worker restores
            the chief's checkpoints and saves its own copies (every worker
            must take part in a save) to `model_dir/workers/<name>`, removed
            when the run ends, and a preemption signal that reaches any worker
            makes all of them save at one step and stop
            (`tftrain.services.multiworker_preemption`).
        extra_services: More services, run after the NaN guard and the step
            budget and before the summaries and checkpoints (e.g. a periodic
            validation, whose logs the summaries write).
        total_steps: End the run after this many training steps in all (a
            resumed run trains up to it); None: the epochs decide.
        global_step: The run's global step variable (the training loop
            increments it before each step): set to 0, or restored from the
            checkpoint, and saved with every checkpoint. None: counted on
            the host only.
        in_step_summaries: Returns the writer and cadence for `tf.summary`
            calls inside the training step, or None (called once `model_dir`
            is this run's: the writer creates `model_dir/train`).

    Returns:
        The `TrainingRun`, at the restored progress (or at the start).

    Raises:
        ValueError: `profile_steps` ends after the run's last step, `model_dir`
            cannot be written, or a checkpoint exists but the model is not
            built to restore it.
        tftrain.checkpoint.CheckpointError: the checkpoint cannot be used.
    """
    place = _RunPlace.of(strategy)
    if global_step is not None:
        global_step.assign(0)  # a run without a checkpoint starts at 0, as its Progress does
    planned_steps = epochs * plan.steps if plan.steps is not None else None
    if total_steps is not None:
        planned_steps = total_steps
    window = check_profile_steps(options.profile_steps, planned_steps)
    timing_service = TimingService(timer, trace_counter)
    services: list[Service] = [NonFiniteGuard()] if options.terminate_on_nan else []
    if total_steps is not None:
        services.append(StepBudget(total_steps))
    services.extend(extra_services)
    checkpointer = None
    progress = checkpoint_lib.Progress()
    if options.model_dir is not None:
        model_dir = checkpoint_lib.ensure_writable_directory(options.model_dir, "model_dir")
        chief, _ = place.worker
        # The chief is the writer: one per model_dir, held before anything there is touched.
        lock = WriterLock(model_dir) if chief else None
        try:
            checkpointer, progress = _model_dir_services(
                options,
                model,
                extra_state,
                plan,
                window,
                timer,
                timing_service,
                services,
                model_dir,
                place,
                verbose,
                global_step,
            )
        except BaseException:
            if lock is not None:
                lock.close()
            raise
        if lock is not None:
            services.append(WriterLockService(lock))
    step_summaries = in_step_summaries() if in_step_summaries is not None else None
    if step_summaries is not None:
        services.append(InStepSummaryService(step_summaries))
    services.append(timing_service)
    return TrainingRun(
        plan,
        progress,
        services,
        checkpointer=checkpointer,
        timing_service=timing_service,
        total_steps=total_steps,
    )


def _model_dir_services(
    options: RunOptions,
    model: Any,
    extra_state: Callable[[], dict[str, Any]],
    plan: inputs.EpochPlan,
    window: tuple[int, int] | None,
    timer: timing.StepTimer | None,
    timing_service: TimingService,
    services: list[Service],
    model_dir: str,
    place: _RunPlace,
    verbose: int,
    global_step: tf.Variable | None,
) -> tuple[checkpoint_lib.Checkpointer, checkpoint_lib.Progress]:
    """Restores the latest checkpoint and appends the services that write to `model_dir`."""
    chief, worker_name = place.worker
    progress = checkpoint_lib.Progress()
    checkpoints = f"{model_dir}/checkpoints"
    scratch_dir = None if chief else f"{model_dir}/workers/{worker_name}"
    checkpointer = checkpoint_lib.Checkpointer(
        checkpoints if chief else f"{scratch_dir}/checkpoints",
        lambda: checkpoint_lib.training_state(model, extra_state()),
        max_to_keep=options.max_to_keep if chief else 1,
        restore_directory=None if chief else checkpoints,
        global_step=global_step,
        async_write=options.async_checkpoint,
    )
    if (checkpointer.latest or options.resume_from) is not None and not model.built:
        raise ValueError(
            f"Cannot resume from {checkpointer.latest or options.resume_from}: the model is not built yet, so its variables "
            "do not exist to be restored. Expected a built model: call it once on a batch, or "
            "`model.build(input_shape)`, before `fit`."
        )
    data_mode = _prepare_data_checkpoint(plan, checkpointer, options.resume_from)
    if data_mode is not None:
        services.append(DataCheckpointService(data_mode))
    restored = checkpointer.restore_latest(plan.next_iterator())
    source = checkpointer.latest
    if restored is None and options.resume_from is not None:  # model_dir's own checkpoints win
        source, restored = checkpointer.restore_from(options.resume_from, plan.next_iterator())
    if restored is not None:
        progress = restored
        plan.resume(progress.batches_in_pass, progress.step_in_epoch, checkpointer.iterator_restored)
        if "timing" in checkpointer.service_states:
            timing_service.load_state_dict(checkpointer.service_states["timing"])
        report_resume(
            f"tftrain: resumed from {source} at step {progress.global_step} "
            f"(epoch {progress.epoch + 1}, step {progress.step_in_epoch} of the epoch).",
            verbose,
        )
    if chief and window is not None:
        services.append(ProfilerService(summaries.ProfileWindow(f"{model_dir}/train", window)))
        if progress.global_step > window[0] - 1:
            warnings.warn(
                f"profile_steps={options.profile_steps} starts at or before step {progress.global_step}, "
                "where this run resumes: nothing is profiled. Expected a window after the resume point.",
                stacklevel=4,
            )
    if chief:
        writer = summaries.TrainingSummaries(model_dir, every_steps=options.summary_every_steps)
        # A resumed run's first call is not the job's trace: its trace time was written already.
        services.append(
            SummaryService(
                writer,
                timer,
                getattr(model, "optimizer", None),
                trace_written=progress.global_step > 0,
            )
        )
    if chief and options.best_checkpoint_monitor is not None:
        # Before the regular checkpoint: the best value it saves must include this epoch's.
        best = BestCheckpointService(
            checkpoint_lib.Checkpointer(
                f"{model_dir}/best",
                lambda: checkpoint_lib.training_state(model, extra_state()),
                max_to_keep=1,
                global_step=global_step,
                async_write=options.async_checkpoint,
            ),
            options.best_checkpoint_monitor,
            options.best_checkpoint_mode,
        )
        if "best_checkpoint" in checkpointer.service_states:
            best.load_state_dict(checkpointer.service_states["best_checkpoint"])
        services.append(best)
    checkpoint_service = CheckpointService(
        checkpointer,
        options.checkpoint_every_steps,
        timer,
        scratch_dir,
        save_iterator=data_mode != data_position.POSITION,
    )
    services.append(checkpoint_service)
    if options.preemption_signals and place.single_process:
        services.append(PreemptionService(options.preemption_signals, checkpoint_service))
    elif options.preemption_signals:
        preemption = multiworker_preemption(
            options.preemption_signals, checkpoint_service, place.cluster_resolver, place.worker
        )
        if preemption is not None:
            services.append(preemption)
    return checkpointer, progress


def _prepare_data_checkpoint(
    plan: inputs.EpochPlan, checkpointer: checkpoint_lib.Checkpointer, resume_from: str | None
) -> str | None:
    """Chooses how checkpoints keep the data position (that of the checkpoint to resume, if any).

    Returns the mode, or None where the iterators are distributed (never saved).
    """
    if not plan.plain_iterators:
        return None
    states = checkpointer.read_service_states()
    if checkpointer.latest is None and resume_from is not None:
        path, _ = checkpoint_lib.open_checkpoint(resume_from, "resume_from")
        states = checkpointer.read_service_states(path)
    mode, plan.dataset = data_position.prepare(plan.dataset, data_position.saved_mode(states))
    return mode
