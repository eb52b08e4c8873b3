"""The outer loop of one `Trainer.fit`: its options, its progress, the services around the steps.

`start_run` builds a `TrainingRun` from the frozen `RunOptions`: the progress
(restored from the latest checkpoint), and the services (`tftrain._services`)
that stop on a non-finite loss, run the profiler window, keep the timing,
write TensorBoard summaries and save checkpoints. The run tells the loop where
a host call must end (the nearest service boundary), so a `steps_per_loop`
call never jumps over one. `run_pass` runs one epoch of host calls.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tftrain import _data_checkpoint, _hooks, _inputs, _loops, distribute, summaries, timing
from tftrain import checkpoint as checkpoint_lib
from tftrain._auto_steps import StepsPerCall
from tftrain._checkpoint_services import BestCheckpointService, CheckpointService, PreemptionService
from tftrain._data_checkpoint import DataCheckpointService
from tftrain._multiworker_preemption import multiworker_preemption
from tftrain._run_options import RunOptions
from tftrain._services import (
    NonFiniteGuard,
    NonFiniteLossError,
    PreemptedError,
    ProfilerService,
    Service,
    StepBudget,
    SummaryService,
    TimingService,
)
from tftrain._step_summaries import InStepSummaries, InStepSummaryService
from tftrain._writer_lock import WriterLock

__all__ = ["NonFiniteLossError", "PreemptedError", "RunOptions", "TrainingRun", "run_pass", "start_run"]


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
    plan: _inputs.EpochPlan,
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
            (`tftrain._multiworker_preemption`).
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
    window = summaries.check_profile_steps(options.profile_steps, planned_steps)
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
            services.append(lock)
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
    plan: _inputs.EpochPlan,
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
        save_iterator=data_mode != _data_checkpoint.POSITION,
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
    plan: _inputs.EpochPlan, checkpointer: checkpoint_lib.Checkpointer, resume_from: str | None
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
    mode, plan.dataset = _data_checkpoint.prepare(plan.dataset, _data_checkpoint.saved_mode(states))
    return mode


class TrainingRun:
    """The outer loop's state in one `fit`: the progress, and the services around the steps.

    Args:
        plan: The training data plan (for the iterator a checkpoint saves).
        progress: Where the run starts (restored or fresh).
        services: Called in order after each host call and at each epoch end
            (the NaN guard first, the checkpoint after the summaries).
        checkpointer: The run's checkpoints, or None.
        timing_service: The service that keeps the timing state and trace count, or None.
        total_steps: The run's step budget, or None.
    """

    def __init__(
        self,
        plan: _inputs.EpochPlan,
        progress: checkpoint_lib.Progress,
        services: list[Service],
        *,
        checkpointer: checkpoint_lib.Checkpointer | None = None,
        timing_service: TimingService | None = None,
        total_steps: int | None = None,
    ):
        self.plan = plan
        self.total_steps = total_steps
        self.progress = progress
        self.services = list(services)
        self.checkpointer = checkpointer
        self.timing_service = timing_service
        self.resumed = progress.global_step > 0 or progress.epoch > 0
        self.epoch_steps: int | None = None  # steps in the current epoch, if known
        self.timer = timing_service.timer if timing_service is not None else None
        self._unread: tuple[_loops.PendingCall, bool] | None = None  # filed, results not read yet

    @property
    def finished(self) -> bool:
        """Whether the run has trained its step budget (never, without one)."""
        return self.total_steps is not None and self.progress.global_step >= self.total_steps

    def trace_count(self) -> int:
        """Traces of the training step in this run (a resumed run adds the checkpointed count)."""
        return self.timing_service.trace_count() if self.timing_service is not None else 0

    def latest_checkpoint(self) -> str | None:
        """The newest checkpoint of the run, or None."""
        return self.checkpointer.latest if self.checkpointer is not None else None

    def service_states(self) -> dict[str, Any]:
        """Every service's state, by name (saved with a checkpoint)."""
        states = {service.name: service.state_dict() for service in self.services}
        return {name: state for name, state in states.items() if state is not None}

    def steps_allowed(self, wanted: int) -> int:
        """`wanted`, shortened so that the host call ends at the next service boundary."""
        done = self.progress.global_step
        for service in self.services:
            stop = service.next_stop(done)
            if stop is not None:
                wanted = min(wanted, stop - done)
        return max(wanted, 1)

    def ends_at_boundary(self, steps: int) -> bool:
        """Whether a call of `steps` steps from here ends where a service acts (a save, a summary, ...)."""
        done = self.progress.global_step
        return any(service.next_stop(done) == done + steps for service in self.services)

    def file_unread(
        self, call: _loops.PendingCall, epoch_steps: int | None, traced: bool
    ) -> _loops.LoopResult:
        """Files a dispatched call before its results are read: its steps count, its check waits for `settle`.

        The services run as after any call (no service acts at its last step:
        the caller checked `ends_at_boundary`); the NaN guard's check and the
        call's time come when `settle` reads the results.

        Returns:
            The `LoopResult` the services saw (the call's expected steps, logs not read).
        """
        result = call.expected()
        self._unread = (call, traced)  # first: a service that saves now (a preemption) settles it
        self.after_call(result, epoch_steps)
        return result

    def settle(self, next_call_traced: bool = False) -> None:
        """Reads the unread call's results, if any: files its time, and raises if its loss was not finite.

        Called after the next call was dispatched (so the read overlaps it),
        before any checkpoint is written, and at the end of a pass.

        Args:
            next_call_traced: The call dispatched since traced: the unread
                call's time (which ends at this read) holds that trace, so it
                is not a steady-state time.

        Raises:
            NonFiniteLossError: the call stopped at a non-finite loss (named
                by its global step; the next call, dispatched after it, ran
                no step).
        """
        if self._unread is None:
            return
        call, traced = self._unread
        self._unread = None
        result = call.result()
        if self.timer is not None:
            self.timer.end_call(result.steps, result.examples, traced=traced or next_call_traced)
        missing = call.steps - result.steps  # the steps after a non-finite one did not run
        self.progress.global_step -= missing
        self.progress.step_in_epoch -= missing
        if result.nonfinite:
            for service in self.services:
                if isinstance(service, NonFiniteGuard):
                    service.after_call(self, result)

    def before_call(self) -> None:
        """Runs the services' `before_call` (the profiler starts at its window)."""
        for service in self.services:
            service.before_call(self)

    def after_call(self, result: _loops.LoopResult, epoch_steps: int | None) -> None:
        """Files a host call: counts its steps, then runs the services (NaN guard first).

        Args:
            result: What the call did.
            epoch_steps: Steps in the current epoch, if known.

        Raises:
            NonFiniteLossError: the last step's loss is NaN or infinite.
        """
        self.progress.global_step += result.steps
        self.progress.step_in_epoch += result.steps
        self.epoch_steps = epoch_steps
        for service in self.services:
            service.after_call(self, result)

    def end_epoch(self, epoch_logs: dict[str, Any]) -> None:
        """Moves the progress to the next epoch and runs the services (summaries, then the checkpoint)."""
        self.settle()
        self.progress.epoch += 1
        self.progress.step_in_epoch = 0
        for service in self.services:
            service.end_epoch(self, epoch_logs)

    def close(self) -> None:
        """Closes every service (the profiler stops, writers flush, scratch copies go)."""
        for service in self.services:
            service.close()


def run_pass(
    plan: _inputs.EpochPlan,
    step_loop: _loops.StepLoop,
    on_batch_begin: Callable[..., Any],
    on_batch_end: Callable[..., Any],
    *,
    steps_per_loop: int | StepsPerCall,
    timer: timing.StepTimer | None = None,
    run: TrainingRun | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> Any:
    """Runs one epoch (or one evaluation or prediction) of host calls; returns the last logs.

    With a `run` (training), the epoch starts at the run's step in the
    epoch (after a resume) and host calls end at checkpoint and profiler
    edges. `should_stop()` is asked after each call (e.g. `model.stop_training`).
    `steps_per_loop` is a fixed k or a `StepsPerCall` (`"auto"`), which is
    told how long each call took, hooks and services included.
    Every `on_batch_begin` is matched by an `on_batch_end`: where no count
    says where the data ends, the next batch is fetched before the hook.

    A training call whose results nothing needs at once (no batch hook, no
    service acting at its last step, not the pass's last call, `"auto"` done
    measuring) is read after the next call is dispatched (`TrainingRun.settle`),
    so the host does not wait for the device between calls.
    """
    steps_per_call = (
        steps_per_loop if isinstance(steps_per_loop, StepsPerCall) else StepsPerCall(steps_per_loop)
    )
    target = plan.steps
    step = run.progress.step_in_epoch if run is not None else 0
    logs, data_ended, unread = None, False, None
    # Results are read one call late where nothing on the host needs them at once (module doc).
    may_defer = run is not None and step_loop.pipelines and _hooks.is_no_hook(on_batch_end)
    try:
        iterator = plan.begin_epoch()
        while target is None or step < target:
            if run is not None and run.finished:
                break
            call_start = time.perf_counter()
            wanted = steps_per_call.next()
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
            traces_before = step_loop.traces
            call = step_loop.dispatch(
                iterator, wanted, first, available=not plan.may_end_unannounced, after=unread
            )
            traced = step_loop.traces != traces_before
            if unread is not None:
                run.settle(traced)  # the previous call's results, read while this one runs
                unread = None
            defer = (
                may_defer
                and call.steps is not None
                and not traced
                and steps_per_call.chosen is not None
                and (target is None or step + call.steps < target)
                and not run.ends_at_boundary(call.steps)
            )
            if defer:
                result = run.file_unread(call, target, traced)
                unread = call
            else:
                result = call.result()
                if timer is not None:
                    timer.end_call(result.steps, result.examples, traced=traced)
                if run is not None:
                    run.after_call(result, target)
            if result.steps:
                step += result.steps
                logs = result.logs
                on_batch_end(step - 1, logs)
            steps_per_call.record(result.steps, time.perf_counter() - call_start, traced)
            if result.steps < wanted:
                data_ended = True
                break
            if should_stop():
                break
        if unread is not None:
            run.settle()
    except BaseException:
        plan.close()
        raise
    plan.end_epoch(step, data_ended)
    return logs
