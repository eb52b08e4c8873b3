"""The run in TensorBoard's HParams tab: checked against a real TensorBoard over HTTP, and in the event files."""

import glob
import json
import os
import time

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import TensorBoardServer

import tftrain
from tftrain.services.hparams import hparams_of, trial_id

START_TAG, END_TAG = "_hparams_/session_start_info", "_hparams_/session_end_info"


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 3)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def _fit(model_dir, learning_rate, epochs, **trainer_kwargs):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(learning_rate), "mse", metrics=["mae"])
    trainer = tftrain.Trainer(model, model_dir=str(model_dir), **trainer_kwargs)
    x, y = _data()
    return trainer.fit(x, y, batch_size=8, epochs=epochs, verbose=0, validation_split=0.25)


def _root_tags(model_dir):
    """Each tag written to the run directory itself (not train/ or validation/), with its values in order."""
    tags = {}
    for path in sorted(glob.glob(os.path.join(model_dir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append((event.step, value))
    return tags


def test_hparams_of_shows_each_value_once_under_one_name_with_its_own_type():
    record = {
        "optimizer": "keras.optimizers.SGD",
        "optimizer.learning_rate": 0.1,
        "optimizer.momentum": 0.9,
        "loss": "mse",
        "data.element_spec": ["float32[3]", "float32[1]"],
        "data.global_batch_size": 64,
        "hparams.batch_size": 64,  # a program's global batch size: the record's shown once, as the program's
        "model.layers": ["Dense[3x1, 1]"],
        "model.layer_names": ["dense"],
        "optimizer.variables": [[3, 1]],
        "ema_decay": None,
        "steps_per_loop": 8,
        "jit_compile": False,
        "hparams.learning_rate": 0.1,  # a program's flag, the optimizer's rate: shown once, as the program's
        "hparams.momentum": 0.5,  # another value than the optimizer's: both shown
        "hparams.model.loss": "mae",  # a column of the record's own: the user's keeps its prefix
        "hparams.dry_run": True,
        "hparams.command_line": "train.py --learning_rate=0.1 --steps_per_loop=8",
        "hparams.trainer.steps_per_loop": 8,  # the program's flag for an option the record holds itself
        "epochs": 3,
        "hparams.trainer.epochs": 2,  # the record's own value is the one in effect
        "hparams.trainer.checkpoint_every_steps": 16,
        "hparams.trainer.model_dir": "runs/lr0.1",
    }
    shown = hparams_of(record)
    assert shown == {
        "learning_rate": 0.1,
        "momentum": 0.5,
        "hparams.model.loss": "mae",
        "dry_run": True,
        "batch_size": 64,
        "trainer.checkpoint_every_steps": 16,
        "trainer.steps_per_loop": 8,
        "trainer.jit_compile": False,
        "trainer.epochs": 3,
        "optimizer.class": "keras.optimizers.SGD",
        "optimizer.momentum": 0.9,
        "model.loss": "mse",
        "data.element_spec": '["float32[3]", "float32[1]"]',
    }
    assert set(list(shown)[:5]) == {"batch_size", "dry_run", "hparams.model.loss", "learning_rate", "momentum"}  # the user's first


def test_a_runs_trial_id_is_its_directorys_name_and_a_hash_of_its_path(tmp_path):
    assert trial_id(str(tmp_path / "a" / "lr0.1")).startswith("lr0.1-")
    assert trial_id(str(tmp_path / "a" / "lr0.1")) != trial_id(str(tmp_path / "b" / "lr0.1"))
    assert trial_id(str(tmp_path / "a" / "lr0.1")) == trial_id(str(tmp_path / "a" / "lr0.1") + "/")


def test_a_fit_writes_its_record_its_final_logs_and_its_end_to_the_run_directory(tmp_path):
    history = _fit(tmp_path, 0.1, 2, hparams={"seed": np.int64(0), "augment": "strong", "note": None})
    tags = _root_tags(tmp_path)
    start = tags[START_TAG]
    assert len(start) == 1
    from tensorboard.plugins.hparams import metadata

    content = start[0][1].metadata.plugin_data.content
    hparams = metadata.parse_session_start_info_plugin_data(content).hparams
    assert hparams["optimizer.learning_rate"].number_value == pytest.approx(0.1)
    assert hparams["seed"].number_value == 0
    assert hparams["augment"].string_value == "strong"
    assert "note" not in hparams  # None is recorded, not shown
    assert "model.layers" not in hparams
    # The epochs' logs under their Keras names, the last at the run's last step.
    for name in ("loss", "mae", "val_loss", "val_mae"):
        steps = [step for step, _ in tags[name]]
        assert steps == [3, 6]
        assert tf.make_ndarray(tags[name][-1][1].tensor) == pytest.approx(history.history[name][-1])
    assert len(tags[END_TAG]) == 1


def test_a_failed_fit_writes_no_end(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    x, y = _data()
    y[9] = np.nan  # the second batch's loss is NaN
    trainer = tftrain.Trainer(model, model_dir=str(tmp_path), steps_per_loop=1)
    with pytest.raises(tftrain.NonFiniteLossError):
        trainer.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    tags = _root_tags(tmp_path)
    assert START_TAG in tags
    assert END_TAG not in tags


def test_hparams_needs_a_model_dir_and_plain_values():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match=r"hparams=.*model_dir=None"):
        tftrain.Trainer(model, "sgd", "mse", hparams={"seed": 0})
    with pytest.raises(TypeError, match=r"hparams\['sizes'\] of type list.*json.dumps"):
        tftrain.Trainer(model, "sgd", "mse", model_dir="unused", hparams={"sizes": [1, 2]})
    with pytest.raises(TypeError, match=r"Expected a mapping"):
        tftrain.Trainer(model, "sgd", "mse", model_dir="unused", hparams=[("seed", 0)])


def test_a_changed_hparam_at_resume_is_said_and_kept_in_the_record_file(tmp_path, caplog):
    _fit(tmp_path, 0.1, 1, hparams={"seed": 0})
    with caplog.at_level("WARNING", logger="tftrain"):
        _fit(tmp_path, 0.1, 2, hparams={"seed": 1})
    assert "resuming with a change: hparams.seed: 0 in the checkpoint, 1 now (yours)" in caplog.text
    with open(tmp_path / "run_record.json") as file:
        saved = json.load(file)
    assert saved["record"]["hparams.seed"] == 1
    assert {"key": "hparams.seed", "saved": 0, "now": 1, "step": 3} in saved["changes"]


def _session_groups(server, expected, timeout_s=60.0):
    """The HParams plugin's session groups, once it has read `expected` sessions with their ends and final logs."""
    body = {
        "experimentName": "",
        "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
        "colParams": [],
        "startIndex": 0,
        "sliceSize": 100,
    }
    deadline = time.monotonic() + timeout_s
    while True:
        answer = server.post("/data/plugin/hparams/session_groups", body)
        groups = answer.get("sessionGroups", [])
        sessions = [session for group in groups for session in group["sessions"]]
        done = [s for s in sessions if s.get("status") == "STATUS_SUCCESS" and len(s.get("metricValues", [])) > 4]
        if len(done) == expected or time.monotonic() > deadline:
            return groups
        time.sleep(1)


def test_two_runs_under_one_log_root_are_two_rows_of_a_real_tensorboards_hparams_tab(tmp_path):
    root = tmp_path / "runs"
    final = {}
    _fit(root / "fast", 0.1, 1, hparams={"seed": 0})
    final["fast"] = _fit(root / "fast", 0.1, 2, hparams={"seed": 0}).history  # resumed: still one run
    final["slow"] = _fit(root / "slow", 0.01, 2, hparams={"seed": 0}).history
    with TensorBoardServer(str(root)) as server:
        groups = _session_groups(server, expected=2)
        experiment = server.post("/data/plugin/hparams/experiment", {"experimentName": ""})
    assert len(groups) == 2
    infos = {info["name"]: info for info in experiment["hparamInfos"]}
    assert infos["optimizer.learning_rate"]["differs"] is True
    assert infos["optimizer.class"]["differs"] is False
    assert {"group": "", "tag": "val_loss"} in [info["name"] for info in experiment["metricInfos"]]
    rows = {}
    for group in groups:
        (session,) = group["sessions"]
        assert group["name"] == trial_id(str(root / session["name"]))
        metrics = {(m["name"]["group"], m["name"]["tag"]): m["value"] for m in group["metricValues"]}
        rows[session["name"]] = (group["hparams"], metrics, session["status"])
    assert set(rows) == {"fast", "slow"}
    for name, learning_rate in (("fast", 0.1), ("slow", 0.01)):
        hparams, metrics, status = rows[name]
        assert hparams["optimizer.learning_rate"] == pytest.approx(learning_rate)
        assert hparams["seed"] == 0
        assert hparams["optimizer.class"] == "keras.optimizers.SGD"
        assert status == "STATUS_SUCCESS"
        for key in ("loss", "mae", "val_loss", "val_mae"):
            assert metrics[("", key)] == pytest.approx(final[name][key][-1], rel=1e-6)
        # The epoch curves' last values are columns too (the train/ and validation/ runs).
        assert metrics[("validation", "epoch_loss")] == pytest.approx(final[name]["val_loss"][-1], rel=1e-6)
