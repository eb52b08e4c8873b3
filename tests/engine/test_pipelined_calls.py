"""Results read one call late: no host sync per call, with the NaN guard's and the timing's guarantees kept."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    STEPS_PER_EPOCH,
    assert_checkpoints_finite,
    loss_of_batch,
    make_mlp,
    mse_args,
    regression_data,
    values_dataset,
)

import tftrain
from tftrain import options
from tftrain.engine import step_runner
from tftrain.errors import NonFiniteLossError


@pytest.fixture
def calls(monkeypatch):
    """Spies on `StepRunner.dispatch`: a list of ("dispatch", n) and ("read", n) events, in order."""
    events = []
    dispatch = step_runner.StepRunner.dispatch

    def spied(self, *args, **kwargs):
        call = dispatch(self, *args, **kwargs)
        number = sum(kind == "dispatch" for kind, _ in events)
        events.append(("dispatch", number))
        read = call._read

        def logged_read():
            events.append(("read", number))
            return read()

        call._read = logged_read
        return call

    monkeypatch.setattr(step_runner.StepRunner, "dispatch", spied)
    return events


def read_late(events) -> list[bool]:
    """Per call that was read: whether its results were read after the next call was dispatched."""
    dispatched = [number for kind, number in events if kind == "dispatch" and ("read", number) in events]
    late = []
    for number in dispatched:
        read_at = events.index(("read", number))
        late.append(("dispatch", number + 1) in events[:read_at])
    return late


# ------------------------------------------------------------------ the loop


# The in-graph loop: "auto" runs calls of any k in it (1 while it measures).
@pytest.mark.parametrize("steps_per_loop", [1, 3])
@pytest.mark.parametrize("available", [True, False], ids=["counted", "peeked"])
def test_a_call_after_an_unread_nonfinite_call_runs_no_step(steps_per_loop, available):
    loop = step_runner.make_runner(
        loss_of_batch, options.EngineOptions(steps_per_loop="auto"), nonfinite_policy=options.NonFinitePolicy()
    )
    iterator = iter(values_dataset())  # 1, 2, 3, nan, 5, ...
    calls = []
    for _ in range(3 // steps_per_loop + 2):  # up to the NaN call, and one after it
        calls.append(
            loop.dispatch(iterator, steps_per_loop, available=available, after=calls[-1] if calls else None)
        )
    bad = calls[3 // steps_per_loop]
    assert bad.result().nonfinite
    assert np.isnan(float(bad.result().logs["loss"]))
    assert bad.result().steps == 3 % steps_per_loop + 1  # stopped right at the NaN step
    assert calls[-1].result().steps == 0  # dispatched after it: ran no step
    after = loop(iterator, 1)
    assert float(after.logs["loss"]) == 5.0  # and fetched no batch


@pytest.mark.parametrize("drop_remainder", [True, False], ids=["static_batch", "partial_batch"])
def test_counted_loop_counts_examples_once_or_per_step(drop_remainder):
    loop = step_runner.make_runner(loss_of_batch, options.EngineOptions(steps_per_loop="auto"))
    dataset = tf.data.Dataset.range(10, output_type=tf.float32).batch(4, drop_remainder=drop_remainder)
    iterator = iter(dataset)  # 4, 4 (, 2) examples
    first = loop.dispatch(iterator, 2, available=True)
    second = loop.dispatch(iterator, 1, available=True, after=first) if not drop_remainder else None
    assert first.result().steps == 2 and first.result().examples == 8
    assert float(first.result().logs["loss"]) == 5.5  # the mean of 4..7
    if second is not None:
        assert second.result().examples == 2 and float(second.result().logs["loss"]) == 8.5


# ------------------------------------------------------------------ fit


@pytest.mark.parametrize("steps_per_loop", [2, 3])
def test_steady_calls_are_read_after_the_next_dispatch(steps_per_loop, calls):
    trainer = tftrain.Trainer(make_mlp(), **mse_args(), steps_per_loop=steps_per_loop)
    trainer.fit(regression_data(nan_batch=None).repeat(3), epochs=2, verbose=0)
    late = read_late(calls)
    per_epoch = 3 * STEPS_PER_EPOCH // steps_per_loop
    assert len(late) == 2 * per_epoch
    second_epoch = late[per_epoch:]
    # Every call but the epoch's last is read while the next one runs: no sync per call.
    assert second_epoch == [True] * (per_epoch - 1) + [False]
    report = trainer.timing
    assert report.steps == 2 * 3 * STEPS_PER_EPOCH
    assert report.examples_per_sec is not None and report.examples_per_sec > 0
    assert 0 < report.step_time_median_s < report.first_step_s


@pytest.mark.parametrize("steps_per_loop", [1, 2])
def test_a_batch_hook_or_one_step_calls_read_every_call_at_once(steps_per_loop, calls):
    """A batch hook reads the logs anyway; one-step calls have no in-graph way to skip a step after a NaN."""
    seen = []
    hook = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(logs["loss"]))
    trainer = tftrain.Trainer(make_mlp(), **mse_args(), steps_per_loop=steps_per_loop)
    callbacks = [hook] if steps_per_loop > 1 else []
    trainer.fit(regression_data(nan_batch=None), epochs=1, verbose=0, callbacks=callbacks)
    assert read_late(calls) == [False] * (STEPS_PER_EPOCH // steps_per_loop)
    if callbacks:
        assert len(seen) == STEPS_PER_EPOCH // steps_per_loop and all(np.isfinite(seen))


@pytest.mark.parametrize(
    "steps_per_loop,bad_step",
    [(2, 5), (3, 6), (3, 7)],
    ids=["first_of_a_call", "inside_a_call", "last_of_a_call"],
)
def test_nan_in_an_unread_call_stops_at_its_step_and_is_never_saved(
    steps_per_loop, bad_step, calls, tmp_path
):
    model = make_mlp()
    trainer = tftrain.Trainer(
        model,
        **mse_args(),
        steps_per_loop=steps_per_loop,
        model_dir=str(tmp_path),
        checkpoint_every_steps=4,
    )
    with pytest.raises(NonFiniteLossError, match=rf"step {bad_step} \(epoch 1, step {bad_step} of") as raised:
        trainer.fit(regression_data(nan_batch=bad_step - 1), epochs=2, verbose=0)
    assert any(read_late(calls))  # the NaN was found in a call read late
    assert int(model.optimizer.iterations) == bad_step  # the call dispatched after it ran no step
    assert int(trainer.global_step) == bad_step
    latest = assert_checkpoints_finite(tmp_path, bad_step)
    assert latest.endswith("-4") and latest in str(raised.value)
