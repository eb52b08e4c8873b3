"""Checkpoints written before the services' states had their own key still restore.

The fixture `fixtures/service_states_under_timing` was written by tftrain 0.1.0
at commit ab8620d with its `make.py`: one epoch of two steps of a Dense(2) under
SGD(0.1), the services' states saved under the checkpoint key "timing".
"""

import logging
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import tftrain
from tftrain.checkpoint.state import SERVICE_STATES_KEY, saved_service_states

FIXTURE = Path(__file__).parent / "fixtures" / "service_states_under_timing"


def _old_run(tmp_path):
    model_dir = tmp_path / "run"
    shutil.copytree(FIXTURE, model_dir / "checkpoints", ignore=shutil.ignore_patterns("*.py"))
    return model_dir


def test_the_services_states_are_read_under_the_old_key():
    reader = tf.train.load_checkpoint(str(FIXTURE / "ckpt-2"))
    assert not reader.has_tensor(SERVICE_STATES_KEY)
    states = saved_service_states(reader)
    assert states["data"] == {"checkpoint": "symbolic", "pass_offset": [0, 0]}
    assert states["timing"]["timer"]["steps"] == 2
    assert states["run_record"]["optimizer.learning_rate"] == 0.1


def test_a_run_resumes_from_the_old_checkpoint_with_its_record(tmp_path, caplog):
    model_dir = _old_run(tmp_path)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.2), loss="mse")
    x = np.arange(24, dtype="float32").reshape(8, 3) / 24
    y = np.ones((8, 2), "float32")
    trainer = tftrain.Trainer(model, model_dir=str(model_dir))
    with caplog.at_level(logging.WARNING, logger="tftrain"):
        trainer.fit(x, y, batch_size=4, epochs=2, verbose=0)
    # The saved record was read (the new rate is said against it), the run went on from step 2.
    assert "learning_rate: 0.1 in the checkpoint, 0.2 now (yours)" in caplog.text
    assert int(model.optimizer.iterations) == 4
    latest = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir / "checkpoints")))
    assert latest.has_tensor(SERVICE_STATES_KEY)
    assert saved_service_states(latest)["timing"]["timer"]["steps"] == pytest.approx(4)
