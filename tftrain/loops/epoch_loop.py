"""The epoch loop: one pass (an epoch, an evaluation or a prediction) of host calls over the engine.

`run_pass` asks the engine (`tftrain.engine.step_runner.StepRunner`) for host calls
of k steps, sized by a `tftrain.loops.step_plan.StepPlan` (ending each where
the data ends or where a service acts: `TrainingRun.steps_allowed`), calls the
batch hooks around each call, and files it with the run, which runs the
services. A training call whose results nothing needs at once is read one
call late, after the next call is dispatched (`_HostCalls`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from tftrain import timing
from tftrain.engine import calls
from tftrain.engine.auto_steps import StepsPerCall
from tftrain.engine.step_runner import StepRunner
from tftrain.fit_inputs.epoch_plan import EpochPlan
from tftrain.loops import hooks
from tftrain.loops.step_plan import StepPlan
from tftrain.loops.training_run import TrainingRun

__all__ = ["run_pass"]


def run_pass(
    plan: EpochPlan,
    step_runner: StepRunner,
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
    As under `fit`, a fixed k runs k steps per call (past the epoch's
    `steps_per_epoch` too), batch hooks get the indices Keras gives them
    (`keras_internals.batch_end_index`), and where no count says where the
    data ends, the call that finds no batch has a begin hook and no end hook.

    A training call whose results nothing needs at once (no batch hook, no
    service acting at its last step, not the pass's last call, `"auto"` done
    measuring) is read after the next call is dispatched (`TrainingRun.settle`),
    so the host does not wait for the device between calls.
    """
    steps_per_call = (
        steps_per_loop if isinstance(steps_per_loop, StepsPerCall) else StepsPerCall(steps_per_loop)
    )
    steps = StepPlan(plan, steps_per_call, run=run)
    host_calls = _HostCalls(step_runner, run, timer, may_defer=hooks.is_no_hook(on_batch_end))
    logs = None
    if run is not None:
        run.epoch_steps = steps.target
    try:
        iterator = plan.begin_epoch()
        if run is not None:
            run.epoch_steps = steps.epoch_steps()
        while steps.more_calls() and not (run is not None and run.finished):
            call_start = time.perf_counter()
            num_steps = steps.next_call_steps()
            if num_steps is None:  # the data ended before the epoch: no call, no hook
                break
            host_calls.begin(on_batch_begin, steps.step)
            found, first = _first_batch(plan, step_runner, iterator)
            if not found:
                steps.found_no_batch()
                break
            call, traced = host_calls.dispatch(iterator, num_steps, first, available=not plan.may_end_unannounced)
            result = host_calls.read(call, traced, steps)
            begin = steps.advance(result.steps)
            if result.steps:
                logs = result.logs
                on_batch_end(steps.batch_end_index(begin), logs)
            steps_per_call.record(result.steps, time.perf_counter() - call_start, traced)
            if steps.ran_out(result):
                if (index := steps.unannounced_begin_index(begin)) is not None:
                    on_batch_begin(index)
                break
            if should_stop():
                break
        host_calls.settle()
    except BaseException:
        plan.close()
        raise
    plan.end_epoch(steps.step, steps.data_ended, cut=run is not None and run.cut_by_budget)
    return logs


def _first_batch(plan: EpochPlan, step_runner: StepRunner, iterator: Iterator[Any]) -> tuple[bool, Any]:
    """Whether the call has a batch, and its first batch where the loop had to look (else None).

    As under `fit`, the begin hook of a call that finds no batch has no end
    hook: where the data may end with no count saying so, the call peeks at
    its first batch after the begin hook (part of the call's time: it fetched
    the batch) and passes it on to the engine.
    """
    if not plan.may_end_unannounced:
        return True, None
    first = step_runner.peek(iterator)
    return first.has_value(), first


class _HostCalls:
    """A pass's host calls around the engine: what comes before each, its dispatch, and reading its results.

    Before a call, the services' `before_call` and the batch begin hook (its
    time kept out of the call's). A training call whose results nothing on
    the host needs at once is read one call late (`TrainingRun.file_unread`,
    then `TrainingRun.settle` after the next call is dispatched).

    Args:
        step_runner: The engine.
        run: The training run, or None.
        timer: Times the training calls, or None.
        may_defer: Whether nothing reads a call's logs at once (no batch end hook).
    """

    def __init__(
        self, step_runner: StepRunner, run: TrainingRun | None, timer: timing.StepTimer | None, *, may_defer: bool
    ):
        self._step_runner = step_runner
        self._run = run
        self._timer = timer
        # Results are read one call late where nothing on the host needs them at once (module doc).
        self._may_defer = run is not None and not run.reads_every_call and step_runner.pipelines and may_defer
        self._unread: calls.PendingCall | None = None

    def begin(self, on_batch_begin: Callable[..., Any], index: int) -> None:
        """Before a call: the services' `before_call`, the timer's start, then the begin hook (not timed)."""
        if self._run is not None:
            self._run.before_call()
        if self._timer is not None:
            self._timer.begin_call()
        hook_start = time.perf_counter()
        on_batch_begin(index)
        if self._timer is not None:
            self._timer.exclude(time.perf_counter() - hook_start)

    def dispatch(
        self, iterator: Iterator[Any], num_steps: int, first: Any, *, available: bool
    ) -> tuple[calls.PendingCall, bool]:
        """Dispatches a call (`StepRunner.dispatch`), then reads the previous call if it was left unread.

        Returns:
            The call, and whether it traced.
        """
        traces_before = self._step_runner.traces
        call = self._step_runner.dispatch(iterator, num_steps, first, available=available, after=self._unread)
        traced = self._step_runner.traces != traces_before
        if self._unread is not None:
            self._run.settle(traced)  # the previous call's results, read while this one runs
            self._unread = None
        return call, traced

    def read(self, call: calls.PendingCall, traced: bool, steps: StepPlan) -> calls.LoopResult:
        """Files a dispatched call with the timer and the run: its results now, or after the next dispatch.

        Returns:
            The call's `LoopResult` (where it is read later: its expected steps, logs not read).
        """
        if self._defers(call, traced, steps):
            result = self._run.file_unread(call, traced)
            self._unread = call
            return result
        result = call.result()
        if self._timer is not None:
            self._timer.end_call(result.steps, result.examples, traced=traced)
        if self._run is not None:
            self._run.after_call(result)
        return result

    def _defers(self, call: calls.PendingCall, traced: bool, steps: StepPlan) -> bool:
        """Whether the call is read one call late (see `run_pass`)."""
        return (
            self._may_defer
            and call.steps is not None
            and not traced
            and not steps.measuring
            and not steps.ends_pass(call.steps)
            and not self._run.ends_at_boundary(call.steps)
        )

    def settle(self) -> None:
        """At the end of the pass: reads the call left unread, if any."""
        if self._unread is not None:
            self._run.settle()
