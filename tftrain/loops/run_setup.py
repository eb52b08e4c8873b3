"""Starting one `Trainer.fit`: the services around its steps, and the run restored (`tftrain.loops.restore`).

`start_run` builds a `tftrain.loops.training_run.TrainingRun` from the
Trainer's frozen options and the `fit` call: with a `model_dir` it takes the
writer lock, composes the run's services, and runs the restore sequence
(`restore.restore_run`: find, validate, the run record, then each part loads
itself: the data pipeline, the progress with the model and optimizer, the
services' state, the data position).

The services are composed in one place, `_services`, in the order they run
after each host call: the NaN guard (or, with `on_nonfinite="rollback"`, the
loss recovery), the step budget, the call's own and the user's services, the
profiler, TensorBoard summaries, the best checkpoint, checkpoints, preemption
(which saves through the checkpoint service), HParams, the writer lock,
in-step summaries, the timing state (a service only where checkpoints keep
it) and, with `slurm_requeue`, the SLURM requeue (closed last, after the lock
is released). The run's own state besides (the data position, the run record)
is not a service: it is saved with the services' states, each part under its
name, and loads itself at a resume.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tftrain import checkpoint as checkpoint_lib
from tftrain import summaries, timing
from tftrain.arguments import check_profile_steps
from tftrain.checkpoint import run_record
from tftrain.checkpoint.data_position import DataPosition
from tftrain.checkpoint.layout import ModelDirLayout
from tftrain.checkpoint.writer_lock import WriterLock, check_writer
from tftrain.loops import restore
from tftrain.loops.owner import StepOwner
from tftrain.loops.preparation import FitCall
from tftrain.loops.restore import report_resume
from tftrain.loops.trainer_engines import Engines
from tftrain.loops.training_run import TrainingRun, close_all
from tftrain.options import RunOptions
from tftrain.services.best_checkpoint import BestCheckpointService
from tftrain.services.checkpointing import CheckpointService
from tftrain.services.hparams import HParamsService
from tftrain.services.lock_heartbeat import WriterLockService
from tftrain.services.loss_recovery import LossRecovery
from tftrain.services.multiworker_preemption import MultiWorkerPreemption, multiworker_preemption
from tftrain.services.nan_guard import NonFiniteGuard
from tftrain.services.periodic_validation import PeriodicValidation
from tftrain.services.preemption import PreemptionService
from tftrain.services.profiler import ProfilerService
from tftrain.services.protocol import Service
from tftrain.services.slurm_requeue import SlurmRequeue
from tftrain.services.step_budget import StepBudget
from tftrain.services.step_summaries import InStepSummaryService
from tftrain.services.tensorboard import SummaryService
from tftrain.services.timing_state import TimingService

__all__ = ["BUILT_IN_NAMES", "RunParts", "report_resume", "start_run"]

BUILT_IN_NAMES = frozenset(
    service.name
    for service in (
        NonFiniteGuard, LossRecovery, StepBudget, PeriodicValidation, ProfilerService, SummaryService,
        BestCheckpointService, CheckpointService, PreemptionService, MultiWorkerPreemption, WriterLockService,
        InStepSummaryService, TimingService, HParamsService, DataPosition, run_record.RunRecord, SlurmRequeue,
    )
)  # fmt: skip
"""The names of the built-in services and of the run's own saved state (a user's service cannot take one: its state is saved by name)."""


@dataclasses.dataclass(frozen=True)
class RunParts:
    """What the fit loop made for one run, besides the Trainer's options and the `fit` call.

    Attributes:
        timer: Times each host call (None: timing off).
        trace_counter: Counts the training step's traces (saved with checkpoints).
        services: The call's own services (a validation every N steps) and
            the user's, run after the NaN guard and the step budget and before
            the summaries and checkpoints; their state is saved by name.
        record: The call's run record (`tftrain.checkpoint.run_record.build`):
            compared with the checkpoint's at a resume, saved with every
            checkpoint, written to `model_dir/run_record.json` and shown in
            TensorBoard's HParams tab. None: no record.
        optimizers: The run's optimizers by their place in the record
            (`tftrain.checkpoint.run_record.optimizers_of`): each is compared
            at a resume, its new learning rate taken.
    """

    timer: timing.StepTimer | None
    trace_counter: timing.TraceCounter
    services: tuple[Service, ...] = ()
    record: dict[str, Any] | None = None
    optimizers: dict[str, Any] | None = None


def start_run(owner: StepOwner, call: FitCall, parts: RunParts) -> TrainingRun:
    """Sets up one `fit`: composes its services and restores the latest checkpoint.

    Args:
        owner: The Trainer: its model, options and global step.
        call: The `fit` call: its data plan, target, `verbosity` and `nonfinite_policy`.
        parts: What the fit loop made for the run.

    Returns:
        The `TrainingRun`, at the restored progress (or at the start).

    Raises:
        ValueError: `profile_steps` ends after the run's last step, `model_dir`
            cannot be written, a checkpoint exists but the model is not built
            to restore it, or two services share a name.
        tftrain.checkpoint.CheckpointError: the checkpoint cannot be used.
        tftrain.errors.RunChangedError: the call changed what the checkpoint
            cannot follow (nothing is restored).
    """
    options, plan = owner.run_options, call.plan
    owner.global_step.assign(0)  # a run without a checkpoint starts at 0, as its Progress does
    planned = call.target.planned_steps(call.plan.steps)
    window = check_profile_steps(options.profile_steps, planned) if options.profile_steps else None
    where = _ModelDir.of(owner) if options.model_dir is not None else None
    data = DataPosition(plan) if where is not None else None
    kept = where is not None and parts.record is not None
    record = run_record.RunRecord(parts.record, owner.model, parts.optimizers) if kept else None
    counter, traces_before = parts.trace_counter, parts.trace_counter.count
    # The timing state kept across a resume: a service only where checkpoints keep it.
    timing_service = TimingService(parts.timer, counter) if where is not None else None
    # The chief is the writer: one per model_dir, held before anything there is touched.
    lock = WriterLock(where.path) if where is not None and where.chief else None
    services: list[Service] = []
    checkpointer, progress = None, None
    try:
        checkpointer = where.checkpointer() if where is not None else None
        made = _Made(timing_service, where, checkpointer, data, lock, window)
        _services(services, owner, call, parts, made)
        lock = None  # a service of the run now (closing it twice is harmless)
        if checkpointer is not None:
            request = restore.RestoreRequest(
                options, owner.model, data, tuple(services), record, call.verbosity,
                writes_record_file=where.chief, built_in_names=BUILT_IN_NAMES,
            )  # fmt: skip
            progress = restore.restore_run(checkpointer, request)
            _check_profile_window(options, window if where.chief else None, progress)
    except BaseException:
        with contextlib.suppress(Exception):  # the setup's error is the one to report
            close_all(services)  # what the services hold: writers, signal handlers, the lock
        if lock is not None:
            lock.close()
        raise
    return TrainingRun(
        plan,
        progress or checkpoint_lib.Progress(),
        services,
        checkpointer=checkpointer,
        timer=parts.timer,
        trace_count=timing_service.trace_count if timing_service else lambda: counter.count - traces_before,
        saved_parts=tuple(part for part in (data, record) if part is not None),
        total_steps=call.target.total_steps,
    )


@dataclasses.dataclass(frozen=True)
class _Made:
    """What the services act on, made before them (where a run has no `model_dir`, what it needs is None)."""

    timing: TimingService | None
    where: _ModelDir | None
    checkpointer: checkpoint_lib.Checkpointer | None
    data: DataPosition | None
    lock: WriterLock | None
    window: tuple[int, int] | None


def _services(
    services: list[Service], owner: StepOwner, call: FitCall, parts: RunParts, made: _Made
) -> list[Service]:
    """The run's services, composed here alone, in the order they run; checks their names. Returns `services`.

    Each is appended as soon as it exists, so an error while the next is made
    closes it (its writer, its signal handlers). The services that write to
    `model_dir` (from the profiler to the writer lock) exist only with one.
    """
    options, policy, where, record, timer = owner.run_options, call.nonfinite_policy, made.where, parts.record, parts.timer
    chief = where is not None and where.chief
    optimizer = getattr(owner.model, "optimizer", None)
    writer = summaries.TrainingSummaries(where.path, every_steps=options.summary_every_steps) if chief else None
    preemption = None
    if policy.rollback and where is not None:  # it keeps states at the run's checkpoint steps too
        every = options.checkpoint_every_steps
        services.append(LossRecovery(policy, optimizer=optimizer, checkpoint_every_steps=every, verbose=call.verbosity,
                                     writer=writer))  # fmt: skip
    elif policy.terminate_on_nan:
        services.append(NonFiniteGuard(policy, checkpoints=where is not None))
    if call.target.total_steps is not None:
        services.append(StepBudget(call.target.total_steps))
    services.extend(parts.services)
    if chief and made.window is not None:
        services.append(ProfilerService(summaries.ProfileWindow(where.layout.train, made.window)))
    if writer is not None:
        services.append(SummaryService(writer, timer, optimizer))
    if chief and options.best_checkpoint_monitor is not None:  # before the checkpoint: it saves the best value
        monitor, mode = options.best_checkpoint_monitor, options.best_checkpoint_mode
        services.append(BestCheckpointService(where.checkpointer(best=True), monitor, mode,
                                              weights=where.averaged_weights))  # fmt: skip
    if where is not None:
        checkpoints = CheckpointService(made.checkpointer, options.checkpoint_every_steps, timer, where.scratch_dir,
                                        data=made.data)  # fmt: skip
        services.append(checkpoints)
        preemption = _preemption(options.preemption_signals, checkpoints, where.place)  # saves through `checkpoints`
        services.extend([preemption] if preemption is not None else [])
    if chief and record is not None:  # closed after the saves: its end says the run ended well
        services.append(HParamsService(where.layout.root, record))
    if made.lock is not None:  # released at the run's end, after the last save
        services.append(WriterLockService(made.lock))
    step_summaries = owner.engines.in_step_summaries(options.model_dir, options.summary_every_steps)
    if step_summaries is not None:
        services.append(InStepSummaryService(step_summaries))
    services.extend([made.timing] if made.timing is not None else [])
    if chief and preemption is not None and options.slurm_requeue:  # last: closed after the lock's release
        services.append(SlurmRequeue(preemption))
    _check_names(services)
    return services


def _preemption(signals: tuple[int, ...], checkpoints: CheckpointService, place: Engines) -> Service | None:
    """The preemption service of this process (one process, or several workers), or None."""
    if not signals:
        return None
    if place.workers == 1:
        return PreemptionService(signals, checkpoints)
    return multiworker_preemption(signals, checkpoints, place.strategy.cluster_resolver, place.worker)



@dataclasses.dataclass(frozen=True)
class _ModelDir:
    """A run's `model_dir`, where this process stands in the run, and what its checkpoints save."""

    path: str
    options: RunOptions
    place: Engines  # where this process stands: `Engines.worker`, `Engines.workers`
    model: Any
    extra_state: Callable[[], dict[str, Any]]
    global_step: tf.Variable | None
    averaged_weights: Callable[[], contextlib.AbstractContextManager[None]] | None = None

    @classmethod
    def of(cls, owner: StepOwner) -> _ModelDir:
        """The Trainer's `model_dir` (created, checked writable) and this process's place in the run."""
        options = owner.run_options
        path = checkpoint_lib.ensure_writable_directory(options.model_dir, "model_dir")
        averaged = owner.averaged_weights if owner.ema_decay is not None else None
        return cls(path, options, owner.engines, owner.model, owner.checkpoint_state, owner.global_step, averaged)

    @property
    def chief(self) -> bool:
        return self.place.worker[0]

    @property
    def layout(self) -> ModelDirLayout:
        """Every path under `model_dir`."""
        return ModelDirLayout(self.path)

    @property
    def scratch_dir(self) -> str | None:
        """A non-chief worker's own directory (its checkpoint copies), removed when the run ends."""
        return None if self.chief else self.layout.worker(self.place.worker[1])

    def checkpointer(self, *, best: bool = False) -> checkpoint_lib.Checkpointer:
        """The run's checkpointer (a non-chief worker's saves to its scratch directory), or the best checkpoint's.

        The chief's check, before each write, that it still holds `model_dir`'s writer lock.
        """
        checkpoints = self.layout.checkpoints
        if best:
            directory, max_to_keep, restore_directory = self.layout.best, 1, None
        elif self.chief:
            directory, max_to_keep, restore_directory = checkpoints, self.options.max_to_keep, None
        else:
            scratch = ModelDirLayout(self.scratch_dir).checkpoints
            directory, max_to_keep, restore_directory = scratch, 1, checkpoints
        return checkpoint_lib.Checkpointer(
            directory,
            lambda: checkpoint_lib.training_state(self.model, self.extra_state()),
            max_to_keep=max_to_keep,
            restore_directory=restore_directory,
            global_step=self.global_step,
            async_write=self.options.async_checkpoint,
            writer_check=(lambda: check_writer(self.path)) if self.chief else None,
        )


def _check_profile_window(options: RunOptions, window: tuple[int, int] | None, progress: Any) -> None:
    """Warns where the profiler's window starts at or before the step the run resumes at (nothing is profiled)."""
    step = progress.global_step if progress is not None else 0
    if window is not None and step > window[0] - 1:
        warnings.warn(
            f"profile_steps={options.profile_steps} starts at or before step {step}, "
            "where this run resumes: nothing is profiled. Expected a window after the resume point.",
            stacklevel=4,
        )


def _check_names(services: list[Service]) -> None:
    """Each service's state is saved under its name: two services of a run cannot share one."""
    names = [service.name for service in services]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(
            f"Invalid value for argument `services`. Received: services named {repeated}, which "
            f"another service of the run uses (the run's services: {names}). Expected a distinct "
            "`name` for each service: it names the service's state in a checkpoint."
        )
