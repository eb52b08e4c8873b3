"""Starting one `Trainer.fit`: restore as one named sequence, then the services around its steps.

`start_run` builds a `tftrain.loops.training_run.TrainingRun` from the frozen
`RunOptions`. With a `model_dir`, restoring is one sequence, in this order:

1. find: the newest checkpoint of `model_dir` (else `resume_from`'s);
2. validate: every tensor of it is read and its services' states parsed
   (a damaged one is skipped, warned, for the one before); nothing of a
   checkpoint is used before it validates; then the run record: the new call
   is compared with the checkpoint's record (`tftrain.checkpoint.run_record`),
   and a change it cannot follow is refused, naming it;
3. model and optimizer (and the data iterator), checked compatible before
   anything is assigned (`tftrain.checkpoint.Checkpointer.restore_latest`);
   then the changes taken from the record are put in effect (the user's new
   learning rate over the checkpoint's) and logged, one line each;
4. the services' state (each service's `load_state_dict`, by name);
5. the data position (`EpochPlan.resume`).

The services run in this order after each host call: the NaN guard (or, with
`on_nonfinite="rollback"`, the loss recovery), the step budget, the call's own and the user's services, the profiler, TensorBoard
summaries, the best checkpoint, checkpoints, preemption, the writer lock,
in-step summaries and timing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import warnings
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tftrain import checkpoint as checkpoint_lib
from tftrain import distribute, summaries, timing
from tftrain.checkpoint import data_position, run_record
from tftrain.checkpoint.layout import ModelDirLayout
from tftrain.checkpoint.writer_lock import WriterLock, check_writer
from tftrain.fit_inputs.epoch_plan import EpochPlan
from tftrain.loops.training_run import TrainingRun, close_all
from tftrain.options import RunOptions, check_profile_steps
from tftrain.services.best_checkpoint import BestCheckpointService
from tftrain.services.checkpointing import CheckpointService
from tftrain.services.data_position import DataCheckpointService
from tftrain.services.hparams import HParamsService
from tftrain.services.loss_recovery import LossRecovery, RecoveryPolicy
from tftrain.services.multiworker_preemption import MultiWorkerPreemption, multiworker_preemption
from tftrain.services.nan_guard import NonFiniteGuard
from tftrain.services.periodic_validation import PeriodicValidation
from tftrain.services.preemption import PreemptionService
from tftrain.services.profiler import ProfilerService
from tftrain.services.protocol import Service
from tftrain.services.run_record import RunRecordService
from tftrain.services.step_budget import StepBudget
from tftrain.services.step_summaries import InStepSummaries, InStepSummaryService
from tftrain.services.tensorboard import SummaryService
from tftrain.services.timing_state import TimingService
from tftrain.services.writer_lock import WriterLockService

__all__ = ["BUILT_IN_NAMES", "report_resume", "start_run"]

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
    plan: EpochPlan,
    epochs: int,
    timer: timing.StepTimer | None,
    trace_counter: timing.TraceCounter,
    verbose: int = 1,
    strategy: tf.distribute.Strategy | None = None,
    total_steps: int | None = None,
    extra_services: tuple[Service, ...] = (),
    global_step: tf.Variable | None = None,
    in_step_summaries: Callable[[], InStepSummaries | None] | None = None,
    callbacks_decide_nan: bool = False,
    recovery: RecoveryPolicy | None = None,
    averaged_weights: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
    record: dict[str, Any] | None = None,
) -> TrainingRun:
    """Sets up one `fit`: restores the latest checkpoint and builds its services.

    Args:
        options: The run options.
        model: The model being trained (its optimizer's learning rate is logged).
        extra_state: Returns more trackables to checkpoint (a Trainer subclass's own state).
        plan: The training data plan; resumed at the checkpoint's data position.
        epochs: Epochs of the call (to check a profiler window against).
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
        total_steps: The call's step budget, or None: the epochs decide.
        extra_services: More services (the call's own, then the user's), run
            after the NaN guard and the step budget and before the summaries
            and checkpoints; their state is saved and restored by name.
        global_step: The run's global step variable (the training loop
            increments it before each step): set to 0, or restored from the
            checkpoint, and saved with every checkpoint. None: counted on
            the host only.
        in_step_summaries: Returns the writer and cadence for `tf.summary`
            calls inside the training step, or None (called once `model_dir`
            is this run's: the writer creates `model_dir/train`).
        callbacks_decide_nan: The call's callbacks hold Keras's
            `TerminateOnNaN`: the NaN guard raises nothing, and no checkpoint
            is written from the first non-finite step on
            (`tftrain.services.nan_guard`).
        recovery: What a loss blow-up does; with `on_nonfinite="rollback"`
            (and `model_dir`) a `LossRecovery` takes the NaN guard's place,
            first among the services.
        averaged_weights: A block in which the model holds its EMA weights
            (`ema_decay`): the best checkpoint is saved in one. None: as they are.
        record: The call's run record (`tftrain.checkpoint.run_record.build`):
            compared with the checkpoint's at a resume, saved with every
            checkpoint and written to `model_dir/run_record.json`. None: no record.

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
    place = _RunPlace.of(strategy)
    if global_step is not None:
        global_step.assign(0)  # a run without a checkpoint starts at 0, as its Progress does
    planned_steps = total_steps if total_steps is not None else (epochs * plan.steps if plan.steps else None)
    window = check_profile_steps(options.profile_steps, planned_steps)
    timing_service = TimingService(timer, trace_counter)
    services: list[Service] = []
    recovery = recovery or RecoveryPolicy()
    rollback = recovery.rollback and options.model_dir is not None
    if options.terminate_on_nan and not rollback:
        guard = NonFiniteGuard(
            callbacks_decide=callbacks_decide_nan,
            checkpoints=options.model_dir is not None,
            loss_limit=recovery.loss_spike_threshold,
        )
        services.append(guard)
    if total_steps is not None:
        services.append(StepBudget(total_steps))
    services.extend(extra_services)
    checkpointer, restored, lock = None, None, None
    try:
        if options.model_dir is not None:
            path = checkpoint_lib.ensure_writable_directory(options.model_dir, "model_dir")
            where = _ModelDir(path, options, place, model, extra_state, global_step, averaged_weights)
            # The chief is the writer: one per model_dir, held before anything there is touched.
            lock = WriterLock(path) if where.chief else None
            checkpointer = where.checkpointer()
            found = _restore(options, checkpointer, model, plan, record)  # steps 1 to 3
            restored, data_mode, comparison = found.progress, found.data_mode, found.comparison
            if restored is not None:
                report_resume(
                    f"tftrain: resumed from {checkpointer.restored_path} at step {restored.global_step} "
                    f"(epoch {restored.epoch + 1}, step {restored.step_in_epoch} of the epoch).",
                    verbose,
                )
            if record is not None:
                run_record.log_taken(comparison, verbose)
                if where.chief:
                    run_record.write_file(path, record, comparison, restored.global_step if restored else 0)
                services.append(RunRecordService(record, model))
            _add_model_dir_services(services, where, checkpointer, window, timer, restored, data_mode, plan)
            if record is not None and where.chief:  # closed after the saves: its end says the run ended well
                services.append(HParamsService(where.layout.root, record))
            if rollback:
                services.insert(0, _loss_recovery(recovery, services, model, verbose))
            if lock is not None:
                services.append(WriterLockService(lock))  # released at the run's end, after the last save
                lock = None
        step_summaries = in_step_summaries() if in_step_summaries is not None else None
        if step_summaries is not None:
            services.append(InStepSummaryService(step_summaries))
        services.append(timing_service)
        _check_names(services)
        if restored is not None:
            for service in services:  # 4. the services' state
                if service.name in checkpointer.service_states:
                    service.load_state_dict(checkpointer.service_states[service.name])
            _warn_unmatched_states(checkpointer.service_states, services, checkpointer.restored_path)
            # 5. the data position (none to find where the run starts the next epoch on new data)
            if plan.position is not None and not found.at_next_epoch:
                examples = _examples_read(checkpointer.service_states, restored, found.comparison, plan)
                plan.resume_at_example(examples, restored.batches_in_pass, restored.step_in_epoch, found.saved_order)
            elif not found.at_next_epoch:
                plan.resume(restored.batches_in_pass, restored.step_in_epoch, checkpointer.iterator_restored)
    except BaseException:
        with contextlib.suppress(Exception):  # the setup's error is the one to report
            close_all(services)  # what the services hold: writers, signal handlers, the lock
        if lock is not None:
            lock.close()
        raise
    return TrainingRun(
        plan,
        restored or checkpoint_lib.Progress(),
        services,
        checkpointer=checkpointer,
        timing_service=timing_service,
        total_steps=total_steps,
    )


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


# The order of a shuffled array pass, as `CheckpointService(data_state=...)` saves it.
_ORDER_KEY = "data/epoch_order" + checkpoint_lib.VARIABLE_SUFFIX


@dataclasses.dataclass(frozen=True)
class _Restored:
    """What steps 1 to 3 of the restore sequence found.

    Attributes:
        progress: Where the run resumes (None: nothing to resume).
        data_mode: How checkpoints keep the data position: the validated
            checkpoint's (a resume reads it as it was saved), else the one
            that suits the pipeline; None where the iterators are
            distributed (never saved).
        comparison: The call against the checkpoint's run record, its
            changes taken already in effect.
        saved_order: The order of the pass of shuffled arrays the checkpoint
            was in (None: none saved).
        at_next_epoch: The run resumes at the start of the epoch after the
            checkpoint's (`on_data_change="next_epoch"` took a data change).
    """

    progress: checkpoint_lib.Progress | None
    data_mode: str | None
    comparison: run_record.Comparison
    saved_order: Any = None
    at_next_epoch: bool = False


def _restore(
    options: RunOptions,
    checkpointer: checkpoint_lib.Checkpointer,
    model: Any,
    plan: EpochPlan,
    record: dict[str, Any] | None,
) -> _Restored:
    """Steps 1 to 3 of the restore sequence (module doc)."""
    source = checkpointer.latest or options.resume_from  # 1. find (model_dir's own checkpoints win)
    if source is not None and not model.built:
        raise ValueError(
            f"Cannot resume from {source}: the model is not built yet, so its variables "
            "do not exist to be restored. Expected a built model: call it once on a batch, or "
            "`model.build(input_shape)`, before `fit`."
        )
    modes: list[str | None] = []
    comparisons: list[run_record.Comparison] = []
    saved_orders: list[Any] = []
    next_epoch: list[bool] = []  # on_data_change="next_epoch" took a data change
    optimizer = getattr(model, "optimizer", None)
    users_learning_rate = run_record.learning_rate_value(optimizer)  # before a restore assigns the checkpoint's

    def prepare(validated: checkpoint_lib.ValidatedCheckpoint | None) -> Any:
        """Checks the call against the validated checkpoint's record, then makes the data pipeline keep its position as that checkpoint did.

        Returns the iterator whose saved state to restore, or None for
        arrays: their position is kept in examples, with the pass's order
        where shuffled (an iterator's state holds the position, not the
        order), and the resumed pass reads the rest of its examples in that
        order (step 5).
        """
        for found in (modes, comparisons, saved_orders, next_epoch):
            found.clear()  # called again for an older checkpoint where restoring a newer one failed
        states = validated.states if validated is not None else None
        mid_pass = validated is not None and (validated.progress.step_in_epoch > 0 or validated.progress.batches_in_pass > 0)
        if record is not None and validated is not None:
            comparison = run_record.compare(
                states.get(run_record.RECORD_KEY), record, mid_epoch=mid_pass, convertible=plan.position is not None
            )
            if comparison.data_only and options.on_data_change == "next_epoch":
                comparison = comparison.at_next_epoch()
                next_epoch.append(True)
            if comparison.refused:
                where = f"the checkpoint of step {validated.progress.global_step} ({validated.path})"
                raise run_record.refusal(comparison, where, options.model_dir)
            comparisons.append(comparison)
        mode = None
        if plan.plain_iterators:
            mode, plan.dataset = data_position.prepare(plan.dataset, data_position.saved_mode(states))
        modes.append(mode)
        if next_epoch:
            return None  # the next epoch is a fresh pass of the new data
        if plan.position is None:
            return plan.next_iterator()
        if validated is not None and plan.order is not None:
            saved_orders.append(validated.tensor(_ORDER_KEY))
        return None  # arrays: the position in examples (step 5), not the iterator

    # 2. validate and 3. model, optimizer and iterator: in the checkpointer, in that order.
    progress = checkpointer.restore_latest(prepare=prepare)
    if progress is None and options.resume_from is not None:
        _, progress = checkpointer.restore_from(options.resume_from, prepare=prepare)
    if not modes:  # nothing to resume: a new run
        prepare(None)
    comparison = comparisons[0] if comparisons and progress is not None else run_record.Comparison()
    if progress is not None:
        comparison = run_record.apply_taken(comparison, optimizer, users_learning_rate)
    if progress is not None and next_epoch:  # the rest of the checkpoint's epoch is not trained
        epoch = progress.epoch + (1 if progress.step_in_epoch else 0)  # at an epoch end mid-pass: that next epoch
        progress = dataclasses.replace(progress, epoch=epoch, step_in_epoch=0, batches_in_pass=0)
        return _Restored(progress, modes[0], comparison, at_next_epoch=True)
    return _Restored(progress, modes[0], comparison, saved_orders[0] if saved_orders else None)


def _examples_read(
    states: dict[str, Any], restored: checkpoint_lib.Progress, comparison: run_record.Comparison, plan: EpochPlan
) -> int:
    """Examples of the pass the checkpointed run had read: from its batches read, its batch size and where its iterator started."""
    offset = tuple(states.get("data", {}).get("pass_offset", (0, 0)))
    batch_size = next(
        (change.saved for change in comparison.taken if change.key == "data.global_batch_size"),
        plan.position.batch_size,
    )
    return plan.position.examples_read(restored.batches_in_pass, offset, int(batch_size))


def _add_model_dir_services(
    services: list[Service],
    where: _ModelDir,
    checkpointer: checkpoint_lib.Checkpointer,
    window: tuple[int, int] | None,
    timer: timing.StepTimer | None,
    restored: checkpoint_lib.Progress | None,
    data_mode: str | None,
    plan: EpochPlan,
) -> None:
    """Appends the services that write to `model_dir`, in the order they run, each as it is made.

    Each is in `services` as soon as it exists, so an error while the next is
    made closes it (its writer, its signal handlers).
    """
    options, place, chief, model_dir = where.options, where.place, where.chief, where.path
    step = restored.global_step if restored is not None else 0
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


def _loss_recovery(policy: RecoveryPolicy, services: list[Service], model: Any, verbose: int) -> LossRecovery:
    """The rollback service, keeping states at the run's checkpoint steps too (and TensorBoard writers, on the chief)."""
    checkpoints = next(service for service in services if isinstance(service, CheckpointService))
    writer = next((service.writer for service in services if isinstance(service, SummaryService)), None)
    return LossRecovery(
        policy,
        optimizer=getattr(model, "optimizer", None),
        checkpoint_every_steps=checkpoints.when.every_steps,
        verbose=verbose,
        writer=writer,
    )


def _warn_unmatched_states(states: dict[str, Any], services: list[Service], path: str | None) -> None:
    """Warns of a service state in the checkpoint that no service of this run takes (a user's service left out)."""
    running = {service.name for service in services}
    unmatched = sorted(name for name in states if name not in running and name not in BUILT_IN_NAMES)
    if unmatched:
        warnings.warn(
            f"The checkpoint {path} holds the state of services this run does not have: {unmatched} "
            f"(the run's services: {sorted(running)}). Their state is not restored; it is dropped from "
            "the next checkpoint. Pass those services in `Trainer(services=[...])` to keep them.",
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
