"""Kill-and-resume: a job killed by SIGKILL and rerun ends bit-identical to an uninterrupted one.

Each case runs `tests/jobs/resume_job.py` in fresh processes (op determinism,
Dropout, a shuffled repeating dataset, checkpoints every 3 steps of 4-step
epochs) and compares the final weights to the bit and the step count.
"""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

JOB = os.path.join(os.path.dirname(__file__), "jobs", "resume_job.py")
TOTAL_STEPS = 12  # 3 epochs x 4 steps


def run_job(model_dir, *args, expect_killed=False):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONHASHSEED="0")
    result = subprocess.run(
        [sys.executable, JOB, str(model_dir), *args], capture_output=True, text=True, timeout=240, env=env
    )
    if expect_killed:
        assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    else:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def final_state(model_dir):
    with np.load(os.path.join(model_dir, "final.npz")) as data:
        return {key: data[key] for key in data.files}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("uninterrupted")
    run_job(model_dir)
    return final_state(model_dir)


def assert_same_as_uninterrupted(model_dir, uninterrupted):
    resumed = final_state(model_dir)
    assert int(resumed["steps"]) == TOTAL_STEPS == int(uninterrupted["steps"])
    for key in uninterrupted:
        np.testing.assert_array_equal(resumed[key], uninterrupted[key], err_msg=key)


@pytest.mark.parametrize(
    "kill, resumed_step",
    # Mid-epoch: killed after step 7, the last checkpoint is step 6 (2 steps into epoch 2).
    # Just after an epoch end: killed as epoch 3 begins, after epoch 2's checkpoint (step 8).
    [("step:7", 6), ("epoch:2", 8)],
    ids=["mid_epoch", "after_epoch_end"],
)
def test_killed_job_resumes_bit_identical(tmp_path, uninterrupted, kill, resumed_step):
    run_job(tmp_path, f"--kill={kill}", expect_killed=True)
    assert not os.path.exists(tmp_path / "final.npz")
    rerun = run_job(tmp_path)
    assert f"resumed from {tmp_path}/checkpoints/" in rerun.stdout
    assert f"at step {resumed_step} " in rerun.stdout
    assert_same_as_uninterrupted(tmp_path, uninterrupted)


def test_kill_during_save_leaves_a_restorable_checkpoint(tmp_path, uninterrupted):
    # The 3rd save (step 6) dies after writing a truncated data file and temporary files.
    run_job(tmp_path, "--kill=save:3", expect_killed=True)
    checkpoints = tmp_path / "checkpoints"
    assert (checkpoints / "ckpt-3_temp").is_dir() and (checkpoints / "checkpoint.tmp0123abcd").exists()
    rerun = run_job(tmp_path)
    assert "at step 4 " in rerun.stdout  # ckpt-2 (epoch 1 end), the last recorded one
    assert not (checkpoints / "ckpt-3_temp").exists()
    assert not (checkpoints / "checkpoint.tmp0123abcd").exists()
    assert_same_as_uninterrupted(tmp_path, uninterrupted)

