"""`StepPlan`: how many steps each host call of one pass runs, and where the pass's calls end.

Shaped like Keras's `EpochIterator`, which hides `steps_per_execution` from
the loops: the plan counts the pass's steps, sizes each call (`steps_per_loop`
or `"auto"`, the epoch's end, the data left, the services' next stop), says
which index the batch hooks get, and notes where the data ended.
"""

from __future__ import annotations

from tftrain.compat import keras_internals
from tftrain.engine import calls
from tftrain.engine.auto_steps import StepsPerCall
from tftrain.fit_inputs.epoch_plan import EpochPlan
from tftrain.loops.training_run import TrainingRun

__all__ = ["StepPlan"]


class StepPlan:
    """The steps of one pass (an epoch, an evaluation or a prediction), one host call at a time.

    As under `fit`, a fixed k runs k steps per call, past the epoch's
    `steps_per_epoch` up to the next multiple of k (Keras's
    `steps_per_execution`); `"auto"` ends its calls at the epoch's steps.
    Every call ends where the data does and, in training, at the next
    service boundary (`TrainingRun.steps_allowed`).

    Args:
        plan: The pass's data (its steps, and the batches left in its pass).
        steps_per_call: The steps each call runs before the pass shortens it.
        run: The training run (None for an evaluation or a prediction): the
            pass starts at its step in the epoch (after a resume), and its
            calls end at the services' boundaries.

    Attributes:
        target: The epoch's steps, or None while unknown (the calls go on
            until the data ends or the loop stops).
        epoch_end: Where the epoch's calls end: `target`, or with a fixed k
            the next multiple of k at or after it.
        step: Steps run in the epoch so far.
        requested: The steps the last planned call was asked for, before the
            pass shortened it (`StepsPerCall.next`).
        planned: The steps of the last planned call.
        shortened_by_run: Whether the run shortened the last planned call
            (it ends at a service boundary).
        data_ended: Whether the data ended before the epoch's end.
    """

    def __init__(self, plan: EpochPlan, steps_per_call: StepsPerCall, *, run: TrainingRun | None = None):
        self._plan = plan
        self._steps_per_call = steps_per_call
        self._run = run
        self.target = plan.steps
        self.epoch_end = self.target
        if self.target is not None and not steps_per_call.auto:
            self.epoch_end = -(-self.target // steps_per_call.chosen) * steps_per_call.chosen
        self.step = run.progress.step_in_epoch if run is not None else 0
        self.requested: int | None = None
        self.planned: int | None = None
        self.shortened_by_run = False
        self.data_ended = False

    def epoch_steps(self) -> int | None:
        """The steps the epoch runs, where known (for `TrainingRun.epoch_steps`; after the epoch began).

        A fixed k's epoch runs to `epoch_end`, and also ends where the data does.
        """
        if self.target is None or self._steps_per_call.auto:
            return self.target
        left = self._plan.batches_left(self.step)
        return self.epoch_end if left is None else min(self.epoch_end, self.step + left)

    def more_calls(self) -> bool:
        """Whether the epoch has steps left to run (always, while its steps are unknown)."""
        return self.target is None or self.step < self.target

    def next_call_steps(self) -> int | None:
        """Plans the next call: its steps, or None where the data ended before it (`data_ended`).

        The steps are the least of `StepsPerCall.next()`, the steps to
        `epoch_end`, the batches left in the pass and what the run allows
        (`TrainingRun.steps_allowed`); `requested`, `planned` and
        `shortened_by_run` describe the call.
        """
        self.requested = steps = self._steps_per_call.next()
        if self.epoch_end is not None:
            steps = min(steps, self.epoch_end - self.step)
        left = self._plan.batches_left(self.step)
        if left is not None:
            if left <= 0:  # the pass ended before the epoch: no call, and no hook for a call with no step
                self.data_ended = True
                return None
            steps = min(steps, left)
        self.shortened_by_run = False
        if self._run is not None:
            allowed = self._run.steps_allowed(steps)
            self.shortened_by_run = allowed < steps
            steps = allowed
        self.planned = steps
        return steps

    @property
    def measuring(self) -> bool:
        """Whether `"auto"` is still measuring calls to choose its steps per call."""
        return self._steps_per_call.chosen is None

    def ends_pass(self, steps: int) -> bool:
        """Whether a call of `steps` steps from here is the pass's last (it reaches `target`)."""
        return self.target is not None and self.step + steps >= self.target

    @property
    def counts_whole_calls(self) -> bool:
        """Whether Keras counts the last planned call as `requested` steps (a fixed k the run did not shorten).

        Keras's epoch iterator counts k steps per call; `"auto"` and a call
        ending at a service boundary have no Keras counterpart, so their
        hooks count the steps run.
        """
        return not (self._steps_per_call.auto or self.shortened_by_run)

    def advance(self, steps: int) -> int:
        """Counts a call's `steps` (run, or filed to be read later); returns the step it began at."""
        begin = self.step
        self.step += steps
        return begin

    def batch_end_index(self, begin: int) -> int:
        """The index the batch end hook gets for the call that began at `begin` (after `advance`).

        The index Keras reports for a call of `requested` steps
        (`keras_internals.batch_end_index`), or the call's last step where
        Keras would not count it so (`counts_whole_calls`).
        """
        if not self.counts_whole_calls:
            return self.step - 1
        return keras_internals.batch_end_index(begin, self.requested)

    def ran_out(self, result: calls.LoopResult) -> bool:
        """Whether a call that ran `result.steps` found the end of the data (then `data_ended`).

        A call that ran fewer steps than planned found the end, except a
        call that stopped at its blow-up and was rolled back (a run whose
        services read every call, flagging a non-finite loss).
        """
        rolled_back = result.nonfinite and self._run is not None and self._run.reads_every_call
        ran_out = result.steps < self.planned and not rolled_back
        self.data_ended = self.data_ended or ran_out
        return ran_out

    def found_no_batch(self) -> None:
        """Notes that the data ended where no count said so: a call found no batch (`data_ended`)."""
        self.data_ended = True

    def unannounced_begin_index(self, begin: int) -> int | None:
        """After a short call that began at `begin`: the index of the begin hook Keras calls next, or None.

        Where no count says where the data ends, Keras's epoch iterator counts
        k steps per call and starts one more call, which finds no batch: its
        begin hook, at `begin + requested`, with no end hook.
        """
        if self._plan.may_end_unannounced and self.counts_whole_calls:
            return begin + self.requested
        return None
