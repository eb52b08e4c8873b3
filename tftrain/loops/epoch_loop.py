"""The epoch loop: one pass (an epoch, an evaluation or a prediction) of host calls over the engine.

`run_pass` asks the engine (`tftrain.engine.step_loop.StepLoop`) for host calls
of k steps, ending each where the data ends or where a service acts
(`TrainingRun.steps_allowed`), calls the batch hooks around each call, and
files it with the run, which runs the services. A training call whose results
nothing needs at once is read one call late, after the next call is dispatched.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tftrain import timing
from tftrain.compat import keras_internals
from tftrain.engine.auto_steps import StepsPerCall
from tftrain.engine.step_loop import StepLoop
from tftrain.fit_inputs.epoch_plan import EpochPlan
from tftrain.loops import hooks
from tftrain.loops.training_run import TrainingRun

__all__ = ["run_pass"]


def run_pass(
    plan: EpochPlan,
    step_loop: StepLoop,
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
    target = plan.steps
    # Where the epoch's calls end: "auto" ends its calls at the target; a fixed k runs k steps
    # per call, past `steps_per_epoch` up to the next multiple of k, as Keras's
    # `steps_per_execution` does (also where a service edge shortened a call).
    epoch_end = target
    if target is not None and not steps_per_call.auto:
        epoch_end = -(-target // steps_per_call.chosen) * steps_per_call.chosen
    step = run.progress.step_in_epoch if run is not None else 0
    logs, data_ended, unread = None, False, None
    # Results are read one call late where nothing on the host needs them at once (module doc).
    may_defer = (
        run is not None
        and not run.reads_every_call
        and step_loop.pipelines
        and hooks.is_no_hook(on_batch_end)
    )
    if run is not None:
        run.epoch_steps = target
    try:
        iterator = plan.begin_epoch()
        if run is not None and target is not None and not steps_per_call.auto:
            left = plan.batches_left(step)  # a fixed k's epoch also ends where the data does
            run.epoch_steps = epoch_end if left is None else min(epoch_end, step + left)
        while target is None or step < target:
            if run is not None and run.finished:
                break
            call_start = time.perf_counter()
            requested = wanted = steps_per_call.next()
            if epoch_end is not None:
                wanted = min(wanted, epoch_end - step)
            left = plan.batches_left(step)
            if left is not None:
                if left <= 0:  # the pass ended before the epoch: no hook for a call with no step
                    data_ended = True
                    break
                wanted = min(wanted, left)
            shortened_by_run = False
            if run is not None:
                allowed = run.steps_allowed(wanted)
                shortened_by_run = allowed < wanted
                wanted = allowed
                run.before_call()
            if timer is not None:
                timer.begin_call()
            hook_start = time.perf_counter()
            on_batch_begin(step)
            if timer is not None:
                timer.exclude(time.perf_counter() - hook_start)
            first = None
            if plan.may_end_unannounced:
                # As under `fit`, the begin hook of a call that finds no batch has no end hook.
                first = step_loop.peek(iterator)  # part of the call's time: it fetched the first batch
                if not first.has_value():
                    data_ended = True
                    break
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
                result = run.file_unread(call, traced)
                unread = call
            else:
                result = call.result()
                if timer is not None:
                    timer.end_call(result.steps, result.examples, traced=traced)
                if run is not None:
                    run.after_call(result)
            if result.steps:
                begin = step
                step += result.steps
                logs = result.logs
                if steps_per_call.auto or shortened_by_run:
                    on_batch_end(step - 1, logs)
                else:  # the index Keras reports for a call of `requested` steps
                    on_batch_end(keras_internals.batch_end_index(begin, requested), logs)
            steps_per_call.record(result.steps, time.perf_counter() - call_start, traced)
            rolled_back = result.nonfinite and run is not None and run.reads_every_call
            if result.steps < wanted and not rolled_back:  # a rolled-back call stopped at its blow-up
                data_ended = True
                if plan.may_end_unannounced and not (steps_per_call.auto or shortened_by_run):
                    # Keras's epoch iterator counts k steps per call and starts one more
                    # call, which finds no batch: its begin hook, with no end hook.
                    on_batch_begin(begin + requested)
                break
            if should_stop():
                break
        if unread is not None:
            run.settle()
    except BaseException:
        plan.close()
        raise
    plan.end_epoch(step, data_ended, cut=run is not None and run.cut_by_budget)
    return logs
