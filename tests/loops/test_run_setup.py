"""Starting a run: the restore sequence and how a resume is reported (services are tested through `Trainer.fit`)."""

import glob
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import make_mlp

import tftrain
from tftrain.loops import run_setup


@pytest.mark.parametrize("verbose", [0, 1])
def test_resume_message_is_logged_and_printed_unless_silent(verbose, capsys, caplog):
    with caplog.at_level("INFO", logger="tftrain"):
        run_setup.report_resume("tftrain: resumed from x at step 3", verbose)
    assert "resumed from x" in caplog.text
    assert ("resumed from x" in capsys.readouterr().out) == bool(verbose)


# ------------------------------------------------ restore: one validated sequence


def _regression(steps: int = 12):
    rng = np.random.RandomState(0)
    x = rng.rand(steps * 4, 6).astype("float32")
    y = rng.rand(steps * 4, 3).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(4).repeat()


def _trainer(model_dir, **kwargs):
    return tftrain.Trainer(
        make_mlp(),
        keras.optimizers.SGD(0.01),
        "mse",
        model_dir=str(model_dir),
        checkpoint_every_steps=2,
        **kwargs,
    )


@pytest.mark.parametrize("damaged", ["index", "data", "state_file"])
def test_a_damaged_latest_checkpoint_falls_back_to_the_one_before_it(tmp_path, damaged):
    # The regression of issue 23: a truncated file of the latest checkpoint failed `fit` with a raw
    # IndexError, read before it was validated. Each of its files in turn, and the state file.
    _trainer(tmp_path).fit(_regression(), epochs=1, steps_per_epoch=7, verbose=0)  # saves at 2, 4, 6, 7
    checkpoints = tmp_path / "checkpoints"
    latest = tf.train.latest_checkpoint(str(checkpoints))
    assert latest.endswith("ckpt-7")
    target = {
        "index": latest + ".index",
        "data": glob.glob(latest + ".data-*")[0],
        "state_file": str(checkpoints / "checkpoint"),
    }[damaged]
    with open(target, "r+b") as handle:
        handle.truncate(3)
    trainer = _trainer(tmp_path)
    if damaged == "state_file":
        # The state file cannot be parsed: the checkpoints on disk are found directly, the latest is whole.
        with pytest.warns(UserWarning, match="state file"):
            trainer.fit(_regression(), epochs=2, steps_per_epoch=7, verbose=0)
        assert int(trainer.global_step.numpy()) == 14
        return
    with pytest.warns(UserWarning, match=r"ckpt-7 cannot be read .*falling back"):
        history = trainer.fit(_regression(), epochs=2, steps_per_epoch=7, verbose=0)
    # Resumed at step 6 (epoch 1, step 6): the epoch's last step, then the second epoch.
    assert int(trainer.global_step.numpy()) == 14
    assert history.epoch == [0, 1]
    assert sorted(os.listdir(checkpoints)).count("ckpt-7.index.corrupt") == 1


def test_nothing_is_restored_from_a_checkpoint_that_does_not_fit_the_model(tmp_path):
    _trainer(tmp_path).fit(_regression(), epochs=1, steps_per_epoch=4, verbose=0)
    keras.utils.set_random_seed(3)
    other = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5), keras.layers.Dense(3)])
    before = [w.numpy().copy() for w in other.weights]
    trainer = tftrain.Trainer(other, "sgd", "mse", model_dir=str(tmp_path))
    with pytest.raises(tftrain.checkpoint.IncompatibleCheckpointError):
        trainer.fit(_regression(), epochs=2, steps_per_epoch=4, verbose=0)
    for weight, value in zip(other.weights, before, strict=True):
        np.testing.assert_array_equal(weight.numpy(), value)


def test_every_service_gets_its_saved_state_at_a_resume_the_timing_included(tmp_path):
    """The states are loaded once the run has all its services, the last ones (the timing) included."""
    x = np.random.default_rng(0).random((32, 6), dtype=np.float32)
    y = np.zeros(32, dtype=np.int32)
    compile_kwargs = {"optimizer": "sgd", "loss": "sparse_categorical_crossentropy"}
    first = tftrain.Trainer(make_mlp(), **compile_kwargs, model_dir=str(tmp_path))
    first.fit(x, y, batch_size=16, epochs=1, verbose=0)
    resumed = tftrain.Trainer(make_mlp(), **compile_kwargs, model_dir=str(tmp_path))
    resumed.fit(x, y, batch_size=16, epochs=2, verbose=0)
    assert resumed.timing.steps == 4  # the first run's 2 steps and the resumed run's 2
    assert resumed.timing.first_step_s == first.timing.first_step_s  # the job's first call, not the resumed one's
