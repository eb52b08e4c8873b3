"""The non-finite loss guard: training stops at the step whose loss is NaN, on every engine."""

import dataclasses
import os
import signal
import threading
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import (
    BAD_STEP,
    STEPS_PER_EPOCH,
    assert_checkpoints_finite,
    loss_of_batch,
    make_mlp,
    mse_args,
    read_run,
    regression_data,
    values_dataset,
)

import tftrain
from tftrain import options
from tftrain.engine import step_runner
from tftrain.errors import NonFiniteLossError
from tftrain.options import NonFinitePolicy

# Where the engine matters less: one that checks the loss on the host, one that checks it in the graph.
host_and_graph_checks = pytest.mark.parametrize("engine", ["graph", "loop3"], indirect=True)


def test_nan_loss_stops_training_at_that_step(engine):
    model = make_mlp()
    trainer = tftrain.Trainer(model, **mse_args(), **engine)
    with pytest.raises(NonFiniteLossError, match=rf"step {BAD_STEP}\b.*'loss': nan") as raised:
        trainer.fit(regression_data(), epochs=2, verbose=0)
    assert isinstance(raised.value, FloatingPointError)
    assert "terminate_on_nan=False" in str(raised.value)
    assert int(model.optimizer.iterations) == BAD_STEP  # no step ran after the bad one


@host_and_graph_checks
def test_no_checkpoint_holds_the_nan(engine, tmp_path):
    model = make_mlp()
    trainer = tftrain.Trainer(
        model, **mse_args(), **engine, model_dir=str(tmp_path), checkpoint_every_steps=2
    )
    with pytest.raises(NonFiniteLossError, match=rf"step {BAD_STEP}\b") as raised:
        trainer.fit(regression_data(), epochs=2, verbose=0)
    assert int(model.optimizer.iterations) == BAD_STEP
    assert not np.all(np.isfinite(model.get_weights()[0]))  # the bad step did reach the weights

    latest = assert_checkpoints_finite(tmp_path, BAD_STEP)
    assert latest in str(raised.value)  # the error points at the last good checkpoint
    reader = tf.train.load_checkpoint(latest)
    assert int(reader.get_tensor("progress/global_step/.ATTRIBUTES/VARIABLE_VALUE")) == 2


@host_and_graph_checks
def test_terminate_on_nan_false_trains_on(engine):
    model = make_mlp()
    trainer = tftrain.Trainer(model, **mse_args(), **engine, terminate_on_nan=False)
    history = trainer.fit(regression_data(), epochs=2, verbose=0)
    assert int(model.optimizer.iterations) == 2 * STEPS_PER_EPOCH
    assert np.isnan(history.history["loss"][0])


class NamedLossTrainer(tftrain.Trainer):
    """A custom-loop trainer whose logs are computed from the batch, counting its steps."""

    def __init__(self, *args, logs_fn, **kwargs):
        super().__init__(*args, **kwargs)
        self.logs_fn = logs_fn
        self.steps_run = tf.Variable(0, dtype=tf.int64, trainable=False)

    def train_step(self, batch):
        self.steps_run.assign_add(1)
        return self.logs_fn(*batch)


def named_loss_logs(x, y):
    bad = tf.reduce_mean(y)  # NaN at the bad batch
    return {"d_loss": tf.reduce_mean(x), "g_loss": bad}


def non_loss_logs(x, y):
    return {"loss": tf.reduce_mean(x), "ratio": tf.reduce_mean(y), "loss_scale": tf.reduce_max(y)}


def test_a_named_loss_counts(engine):
    trainer = NamedLossTrainer(make_mlp(), logs_fn=named_loss_logs, **engine)
    with pytest.raises(NonFiniteLossError, match=rf"step {BAD_STEP}\b.*'g_loss': nan"):
        trainer.fit(regression_data(), epochs=2, verbose=0)
    assert int(trainer.steps_run) == BAD_STEP


@host_and_graph_checks
def test_a_non_loss_log_does_not_stop_training(engine):
    trainer = NamedLossTrainer(make_mlp(), logs_fn=non_loss_logs, **engine)
    history = trainer.fit(regression_data(), epochs=2, verbose=0)
    assert int(trainer.steps_run) == 2 * STEPS_PER_EPOCH
    assert np.isfinite(history.history["loss"]).all()


def test_terminate_on_nan_must_be_a_bool():
    with pytest.raises(TypeError, match="terminate_on_nan"):
        tftrain.Trainer(make_mlp(), **mse_args(), terminate_on_nan="yes")
    with pytest.raises(TypeError, match="terminate_on_nan"):
        tftrain.Trainer(make_mlp(), **mse_args(), terminate_on_nan=1)


# ------------------------------------------------------------------ loops


loop_engines = pytest.mark.parametrize(
    "options",
    [
        options.EngineOptions(steps_per_loop=3),  # in-graph k-step loop
        options.EngineOptions(),  # host loop over a tf.function step
        options.EngineOptions(use_tf_function=False),  # host loop, eager
    ],
    ids=lambda options: options.name,
)


@loop_engines
def test_loop_stops_right_after_a_nonfinite_loss(options):
    loop = step_runner.make_runner(loss_of_batch, options, nonfinite_policy=NonFinitePolicy())
    iterator = iter(values_dataset())
    results = [loop(iterator, 3) for _ in range(4)]
    assert [result.steps for result in results] == [3, 1, 3, 2]
    assert [result.nonfinite for result in results] == [False, True, False, False]
    assert np.isnan(float(results[1].logs["loss"]))
    assert float(results[2].logs["loss"]) == 7.0  # the next call starts at the next batch


@loop_engines
def test_loop_without_the_guard_runs_every_step(options):
    loop = step_runner.make_runner(loss_of_batch, options)
    iterator = iter(values_dataset())
    results = [loop(iterator, 3) for _ in range(4)]
    assert [result.steps for result in results] == [3, 3, 3, 0]
    assert not any(result.nonfinite for result in results)
    assert float(results[1].logs["loss"]) == 6.0  # ran on past the NaN batch


@loop_engines
def test_loop_past_nonfinite_runs_every_step_and_flags_any_bad_one(options):
    # A fit with Keras's TerminateOnNaN: the calls run as under model.fit, and the flag keeps checkpoints out.
    guarded = step_runner.make_runner(loss_of_batch, options, nonfinite_policy=NonFinitePolicy())
    guarded(iter(values_dataset()), 1)
    loop = guarded.past_nonfinite()
    iterator = iter(values_dataset())
    results = [loop(iterator, 3) for _ in range(4)]
    assert [result.steps for result in results] == [3, 3, 3, 0]
    # The NaN is the first step of the second call, whose last loss (6.) is finite: still flagged.
    assert [result.nonfinite for result in results] == [False, True, False, False]
    assert float(results[1].logs["loss"]) == 6.0
    assert loop.trace_counter is guarded.trace_counter
    # The step is not traced again (eager: never traced).
    assert guarded.trace_counter.count == (1 if options.use_tf_function else 0)


class LazyModel(keras.Model):
    """Built on its first call only, by its own training step (no symbolic build)."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(3)

    def call(self, x, training=False):
        return self.dense(x)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self(x, training=True) - y))
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables, strict=True))
        return {"loss": loss}


def test_resume_into_an_unbuilt_model_is_a_clear_error(tmp_path):
    first = LazyModel()
    tftrain.Trainer(first, optimizer=keras.optimizers.SGD(0.01), model_dir=str(tmp_path)).fit(
        regression_data(nan_batch=None), epochs=1, verbose=0
    )
    assert first.built
    rerun = LazyModel()
    trainer = tftrain.Trainer(rerun, optimizer=keras.optimizers.SGD(0.01), model_dir=str(tmp_path))
    with pytest.raises(
        ValueError, match=r"Cannot resume from .*ckpt-\d+: the model is not built.*model\.build"
    ):
        trainer.fit(regression_data(nan_batch=None), epochs=2, verbose=0)
    rerun(np.zeros((1, 6), "float32"))  # built by a call: the fix the error suggests
    trainer.fit(regression_data(nan_batch=None), epochs=2, verbose=0)  # built: resumes at epoch 2
    assert int(rerun.optimizer.iterations) == 2 * STEPS_PER_EPOCH


def test_options_touch_no_directory_until_a_run_starts(tmp_path):
    from tftrain.options import RunOptions

    model_dir = tmp_path / "not" / "yet"
    options = RunOptions(model_dir=str(model_dir), checkpoint_every_steps=2)
    assert options.model_dir == str(model_dir) and not model_dir.exists()
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.max_to_keep = 3
    trainer = tftrain.Trainer(make_mlp(), optimizer="sgd", loss="mse", model_dir=str(model_dir))
    assert not model_dir.exists()
    trainer.fit(np.zeros((4, 6), "float32"), np.zeros((4, 3), "float32"), batch_size=2, verbose=0)
    assert (model_dir / "checkpoints").is_dir()


# ------------------------------------------------------------------ preemption


class _SignalAt(keras.callbacks.Callback):
    def __init__(self, step, number):
        super().__init__()
        self.step, self.number = step, number

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.step:
            os.kill(os.getpid(), self.number)


def test_a_configured_signal_checkpoints_and_stops_and_handlers_are_restored(tmp_path):
    before = signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM)
    trainer = tftrain.Trainer(
        make_mlp(),
        optimizer="sgd",
        loss="mse",
        model_dir=str(tmp_path),
        preemption_signals=("SIGTERM", "SIGUSR1"),
    )
    x, y = np.zeros((32, 6), "float32"), np.zeros((32, 3), "float32")
    with pytest.raises(tftrain.PreemptedError, match="stopped on SIGUSR1 at step 2") as info:
        trainer.fit(x, y, batch_size=4, epochs=2, callbacks=[_SignalAt(2, signal.SIGUSR1)], verbose=0)
    assert info.value.step == 2 and info.value.signal_number == signal.SIGUSR1
    assert info.value.checkpoint.endswith("ckpt-2") and os.path.exists(info.value.checkpoint + ".index")
    assert (signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGTERM)) == before
    resumed = tftrain.Trainer(trainer.model, model_dir=str(tmp_path))
    resumed.fit(x, y, batch_size=4, epochs=2, verbose=0)
    assert int(trainer.model.optimizer.iterations.numpy()) == 16


def test_no_handler_without_model_dir_or_with_no_signals(tmp_path):
    seen = []

    class Probe(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append(signal.getsignal(signal.SIGTERM))

    default = signal.getsignal(signal.SIGTERM)
    x, y = np.zeros((8, 6), "float32"), np.zeros((8, 3), "float32")
    tftrain.Trainer(make_mlp(), optimizer="sgd", loss="mse").fit(x, y, callbacks=[Probe()], verbose=0)
    tftrain.Trainer(
        make_mlp(), optimizer="sgd", loss="mse", model_dir=str(tmp_path), preemption_signals=()
    ).fit(x, y, callbacks=[Probe()], verbose=0)
    assert seen == [default, default]


def test_bad_preemption_signals():
    with pytest.raises(ValueError, match="preemption_signals='SIGNOPE'"):
        tftrain.Trainer(make_mlp(), preemption_signals="SIGNOPE")
    with pytest.raises(ValueError, match="not SIGKILL or SIGSTOP"):  # no handler can catch them
        tftrain.Trainer(make_mlp(), preemption_signals=("SIGUSR1", "SIGKILL"))


def test_fit_outside_the_main_thread_warns_that_preemption_cannot_checkpoint(tmp_path):
    caught = []

    def train():
        with warnings.catch_warnings(record=True) as records:
            warnings.simplefilter("always")
            trainer = tftrain.Trainer(make_mlp(), optimizer="sgd", loss="mse", model_dir=str(tmp_path))
            trainer.fit(np.zeros((8, 6), "float32"), np.zeros((8, 3), "float32"), verbose=0)
        caught.extend(str(record.message) for record in records)

    thread = threading.Thread(target=train)
    thread.start()
    thread.join()
    assert any("outside the main thread" in message for message in caught)


# ------------------------------------------------------------------ step budgets


class _Calls(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.ends = []

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append(int(self.model.optimizer.iterations.numpy()))


def test_a_step_budget_on_endless_data_is_one_epoch_and_calls_stop_at_it():
    endless = tf.data.Dataset.from_tensor_slices((np.zeros((8, 6), "float32"), np.zeros((8, 3), "float32")))
    calls = _Calls()
    trainer = tftrain.Trainer(make_mlp(), optimizer="sgd", loss="mse", steps_per_loop=3)
    history = trainer.fit(endless.batch(2).repeat(), total_steps=10, callbacks=[calls], verbose=0)
    assert calls.ends == [3, 6, 9, 10] and len(history.history["loss"]) == 1


def test_a_step_budget_over_epochs_cuts_the_last_one_and_validates_it():
    x, y = np.zeros((12, 6), "float32"), np.zeros((12, 3), "float32")
    trainer = tftrain.Trainer(make_mlp(), optimizer="sgd", loss="mse")
    history = trainer.fit(
        x, y, batch_size=2, total_steps=14, validation_data=(x, y), verbose=0
    )  # 6 per epoch
    assert history.epoch == [0, 1, 2] and len(history.history["val_loss"]) == 3
    assert int(trainer.model.optimizer.iterations.numpy()) == 14


def test_a_killed_step_budget_run_finishes_exactly(tmp_path):
    x = np.random.RandomState(0).rand(12, 6).astype("float32")
    y = x[:, :3] * 2

    def run(model_dir, callbacks=()):
        trainer = tftrain.Trainer(
            make_mlp(), optimizer="adam", loss="mse", model_dir=str(model_dir), checkpoint_every_steps=2
        )
        trainer.fit(x, y, batch_size=2, shuffle=False, total_steps=15, callbacks=list(callbacks), verbose=0)
        return trainer.model

    class Crash(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == 9:
                raise RuntimeError("killed")

    reference = run(tmp_path / "uninterrupted")
    with pytest.raises(RuntimeError, match="killed"):
        run(tmp_path / "killed", [Crash()])
    resumed = run(tmp_path / "killed")
    assert int(resumed.optimizer.iterations.numpy()) == 15
    for got, expected in zip(resumed.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-6)
    assert tf.train.latest_checkpoint(str(tmp_path / "killed" / "checkpoints")).endswith("ckpt-15")


def test_step_budget_bad_input():
    trainer = tftrain.Trainer(make_mlp(), optimizer="sgd", loss="mse")
    x, y = np.zeros((12, 6), "float32"), np.zeros((12, 3), "float32")
    with pytest.raises(ValueError, match="total_steps=14 and epochs=2.*takes 3 epochs"):
        trainer.fit(x, y, batch_size=2, total_steps=14, epochs=2, verbose=0)
    with pytest.raises(ValueError, match="total_steps=0"):
        trainer.fit(x, y, total_steps=0, verbose=0)
    unknown = tf.data.Dataset.from_tensor_slices((x, y)).batch(2).filter(lambda a, b: True)
    with pytest.raises(ValueError, match="data of unknown length and steps_per_epoch=None"):
        trainer.fit(unknown, total_steps=5, verbose=0)
    assert int(trainer.model.optimizer.iterations.numpy()) == 0


# ------------------------------------------------------------------ validation every N steps


def test_validation_every_n_steps_keeps_the_epochs_metrics_and_records_each(tmp_path):
    x = np.random.RandomState(0).rand(24, 6).astype("float32")
    y = (x[:, 0] * 3).astype("int32").clip(0, 2)
    tests = []

    class Tests(keras.callbacks.Callback):
        def on_test_end(self, logs=None):
            tests.append(int(self.model.optimizer.iterations.numpy()))

    def make(model_dir=None):
        return tftrain.Trainer(
            make_mlp(),
            keras.optimizers.SGD(0.1),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            model_dir=model_dir,
        )

    plain = make().fit(x, y, batch_size=4, epochs=2, shuffle=False, validation_data=(x, y), verbose=0)
    trainer = make(str(tmp_path))
    history = trainer.fit(
        x,
        y,
        batch_size=4,
        epochs=2,
        shuffle=False,
        validation_data=(x, y),
        validation_every_steps=4,
        callbacks=[Tests()],
        verbose=0,
    )
    # Every 4 steps (mid-epoch too) and at both epoch ends (6 steps each): at steps 4, 6, 8, 12, 12.
    assert tests == [4, 6, 8, 12, 12]
    assert history.step_history["step"] == [4, 8, 12] and len(history.step_history["val_loss"]) == 3
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):  # the epochs' logs are untouched
        np.testing.assert_allclose(history.history[key], plain.history[key], rtol=1e-6)
    validation = read_run(tmp_path / "validation")
    assert [step for step, _ in validation["step_loss"]] == [4, 8, 12]
    np.testing.assert_allclose(
        [value for _, value in validation["step_loss"]], history.step_history["val_loss"], rtol=1e-6
    )


def test_validation_every_n_steps_needs_validation_data():
    trainer = tftrain.Trainer(make_mlp(), optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="validation_every_steps=5 with no validation data"):
        trainer.fit(
            np.zeros((8, 6), "float32"), np.zeros((8, 3), "float32"), validation_every_steps=5, verbose=0
        )
    with pytest.raises(ValueError, match="validation_every_steps=0"):
        trainer.fit(
            np.zeros((8, 6), "float32"), np.zeros((8, 3), "float32"), validation_every_steps=0, verbose=0
        )
