"""TensorBoard summaries and the profiler window: what `Trainer(model_dir=...)` writes, read back."""

import glob
import os
import types

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import compile_args, make_mlp, read_run

import tftrain
from tftrain import options, summaries

STEPS_PER_EPOCH = 4  # 16 examples in batches of 4


def classification_data(examples=16, batch_size=4, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.rand(examples, 6).astype("float32")
    y = (x[:, 0] * 3).astype("int32").clip(0, 2)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)


def steps_of(events):
    return sorted({step for step, _ in events})


def values_at(events, step):
    return [value for event_step, value in events if event_step == step]


# ------------------------------------------------------------- event files


def test_fit_writes_train_and_validation_runs(tmp_path):
    train_ds, val_ds = classification_data(), classification_data(examples=8, seed=1)
    trainer = tftrain.Trainer(make_mlp(), **compile_args(), model_dir=str(tmp_path), summary_every_steps=2)
    history = trainer.fit(train_ds, epochs=2, validation_data=val_ds, verbose=0)
    epoch_ends = [STEPS_PER_EPOCH, 2 * STEPS_PER_EPOCH]

    train = read_run(tmp_path / "train")
    for tag in ("epoch_loss", "epoch_accuracy"):
        assert steps_of(train[tag]) == epoch_ends, tag
        assert len(train[tag]) == 2, tag
    np.testing.assert_allclose([v for _, v in train["epoch_loss"]], history.history["loss"], rtol=1e-6)
    np.testing.assert_allclose(
        [v for _, v in train["epoch_accuracy"]], history.history["accuracy"], rtol=1e-6
    )
    assert steps_of(train["step_loss"]) == [2, 4, 6, 8]
    assert steps_of(train["step_accuracy"]) == [2, 4, 6, 8]
    # The logs of an epoch's last step are the epoch's logs (running means).
    for step, value in train["epoch_loss"]:
        np.testing.assert_allclose(values_at(train["step_loss"], step), [value], rtol=1e-6)
    assert set(steps_of(train["learning_rate"])) == {2, 4, 6, 8}
    np.testing.assert_allclose([v for _, v in train["learning_rate"]], 0.01, rtol=1e-6)
    for tag in ("steps_per_sec", "examples_per_sec", "step_time_s"):
        assert steps_of(train[tag]) == [2, 4, 6, 8], tag
        assert all(np.isfinite(v) and v > 0 for _, v in train[tag]), tag
    for (_, steps_per_sec), (_, step_time) in zip(train["steps_per_sec"], train["step_time_s"], strict=True):
        np.testing.assert_allclose(steps_per_sec * step_time, 1.0, rtol=1e-5)
    for (_, examples_per_sec), (_, steps_per_sec) in zip(
        train["examples_per_sec"], train["steps_per_sec"], strict=True
    ):
        np.testing.assert_allclose(examples_per_sec, 4 * steps_per_sec, rtol=1e-5)  # batches of 4
    assert len(train["trace_time_s"]) == 1
    assert train["trace_time_s"][0][0] == 1 and train["trace_time_s"][0][1] > 0
    assert not any(tag.startswith(("val_", "epoch_val_")) for tag in train)

    validation = read_run(tmp_path / "validation")
    assert set(validation) == {"epoch_loss", "epoch_accuracy"}
    for tag in ("loss", "accuracy"):
        events = validation[f"epoch_{tag}"]
        assert [step for step, _ in events] == epoch_ends
        np.testing.assert_allclose([v for _, v in events], history.history[f"val_{tag}"], rtol=1e-6)


def test_without_summary_every_steps_only_epoch_ends_are_written(tmp_path):
    trainer = tftrain.Trainer(make_mlp(), **compile_args(), model_dir=str(tmp_path))
    trainer.fit(classification_data(), epochs=2, verbose=0)
    train = read_run(tmp_path / "train")
    assert steps_of(train["epoch_loss"]) == [4, 8]
    assert steps_of(train["learning_rate"]) == [4, 8]
    assert not any(tag.startswith("step_") and tag != "step_time_s" for tag in train)  # no per-step logs
    for speed in ("steps_per_sec", "examples_per_sec", "step_time_s"):  # a speed curve in a default run
        assert steps_of(train[speed]) == [4, 8]
    assert not glob.glob(str(tmp_path / "validation" / "*"))


def test_learning_rate_schedule_is_logged_at_each_step(tmp_path):
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    args = dict(compile_args(), optimizer=keras.optimizers.SGD(schedule))
    trainer = tftrain.Trainer(make_mlp(), **args, model_dir=str(tmp_path), summary_every_steps=1)
    trainer.fit(classification_data(), epochs=2, verbose=0)

    learning_rate = read_run(tmp_path / "train")["learning_rate"]
    assert steps_of(learning_rate) == list(range(1, 9))
    for step, value in learning_rate:  # after `step` steps, optimizer.iterations == step
        np.testing.assert_allclose(value, float(schedule(step)), rtol=1e-5)
    assert len({round(value, 10) for _, value in learning_rate}) == 8  # it changes at every step
    assert int(trainer.model.optimizer.iterations) == 8
    np.testing.assert_allclose(
        summaries.learning_rate_of(trainer.model.optimizer), float(schedule(8)), rtol=1e-6
    )


# ----------------------------------------------------------- learning rate


def test_learning_rate_of_a_float_learning_rate():
    value = summaries.learning_rate_of(keras.optimizers.SGD(0.05))
    assert isinstance(value, float)
    np.testing.assert_allclose(value, 0.05, rtol=1e-6)


def test_learning_rate_of_a_schedule_is_evaluated_at_the_iterations():
    schedule = keras.optimizers.schedules.PolynomialDecay(0.1, decay_steps=10, end_learning_rate=0.0)
    optimizer = keras.optimizers.SGD(schedule)
    np.testing.assert_allclose(summaries.learning_rate_of(optimizer), 0.1, rtol=1e-6)
    optimizer.iterations.assign(4)
    np.testing.assert_allclose(summaries.learning_rate_of(optimizer), 0.06, rtol=1e-5)
    # An optimizer-like object that hands back the schedule itself.
    unevaluated = types.SimpleNamespace(learning_rate=schedule, iterations=tf.constant(5, tf.int64))
    np.testing.assert_allclose(summaries.learning_rate_of(unevaluated), 0.05, rtol=1e-5)


def test_learning_rate_of_no_optimizer_is_none():
    assert summaries.learning_rate_of(None) is None
    assert summaries.learning_rate_of(object()) is None
    assert summaries.learning_rate_of(types.SimpleNamespace(learning_rate="fast")) is None


# -------------------------------------------------------- steps arithmetic


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_check_every_steps_rejects_bad_values(value):
    with pytest.raises(ValueError, match="summary_every_steps"):
        options.check_every_steps(value, "summary_every_steps")
    with pytest.raises(ValueError, match="summary_every_steps"):
        summaries.TrainingSummaries("unused", every_steps=value)


@pytest.mark.parametrize("value", [None, 1, 7])
def test_check_every_steps_accepts_none_and_positive_integers(value):
    options.check_every_steps(value, "checkpoint_every_steps")


# ----------------------------------------------------------- profile window


@pytest.mark.parametrize("window", [(0, 3), (5, 2), (1,), (1, 2, 3), "x", "12", 3, (1.5, 2), (True, 2)])
def test_check_profile_steps_rejects_bad_windows(window):
    with pytest.raises(ValueError, match="profile_steps"):
        options.check_profile_steps(window)


def test_check_profile_steps_accepts_good_windows():
    assert options.check_profile_steps(None) is None
    assert options.check_profile_steps(None, total_steps=3) is None
    assert options.check_profile_steps((2, 3)) == (2, 3)
    assert options.check_profile_steps([1, 1], total_steps=1) == (1, 1)
    assert options.check_profile_steps((np.int64(2), 4), total_steps=4) == (2, 4)
    assert options.check_profile_steps((2, 100)) == (2, 100)  # total unknown


def test_check_profile_steps_rejects_a_window_past_the_run():
    with pytest.raises(ValueError, match=r"profile_steps.*only 4 steps"):
        options.check_profile_steps((2, 5), total_steps=4)


def test_trainer_checks_profile_steps(tmp_path):
    with pytest.raises(ValueError, match="profile_steps.*model_dir"):
        tftrain.Trainer(make_mlp(), **compile_args(), profile_steps=(2, 3))
    with pytest.raises(ValueError, match="profile_steps"):
        tftrain.Trainer(make_mlp(), **compile_args(), model_dir=str(tmp_path), profile_steps=(3, 2))
    model = make_mlp()
    trainer = tftrain.Trainer(model, **compile_args(), model_dir=str(tmp_path), profile_steps=(2, 9))
    two_step_epochs = classification_data(examples=8)
    with pytest.raises(ValueError, match=r"profile_steps.*only 4 steps"):
        trainer.fit(two_step_epochs, epochs=2, verbose=0)
    assert int(model.optimizer.iterations) == 0  # raised before any step trained
    assert not glob.glob(str(tmp_path / "train" / "plugins" / "profile" / "*"))


@pytest.fixture
def profiler_calls(monkeypatch):
    """Records the optimizer's iterations each time the profiler starts and stops.

    Set `profiler_calls.model` to the model being trained.
    """
    calls = types.SimpleNamespace(model=None, events=[])
    start, stop = tf.profiler.experimental.start, tf.profiler.experimental.stop

    def recording_start(*args, **kwargs):
        calls.events.append(("start", int(calls.model.optimizer.iterations)))
        return start(*args, **kwargs)

    def recording_stop(*args, **kwargs):
        calls.events.append(("stop", int(calls.model.optimizer.iterations)))
        return stop(*args, **kwargs)

    monkeypatch.setattr(tf.profiler.experimental, "start", recording_start)
    monkeypatch.setattr(tf.profiler.experimental, "stop", recording_stop)
    return calls


class CallStarts(keras.callbacks.Callback):
    """Records the global step at the start of each host call."""

    def __init__(self):
        super().__init__()
        self.steps_done = []

    def on_train_batch_begin(self, batch, logs=None):
        self.steps_done.append(int(self.model.optimizer.iterations))


@pytest.mark.parametrize(
    "steps_per_loop, call_starts",
    [
        (1, list(range(8))),
        # Host calls end before step 2 and after step 3: 0->1, 1->3, 3->4 (epoch end), 4->7, 7->8.
        (3, [0, 1, 3, 4, 7]),
    ],
)
def test_profile_window_writes_a_trace(tmp_path, profiler_calls, steps_per_loop, call_starts):
    model = make_mlp()
    profiler_calls.model = model
    trainer = tftrain.Trainer(
        model, **compile_args(), model_dir=str(tmp_path), profile_steps=(2, 3), steps_per_loop=steps_per_loop
    )
    starts = CallStarts()
    trainer.fit(classification_data(), epochs=2, callbacks=[starts], verbose=0)
    assert int(model.optimizer.iterations) == 8
    assert profiler_calls.events == [("start", 1), ("stop", 3)]
    assert starts.steps_done == call_starts
    traces = glob.glob(str(tmp_path / "train" / "plugins" / "profile" / "*" / "*.xplane.pb"))
    assert len(traces) == 1
    assert os.path.getsize(traces[0]) > 0


def test_profile_window_is_stopped_when_training_fails(tmp_path, profiler_calls):
    class Failing(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations) == 2:
                raise RuntimeError("boom")

    model = make_mlp()
    profiler_calls.model = model
    trainer = tftrain.Trainer(model, **compile_args(), model_dir=str(tmp_path), profile_steps=(2, 4))
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(classification_data(), epochs=2, callbacks=[Failing()], verbose=0)
    assert profiler_calls.events == [("start", 1), ("stop", 2)]
