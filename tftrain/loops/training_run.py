"""The outer loop of one `Trainer.fit`: its progress and the services around the steps.

A `TrainingRun` (built by `tftrain.loops.run_setup.start_run`) tells the loop where
a host call must end (the nearest service boundary), so a `steps_per_loop`
call never jumps over one, reads each call's results one call late, and calls
the services after it. `run_pass` runs one epoch of host calls. Where a
service asks (`on_nonfinite="rollback"`), the run keeps its training state in
memory and rolls back to it (`keep_state`, `roll_back`).
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from collections.abc import Callable
from typing import Any

from tftrain import checkpoint as checkpoint_lib
from tftrain.checkpoint.memory_snapshot import KeptState, Rollback, StateSnapshot
from tftrain.engine import calls
from tftrain.fit_inputs.epoch_plan import EpochPlan
from tftrain.services.protocol import Service, json_ready_state
from tftrain.timing import StepTimer

__all__ = ["TrainingRun", "close_all"]


class TrainingRun:  # implements tftrain.services.protocol.RunState
    """The outer loop's state in one `fit`: the progress, and the services around the steps.

    Args:
        plan: The training data plan (for the iterator a checkpoint saves).
        progress: Where the run starts (restored or fresh).
        services: Called in order after each host call and at each epoch end
            (the NaN guard first, the checkpoint after the summaries).
        checkpointer: The run's checkpoints, or None.
        timer: Times each host call, or None.
        trace_count: Returns the training step's traces in this run (a resumed
            run's count, the checkpoint's: `TimingService.trace_count`).
        saved_parts: The run's own state saved with the services' states,
            each under its `name` with its `state_dict()` (the data position,
            the run record); each loads itself at a resume (`tftrain.loops.restore`).
        total_steps: The run's step budget, or None.
    """

    def __init__(
        self,
        plan: EpochPlan,
        progress: checkpoint_lib.Progress,
        services: list[Service],
        *,
        checkpointer: checkpoint_lib.Checkpointer | None = None,
        timer: StepTimer | None = None,
        trace_count: Callable[[], int] = lambda: 0,
        saved_parts: tuple[Any, ...] = (),
        total_steps: int | None = None,
    ):
        self.plan = plan
        self.total_steps = total_steps
        self.progress = progress
        self.services = list(services)
        self.checkpointer = checkpointer
        self.trace_count = trace_count
        self.saved_parts = saved_parts
        self.resumed = progress.global_step > 0 or progress.epoch > 0
        self.epoch_steps: int | None = None  # steps in the current epoch, if known
        self.timer = timer
        self.nonfinite_step: int | None = None  # `RunState.nonfinite_step`: no checkpoint once set
        # `RunState.steps_kept_in_epoch`: a resumed run's checkpoint holds its epoch's steps so far.
        self.steps_kept_in_epoch = progress.step_in_epoch
        self._snapshot: StateSnapshot | None = None  # made at the first `keep_state`: none without rollbacks
        self._kept: KeptState | None = None
        self._unread: tuple[calls.PendingCall, bool] | None = None  # filed, results not read yet
        # A service acts on each call's results before the next call (`Service.reads_every_call`).
        self.reads_every_call = any(service.reads_every_call for service in self.services)
        # The services each hook calls: those whose method is not `Service`'s own (which does nothing).
        overrides = lambda service, hook: getattr(getattr(service, hook), "__func__", None) is not getattr(Service, hook)  # noqa: E731
        self.acting = {hook: [s for s in self.services if overrides(s, hook)] for hook in _HOOKS}

    @property
    def finished(self) -> bool:
        """Whether the run has trained its step budget (never, without one)."""
        return self.total_steps is not None and self.progress.global_step >= self.total_steps

    def data_position(self) -> tuple[Any, int]:
        """The iterator the next training step reads from, and the batches read in its pass so far.

        The iterator first: at an epoch end it starts the next pass, which has read no batch yet.
        """
        iterator = self.plan.next_iterator()
        return iterator, self.plan.batches_in_pass(self.progress.step_in_epoch)

    def report_validation(self, logs: dict[str, Any]) -> None:
        """Tells every service of a validation taken at the current step (`Service.validated`)."""
        for service in self.acting["validated"]:
            service.validated(self, logs)

    def latest_checkpoint(self) -> str | None:
        """The newest checkpoint of the run, or None."""
        return self.checkpointer.latest if self.checkpointer is not None else None

    def keep_state(self, *, steps_kept_in_epoch: int | None = None) -> bool:
        """Keeps the training state in memory, as the state `roll_back` returns to (`RunState.keep_state`).

        Args:
            steps_kept_in_epoch: The epoch's steps the state holds, where the
                run cannot count them itself (a resume: what its checkpoint
                saved). None: the run's count.

        Returns:
            Whether it was kept: not if a model or optimizer variable is NaN
            or infinite (the state kept before stays).

        Raises:
            ValueError: the run has no `model_dir` (no training state to keep).
        """
        if self.checkpointer is None:
            raise ValueError(
                "Cannot keep the training state: the run has no checkpointer. Expected a `model_dir`."
            )
        if self._snapshot is None:
            self._snapshot = StateSnapshot(self.checkpointer.training_state)
        if steps_kept_in_epoch is not None:
            self.steps_kept_in_epoch = steps_kept_in_epoch
        if not self._snapshot.take():
            return False
        step = self.progress.global_step
        self._kept = KeptState(dataclasses.replace(self.progress), self.steps_kept_in_epoch, since=step)
        return True

    @property
    def kept_progress(self) -> checkpoint_lib.Progress | None:
        """Where the state `roll_back` returns to was kept (`RunState.kept_progress`), or None."""
        return self._kept.progress if self._kept is not None else None

    def roll_back(self) -> Rollback:
        """Restores the kept training state; progress, data and services go on (`RunState.roll_back`).

        Raises:
            ValueError: no state is kept.
        """
        if self._kept is None or self._snapshot is None:
            raise ValueError(
                "Cannot roll back: no training state is kept. Expected `keep_state()` at a good step first."
            )
        self._snapshot.restore()
        step = self.progress.global_step
        lost = step - self._kept.since
        self._kept = dataclasses.replace(self._kept, since=step)
        self.steps_kept_in_epoch = self._kept.steps_kept_in_epoch
        self.nonfinite_step = None
        return Rollback(dataclasses.replace(self._kept.progress), lost)

    def kept_logs(self, logs: dict[str, Any]) -> dict[str, Any]:
        """An epoch's logs as the kept steps give them: NaN for each where rollbacks kept none of its steps.

        The metrics hold the kept steps alone (a rollback restores them with
        the weights), so the logs are their mean; where no step of the epoch
        is kept, a mean over none is NaN, never the values of metrics just
        reset. Every key stays (callbacks monitor them; NaN is no improvement).
        """
        if self.steps_kept_in_epoch > 0 or self.progress.step_in_epoch == 0:
            return logs
        return {key: float("nan") for key in logs}

    def service_states(self) -> dict[str, Any]:
        """Every service's state and each saved part's, by name (saved with a checkpoint), JSON-ready (`json_ready_state`).

        Raises:
            TypeError: a state holds a value JSON cannot save (named with its service and key path).
        """
        parts = (*self.saved_parts, *self.acting["state_dict"])  # a service without its own `state_dict` keeps none
        states = {part.name: json_ready_state(part.name, part.state_dict()) for part in parts}
        return {name: state for name, state in states.items() if state is not None}

    def steps_allowed(self, wanted: int) -> int:
        """`wanted`, shortened so that the host call ends at the next service boundary."""
        done = self.progress.global_step
        for service in self.acting["next_stop"]:
            stop = service.next_stop(done)
            if stop is not None:
                wanted = min(wanted, stop - done)
        return max(wanted, 1)

    def ends_at_boundary(self, steps: int) -> bool:
        """Whether a call of `steps` steps from here ends where a service acts (a save, a summary, ...)."""
        done = self.progress.global_step
        return any(service.next_stop(done) == done + steps for service in self.acting["next_stop"])

    def file_unread(self, call: calls.PendingCall, traced: bool) -> calls.LoopResult:
        """Files a dispatched call before its results are read: its steps count, its check waits for `settle`.

        The services run as after any call (no service acts at its last step:
        the caller checked `ends_at_boundary`); the NaN guard's check and the
        call's time come when `settle` reads the results.

        Returns:
            The `LoopResult` the services saw (the call's expected steps, logs not read).
        """
        result = call.expected()
        self._unread = (call, traced)  # first: a service that saves now (a preemption) settles it
        self.after_call(result, read=False)
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
        self.steps_kept_in_epoch -= missing
        self._read(result)

    def _read(self, result: calls.LoopResult) -> None:
        """Files a call's read results: notes a non-finite loss, then runs the services' `results_read`."""
        if result.nonfinite and self.nonfinite_step is None:
            self.nonfinite_step = self.progress.global_step
        for service in self.acting["results_read"]:
            service.results_read(self, result)

    def before_call(self) -> None:
        """Runs the services' `before_call` (the profiler starts at its window)."""
        for service in self.acting["before_call"]:
            service.before_call(self)

    def after_call(self, result: calls.LoopResult, *, read: bool = True) -> None:
        """Files a host call: counts its steps, then runs the services (NaN guard first).

        Args:
            result: What the call did.
            read: Whether its results were read (else `settle` reads them later).

        Raises:
            NonFiniteLossError: the last step's loss is NaN or infinite.
        """
        self.progress.global_step += result.steps
        self.progress.step_in_epoch += result.steps
        self.steps_kept_in_epoch += result.steps
        if read:
            self._read(result)
        for service in self.acting["after_call"]:
            service.after_call(self, result)

    @property
    def epoch_ending(self) -> bool:
        """Whether the epoch ends after the call just filed: at its last step, or at the step budget."""
        return self.finished or (
            self.epoch_steps is not None and self.progress.step_in_epoch >= self.epoch_steps
        )

    @property
    def cut_by_budget(self) -> bool:
        """Whether the step budget ended the run before the current epoch's last step.

        Such an epoch ends for the call (its hooks and services run), not for
        the run: its progress stays mid-epoch, so a call with a larger budget
        trains the rest of it, exactly as one uninterrupted call would.
        """
        return (
            self.finished and self.epoch_steps is not None and self.progress.step_in_epoch < self.epoch_steps
        )

    def end_epoch(self, epoch_logs: dict[str, Any]) -> None:
        """Moves the progress to the next epoch (not past a budget cut) and runs the services."""
        self.settle()
        if not self.cut_by_budget:
            self.progress.epoch += 1
            self.progress.step_in_epoch = 0
            self.steps_kept_in_epoch = 0
        for service in self.acting["end_epoch"]:
            service.end_epoch(self, epoch_logs)

    def close(self) -> None:
        """Closes every service (the profiler stops, writers flush, handlers and the lock go).

        Every service is closed even if one fails; the first error is raised after.
        """
        close_all(self.acting["close"])


_HOOKS = ("next_stop", "before_call", "after_call", "results_read", "end_epoch", "validated", "close", "state_dict")


def close_all(services: list[Service]) -> None:
    """Closes each service, all of them even if one raises; then raises the first error, if any.

    Where the run is ending on an error already (closed from its `finally`),
    a service's error in closing is warned of and never hides the run's own.
    """
    first_error: BaseException | None = None
    for service in services:
        try:
            service.close()
        except BaseException as error:  # the signal handlers and the writer lock must still go
            first_error = first_error or error
    if first_error is None:
        return
    if sys.exc_info()[1] is None:
        raise first_error
    warnings.warn(
        f"Closing the run's services failed too ({type(first_error).__name__}: {first_error}); "
        "the run's own error follows.",
        stacklevel=3,
    )
