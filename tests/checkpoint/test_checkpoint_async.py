"""Asynchronous checkpoints: each save holds the state of its moment, new state is copied, errors surface.

`Checkpointer(async_write=True)` and `Trainer(async_checkpoint=True)` use
TensorFlow's asynchronous checkpointing; these tests change the state while a
write is pending and read every checkpoint back. (Killing a process in the
writer thread is covered by test_trainer_resume.py.)
"""

import threading

import numpy as np
import pytest
import tensorflow as tf
from helpers import compile_args, make_mlp

import tftrain
from tftrain.checkpoint import Checkpointer, Progress, training_state
from tftrain.checkpoint.state import SERVICE_STATES
from tftrain.compat import keras_internals
from tftrain.errors import CheckpointWriteError

RNG = np.random.RandomState(0)
X = RNG.rand(48, 6).astype("float32")
Y = (X[:, 0] * 3).astype("int32").clip(0, 2)


def trained_model(seed=1):
    model = make_mlp(seed)
    model.compile(**compile_args(), run_eagerly=True)
    model.train_on_batch(X[:8], Y[:8])
    return model


def arrays(model):
    return [np.array(v.numpy()) for v in [*model.weights, *model.optimizer.variables]]


def restored_arrays(path):
    """A fresh model's state after restoring `path` into it."""
    model = trained_model(seed=2)
    Checkpointer(path.rsplit("/", 1)[0] + "_reader", training_state(model)).restore_from(path)
    return arrays(model)


def assert_arrays_equal(actual, expected):
    assert len(actual) == len(expected)
    for index, (value, wanted) in enumerate(zip(actual, expected, strict=True)):
        np.testing.assert_array_equal(value, wanted, err_msg=f"variable {index}")


def test_each_save_holds_the_state_of_its_moment_while_training_goes_on(tmp_path):
    model = trained_model()
    checkpointer = Checkpointer(str(tmp_path / "ckpts"), training_state(model), async_write=True)
    expected = {}
    for number in (1, 2, 3):
        path = checkpointer.save(Progress(global_step=number), number=number)
        expected[path] = arrays(model)
        model.train_on_batch(X[8:16], Y[8:16])  # changes every variable while the write is pending
    assert checkpointer.latest == str(tmp_path / "ckpts" / "ckpt-3")  # waits for the pending write
    checkpointer.close()
    for path, state in expected.items():
        assert_arrays_equal(restored_arrays(path), state)
    assert not np.array_equal(expected[str(tmp_path / "ckpts" / "ckpt-3")][0], arrays(model)[0])


def writer_threads():
    return [thread for thread in threading.enumerate() if "_async_save" in thread.name]


def test_state_that_appears_after_the_first_save_is_saved_and_no_writer_thread_is_left(tmp_path):
    model = trained_model()
    dataset = tf.data.Dataset.range(100).batch(4)
    checkpointer = Checkpointer(str(tmp_path / "ckpts"), training_state(model), async_write=True)
    checkpointer.save(Progress(global_step=1), number=1)  # no iterator yet
    positions = {}
    for number in (2, 3, 4):  # a new iterator each save, as a new pass starts
        iterator = iter(dataset)
        for _ in range(number):
            next(iterator)
        checkpointer.save(Progress(global_step=number), iterator, number=number)
        positions[number] = int(next(iterator)[0])
        assert len(writer_threads()) == 1
    checkpointer.close()
    assert not writer_threads()
    for number, position in positions.items():
        reader = Checkpointer(str(tmp_path / f"reader{number}"), training_state(trained_model(seed=2)))
        iterator = iter(dataset)
        reader.restore_from(str(tmp_path / "ckpts" / f"ckpt-{number}"), iterator)
        assert reader.iterator_restored
        assert int(next(iterator)[0]) == position


def test_a_failed_background_write_raises_at_sync_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = trained_model()
    checkpointer = Checkpointer(str(tmp_path / "ckpts"), training_state(model), async_write=True)
    checkpointer.save(Progress(global_step=1), number=1)
    checkpointer.sync()
    original = tf.train.Checkpoint._write

    def failing_write(self, prefix, options=None):
        if options is not None and not options.experimental_enable_async_checkpoint:
            raise OSError("No space left on device")  # the writer thread's own write
        return original(self, prefix, options=options)

    monkeypatch.setattr(tf.train.Checkpoint, "_write", failing_write)
    checkpointer.save(Progress(global_step=2), number=2)  # returns at once; the write fails later
    with pytest.raises(CheckpointWriteError, match="ckpt-2: OSError: No space left.*ckpt-1, is intact") as raised:
        checkpointer.sync()
    assert isinstance(raised.value.__cause__, OSError)
    assert raised.value.kept == str(tmp_path / "ckpts" / "ckpt-1")
    monkeypatch.undo()
    assert checkpointer.latest == str(tmp_path / "ckpts" / "ckpt-1")
    checkpointer.close()


def fit(model_dir, **kwargs):
    model = make_mlp(3)
    trainer = tftrain.Trainer(model, **compile_args(), model_dir=str(model_dir), steps_per_loop=2, **kwargs)
    data = tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(48, seed=1).batch(8)
    trainer.fit(data, epochs=2, validation_data=(X[:16], Y[:16]), verbose=0)
    return model


def test_trainer_with_async_checkpoints_writes_what_a_synchronous_run_writes(tmp_path, deterministic):
    common = dict(checkpoint_every_steps=4, best_checkpoint_monitor="val_loss")
    asynchronous = fit(tmp_path / "async", async_checkpoint=True, **common)
    synchronous = fit(tmp_path / "sync", **common)
    assert_arrays_equal(arrays(asynchronous), arrays(synchronous))
    for name in ("checkpoints/ckpt-12", "checkpoints/ckpt-8", "checkpoints/ckpt-4"):
        sync_reader = tf.train.load_checkpoint(str(tmp_path / "sync" / name))
        async_reader = tf.train.load_checkpoint(str(tmp_path / "async" / name))
        keys = sorted(key for key in sync_reader.get_variable_to_shape_map() if "save_counter" not in key)
        assert keys == sorted(k for k in async_reader.get_variable_to_shape_map() if "save_counter" not in k)
        for key in keys:
            if key.startswith("data/") or key.startswith(f"{SERVICE_STATES}/") or key == "_CHECKPOINTABLE_OBJECT_GRAPH":
                continue  # iterator bytes, the services' wall-clock timings and the host copies' names differ
            np.testing.assert_array_equal(
                async_reader.get_tensor(key), sync_reader.get_tensor(key), err_msg=key
            )
    assert tf.train.latest_checkpoint(str(tmp_path / "async" / "best")) is not None


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(async_checkpoint="yes", model_dir="unused"), TypeError, "async_checkpoint='yes'"),
        (dict(async_checkpoint=True), ValueError, "async_checkpoint=True with model_dir=None"),
    ],
)
def test_bad_async_checkpoint_arguments_raise_at_construction(kwargs, error, match, tmp_path):
    if "model_dir" in kwargs:
        kwargs["model_dir"] = str(tmp_path)
    with pytest.raises(error, match=match):
        tftrain.Trainer(make_mlp(), **compile_args(), **kwargs)


def test_async_checkpoint_where_tensorflow_cannot_raises_before_training(tmp_path, monkeypatch):
    monkeypatch.delattr(tf.train.Checkpoint, "_async_checkpointer")
    with pytest.raises(keras_internals.KerasInternalsError, match="asynchronous checkpoint saving"):
        tftrain.Trainer(make_mlp(), **compile_args(), model_dir=str(tmp_path), async_checkpoint=True)
    with pytest.raises(keras_internals.KerasInternalsError):
        Checkpointer(str(tmp_path / "c"), training_state(make_mlp()), async_write=True)
    with pytest.raises(TypeError, match="async_write=1"):
        Checkpointer(str(tmp_path / "d"), training_state(make_mlp()), async_write=1)
