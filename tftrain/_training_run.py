"""The outer loop of one `Trainer.fit`: its progress and the services around the steps.

A `TrainingRun` (built by `tftrain._run_setup.start_run`) tells the loop where
a host call must end (the nearest service boundary), so a `steps_per_loop`
call never jumps over one, reads each call's results one call late, and calls
the services after it. `run_pass` runs one epoch of host calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tftrain import _hooks, _inputs, _loops, timing
from tftrain import checkpoint as checkpoint_lib
from tftrain._auto_steps import StepsPerCall
from tftrain._services import NonFiniteGuard, NonFiniteLossError, PreemptedError, Service, TimingService

__all__ = ["NonFiniteLossError", "PreemptedError", "TrainingRun", "run_pass"]


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
