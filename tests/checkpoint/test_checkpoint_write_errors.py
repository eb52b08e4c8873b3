"""A save that fails raises `CheckpointWriteError`: what failed, what is kept, and that a rerun resumes from it."""

import os
import subprocess
import time
import uuid

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import NO_SPACE, fail_after_writing, make_mlp

import tftrain
from tftrain.checkpoint import Checkpointer, Progress, files, training_state
from tftrain.errors import CheckpointWriteError

X = np.random.RandomState(0).rand(16, 6).astype("float32")
Y = np.random.RandomState(1).rand(16, 3).astype("float32")


def trained_model():
    model = make_mlp()
    model.compile(optimizer="adam", loss="mse")
    model.fit(X, Y, batch_size=8, epochs=1, verbose=0)
    return model


@pytest.mark.parametrize(
    "error, line",
    [
        (tf.errors.ResourceExhaustedError(None, None, NO_SPACE), f"ResourceExhaustedError: {NO_SPACE}"),
        (
            tf.errors.PermissionDeniedError(None, None, "Permission denied"),
            "PermissionDeniedError: Permission denied",
        ),
        (OSError(122, "Disk quota exceeded"), "OSError: [Errno 122] Disk quota exceeded"),
    ],
    ids=["disk_full", "permission", "quota"],
)
def test_a_failed_write_raises_the_librarys_error_and_keeps_the_last_checkpoint(
    tmp_path, monkeypatch, error, line
):
    directory = tmp_path / "checkpoints"
    checkpointer = Checkpointer(str(directory), training_state(trained_model()))
    checkpointer.save(Progress(global_step=1), number=1)
    fail_after_writing(monkeypatch, error)
    with pytest.raises(CheckpointWriteError) as raised:
        checkpointer.save(Progress(global_step=2), number=2)
    assert raised.value.__cause__ is error
    assert raised.value.checkpoint == str(directory / "ckpt-2") and raised.value.kept == str(
        directory / "ckpt-1"
    )
    assert str(raised.value).startswith(
        f"Could not write the checkpoint {directory / 'ckpt-2'}: {line}. The last checkpoint written, "
        f"{directory / 'ckpt-1'}, is intact and kept: rerunning `fit` on the same model_dir resumes from it."
    )
    assert "\n" not in str(raised.value)
    monkeypatch.undo()
    # The failed save's partial files are gone; the kept checkpoint is the latest and reads whole.
    assert sorted(os.listdir(directory)) == ["checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]
    assert Checkpointer(str(directory), training_state(make_mlp())).latest == str(directory / "ckpt-1")
    checkpointer.save(Progress(global_step=2), number=2)  # a later save works again
    assert checkpointer.latest == str(directory / "ckpt-2")


def test_a_failed_first_write_says_no_checkpoint_exists_yet(tmp_path, monkeypatch):
    checkpointer = Checkpointer(str(tmp_path), training_state(trained_model()))
    fail_after_writing(monkeypatch)
    with pytest.raises(
        CheckpointWriteError, match="No checkpoint was written before it: a rerun .* starts from the"
    ):
        checkpointer.save(Progress(global_step=1), number=1)
    assert checkpointer.latest is None


def test_an_error_cleaning_up_after_a_failed_write_does_not_hide_it(tmp_path, monkeypatch):
    checkpointer = Checkpointer(str(tmp_path), training_state(trained_model()))
    checkpointer.save(Progress(global_step=1), number=1)
    fail_after_writing(monkeypatch)

    def cleaning_fails(directory):
        raise PermissionError(13, "Permission denied", directory)

    monkeypatch.setattr(files, "clean_leftovers", cleaning_fails)
    with pytest.raises(
        CheckpointWriteError, match="Removing its partial files failed too .PermissionError"
    ) as raised:
        checkpointer.save(Progress(global_step=2), number=2)
    assert isinstance(raised.value.__cause__, tf.errors.ResourceExhaustedError)
    assert raised.value.kept == str(tmp_path / "ckpt-1")


def fit(model_dir, epochs, callbacks=(), **kwargs):
    model = make_mlp()
    trainer = tftrain.Trainer(model, optimizer="adam", loss="mse", model_dir=str(model_dir), **kwargs)
    trainer.fit(X, Y, batch_size=8, epochs=epochs, shuffle=False, verbose=0, callbacks=list(callbacks))
    return model


def assert_same_weights(a, b):
    for got, expected in zip(a.get_weights(), b.get_weights(), strict=True):
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("async_checkpoint", [False, True], ids=["sync", "async"])
def test_a_fit_whose_save_fails_says_so_and_a_rerun_resumes_exactly(
    tmp_path, monkeypatch, deterministic, async_checkpoint
):
    uninterrupted = fit(tmp_path / "uninterrupted", 3, async_checkpoint=async_checkpoint)
    model_dir = tmp_path / "run"
    fit(model_dir, 1, async_checkpoint=async_checkpoint)
    fail_after_writing(monkeypatch)
    with pytest.raises(CheckpointWriteError, match=f"checkpoints/ckpt-4: ResourceExhaustedError: {NO_SPACE}"):
        fit(model_dir, 3, async_checkpoint=async_checkpoint)
    monkeypatch.undo()
    assert tf.train.latest_checkpoint(str(model_dir / "checkpoints")).endswith("ckpt-2")
    assert_same_weights(fit(model_dir, 3, async_checkpoint=async_checkpoint), uninterrupted)


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (where this process may mount one: root, outside most containers)."""
    mount_point = tmp_path / f"disk-{uuid.uuid4().hex[:6]}"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)  # lazily: event writers may hold files


class FillTheDisk(keras.callbacks.Callback):
    """Fills the disk holding `directory` after the last batch of the second epoch, once the first's checkpoint is in."""

    def __init__(self, directory, checkpoints):
        super().__init__()
        self.directory, self.checkpoints, self.current = directory, checkpoints, None

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.current == 1 and batch == 1:
            deadline = time.monotonic() + 60
            while tf.train.latest_checkpoint(str(self.checkpoints)) is None and time.monotonic() < deadline:
                time.sleep(0.05)  # an asynchronous write of the first epoch's checkpoint may still run
            stats = os.statvfs(self.directory)
            with open(os.path.join(self.directory, "filler"), "wb") as handle:
                handle.write(b"\0" * (stats.f_bavail * stats.f_frsize))


@pytest.mark.filterwarnings("ignore:TensorBoard summaries cannot be written")
@pytest.mark.parametrize("async_checkpoint", [False, True], ids=["sync", "async"])
def test_a_full_disk_during_a_save_keeps_the_last_checkpoint_and_a_rerun_resumes_exactly(
    tmp_path, small_disk, deterministic, async_checkpoint
):
    uninterrupted = fit(tmp_path / "uninterrupted", 2, async_checkpoint=async_checkpoint)
    model_dir = small_disk / "run"
    fill = FillTheDisk(small_disk, model_dir / "checkpoints")
    with pytest.raises(CheckpointWriteError, match=NO_SPACE) as raised:  # TensorBoard's writes may warn first
        fit(model_dir, 2, callbacks=[fill], async_checkpoint=async_checkpoint)
    kept = str(model_dir / "checkpoints" / "ckpt-2")
    assert raised.value.kept == kept and f"{kept}, is intact and kept" in str(raised.value)
    assert isinstance(raised.value.__cause__, tf.errors.ResourceExhaustedError)
    os.remove(small_disk / "filler")
    assert not [name for name in os.listdir(model_dir / "checkpoints") if name.startswith("ckpt-4")]
    assert_same_weights(fit(model_dir, 2, async_checkpoint=async_checkpoint), uninterrupted)
