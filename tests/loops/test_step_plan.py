"""`StepPlan`: the steps of each host call of a pass, and the indices its batch hooks get."""

import pytest
import tensorflow as tf

from tftrain import checkpoint as checkpoint_lib
from tftrain.compat import keras_internals
from tftrain.engine.auto_steps import PROBE_CALLS, PROBE_STEPS, StepsPerCall
from tftrain.engine.calls import LoopResult
from tftrain.fit_inputs.epoch_plan import EpochPlan
from tftrain.fit_inputs.inputs import AdaptedInput
from tftrain.loops.step_plan import StepPlan
from tftrain.loops.training_run import TrainingRun
from tftrain.services.protocol import EveryNSteps, Service


def batches(count=None):
    dataset = tf.data.Dataset.range(10).batch(1)
    return dataset.repeat() if count is None else dataset.take(count)


def epoch_plan(dataset, steps_per_epoch=None):
    plan = EpochPlan(AdaptedInput(dataset=dataset, adapter=None, kind="dataset", steps=steps_per_epoch))
    plan.begin_epoch()
    return plan


class Every(Service):
    """A service whose host calls end every `every` global steps."""

    name = "every"

    def __init__(self, every, reads_every_call=False):
        self.when = EveryNSteps(every)
        self.reads_every_call = reads_every_call

    def next_stop(self, step):
        return self.when.next_stop(step)


def training_run(plan, *services, step_in_epoch=0):
    progress = checkpoint_lib.Progress(step_in_epoch=step_in_epoch, global_step=step_in_epoch)
    return TrainingRun(plan, progress, list(services))


def run_calls(steps, ran=None):
    """Plans calls until the epoch ends; each runs what was planned (or `ran(planned)`); returns their steps."""
    planned = []
    while steps.more_calls():
        num_steps = steps.next_call_steps()
        if num_steps is None:
            break
        planned.append(num_steps)
        steps.advance(num_steps if ran is None else ran(num_steps))
    return planned


def test_a_fixed_k_runs_past_steps_per_epoch_to_the_next_multiple_of_k():
    steps = StepPlan(epoch_plan(batches(), steps_per_epoch=10), StepsPerCall(4))
    assert (steps.target, steps.epoch_end, steps.epoch_steps()) == (10, 12, 12)
    assert run_calls(steps) == [4, 4, 4]
    assert steps.step == 12 and not steps.data_ended


def test_auto_ends_its_calls_at_steps_per_epoch():
    auto = StepsPerCall("auto")
    steps = StepPlan(epoch_plan(batches(), steps_per_epoch=10), auto)
    assert (steps.epoch_end, steps.epoch_steps()) == (10, 10)
    assert steps.measuring
    for _ in range(PROBE_CALLS):
        assert steps.next_call_steps() == 1
        steps.advance(1)
        auto.record(1, 0.01, traced=False)
    assert auto.next() == PROBE_STEPS > 10 - PROBE_CALLS
    assert steps.next_call_steps() == 10 - PROBE_CALLS  # the probe call ends at the epoch's end
    assert steps.requested == PROBE_STEPS


def test_a_call_ends_where_the_data_does_and_keeps_the_steps_keras_counts():
    steps = StepPlan(epoch_plan(batches(10)), StepsPerCall(4))
    assert (steps.target, steps.epoch_end, steps.epoch_steps()) == (10, 12, 10)
    assert run_calls(steps) == [4, 4, 2]
    assert (steps.requested, steps.planned, steps.shortened_by_run) == (4, 2, False)
    # The index Keras reports for a call of k steps, not the call's last step (9).
    assert steps.batch_end_index(8) == keras_internals.batch_end_index(8, 4) != 9
    assert not steps.data_ended


def test_steps_per_epoch_past_the_data_ends_at_the_data():
    steps = StepPlan(epoch_plan(batches(10), steps_per_epoch=12), StepsPerCall(4))
    assert steps.epoch_steps() == 10
    for planned in (4, 4, 2):
        assert steps.next_call_steps() == planned
        steps.advance(planned)
    assert steps.more_calls() and not steps.data_ended
    assert steps.next_call_steps() is None  # no call (and no hook) once no batch is left
    assert steps.data_ended


def test_the_run_shortens_a_call_to_the_next_service_boundary():
    plan = epoch_plan(batches(), steps_per_epoch=10)
    run = training_run(plan, Every(3))
    steps = StepPlan(plan, StepsPerCall(4), run=run)
    assert steps.next_call_steps() == 3
    assert (steps.requested, steps.shortened_by_run, steps.counts_whole_calls) == (4, True, False)
    run.progress.global_step += 3
    assert steps.batch_end_index(steps.advance(3)) == 2  # the call's last step: Keras has no such call
    assert steps.next_call_steps() == 3 and steps.shortened_by_run  # 3 -> 6, before the k-step 3 -> 7


def test_a_call_the_run_does_not_shorten_counts_whole_calls():
    plan = epoch_plan(batches(), steps_per_epoch=10)
    steps = StepPlan(plan, StepsPerCall(4), run=training_run(plan, Every(8)))
    assert steps.next_call_steps() == 4 and steps.counts_whole_calls
    begin = steps.advance(4)
    assert steps.batch_end_index(begin) == keras_internals.batch_end_index(0, 4)


def test_a_resumed_epoch_starts_at_the_runs_step_in_epoch():
    plan = epoch_plan(batches(), steps_per_epoch=10)
    steps = StepPlan(plan, StepsPerCall(4), run=training_run(plan, step_in_epoch=5))
    assert steps.step == 5
    assert run_calls(steps) == [4, 3]  # to the epoch end at 12


def test_auto_hooks_count_the_steps_run():
    steps = StepPlan(epoch_plan(batches(), steps_per_epoch=10), StepsPerCall("auto"))
    steps.next_call_steps()
    assert not steps.counts_whole_calls
    assert steps.batch_end_index(steps.advance(1)) == 0


@pytest.mark.parametrize(
    ("ran", "nonfinite", "reads_every_call", "ran_out"),
    [
        (4, False, False, False),
        (1, False, False, True),
        (1, True, False, True),  # stopped at a non-finite loss: the NaN guard raises
        (1, True, True, False),  # rolled back at its blow-up: the data goes on
    ],
)
def test_a_short_call_found_the_end_of_the_data(ran, nonfinite, reads_every_call, ran_out):
    plan = epoch_plan(batches(), steps_per_epoch=10)
    steps = StepPlan(plan, StepsPerCall(4), run=training_run(plan, Every(100, reads_every_call)))
    steps.next_call_steps()
    assert steps.ran_out(LoopResult(ran, ran, None, nonfinite)) is ran_out
    assert steps.data_ended is ran_out


def test_where_no_count_says_where_the_data_ends_keras_begins_one_more_call():
    unannounced = epoch_plan(batches(10).filter(lambda batch: True))
    steps = StepPlan(unannounced, StepsPerCall(4))
    assert (steps.target, steps.epoch_steps()) == (None, None)
    steps.next_call_steps()
    assert steps.unannounced_begin_index(8) == 12
    counted = StepPlan(epoch_plan(batches(10)), StepsPerCall(4))
    counted.next_call_steps()
    assert counted.unannounced_begin_index(8) is None
    auto = StepPlan(unannounced, StepsPerCall("auto"))
    auto.next_call_steps()
    assert auto.unannounced_begin_index(8) is None


def test_ends_pass_and_measuring():
    steps = StepPlan(epoch_plan(batches(), steps_per_epoch=10), StepsPerCall(4))
    assert not steps.measuring
    steps.advance(8)
    assert steps.ends_pass(2) and steps.ends_pass(4) and not steps.ends_pass(1)
    endless = StepPlan(epoch_plan(batches().filter(lambda batch: True)), StepsPerCall(4))
    assert endless.more_calls() and not endless.ends_pass(1000)
