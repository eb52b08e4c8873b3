"""SimCLR pretraining is reproducible and resumes exactly: same seed, same bits; SIGKILL and rerun, same bits.

Tiny runs of `python -m tftrain.examples.simclr` in fresh processes (16 px,
48 examples, batches of 16: 3 steps per epoch, 9 steps, blur on, a checkpoint
every 2 steps): one uninterrupted, one with the same seed killed after step 5
(its last checkpoint is step 4, mid-epoch) then rerun. Every variable of their
checkpoints at step 4 and at the end (weights, batch-norm statistics, optimizer
slots, metric states) and the final metrics must be bit-identical. The logs,
TensorFlow's C++ warnings included, are checked for warnings a user cannot act on
and for TensorFlow's INFO lines at the saves.
"""

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import tftrain
from tftrain.checkpoint.state import SERVICE_STATES

OWN_FILES = {name for _, _, names in os.walk(os.path.dirname(tftrain.__file__)) for name in names}
JOB = os.path.join(os.path.dirname(__file__), "..", "..", "jobs", "simclr_kill_job.py")
STEPS = 9
FLAGS = [  # the default demo's recipe (cpu_demo, on the generated shapes), at tiny size
    "--image_size=16",
    "--num_train_examples=48",
    "--train_batch_size=16",
    "--width_multiplier=0.0625",
    "--proj_out_dim=16",
    f"--train_steps={STEPS}",
    "--checkpoint_steps=2",
    "--keep_checkpoint_max=10",
    "--use_blur",
    "--mode=train",
    "--seed=1",
    "--verbose=0",
]


def start(model_dir, kill_at=None):
    command = [sys.executable, "-m", "tftrain.examples.simclr"]
    if kill_at is not None:
        command = [sys.executable, JOB, str(kill_at)]
    # No TF_CPP_MIN_LOG_LEVEL: the log is the one a user sees.
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.Popen(
        [*command, *FLAGS, f"--model_dir={model_dir}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def finish(process, returncode=0):
    try:
        log, _ = process.communicate(timeout=300)
    finally:
        process.kill()
    assert process.returncode == returncode, log[-3000:]
    return log


def checkpoint_values(model_dir, step):
    """Every saved value of the checkpoint at `step` that two identical runs must share."""
    path = os.path.join(model_dir, "checkpoints", f"ckpt-{step}")
    reader = tf.train.load_checkpoint(path)
    dtypes = reader.get_variable_to_dtype_map()
    # Not compared: the data iterator's state (a variant, not readable here; the stream it resumes is
    # checked through the weights), the saves this process made, and the wall-clock timings.
    names = [
        name
        for name, dtype in dtypes.items()
        if dtype != tf.variant and "save_counter" not in name and not name.startswith(f"{SERVICE_STATES}/")
    ]
    values = {name: reader.get_tensor(name) for name in names}
    assert any(name.startswith("model/") and "moving_variance" in name for name in values), sorted(values)
    return values


def final_logs(model_dir):
    with open(os.path.join(model_dir, "result.json")) as file:
        return json.load(file)["train_logs"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted run, and a run of the same seed killed after step 5 then rerun (in parallel)."""
    dirs = {name: tmp_path_factory.mktemp(name) for name in ("uninterrupted", "killed")}
    uninterrupted, killed = start(dirs["uninterrupted"]), start(dirs["killed"], kill_at=5)
    logs = {"uninterrupted": finish(uninterrupted), "killed": finish(killed, -signal.SIGKILL)}
    assert not os.path.exists(dirs["killed"] / "result.json")
    before_kill = checkpoint_values(dirs["killed"], 4)
    logs["resumed"] = finish(start(dirs["killed"]))
    return dirs, logs, before_kill


def assert_same(values, other):
    assert sorted(values) == sorted(other)
    for name, value in values.items():
        np.testing.assert_array_equal(value, other[name], err_msg=name)


def test_two_runs_with_the_same_seed_are_bit_identical(runs):
    # Two processes, the same --seed: the same weights, batch-norm statistics, slots and metric states.
    dirs, _, before_kill = runs
    assert_same(before_kill, checkpoint_values(dirs["uninterrupted"], 4))


def test_a_killed_run_resumes_the_exact_stream_and_ends_bit_identical(runs):
    dirs, logs, _ = runs
    assert "tftrain: resumed from" in logs["resumed"] and "ckpt-4" in logs["resumed"]
    assert "skip" not in logs["resumed"].lower()  # the iterator was restored, no batches skipped
    assert_same(checkpoint_values(dirs["killed"], STEPS), checkpoint_values(dirs["uninterrupted"], STEPS))
    logs = final_logs(dirs["killed"])
    assert logs == final_logs(dirs["uninterrupted"]) and "contrast_acc" in logs


def test_the_log_carries_no_warning_a_user_cannot_act_on(runs):
    _, logs, _ = runs
    assert "UserWarning" not in logs["uninterrupted"]
    # The resumed run warns only that it takes over the killed run's writer lock.
    assert logs["resumed"].count("UserWarning") == logs["resumed"].count("UserWarning: Taking over") == 1
    for log in (logs["uninterrupted"], logs["resumed"]):
        assert "cannot be checkpointed" not in log and "is stateful" not in log  # the iterator saves
        assert "did not fully read the dataset being cached" not in log
        # TensorFlow's C++ warnings (W...) from the data pipeline and the checkpoints.
        assert not re.findall(r"^W\d{4} .*$", log, flags=re.MULTILINE)
        # absl's INFO lines (they name their file) are the program's and tftrain's own: none of TensorFlow's
        # at the saves (e.g. functional_saver.py's "Sharding callback duration").
        info_files = set(re.findall(r"^I\d{4} [\d:.]+ +\d+ (\w+\.py):\d+\]", log, flags=re.MULTILINE))
        assert "distribute.py" in info_files  # tftrain's line naming the strategy still shows
        assert info_files <= OWN_FILES, sorted(info_files - OWN_FILES)
