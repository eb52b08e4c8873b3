"""Starting one `Trainer.fit`: the run restored (`tftrain.loops.restore`) and the services around its steps.

`start_run` builds a `tftrain.loops.training_run.TrainingRun` from the
Trainer's frozen options and the `fit` call: with a `model_dir` it takes the
writer lock and runs the restore sequence (`restore.restore_run`: find,
validate, model and optimizer, the services' state, the data position),
building the services from what it restored.

The services run in this order after each host call: the NaN guard (or, with
`on_nonfinite="rollback"`, the loss recovery), the step budget, the call's own and the user's services, the profiler, TensorBoard
summaries, the best checkpoint, checkpoints, preemption, the run record and
HParams, the writer lock, in-step summaries and timing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tftrain import checkpoint as checkpoint_lib
from tftrain import distribute, summaries, timing
from tftrain.arguments import check_profile_steps
from tftrain.checkpoint import data_position
from tftrain.checkpoint.layout import ModelDirLayout
from tftrain.checkpoint.writer_lock import WriterLock, check_writer
from tftrain.loops import restore
from tftrain.loops.owner import StepOwner
from tftrain.loops.preparation import FitCall
from tftrain.loops.restore import report_resume
from tftrain.loops.training_run import TrainingRun, close_all
from tftrain.options import NonFinitePolicy, RunOptions
from tftrain.services.best_checkpoint import BestCheckpointService
from tftrain.services.checkpointing import CheckpointService
from tftrain.services.data_position import DataCheckpointService
from tftrain.services.hparams import HParamsService
from tftrain.services.loss_recovery import LossRecovery
from tftrain.services.multiworker_preemption import MultiWorkerPreemption, multiworker_preemption
from tftrain.services.nan_guard import NonFiniteGuard
from tftrain.services.periodic_validation import PeriodicValidation
from tftrain.services.preemption import PreemptionService
from tftrain.services.profiler import ProfilerService
from tftrain.services.protocol import Service
from tftrain.services.run_record import RunRecordService
from tftrain.services.step_budget import StepBudget
from tftrain.services.step_summaries import InStepSummaryService
from tftrain.services.tensorboard import SummaryService
from tftrain.services.timing_state import TimingService
from tftrain.services.writer_lock import WriterLockService

__all__ = ["BUILT_IN_NAMES", "RunParts", "report_resume", "start_run"]

BUILT_IN_NAMES = frozenset(
    service.name
    for service in (
        NonFiniteGuard, LossRecovery, StepBudget, PeriodicValidation, DataCheckpointService, ProfilerService, SummaryService,
        BestCheckpointService, CheckpointService, PreemptionService, MultiWorkerPreemption, WriterLockService,
        InStepSummaryService, TimingService, RunRecordService, HParamsService,
    )
)  # fmt: skip
"""The names of the built-in services (a user's service cannot take one: its state is saved by name)."""


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
    """Sets up one `fit`: restores the latest checkpoint and builds its services.

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
    options, plan, strategy = owner.run_options, call.plan, owner.engines.strategy
    owner.global_step.assign(0)  # a run without a checkpoint starts at 0, as its Progress does
    window = check_profile_steps(options.profile_steps, _planned_steps(call))
    timing_service = TimingService(parts.timer, parts.trace_counter)
    services = _leading_services(owner, call, parts)
    checkpointer, found, lock = None, None, None
    try:
        if options.model_dir is not None:
            path = checkpoint_lib.ensure_writable_directory(options.model_dir, "model_dir")
            averaged = owner.averaged_weights if owner.ema_decay is not None else None
            where = _ModelDir(path, options, _RunPlace.of(strategy), owner.model, owner.checkpoint_state,
                              owner.global_step, averaged)  # fmt: skip
            # The chief is the writer: one per model_dir, held before anything there is touched.
            lock = WriterLock(path) if where.chief else None
            checkpointer = where.checkpointer()
            request = restore.RestoreRequest(
                options, owner.model, plan, parts.record, call.verbosity,
                writes_record_file=where.chief, built_in_names=BUILT_IN_NAMES, optimizers=parts.optimizers,
            )  # fmt: skip

            def build_services(restored: restore.Restored) -> list[Service]:
                # Every service of the run, before their saved states are loaded into them.
                _add_model_dir_services(services, where, checkpointer, restored, owner, call, parts, window)
                if lock is not None:  # released at the run's end, after the last save
                    services.append(WriterLockService(lock))
                return _add_trailing_services(services, owner, timing_service)

            found, services = restore.restore_run(checkpointer, request, build_services)
            lock = None  # a service of the run now (closing it twice is harmless)
        else:
            _add_trailing_services(services, owner, timing_service)
    except BaseException:
        with contextlib.suppress(Exception):  # the setup's error is the one to report
            close_all(services)  # what the services hold: writers, signal handlers, the lock
        if lock is not None:
            lock.close()
        raise
    progress = found.progress if found is not None else None
    return TrainingRun(
        plan,
        progress or checkpoint_lib.Progress(),
        services,
        checkpointer=checkpointer,
        timing_service=timing_service,
        total_steps=call.total_steps,
    )


def _leading_services(owner: StepOwner, call: FitCall, parts: RunParts) -> list[Service]:
    """The services every run has, in their order: the NaN guard, the step budget, the call's and the user's."""
    options, nonfinite_policy = owner.run_options, call.nonfinite_policy
    services: list[Service] = []
    rollback = nonfinite_policy.rollback and options.model_dir is not None
    if nonfinite_policy.terminate_on_nan and not rollback:
        services.append(NonFiniteGuard(nonfinite_policy, checkpoints=options.model_dir is not None))
    if call.total_steps is not None:
        services.append(StepBudget(call.total_steps))
    return services + list(parts.services)


def _add_trailing_services(services: list[Service], owner: StepOwner, timing: TimingService) -> list[Service]:
    """Appends the services that run last (the in-step summaries, the timing); checks the names. Returns `services`."""
    options = owner.run_options
    step_summaries = owner.engines.in_step_summaries(options.model_dir, options.summary_every_steps)
    if step_summaries is not None:
        services.append(InStepSummaryService(step_summaries))
    services.append(timing)
    _check_names(services)
    return services


def _planned_steps(call: FitCall) -> int | None:
    """The steps the call will train, where known (the profiler's window must end within them)."""
    if call.total_steps is not None:
        return call.total_steps
    return call.epochs * call.plan.steps if call.plan.steps else None


@dataclasses.dataclass(frozen=True)
class _ModelDir:
    """A run's `model_dir`, where this process stands in the run, and what its checkpoints save."""

    path: str
    options: RunOptions
    place: _RunPlace
    model: Any
    extra_state: Callable[[], dict[str, Any]]
    global_step: tf.Variable | None
    averaged_weights: Callable[[], contextlib.AbstractContextManager[None]] | None = None

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


def _add_model_dir_services(
    services: list[Service],
    where: _ModelDir,
    checkpointer: checkpoint_lib.Checkpointer,
    found: restore.Restored,
    owner: StepOwner,
    call: FitCall,
    parts: RunParts,
    window: tuple[int, int] | None,
) -> list[Service]:
    """Appends the services that write to `model_dir`, in the order they run, each as it is made.

    Each is in `services` as soon as it exists, so an error while the next is
    made closes it (its writer, its signal handlers). Returns `services`.
    """
    options, place, chief, model_dir = where.options, where.place, where.chief, where.path
    restored, data_mode, plan, timer = found.progress, found.data_mode, call.plan, parts.timer
    step = restored.global_step if restored is not None else 0
    if parts.record is not None:
        services.append(RunRecordService(parts.record, owner.model, parts.optimizers))
    if data_mode is not None:
        services.append(DataCheckpointService(data_mode, plan.position))
    if chief and window is not None:
        services.append(ProfilerService(summaries.ProfileWindow(where.layout.train, window)))
        if step > window[0] - 1:
            warnings.warn(
                f"profile_steps={options.profile_steps} starts at or before step {step}, "
                "where this run resumes: nothing is profiled. Expected a window after the resume point.",
                stacklevel=5,
            )
    if chief:
        writer = summaries.TrainingSummaries(model_dir, every_steps=options.summary_every_steps)
        # A resumed run's first call is not the job's trace: its trace time was written already.
        optimizer = getattr(where.model, "optimizer", None)
        services.append(SummaryService(writer, timer, optimizer, trace_written=step > 0))
    if chief and options.best_checkpoint_monitor is not None:
        # Before the regular checkpoint: the best value it saves must include this epoch's.
        best = where.checkpointer(best=True)
        services.append(
            BestCheckpointService(
                best,
                options.best_checkpoint_monitor,
                options.best_checkpoint_mode,
                weights=where.averaged_weights,
            )
        )
    # Arrays keep their position in examples and their pass's order, not an iterator (`EpochPlan.keep_array_position`).
    save_iterator = data_mode != data_position.POSITION and plan.position is None
    checkpoints = CheckpointService(
        checkpointer,
        options.checkpoint_every_steps,
        timer,
        where.scratch_dir,
        save_iterator=save_iterator,
        data_state={"epoch_order": plan.order.permutation} if plan.order is not None else None,
    )
    services.append(checkpoints)
    if options.preemption_signals and place.single_process:
        services.append(PreemptionService(options.preemption_signals, checkpoints))
    elif options.preemption_signals:
        preemption = multiworker_preemption(
            options.preemption_signals, checkpoints, place.cluster_resolver, place.worker
        )
        if preemption is not None:
            services.append(preemption)
    if parts.record is not None and chief:  # closed after the saves: its end says the run ended well
        services.append(HParamsService(where.layout.root, parts.record))
    if call.nonfinite_policy.rollback:
        services.insert(0, _loss_recovery(call.nonfinite_policy, services, owner.model, call.verbosity))
    return services


def _loss_recovery(
    nonfinite_policy: NonFinitePolicy, services: list[Service], model: Any, verbose: int
) -> LossRecovery:
    """The rollback service, keeping states at the run's checkpoint steps too (and TensorBoard writers, on the chief)."""
    checkpoints = next(service for service in services if isinstance(service, CheckpointService))
    writer = next((service.writer for service in services if isinstance(service, SummaryService)), None)
    return LossRecovery(
        nonfinite_policy,
        optimizer=getattr(model, "optimizer", None),
        checkpoint_every_steps=checkpoints.when.every_steps,
        verbose=verbose,
        writer=writer,
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
