"""`on_nonfinite="rollback"`: a loss blow-up restores the newest state kept in memory and skips the batches since.

The reference for what a rollback leaves is a run that never read the
skipped batches: with the same seeds, its weights, optimizer state and logs
must be bit-identical to those of the run that rolled back. States are kept
every `keep_every_steps` steps (1 eagerly, k with `steps_per_loop=k`, 4 with
"auto"), at each epoch start, at each checkpoint step and where the run starts.
"""

import json
import logging
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import ENGINES, finish_job, read_run, start_job

import tftrain
from tftrain.checkpoint.state import SERVICE_STATES_KEY
from tftrain.errors import DryRunError
from tftrain.options import EngineOptions
from tftrain.services.loss_recovery import keep_every_steps_for

BATCH = 4
STEPS = 12
JOB = os.path.join(os.path.dirname(os.path.dirname(__file__)), "jobs", "rollback_job.py")


def data():
    rng = np.random.RandomState(0)
    x = rng.rand(STEPS * BATCH, 5).astype("float32")
    y = rng.rand(STEPS * BATCH, 2).astype("float32")
    return x, y


def batches(x, y, *, nan_steps=(), spike_steps=(), without=()):
    """The run's batches in order (1-based steps): NaN or 1e4 targets at some, some left out."""
    y = y.copy()
    for step in nan_steps:
        y[(step - 1) * BATCH] = np.nan
    for step in spike_steps:
        y[(step - 1) * BATCH : step * BATCH] = 1e4
    keep = [step for step in range(1, STEPS + 1) if step not in without]
    rows = np.concatenate([np.arange((step - 1) * BATCH, step * BATCH) for step in keep])
    return tf.data.Dataset.from_tensor_slices((x[rows], y[rows])).batch(BATCH)


def make_model():
    keras.utils.set_random_seed(3)
    return keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)]
    )


def trainer(model, **kwargs):
    return tftrain.Trainer(model, keras.optimizers.Adam(0.01), "mse", metrics=["mae"], **kwargs)


def keep_every(engine_kwargs):
    """The steps between kept states under an engine's Trainer arguments."""
    options = {key: value for key, value in engine_kwargs.items() if key != "jit_compile"}
    return keep_every_steps_for(EngineOptions(**{"steps_per_loop": "auto", **options}))


def lost_steps(nan_steps, *cadences, epoch_starts=()):
    """The steps each blow-up throws away: those since the newest kept step before it (a cadence multiple or an epoch start)."""
    lost, since = [], {}
    for bad in nan_steps:
        kept = max(
            step
            for step in range(0, bad)
            if step == 0
            or step in epoch_starts
            or any(cadence and step % cadence == 0 for cadence in cadences)
        )
        start = max(kept, since.get(kept, kept))  # steps since the last rollback to the same state
        lost.extend(range(start + 1, bad + 1))
        since[kept] = bad
    return tuple(lost)


def assert_same_state(a, b):
    for x, y in zip(a.get_weights() + [v.numpy() for v in a.optimizer.variables],
                    b.get_weights() + [v.numpy() for v in b.optimizer.variables], strict=True):  # fmt: skip
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("engine", ["eager", "graph", "loop3", "xla"])
def test_rollback_equals_a_run_that_never_read_the_skipped_batches(engine, tmp_path, caplog):
    x, y = data()
    model = make_model()
    run = trainer(
        model,
        model_dir=str(tmp_path / "run"),
        checkpoint_every_steps=3,
        on_nonfinite="rollback",
        **ENGINES[engine],
    )
    with caplog.at_level(logging.WARNING, logger="tftrain"):
        history = run.fit(batches(x, y, nan_steps=(5, 10)), epochs=1, verbose=0)
    every = keep_every(ENGINES[engine])
    lost = lost_steps((5, 10), every, 3)
    # Kept: every step eagerly (back to 4 and 9), 3 and 4's multiples with "auto" (4 and 9),
    # 3's multiples with 3 steps per call (3 and 9).
    assert lost == {1: (5, 10), 3: (4, 5, 10), 4: (5, 10)}[every]
    messages = [record.getMessage() for record in caplog.records if "rollback" in record.getMessage()]
    assert len(messages) == 2, messages
    first_kept = 5 - lost.index(5) - 1
    assert "at step 5 " in messages[0] and f"kept at step {first_kept} " in messages[0]
    assert f"{5 - first_kept} step(s) lost" in messages[0]
    assert (
        "at step 10 " in messages[1] and "kept at step 9 " in messages[1] and "1 step(s) lost" in messages[1]
    )
    assert int(run.global_step.numpy()) == STEPS  # the data position went on

    reference = make_model()
    clean = trainer(reference, **ENGINES[engine])
    clean_history = clean.fit(batches(x, y, without=lost), epochs=1, verbose=0)
    assert_same_state(model, reference)
    assert history.history == clean_history.history
    assert int(model.optimizer.iterations.numpy()) == STEPS - len(lost)


def table_data():
    """64 rows, batches of 8: the last batch of every epoch holds a NaN target."""
    rng = np.random.RandomState(0)
    x = rng.rand(64, 4).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    y[56] = np.nan
    return x, y


def table_model():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)]
    )


def test_a_blow_up_at_each_epochs_end_keeps_what_trained(engine, tmp_path):
    """Default cadence, a NaN in each epoch's last batch: each epoch keeps the steps before its last kept state."""
    x, y = table_data()
    model = table_model()
    initial = model.get_weights()
    run = tftrain.Trainer(
        model, keras.optimizers.Adam(0.01), "mse", model_dir=str(tmp_path), on_nonfinite="rollback", **engine
    )
    history = run.fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0)
    every = keep_every(engine)
    lost = lost_steps((8, 16, 24), every, epoch_starts=(8, 16))
    kept_per_epoch = [[row for row in range(8) if 8 * epoch + row + 1 not in lost] for epoch in range(3)]
    assert all(kept_per_epoch), kept_per_epoch

    reference = table_model()
    clean = tftrain.Trainer(reference, keras.optimizers.Adam(0.01), "mse", **engine)
    losses = []
    for rows in kept_per_epoch:  # one epoch per call: the epochs keep different batches
        kept = np.concatenate([np.arange(8 * row, 8 * row + 8) for row in rows])
        losses += clean.fit(x[kept], y[kept], batch_size=8, epochs=1, shuffle=False, verbose=0).history[
            "loss"
        ]
    assert np.all(np.isfinite(history.history["loss"]))
    assert history.history == {"loss": losses}  # the mean over the kept steps of each epoch
    assert_same_state(model, reference)
    assert int(model.optimizer.iterations.numpy()) == 24 - len(lost)
    assert not all(np.array_equal(a, b) for a, b in zip(initial, model.get_weights(), strict=True))
    assert int(run.global_step.numpy()) == 24


def test_a_rollback_shows_in_the_progress_output(tmp_path, capsys):
    x, y = table_data()
    for verbose in (1, 2, 0):
        run = tftrain.Trainer(
            table_model(), keras.optimizers.Adam(0.01), "mse", model_dir=str(tmp_path / str(verbose)),
            on_nonfinite="rollback", measure_timing=False,
        )  # fmt: skip
        run.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=verbose)
        out = capsys.readouterr().out
        if verbose:
            assert (
                "Epoch 1: tftrain: rollback 1 of at most 3 at step 8 (the loss is not finite: {'loss': 'nan'}): "
                "restored the state kept at step 4 (epoch 1, step 4 of the epoch); 4 step(s) lost" in out
            ), out
        else:
            assert "rollback" not in out


@pytest.mark.parametrize("engine, bad_step", [("eager", 1), ("graph", 1), ("graph", 3), ("loop3", 2)])
def test_a_blow_up_before_any_other_step_was_kept_goes_back_to_the_initial_state(engine, bad_step, tmp_path):
    """The initial weights are a good state: a poisoned first batch is skipped as any other, within max_rollbacks."""
    x, y = data()
    model = make_model()
    run = trainer(model, model_dir=str(tmp_path), on_nonfinite="rollback", **ENGINES[engine])
    run.fit(batches(x, y, nan_steps=(bad_step,)), epochs=1, verbose=0)
    lost = lost_steps((bad_step,), keep_every(ENGINES[engine]))
    assert lost == tuple(range(1, bad_step + 1))
    reference = make_model()
    trainer(reference, **ENGINES[engine]).fit(batches(x, y, without=lost), epochs=1, verbose=0)
    assert_same_state(model, reference)
    assert int(run.global_step.numpy()) == STEPS


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_negative_loss_is_compared_with_its_threshold_by_value(engine):
    """A log-likelihood-like loss below zero: a spike is a loss above the threshold, whatever its sign."""
    x, y = data()

    def negative_loss(y_true, y_pred):
        return keras.ops.mean(keras.ops.square(y_true - y_pred)) - 10.0

    def run():
        return tftrain.Trainer(
            make_model(),
            keras.optimizers.Adam(0.01),
            negative_loss,
            loss_spike_threshold=-5.0,
            **ENGINES[engine],
        )

    trained = run()
    history = trained.fit(batches(x, y), epochs=1, verbose=0)
    assert int(trained.model.optimizer.iterations.numpy()) == STEPS and history.history["loss"][0] < -5
    with pytest.raises(
        tftrain.NonFiniteLossError, match=r"Training stopped at step 7 .*above loss_spike_threshold=-5"
    ):
        run().fit(batches(x, y, spike_steps=(7,)), epochs=1, verbose=0)


def test_an_epoch_that_keeps_no_step_logs_nan(tmp_path):
    """Epochs of 2 steps, the second epoch's last one bad: back to that epoch's start, none of it kept."""
    x, y = data()
    model = make_model()
    run = trainer(model, model_dir=str(tmp_path), on_nonfinite="rollback")  # "auto": states every 4 steps
    history = run.fit(batches(x, y, nan_steps=(4,)), epochs=3, steps_per_epoch=2, verbose=0)
    losses, maes = history.history["loss"], history.history["mae"]
    assert np.isfinite(losses[0]) and np.isfinite(losses[2]) and np.isfinite(maes[2])
    assert np.isnan(losses[1]) and np.isnan(maes[1])  # every key, as callbacks expect them
    assert int(model.optimizer.iterations.numpy()) == 4


def test_with_one_step_per_call_only_the_bad_batch_is_lost(tmp_path):
    x, y = data()
    model = make_model()
    run = trainer(model, model_dir=str(tmp_path / "run"), on_nonfinite="rollback", steps_per_loop=1)
    run.fit(batches(x, y, nan_steps=(2,)), epochs=1, verbose=0)
    reference = make_model()
    trainer(reference, steps_per_loop=1).fit(batches(x, y, without=(2,)), epochs=1, verbose=0)
    assert_same_state(model, reference)


def test_a_loss_spike_above_the_threshold_rolls_back(tmp_path):
    x, y = data()
    model = make_model()
    run = trainer(
        model,
        model_dir=str(tmp_path / "run"),
        checkpoint_every_steps=1,
        on_nonfinite="rollback",
        loss_spike_threshold=1e3,
        steps_per_loop=4,
    )
    run.fit(batches(x, y, spike_steps=(7,)), epochs=1, verbose=0)
    reference = make_model()
    trainer(reference, steps_per_loop=4).fit(batches(x, y, without=(7,)), epochs=1, verbose=0)
    assert_same_state(model, reference)


def test_a_spike_with_on_nonfinite_stop_raises_naming_the_threshold(tmp_path):
    x, y = data()
    run = trainer(make_model(), loss_spike_threshold=1e3, steps_per_loop=4)
    with pytest.raises(
        tftrain.NonFiniteLossError, match=r"Training stopped at step 7 .*above loss_spike_threshold=1000"
    ):
        run.fit(batches(x, y, spike_steps=(7,)), epochs=1, verbose=0)


def test_more_blow_ups_than_max_rollbacks_stop_with_the_error(tmp_path):
    x, y = data()
    run = trainer(make_model(), model_dir=str(tmp_path / "run"), on_nonfinite="rollback", max_rollbacks=1)
    with pytest.raises(
        tftrain.NonFiniteLossError, match=r"step 8: the loss is not finite.*after 1 rollback.*\[5\]"
    ):
        run.fit(batches(x, y, nan_steps=(5, 8)), epochs=1, verbose=0)


def test_rollbacks_scale_the_learning_rate_and_are_written_to_tensorboard(tmp_path):
    x, y = data()
    model = make_model()
    run = trainer(
        model,
        model_dir=str(tmp_path / "run"),
        on_nonfinite="rollback",
        rollback_lr_factor=0.5,
        summary_every_steps=2,
        steps_per_loop=2,
    )
    run.fit(batches(x, y, nan_steps=(3, 8)), epochs=1, verbose=0)
    assert float(model.optimizer.learning_rate.numpy()) == pytest.approx(0.0025)
    latest = tf.train.latest_checkpoint(str(tmp_path / "run" / "checkpoints"))
    reader = tf.train.load_checkpoint(latest)
    states = json.loads(reader.get_tensor(SERVICE_STATES_KEY))
    records = states["loss_recovery"]["rollbacks"]
    assert [record["step"] for record in records] == [3, 8]
    assert records[0]["losses"] == {"loss": "nan"}
    assert records[1]["learning_rate"] == pytest.approx(0.0025)
    assert read_run(tmp_path / "run" / "train")["rollbacks"] == [(3, 1.0), (8, 2.0)]


def test_a_rollback_to_an_epochs_start_restores_its_reset_metrics(tmp_path):
    x, y = data()
    model = make_model()
    run = trainer(model, model_dir=str(tmp_path / "run"), on_nonfinite="rollback", steps_per_loop=1)
    # Epoch 2's first batch (step 13) blows up: back to the state kept at epoch 2's start, metrics reset.
    repeated = batches(x, y).concatenate(batches(x, y, nan_steps=(1,)))
    history = run.fit(repeated, epochs=2, steps_per_epoch=STEPS, verbose=0)
    reference = make_model()
    clean = trainer(reference, steps_per_loop=1)
    clean_history = clean.fit(
        batches(x, y).concatenate(batches(x, y, without=(1,))), epochs=2, steps_per_epoch=STEPS, verbose=0
    )
    assert_same_state(model, reference)
    assert history.history["loss"][0] == clean_history.history["loss"][0]
    # The clean run's second epoch has 11 steps, like the rolled-back one's.
    assert history.history["loss"][1] == clean_history.history["loss"][1]


def test_rollback_needs_a_model_dir_and_the_loss_test(tmp_path):
    with pytest.raises(ValueError, match="on_nonfinite='rollback' with model_dir=None"):
        trainer(make_model(), on_nonfinite="rollback")
    with pytest.raises(ValueError, match="terminate_on_nan=False"):
        trainer(make_model(), model_dir=str(tmp_path), on_nonfinite="rollback", terminate_on_nan=False)


def test_a_learning_rate_factor_needs_a_float_learning_rate(tmp_path):
    x, y = data()
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, 10, 0.9)
    run = tftrain.Trainer(
        make_model(),
        keras.optimizers.Adam(schedule),
        "mse",
        model_dir=str(tmp_path),
        on_nonfinite="rollback",
        rollback_lr_factor=0.5,
    )
    with pytest.raises(
        ValueError, match="rollback_lr_factor=0.5 with an optimizer whose learning rate is not"
    ):
        run.fit(batches(x, y), epochs=1, verbose=0)


def test_terminate_on_nan_callback_beside_a_rollback_policy_is_an_error(tmp_path):
    x, y = data()
    run = trainer(make_model(), model_dir=str(tmp_path), on_nonfinite="rollback")
    with pytest.raises(ValueError, match="TerminateOnNaN in `callbacks` with on_nonfinite='rollback'"):
        run.fit(batches(x, y), epochs=1, verbose=0, callbacks=[keras.callbacks.TerminateOnNaN()])
    with pytest.raises(DryRunError, match="'prepare' stage.*TerminateOnNaN in `callbacks`"):
        run.check(batches(x, y), epochs=1, verbose=0, callbacks=[keras.callbacks.TerminateOnNaN()])


def test_a_run_killed_between_rollbacks_and_rerun_ends_bit_identical(tmp_path):
    """Poison at steps 5 and 11, a spike at 17; SIGKILL after step 13; the rerun resumes at 12.

    Step 5 rolls back to a state kept in memory alone (step 4), 11 to 9 and
    17 to 16, under `steps_per_loop="auto"`, whose k each process measures.
    """
    uninterrupted, killed = tmp_path / "uninterrupted", tmp_path / "killed"
    first, second = start_job(JOB, str(uninterrupted)), start_job(JOB, str(killed), "--kill-after=13")
    finish_job(first)
    finish_job(second, returncode=-9)
    _, stderr = finish_job(start_job(JOB, str(killed)))
    assert "rollback 3 of at most 5 at step 17" in stderr and "rollback 1 " not in stderr
    with np.load(uninterrupted / "final.npz") as a, np.load(killed / "final.npz") as b:
        assert int(a["steps"]) == int(b["steps"]) == 24
        records = json.loads(str(a["rollbacks"]))
        assert [(record["step"], record["restored_step"]) for record in records] == [
            (5, 4),
            (11, 9),
            (17, 16),
        ]
        assert np.isfinite(a["last_epoch_loss"])
        assert str(a["rollbacks"]) == str(b["rollbacks"])
        for key in a.files:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
