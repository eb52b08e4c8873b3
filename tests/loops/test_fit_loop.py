"""The fit loop owns its call's target: a step budget after a resume is finished, or extended, as the call asks."""

import logging

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import make_mlp

import tftrain


def endless():
    rng = np.random.RandomState(0)
    x = rng.rand(40, 6).astype("float32")
    y = rng.rand(40, 3).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(4).repeat()


def finite():
    return endless().take(8)  # 8 steps an epoch


def trainer(model_dir=None, **kwargs):
    return tftrain.Trainer(
        make_mlp(), keras.optimizers.SGD(0.05), "mse", model_dir=model_dir and str(model_dir), **kwargs
    )


def assert_same_weights(a, b):
    for left, right in zip(a.model.weights, b.model.weights, strict=True):
        np.testing.assert_array_equal(left.numpy(), right.numpy())


@pytest.mark.parametrize("data", [endless, finite], ids=["endless", "finite"])
def test_a_larger_step_budget_extends_a_finished_run(tmp_path, data):
    # Issue 23: a run finished at total_steps=6, rerun with total_steps=14, trained nothing.
    first = trainer(tmp_path)
    first.fit(data(), total_steps=6, verbose=0)
    assert int(first.global_step.numpy()) == 6
    extended = trainer(tmp_path)
    history = extended.fit(data(), total_steps=14, verbose=0)
    assert int(extended.global_step.numpy()) == 14
    assert history.history["loss"]  # it trained, and says so
    reference = trainer()
    reference.fit(data(), total_steps=14, verbose=0)
    assert_same_weights(extended, reference)  # as if the budget had been 14 from the start


def test_rerunning_a_finished_budget_trains_nothing(tmp_path):
    trainer(tmp_path).fit(finite(), total_steps=10, verbose=0)
    again = trainer(tmp_path)
    history = again.fit(finite(), total_steps=10, verbose=0)
    assert int(again.global_step.numpy()) == 10
    assert history.history == {}


def test_a_branch_from_resume_from_trains_to_its_own_budget(tmp_path):
    trainer(tmp_path / "run1", checkpoint_every_steps=5).fit(endless(), total_steps=10, verbose=0)
    branch = trainer(tmp_path / "run2", resume_from=str(tmp_path / "run1" / "checkpoints" / "ckpt-10"))
    branch.fit(endless(), total_steps=15, verbose=0)
    assert int(branch.global_step.numpy()) == 15
    reference = trainer()
    reference.fit(endless(), total_steps=15, verbose=0)
    assert_same_weights(branch, reference)


def test_a_budget_resumed_mid_epoch_ends_exactly_at_it(tmp_path):
    class StopAt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 4:  # global step 5 of the first epoch
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        trainer(tmp_path, checkpoint_every_steps=3).fit(
            finite(), total_steps=20, callbacks=[StopAt()], verbose=0
        )
    resumed = trainer(tmp_path)
    history = resumed.fit(finite(), total_steps=20, verbose=0)
    assert int(resumed.global_step.numpy()) == 20
    assert history.epoch == [0, 1, 2]  # the rest of epoch 1 (from step 3), epoch 2, 4 steps of epoch 3
    reference = trainer()
    reference.fit(finite(), total_steps=20, verbose=0)
    assert_same_weights(resumed, reference)


def test_an_epoch_cut_by_the_budget_validates_without_losing_its_training_metrics(tmp_path):
    # The cut epoch goes on in a larger budget: its validation must not leave its totals in the metrics.
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 6)).astype("float32"), rng.normal(size=(64, 3)).astype("float32")
    val = (
        (rng.normal(size=(16, 6)) * 10).astype("float32"),
        (rng.normal(size=(16, 3)) * 10).astype("float32"),
    )
    arguments = dict(batch_size=8, shuffle=False, verbose=0, validation_data=val)
    reference = trainer().fit(x, y, total_steps=16, **arguments).history
    cut = trainer(tmp_path).fit(x, y, total_steps=12, **arguments).history
    assert len(cut["val_loss"]) == 2  # the cut epoch validated
    extended = trainer(tmp_path).fit(x, y, total_steps=16, **arguments).history
    assert extended["loss"][-1] == pytest.approx(reference["loss"][1], rel=1e-6)
    assert extended["val_loss"][-1] == pytest.approx(reference["val_loss"][1], rel=1e-6)


def test_rerunning_a_reached_budget_keeps_the_ema_weights_it_ended_with(tmp_path):
    def ema_trainer():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
        optimizer = keras.optimizers.SGD(0.1, use_ema=True, ema_momentum=0.5)
        return tftrain.Trainer(model, optimizer, "mse", model_dir=str(tmp_path))

    first = ema_trainer()
    first.fit(finite(), total_steps=3, verbose=0)
    again = ema_trainer()
    again.fit(finite(), total_steps=3, verbose=0)  # nothing to train: the weights are the finalized ones
    assert_same_weights(first, again)


def notices(caplog):
    return [record for record in caplog.records if "nothing to train" in record.getMessage()]


@pytest.mark.parametrize("verbose", [0, 1])
@pytest.mark.parametrize("target", ["epochs", "total_steps"])
def test_a_fit_whose_target_is_reached_says_so_once_and_how_to_train_more(tmp_path, caplog, capsys, target, verbose):
    call = {"epochs": dict(epochs=3), "total_steps": dict(total_steps=10)}[target]
    with caplog.at_level(logging.INFO, logger="tftrain"):
        trainer(tmp_path).fit(finite(), verbose=0, **call)
        assert not notices(caplog)  # it trained: nothing to say
        capsys.readouterr()
        again = trainer(tmp_path)
        history = again.fit(finite(), verbose=verbose, **call)
    assert history.history == {}
    [notice] = notices(caplog)
    assert notice.levelno == (logging.INFO if verbose else logging.WARNING)
    message = notice.getMessage()
    reached = {"epochs": "(epochs=3)", "total_steps": "(total_steps=10)"}[target]
    larger = {"epochs": "epochs > 3", "total_steps": "total_steps > 10"}[target]
    assert str(tmp_path) in message and reached in message
    assert larger in message and "a new `model_dir`" in message
    assert capsys.readouterr().out.count("nothing to train") == (1 if verbose else 0)


def test_a_second_fit_checks_only_what_changed(monkeypatch):
    from tftrain.engine import model_setup

    checked = []
    monkeypatch.setattr(model_setup, "check_data", lambda *args, **kwargs: checked.append(args[2]))
    fitted = trainer()
    x, y = np.zeros((8, 6), "float32"), np.zeros((8, 3), "float32")
    fitted.fit(x, y, batch_size=4, verbose=0)
    fitted.fit(x, y, batch_size=4, verbose=0)  # the same model and data: not checked again
    assert checked == ["x"]
    fitted.fit(x, y, batch_size=2, verbose=0)  # another batch: another spec, checked
    assert checked == ["x", "x"]
    with pytest.raises(ValueError, match="epochs"):
        fitted.fit(x, y, batch_size=4, epochs=-1, verbose=0)  # a changed argument is checked
