"""TensorFlow's per-save INFO line is kept out of the log; every other line still shows."""

import os
import re
import subprocess
import sys

from tftrain.checkpoint import native_log

SAVE_INFO = b"I0000 00:00:1796457160.587880    3692 iterator_ops.cc:206] Saving symbolic checkpoint\n"


def test_only_the_save_info_line_is_dropped(capfd, monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    with native_log.without_save_info():
        os.write(2, SAVE_INFO)
        os.write(
            2, b"2026-12-05 08:47:03.473787: I tensorflow/core/kernels/data/iterator_ops.cc:172] Saving sym"
        )
        os.write(2, b"bolic checkpoint\n")  # TensorFlow 2.16's format, split over two writes
        os.write(2, b"W0000 00:00:1.0 something.cc:1] a warning that stays\n")
        os.write(2, b"E0000 00:00:1.0 other.cc:2] Saving symbolic checkpoint failed: an error that stays\n")
    err = capfd.readouterr().err
    assert "Saving symbolic checkpoint\n" not in err
    assert "a warning that stays" in err
    assert "an error that stays" in err


def test_nothing_is_captured_when_info_lines_are_off(capfd, monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "1")
    with native_log.without_save_info():
        os.write(2, SAVE_INFO)
    assert "Saving symbolic checkpoint" in capfd.readouterr().err


_FIT_WITH_CHECKPOINTS = """
import sys, numpy as np, tensorflow as tf, tftrain, keras
data = tf.data.Dataset.from_tensor_slices((np.ones((32, 6), "float32"), np.ones((32, 3), "float32"))).batch(4)
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
trainer = tftrain.Trainer(model, "sgd", "mse", model_dir=sys.argv[1], checkpoint_every_steps=2)
trainer.fit(data, epochs=1, verbose=0)
print("saves", trainer.timing.checkpoint_saves)
"""


def test_fit_with_checkpoints_prints_no_save_info_line(tmp_path):
    # A fresh process: TensorFlow reads its C++ log level once, at load (the tests' own is quieter).
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "0"}
    result = subprocess.run(
        [sys.executable, "-c", _FIT_WITH_CHECKPOINTS, str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "saves 4" in result.stdout
    assert "iterator_ops" not in result.stderr  # the save's INFO line
    assert re.search(r"^(I\d|\d{4}-\d\d-\d\d [\d:.]+: I )", result.stderr, re.M)  # other INFO lines show


def test_tensorflows_python_info_lines_of_a_save_are_dropped_and_every_other_record_kept(tmp_path, caplog):
    import inspect
    import logging

    import tensorflow as tf
    from absl import logging as absl_logging

    checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0))
    verbosity = absl_logging.get_verbosity()
    absl_logging.set_verbosity(absl_logging.INFO)  # as a program under absl: a SavedModel save sets the level from it
    with caplog.at_level(logging.INFO), native_log.without_save_info():
        checkpoint.write(str(tmp_path / "ckpt"))  # logs "Sharding callback duration: ... microseconds" at INFO
        tf.saved_model.save(tf.Module(), str(tmp_path / "export"))  # "Assets written to", "Writing fingerprint"
        absl_logging.info("the program's own line")
        absl_logging.warning("the program's own warning")
    absl_logging.set_verbosity(verbosity)
    assert "Sharding callback" not in caplog.text and "Assets written" not in caplog.text
    assert "fingerprint" not in caplog.text
    assert "the program's own line" in caplog.text and "the program's own warning" in caplog.text
    saver = os.path.join(os.path.dirname(inspect.getfile(tf.train.Checkpoint)), "functional_saver.py")
    warning = logging.getLogger("absl").makeRecord("absl", logging.WARNING, saver, 1, "kept", (), None)
    assert all(f.filter(warning) for f in logging.getLogger("absl").filters)  # TensorFlow's warnings still show


def test_the_filter_is_put_on_the_loggers_once_per_process(monkeypatch):
    import inspect
    import logging

    looked_up = []
    monkeypatch.setattr(inspect, "getfile", lambda item, getfile=inspect.getfile: looked_up.append(item) or getfile(item))
    native_log.quiet_python_save_info.cache_clear()
    for _ in range(3):
        native_log.quiet_python_save_info()
    assert len(looked_up) == 2  # the two modules' directories, found at the first call only
    for name in ("absl", "tensorflow"):
        assert sum(isinstance(f, native_log.CheckpointInfoFilter) for f in logging.getLogger(name).filters) == 1
