"""A `model_dir` that cannot be written (read-only at the start, or made so mid-run): the library's error, the last good checkpoint named."""

import os
import subprocess

import keras
import numpy as np
import pytest

import tftrain
from tftrain.checkpoint import writer_lock
from tftrain.errors import CheckpointWriteError, ModelDirError

X = np.random.RandomState(0).rand(64, 4).astype("float32")
Y = X[:, :1] * 2.0


def _directories(path):
    return [os.path.join(root, name) for root, dirs, _ in os.walk(path) for name in dirs] + [str(path)]


def _set_read_only(path, read_only):
    """Makes `path` and the directories in it read-only (or writable again), for root too: `chattr +i`; else `chmod`."""
    for directory in _directories(path) if read_only else reversed(_directories(path)):
        if os.geteuid() != 0:
            os.chmod(directory, 0o555 if read_only else 0o755)
            continue
        done = subprocess.run(["chattr", "+i" if read_only else "-i", directory], capture_output=True, check=False)
        if done.returncode != 0:
            pytest.skip(f"cannot make a directory read-only for root here: {done.stderr.decode().strip()}")


@pytest.fixture
def read_only(tmp_path):
    """Makes a directory read-only; every directory it made so is writable again at the end."""
    made = []

    def make(path):
        made.append(path)
        _set_read_only(path, True)

    yield make
    for path in made:
        for directory in _directories(path):
            if os.geteuid() == 0:
                subprocess.run(["chattr", "-i", directory], capture_output=True, check=False)
            else:
                os.chmod(directory, 0o755)


class ReadOnlyAt(keras.callbacks.Callback):
    def __init__(self, path, batch, read_only):
        super().__init__()
        self.path, self.batch, self.read_only = path, batch, read_only

    def on_train_batch_end(self, batch, logs=None):
        if batch == self.batch:
            self.read_only(self.path)


def _trainer(model_dir, **kwargs):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    return tftrain.Trainer(model, "sgd", "mse", model_dir=str(model_dir), steps_per_loop=1, **kwargs)


@pytest.mark.parametrize("async_checkpoint", [False, True], ids=["sync", "async"])
def test_made_read_only_mid_run_a_save_says_so_and_names_the_last_good_checkpoint(tmp_path, read_only, async_checkpoint):
    model_dir = tmp_path / "run"
    trainer = _trainer(model_dir, checkpoint_every_steps=2, async_checkpoint=async_checkpoint)
    with pytest.warns(UserWarning, match="Could not remove the writer lock"):
        with pytest.raises(CheckpointWriteError, match="Could not write the checkpoint") as raised:
            trainer.fit(X, Y, batch_size=8, epochs=1, verbose=0, callbacks=[ReadOnlyAt(model_dir, 4, read_only)])
    assert raised.value.kept is not None and os.path.exists(raised.value.kept + ".index")
    assert f"The last checkpoint written, {raised.value.kept}, is intact" in str(raised.value)
    assert str(model_dir) in str(raised.value)


def test_made_read_only_between_saves_the_writer_locks_heartbeat_says_so(tmp_path, read_only, monkeypatch):
    monkeypatch.setattr(writer_lock, "HEARTBEAT_S", 0.0)  # a heartbeat after every host call
    model_dir = tmp_path / "run"
    trainer = _trainer(model_dir, checkpoint_every_steps=4)
    with pytest.warns(UserWarning, match="Could not remove the writer lock"):
        with pytest.raises(ModelDirError, match="refreshing its writer lock .*writer.lock failed") as raised:
            trainer.fit(X, Y, batch_size=8, epochs=1, verbose=0, callbacks=[ReadOnlyAt(model_dir, 5, read_only)])
    assert raised.value.kept == str(model_dir / "checkpoints" / "ckpt-4")
    assert f"Could not write to {model_dir}" in str(raised.value)


def test_read_only_at_the_start_is_refused_naming_its_newest_checkpoint(tmp_path, read_only):
    model_dir = tmp_path / "run"
    _trainer(model_dir).fit(X, Y, batch_size=8, epochs=1, verbose=0)
    read_only(model_dir)
    newest = str(model_dir / "checkpoints" / "ckpt-8")
    with pytest.raises(ValueError, match="cannot be written") as raised:
        _trainer(model_dir)
    assert f"Its newest checkpoint, {newest}, can still be read" in str(raised.value)
    resumed = _trainer(tmp_path / "elsewhere", resume_from=newest)
    resumed.fit(X, Y, batch_size=8, epochs=2, verbose=0)
    assert int(resumed.global_step) == 16
