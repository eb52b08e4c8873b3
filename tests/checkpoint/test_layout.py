"""The model_dir: every path built in one place from the directory resolved once, an empty one or a
pattern refused, one that changes under a run stops it."""

import json
import os
import shutil

import keras
import numpy as np
import pytest
from helpers import make_mlp

import tftrain
from tftrain.checkpoint.layout import LOCK_NAME, ModelDirLayout
from tftrain.errors import ModelDirError

X = np.random.RandomState(0).rand(16, 6).astype("float32")
Y = np.random.RandomState(1).rand(16, 3).astype("float32")


def test_every_path_is_joined_under_the_model_dir():
    layout = ModelDirLayout("runs/exp1")
    assert layout.checkpoints == os.path.join("runs/exp1", "checkpoints")
    assert layout.best == os.path.join("runs/exp1", "best")
    assert layout.train == os.path.join("runs/exp1", "train")
    assert layout.validation == os.path.join("runs/exp1", "validation")
    assert layout.evaluation == os.path.join("runs/exp1", "eval")
    assert layout.lock == os.path.join("runs/exp1", LOCK_NAME)
    assert layout.worker("worker_1") == os.path.join("runs/exp1", "workers", "worker_1")
    assert layout.run_record == os.path.join("runs/exp1", "run_record.json")
    assert layout.results == os.path.join("runs/exp1", "eval", "results.json")
    assert ModelDirLayout("runs/exp1/").checkpoints == "runs/exp1/checkpoints"  # no "//"


def test_a_model_dir_is_resolved_once_a_remote_one_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert tftrain.layout.resolve("runs/exp1/") == str(tmp_path / "runs" / "exp1")
    assert tftrain.layout.resolve("gs://bucket/run") == "gs://bucket/run"
    trainer = tftrain.Trainer(make_mlp(), optimizer="sgd", loss="mse", model_dir="runs/exp1")
    assert trainer.model_dir == str(tmp_path / "runs" / "exp1")
    assert not (tmp_path / "runs").exists()  # nothing created before a run starts


class ChangeDirectory(keras.callbacks.Callback):
    """`os.chdir(to)` after the second training batch, as a user's callback might."""

    def __init__(self, to):
        super().__init__()
        self.to = to

    def on_train_batch_end(self, batch, logs=None):
        if batch == 1:
            os.chdir(self.to)


def test_a_working_directory_changed_mid_run_leaves_the_run_where_it_started(tmp_path, monkeypatch):
    home, elsewhere = tmp_path / "home", tmp_path / "elsewhere"
    home.mkdir(), elsewhere.mkdir()
    monkeypatch.chdir(home)
    trainer = tftrain.Trainer(
        make_mlp(), optimizer="sgd", loss="mse", model_dir="run", checkpoint_every_steps=1
    )
    trainer.fit(X, Y, batch_size=4, epochs=2, verbose=0, callbacks=[ChangeDirectory(elsewhere)])
    assert os.getcwd() == str(elsewhere) and os.listdir(elsewhere) == []
    assert "ckpt-8.index" in os.listdir(home / "run" / "checkpoints")
    assert not (home / "run" / LOCK_NAME).exists()  # released

    os.chdir(home)
    batches = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(batch))
    seen = []
    resumed = tftrain.Trainer(make_mlp(), optimizer="sgd", loss="mse", model_dir="run")
    resumed.fit(X, Y, batch_size=4, epochs=3, verbose=0, callbacks=[batches])
    assert int(resumed.global_step) == 12 and seen == [0, 1, 2, 3]  # the third epoch only


@pytest.mark.parametrize("name", ["run[1]", "run*", "run?"])
def test_a_model_dir_tensorflow_would_read_as_a_pattern_is_refused_when_the_trainer_is_made(tmp_path, name):
    # TensorFlow finds checkpoints by pattern: under run[1] none is found at resume (read as damaged); under
    # run* or run? rotating old checkpoints deletes another directory's the pattern matches.
    character = name[3]
    with pytest.raises(ValueError, match=rf"Received: model_dir='.*', which holds '\{character}'"):
        tftrain.Trainer(make_mlp(), optimizer="sgd", loss="mse", model_dir=str(tmp_path / name))
    assert os.listdir(tmp_path) == []


def test_a_pattern_in_the_model_dir_is_refused_by_the_evaluator_and_the_callbacks_too(tmp_path, monkeypatch):
    trainer = tftrain.Trainer(make_mlp(), optimizer="sgd", loss="mse")
    with pytest.raises(
        ValueError, match=r"Received: model_dir='run\[1\]' \(resolved to '.*'\), which holds '\['"
    ):
        tftrain.evaluation.evaluate_continuously(trainer, X, Y, model_dir="run[1]", timeout_s=1)
    with pytest.raises(ValueError, match=r"which holds '\['"):
        tftrain.callbacks.standard_callbacks(str(tmp_path / "run[1]"))
    with pytest.raises(
        ValueError, match=r"argument `resume_from`. Received: resume_from='.*', which holds '\['"
    ):
        tftrain.Trainer(make_mlp(), optimizer="sgd", loss="mse", model_dir=str(tmp_path / "new"),
                        resume_from=str(tmp_path / "old[1]" / "checkpoints"))  # fmt: skip
    (tmp_path / "in[1]").mkdir()
    monkeypatch.chdir(tmp_path / "in[1]")  # a relative model_dir resolves under the working directory
    with pytest.raises(ValueError, match=r"Received: model_dir='run' \(resolved to '.*in\[1\]/run'\)"):
        tftrain.Trainer(make_mlp(), optimizer="sgd", loss="mse", model_dir="run")


@pytest.mark.parametrize("model_dir", ["", b""])
def test_an_empty_model_dir_is_refused_when_the_trainer_is_made(model_dir):
    # `os.environ.get("MODEL_DIR", "")` with the variable unset: the paths would be /checkpoints, ./train.
    with pytest.raises(
        ValueError, match=r"argument `model_dir`. Received: model_dir=''. Expected a directory"
    ):
        tftrain.Trainer(make_mlp(), optimizer="sgd", loss="mse", model_dir=model_dir)


def test_an_empty_model_dir_is_refused_by_the_evaluator_and_the_callbacks(tmp_path):
    trainer = tftrain.Trainer(make_mlp(), optimizer="sgd", loss="mse")
    with pytest.raises(ValueError, match="Received: model_dir=''"):
        tftrain.evaluation.evaluate_continuously(trainer, X, Y, model_dir="", timeout_s=1)
    with pytest.raises(ValueError, match="Received: log_dir=''"):
        tftrain.callbacks.standard_callbacks("")


class RemoveAtEpochEnd(keras.callbacks.Callback):
    """Runs `remove` at the end of the first epoch (the Trainer saves that epoch's checkpoint after)."""

    def __init__(self, remove):
        super().__init__()
        self.remove = remove

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 0:
            self.remove()


def fit(model_dir, remove, **kwargs):
    model = make_mlp()
    trainer = tftrain.Trainer(model, optimizer="sgd", loss="mse", model_dir=str(model_dir), **kwargs)
    trainer.fit(X, Y, batch_size=8, epochs=3, verbose=0, callbacks=[RemoveAtEpochEnd(remove)])
    return model


@pytest.mark.parametrize("async_checkpoint", [False, True], ids=["sync", "async"])
def test_a_model_dir_removed_while_fit_runs_stops_the_run_and_is_not_recreated(tmp_path, async_checkpoint):
    model_dir = tmp_path / "run"
    with pytest.raises(
        ModelDirError, match=f"stopped writing to {model_dir}: the directory was removed"
    ) as raised:
        fit(model_dir, lambda: shutil.rmtree(model_dir), async_checkpoint=async_checkpoint)
    assert "No checkpoint of this run is left: a rerun starts from the beginning" in str(raised.value)
    assert raised.value.directory == str(model_dir) and raised.value.kept is None
    assert not model_dir.exists()  # neither checkpoints/ nor anything else written again


def test_a_checkpoints_directory_removed_while_fit_runs_stops_the_run(tmp_path):
    model_dir = tmp_path / "run"
    checkpoints = model_dir / "checkpoints"
    with pytest.raises(ModelDirError, match=f"stopped writing to {checkpoints}: the directory was removed"):
        fit(model_dir, lambda: shutil.rmtree(checkpoints), checkpoint_every_steps=1)
    assert not checkpoints.exists()
    assert not (model_dir / LOCK_NAME).exists()  # released as the run stopped


def test_a_removed_writer_lock_stops_the_run_at_its_next_save_naming_the_last_checkpoint(tmp_path):
    model_dir = tmp_path / "run"
    with pytest.raises(ModelDirError, match=f"its writer lock {model_dir / LOCK_NAME} was removed") as raised:
        fit(model_dir, lambda: os.remove(model_dir / LOCK_NAME), checkpoint_every_steps=1)
    kept = str(model_dir / "checkpoints" / "ckpt-1")  # the step checkpoint before the epoch's end
    assert raised.value.kept == kept
    assert f"The last checkpoint that is safe is {kept}: a rerun on the same model_dir resumes" in str(
        raised.value
    )
    assert sorted(os.listdir(model_dir / "checkpoints")) == [
        "checkpoint",
        "ckpt-1.data-00000-of-00001",
        "ckpt-1.index",
    ]


def test_a_lock_taken_over_by_another_writer_stops_the_run_and_is_left_to_it(tmp_path):
    model_dir = tmp_path / "run"
    other = {"host": "elsewhere", "pid": 1234, "since": 0.0, "heartbeat": 1e12, "token": "theirs"}

    def take_over():
        (model_dir / LOCK_NAME).write_text(json.dumps(other))

    with pytest.raises(ModelDirError, match="was taken over by elsewhere process 1234"):
        fit(model_dir, take_over)
    assert json.loads((model_dir / LOCK_NAME).read_text()) == other  # the other writer's lock stays
