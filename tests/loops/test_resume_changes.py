"""A resume that changes something: the user's new value is taken, or the change is refused before anything is restored.

The restore sequence compares the new `fit` call with the run record saved in
the checkpoint (`tftrain.checkpoint.run_record`), in `run_setup.start_run`.
"""

import json
import logging
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tftrain
from tftrain.errors import NonFiniteLossError, RunChangedError


def _data(rows=64, nan_at=None):
    rng = np.random.RandomState(0)
    x = rng.rand(rows, 4).astype("float32")
    y = (x[:, :1] * 2.0).astype("float32")
    if nan_at is not None:
        x[nan_at] = np.nan
    return x, y


def _trainer(model_dir, optimizer, *, model=None, **kwargs):
    keras.utils.set_random_seed(0)
    model = model or keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    return tftrain.Trainer(model, optimizer, "mse", model_dir=str(model_dir), **kwargs)


def _weights(model):
    return [w.numpy().copy() for w in model.weights]


def test_a_run_stopped_by_a_blow_up_resumes_with_the_lower_learning_rate(tmp_path, caplog):
    x, y = _data()
    # SGD at 10 diverges: epoch 1 ends finite (checkpointed), epoch 2 overflows.
    with pytest.raises(NonFiniteLossError):
        _trainer(tmp_path, keras.optimizers.SGD(10.0)).fit(x, y, batch_size=8, epochs=2, verbose=0)

    trainer = _trainer(tmp_path, keras.optimizers.SGD(0.01))  # the fix the error suggests
    with caplog.at_level(logging.WARNING, logger="tftrain"):
        history = trainer.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert "learning_rate: 10.0 in the checkpoint, 0.01 now (yours)" in caplog.text
    assert float(trainer.optimizer.learning_rate) == pytest.approx(0.01)
    assert np.isfinite(history.history["loss"]).all() and int(trainer.optimizer.iterations) == 16
    record = json.loads((tmp_path / "run_record.json").read_text())
    assert record["record"]["optimizer.learning_rate"] == 0.01
    assert record["changes"] == [{"step": 8, "key": "optimizer.learning_rate", "saved": 10.0, "now": 0.01}]


def test_the_new_learning_rate_trains_the_resumed_steps(tmp_path):
    x, y = _data()
    _trainer(tmp_path / "a", keras.optimizers.SGD(0.5)).fit(x, y, batch_size=8, epochs=1, verbose=0)
    resumed = _trainer(tmp_path / "a", keras.optimizers.SGD(0.05))
    resumed.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    # The same run with the rate set by hand after epoch 1: bit-identical.
    reference = _trainer(tmp_path / "b", keras.optimizers.SGD(0.5))
    reference.fit(x, y, batch_size=8, epochs=1, verbose=0)
    reference.optimizer.learning_rate.assign(0.05)
    reference.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    for a, b in zip(_weights(resumed.model), _weights(reference.model), strict=True):
        np.testing.assert_array_equal(a, b)


def test_an_unchanged_rerun_says_no_change(tmp_path, capsys):
    x, y = _data()
    _trainer(tmp_path, keras.optimizers.SGD(0.1)).fit(x, y, batch_size=8, epochs=1, verbose=0)
    _trainer(tmp_path, keras.optimizers.SGD(0.1)).fit(x, y, batch_size=8, epochs=1, verbose=1)
    assert "resuming with a change" not in capsys.readouterr().out


def test_a_rate_the_run_changed_itself_is_not_taken_for_the_users(tmp_path, capsys):
    x, y = _data()
    trainer = _trainer(tmp_path, keras.optimizers.SGD(0.1))
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)
    trainer.optimizer.learning_rate.assign(0.02)  # e.g. ReduceLROnPlateau, saved with the next checkpoint
    trainer.fit(x, y, batch_size=8, epochs=2, verbose=0)
    trainer.fit(x, y, batch_size=8, epochs=3, verbose=1)  # resumes from its own checkpoint, at 0.02
    assert "learning_rate" not in capsys.readouterr().out
    assert float(trainer.optimizer.learning_rate) == pytest.approx(0.02)


@pytest.mark.parametrize(
    "change, expected",
    [
        (dict(optimizer=keras.optimizers.Adam), "optimizer: keras.optimizers.SGD in the checkpoint, keras.optimizers.Adam now"),
        (dict(ema_decay=0.9), "ema_decay: None in the checkpoint, 0.9 now"),
        (dict(model="wider"), "the model's layers: layer 0 (dense_wide) is Dense[4x1, 1] in the checkpoint, Dense[4x2, 2] now"),
    ],
    ids=["optimizer_class", "ema_switched_on", "model"],
)
def test_a_change_the_checkpoint_cannot_follow_is_refused_before_anything_is_restored(tmp_path, change, expected):
    x, y = _data()
    _trainer(tmp_path, keras.optimizers.SGD(0.1)).fit(x, y, batch_size=8, epochs=1, verbose=0)
    change = dict(change)
    optimizer = change.pop("optimizer", keras.optimizers.SGD)(0.1)
    model = None
    if change.pop("model", None):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="dense_wide"), keras.layers.Dense(1)])
    trainer = _trainer(tmp_path, optimizer, model=model, **change)
    before = _weights(trainer.model)
    with pytest.raises(RunChangedError) as raised:
        trainer.fit(x, y, batch_size=8, epochs=2, verbose=0)
    assert expected in str(raised.value)
    assert "Nothing was restored" in str(raised.value) and str(tmp_path) in str(raised.value)
    for a, b in zip(before, _weights(trainer.model), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(trainer.optimizer.iterations) == 0


def test_a_new_batch_size_of_a_dataset_mid_epoch_is_refused_naming_the_ways_forward(tmp_path):
    x, y = _data()
    _trainer(tmp_path, keras.optimizers.SGD(0.1), checkpoint_every_steps=3).fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=1, steps_per_epoch=5, verbose=0
    )  # the last checkpoint is at step 5 of an 8-batch pass: mid-pass
    with pytest.raises(RunChangedError) as raised:
        _trainer(tmp_path, keras.optimizers.SGD(0.1)).fit(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=2, steps_per_epoch=5, verbose=0
        )  # a dataset batches itself: its examples cannot be counted from its batches
    message = str(raised.value)
    assert "batches_per_pass: 8 in the checkpoint, 4 now" in message
    assert "new `model_dir`" in message and "epoch end" in message


def test_a_longer_dataset_mid_epoch_is_refused_not_a_raw_graph_error(tmp_path):
    x, y = _data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    _trainer(tmp_path, keras.optimizers.SGD(0.1), checkpoint_every_steps=3).fit(
        dataset, epochs=1, steps_per_epoch=3, verbose=0
    )
    longer = tf.data.Dataset.from_tensor_slices((np.concatenate([x, x]), np.concatenate([y, y]))).batch(8)
    with pytest.raises(RunChangedError, match="batches_per_pass: 8 in the checkpoint, 16 now"):
        _trainer(tmp_path, keras.optimizers.SGD(0.1)).fit(longer, epochs=2, steps_per_epoch=3, verbose=0)
    arrays = tmp_path / "arrays"  # arrays keep their position in examples: more examples cannot continue it either
    _trainer(arrays, keras.optimizers.SGD(0.1), checkpoint_every_steps=3).fit(
        x, y, batch_size=8, epochs=1, steps_per_epoch=3, verbose=0
    )
    with pytest.raises(RunChangedError, match="examples: 64 in the checkpoint, 128 now"):
        _trainer(arrays, keras.optimizers.SGD(0.1)).fit(
            np.concatenate([x, x]), np.concatenate([y, y]), batch_size=8, epochs=2, steps_per_epoch=3, verbose=0
        )


def test_a_new_batch_size_at_an_epoch_boundary_is_taken_and_trains_the_new_epoch(tmp_path, capsys):
    x, y = _data()
    _trainer(tmp_path, keras.optimizers.SGD(0.1)).fit(x, y, batch_size=8, epochs=1, verbose=0)
    trainer = _trainer(tmp_path, keras.optimizers.SGD(0.1))
    history = trainer.fit(x, y, batch_size=16, epochs=2, verbose=1)
    assert "global_batch_size: 8 in the checkpoint, 16 now (yours)" in capsys.readouterr().out
    assert int(trainer.optimizer.iterations) == 8 + 4
    assert len(history.history["loss"]) == 1


def test_the_record_is_written_for_a_new_run(tmp_path):
    x, y = _data()
    _trainer(tmp_path, keras.optimizers.SGD(0.1)).fit(x, y, batch_size=8, epochs=1, verbose=0)
    written = json.loads((tmp_path / "run_record.json").read_text())
    assert written["changes"] == []
    assert written["record"]["data.global_batch_size"] == 8
    assert written["record"]["epochs"] == 1
    assert os.path.exists(tmp_path / "checkpoints")


class _Counter(tftrain.services.Service):
    name = "counter"

    def state_dict(self):
        return {"calls": 1}


def test_a_saved_service_state_no_service_takes_is_warned_by_name(tmp_path):
    x, y = _data()
    _trainer(tmp_path, keras.optimizers.SGD(0.1), services=[_Counter()]).fit(x, y, batch_size=8, epochs=1, verbose=0)
    with pytest.warns(UserWarning, match=r"services this run does not have: \['counter'\]"):
        _trainer(tmp_path, keras.optimizers.SGD(0.1)).fit(x, y, batch_size=8, epochs=2, verbose=0)


class _Stop(Exception):
    pass


class _Recording(tftrain.Trainer):
    """Trains eagerly and records the examples of each batch (x[:, 0] holds the example's index); can fail at a step."""

    def __init__(self, *args, fail_at=None, **kwargs):
        super().__init__(*args, use_tf_function=False, **kwargs)
        self.seen, self.fail_at = [], fail_at

    def train_step(self, batch):
        x, y = batch
        if self.fail_at is not None and int(self.global_step) == self.fail_at:
            raise _Stop()
        self.seen.append(x[:, 0].numpy().astype(int).tolist())
        return self.model.train_step(batch)


def _indexed_data():
    """64 examples whose features hold their index, and zero targets."""
    return np.arange(64, dtype="float32")[:, None].repeat(4, axis=1), np.zeros((64, 1), "float32")


def _recording_trainer(model_dir, **kwargs):
    """A `_Recording` trainer of a fresh linear model (a learning rate of 0: the data order is what is tested)."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    return _Recording(model, keras.optimizers.SGD(0.0), "mse", model_dir=str(model_dir), **kwargs)


def test_a_shuffled_array_epoch_resumes_in_its_own_order_without_a_seed(tmp_path):
    tf.random.set_seed(None)  # no global seed: each pass draws its order at random
    x, y = _indexed_data()

    def trainer(**kwargs):
        return _recording_trainer(tmp_path, checkpoint_every_steps=3, **kwargs)

    first = trainer(fail_at=6)
    with pytest.raises(_Stop):
        first.fit(x, y, batch_size=8, epochs=2, shuffle=True, verbose=0)  # dies in step 6; checkpoint at 3
    assert len(first.seen) == 5
    resumed = trainer()
    resumed.fit(x, y, batch_size=8, epochs=2, shuffle=True, verbose=0)
    epoch_1 = first.seen[:3] + resumed.seen[:5]
    assert sorted(sum(epoch_1, [])) == list(range(64))  # every example once: none skipped, none twice
    assert resumed.seen[:2] == first.seen[3:5]  # the steps after the checkpoint read the same batches again
    assert sorted(sum(resumed.seen[5:], [])) == list(range(64))  # the next epoch: a whole pass


@pytest.mark.parametrize("shuffle", [False, True], ids=["in_order", "shuffled"])
@pytest.mark.parametrize("new_batch_size", [16, 4, 5])
def test_a_new_batch_size_mid_epoch_goes_on_at_the_next_unread_example(tmp_path, shuffle, new_batch_size, capsys):
    tf.random.set_seed(None)
    x, y = _indexed_data()

    def trainer(**kwargs):
        return _recording_trainer(tmp_path, checkpoint_every_steps=3, **kwargs)

    first = trainer(fail_at=5)
    with pytest.raises(_Stop):
        first.fit(x, y, batch_size=8, epochs=2, shuffle=shuffle, verbose=0)  # checkpoint at step 3: 24 examples
    resumed = trainer()
    resumed.fit(x, y, batch_size=new_batch_size, epochs=2, shuffle=shuffle, verbose=1)
    rest = -(-40 // new_batch_size)  # the epoch's 40 unread examples in the new batch size
    epoch_1 = sum(first.seen[:3] + resumed.seen[:rest], [])
    assert sorted(epoch_1) == list(range(64))  # none skipped, none twice
    if not shuffle:
        assert epoch_1 == list(range(64))  # and in their order
    assert [len(batch) for batch in resumed.seen[:rest]] == [new_batch_size] * (40 // new_batch_size) + (
        [40 % new_batch_size] if 40 % new_batch_size else []
    )
    assert sorted(sum(resumed.seen[rest:], [])) == list(range(64))  # the next epoch: a whole pass
    assert f"global_batch_size: 8 in the checkpoint, {new_batch_size} now (yours; the epoch goes on at its next unread example)" in capsys.readouterr().out


def test_a_converted_pass_killed_again_resumes_at_its_next_unread_example(tmp_path):
    tf.random.set_seed(None)
    x, y = _indexed_data()

    def trainer(**kwargs):
        return _recording_trainer(tmp_path, checkpoint_every_steps=2, **kwargs)

    first = trainer(fail_at=4)  # checkpoint at step 2: 16 examples read in batches of 8
    with pytest.raises(_Stop):
        first.fit(x, y, batch_size=8, epochs=1, shuffle=True, verbose=0)
    second = trainer(fail_at=6)  # batches of 5 from example 16: steps 3, 4 (checkpoint: 26 examples), 5
    with pytest.raises(_Stop):
        second.fit(x, y, batch_size=5, epochs=1, shuffle=True, verbose=0)
    third = trainer()
    third.fit(x, y, batch_size=5, epochs=1, shuffle=True, verbose=0)
    epoch = sum(first.seen[:2] + second.seen[:2] + third.seen, [])
    assert sorted(epoch) == list(range(64))
    assert third.seen[0] == second.seen[2]  # the steps after the checkpoint read the same batch again


def test_on_data_change_next_epoch_starts_the_next_epoch_on_the_new_data(tmp_path, capsys):
    x, y = _data()
    _trainer(tmp_path, keras.optimizers.SGD(0.1), checkpoint_every_steps=3).fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=1, steps_per_epoch=5, verbose=0
    )  # checkpoint at step 5, mid-pass
    trainer = _trainer(tmp_path, keras.optimizers.SGD(0.1), on_data_change="next_epoch")
    history = trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=3, verbose=1)
    out = capsys.readouterr().out
    assert "batches_per_pass: 8 in the checkpoint, 4 now (yours; on_data_change='next_epoch'" in out
    assert int(trainer.optimizer.iterations) == 5 + 2 * 4  # epochs 2 and 3, whole passes of the new data
    assert len(history.history["loss"]) == 2


def test_on_data_change_is_checked_and_needs_a_model_dir():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="Invalid value for argument `on_data_change`"):
        tftrain.Trainer(model, "sgd", "mse", model_dir="unused", on_data_change="skip")
    with pytest.raises(ValueError, match="on_data_change"):
        tftrain.Trainer(model, "sgd", "mse", on_data_change="next_epoch")


def test_on_data_change_next_epoch_mid_epoch_leaves_the_rest_of_that_epoch(tmp_path):
    x, y = _data()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    first = _Recording(model, keras.optimizers.SGD(0.1), "mse", model_dir=str(tmp_path), checkpoint_every_steps=3,
                       fail_at=5)  # fmt: skip
    with pytest.raises(_Stop):
        first.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), epochs=2, verbose=0)  # checkpoint: step 3
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    resumed = tftrain.Trainer(model, keras.optimizers.SGD(0.1), "mse", model_dir=str(tmp_path),
                              on_data_change="next_epoch")  # fmt: skip
    history = resumed.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=2, verbose=0)
    assert int(resumed.optimizer.iterations) == 3 + 4  # epoch 2 on the new data; epoch 1's last 5 steps not trained
    assert len(history.history["loss"]) == 1


def test_a_loss_keras_cannot_serialize_trains_and_resumes(tmp_path):
    import functools

    def scaled_mse(y_true, y_pred, scale):
        return scale * keras.losses.mean_squared_error(y_true, y_pred)

    x, y = _data()
    for epochs in (1, 2):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        trainer = tftrain.Trainer(
            model, keras.optimizers.SGD(0.1), functools.partial(scaled_mse, scale=2.0), model_dir=str(tmp_path)
        )
        trainer.fit(x, y, batch_size=8, epochs=epochs, verbose=0)
    assert int(trainer.optimizer.iterations) == 16
    record = json.loads((tmp_path / "run_record.json").read_text())["record"]
    assert record["loss"]["partial"].endswith("scaled_mse") and record["loss"]["keywords"] == {"scale": 2.0}


def test_metrics_keras_numbers_in_one_process_are_no_change(tmp_path):
    x, y = _data()
    labels = (y > y.mean()).astype("float32")
    for epochs in (1, 2):  # the second AUC() of the process is `auc_1`
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
        trainer = tftrain.Trainer(model, "sgd", "binary_crossentropy", metrics=[keras.metrics.AUC()],
                                  model_dir=str(tmp_path))  # fmt: skip
        trainer.fit(x, labels, batch_size=8, epochs=epochs, verbose=0)
    assert int(trainer.optimizer.iterations) == 16
    assert json.loads((tmp_path / "run_record.json").read_text())["changes"][-1]["key"] == "epochs"


def test_another_metric_is_refused_naming_where_it_differs(tmp_path):
    x, y = _data()
    labels = (y > y.mean()).astype("float32")
    for curve in ("ROC", "PR"):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
        trainer = tftrain.Trainer(model, "sgd", "binary_crossentropy", metrics=[keras.metrics.AUC(curve=curve)],
                                  model_dir=str(tmp_path))  # fmt: skip
        if curve == "ROC":
            trainer.fit(x, labels, batch_size=8, epochs=1, verbose=0)
    with pytest.raises(RunChangedError, match=r"metrics\[0\]\[0\]\.config\.curve: ROC in the checkpoint, PR now"):
        trainer.fit(x, labels, batch_size=8, epochs=2, verbose=0)


@pytest.mark.parametrize("shuffle", [True, False])
def test_shuffling_switched_mid_epoch_is_refused(tmp_path, shuffle):
    x, y = _indexed_data()
    first = _recording_trainer(tmp_path, checkpoint_every_steps=3, fail_at=5)
    with pytest.raises(_Stop):
        first.fit(x, y, batch_size=8, epochs=2, shuffle=shuffle, verbose=0)
    before, after = ("shuffled", "in order") if shuffle else ("in order", "shuffled")
    with pytest.raises(RunChangedError, match=f"data.order: {before} in the checkpoint, {after} now"):
        _recording_trainer(tmp_path).fit(x, y, batch_size=8, epochs=2, shuffle=not shuffle, verbose=0)


def test_a_schedule_instead_of_a_float_rate_is_refused_naming_the_learning_rate(tmp_path):
    x, y = _data()
    _trainer(tmp_path, keras.optimizers.Adam(0.01)).fit(x, y, batch_size=8, epochs=1, verbose=0)
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, 10, 0.5)
    with pytest.raises(RunChangedError, match="learning_rate: 0.01 in the checkpoint"):
        _trainer(tmp_path, keras.optimizers.Adam(schedule)).fit(x, y, batch_size=8, epochs=2, verbose=0)


class _TwoOptimizers(tftrain.Trainer):
    """A custom-loop Trainer with a second optimizer of its own (a GAN's discriminator's, say) for the last layer."""

    def __init__(self, model, d_optimizer, **kwargs):
        super().__init__(model, keras.optimizers.SGD(0.1), "mse", **kwargs)
        self.d_optimizer = d_optimizer

    def train_step(self, batch):
        x, y = batch
        with tf.GradientTape() as tape:
            loss = keras.ops.mean((self.model(x, training=True) - y) ** 2)
        first, last = self.model.layers[0].trainable_variables, self.model.layers[1].trainable_variables
        grads = tape.gradient(loss, first + last)
        self.optimizer.apply(grads[: len(first)], first)
        self.d_optimizer.apply(grads[len(first) :], last)
        return {"loss": loss}


def _two_layers():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(1)])


def test_a_trainers_own_optimizer_takes_its_new_learning_rate_and_refuses_another_class(tmp_path, capsys):
    x, y = _data()
    _TwoOptimizers(_two_layers(), keras.optimizers.SGD(0.5), model_dir=str(tmp_path)).fit(
        x, y, batch_size=8, epochs=1, verbose=0
    )
    with pytest.raises(RunChangedError, match="d_optimizer: keras.optimizers.SGD in the checkpoint, keras.optimizers.Adam now"):
        _TwoOptimizers(_two_layers(), keras.optimizers.Adam(0.5), model_dir=str(tmp_path)).fit(
            x, y, batch_size=8, epochs=2, verbose=0
        )
    resumed = _TwoOptimizers(_two_layers(), keras.optimizers.SGD(0.05), model_dir=str(tmp_path))
    resumed.fit(x, y, batch_size=8, epochs=2, verbose=1)
    assert "d_optimizer.learning_rate: 0.5 in the checkpoint, 0.05 now (yours)" in capsys.readouterr().out
    assert float(resumed.d_optimizer.learning_rate) == pytest.approx(0.05)
    assert int(resumed.d_optimizer.iterations) == 16  # its state was restored, then trained on


def test_a_layers_configuration_change_is_said_and_kept_in_the_record(tmp_path, capsys):
    x, y = _data()

    def model(rate):
        keras.utils.set_random_seed(0)
        return keras.Sequential([keras.Input((4,)), keras.layers.Dropout(rate), keras.layers.Dense(1)])

    _trainer(tmp_path, "sgd", model=model(0.1)).fit(x, y, batch_size=8, epochs=1, verbose=0)
    changed = model(0.5)
    _trainer(tmp_path, "sgd", model=changed).fit(x, y, batch_size=8, epochs=2, verbose=1)
    name = changed.layers[0].name
    assert f"the model's layers: layer 0 ({name}) rate: 0.1 in the checkpoint, 0.5 now (yours)" in capsys.readouterr().out
    changes = json.loads((tmp_path / "run_record.json").read_text())["changes"]
    assert ("model.layer_configs", 8) in [(change["key"], change["step"]) for change in changes]
