"""Kill-and-resume: a job killed by SIGKILL and rerun ends bit-identical to an uninterrupted one.

Each case runs `tests/jobs/resume_job.py` in fresh processes (op determinism,
Dropout, a shuffled repeating dataset, checkpoints every 3 steps of 4-step
epochs) and compares the final weights to the bit and the step count. The
independent processes of all cases run side by side to keep the suite short.
"""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

JOB = os.path.join(os.path.dirname(__file__), "jobs", "resume_job.py")
TOTAL_STEPS = 12  # 3 epochs x 4 steps
KILLS = {
    # Killed after step 7: the last checkpoint is step 6, 2 steps into epoch 2.
    "mid_epoch": "step:7",
    # Killed as epoch 3 begins, just after epoch 2's checkpoint (step 8).
    "after_epoch_end": "epoch:2",
    # The 3rd save (step 6) dies after writing a truncated data file and temporary files.
    "during_save": "save:3",
}


def start_job(model_dir, *args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONHASHSEED="0")
    return subprocess.Popen(
        [sys.executable, JOB, str(model_dir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def finish(process, expect_killed=False):
    try:
        stdout, stderr = process.communicate(timeout=300)
    finally:
        process.kill()
    expected = -signal.SIGKILL if expect_killed else 0
    assert process.returncode == expected, stderr[-3000:]
    return stdout


def final_state(model_dir):
    with np.load(os.path.join(model_dir, "final.npz")) as data:
        return {key: data[key] for key in data.files}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs every job: the uninterrupted one and the killed ones, then the reruns."""
    dirs = {name: tmp_path_factory.mktemp(name) for name in ["uninterrupted", *KILLS]}
    first = {
        name: start_job(dirs[name], *([f"--kill={KILLS[name]}"] if name in KILLS else [])) for name in dirs
    }
    for name, process in first.items():
        finish(process, expect_killed=name in KILLS)
    after_kill = {name: sorted(os.listdir(dirs[name] / "checkpoints")) for name in KILLS}
    finished_early = {name: os.path.exists(dirs[name] / "final.npz") for name in KILLS}
    reruns = {name: start_job(dirs[name]) for name in KILLS}
    stdout = {name: finish(process) for name, process in reruns.items()}
    return dict(dirs=dirs, after_kill=after_kill, finished_early=finished_early, stdout=stdout)


def assert_same_as_uninterrupted(model_dir, uninterrupted_dir):
    resumed, uninterrupted = final_state(model_dir), final_state(uninterrupted_dir)
    assert int(resumed["steps"]) == TOTAL_STEPS == int(uninterrupted["steps"])
    for key in uninterrupted:
        np.testing.assert_array_equal(resumed[key], uninterrupted[key], err_msg=key)


@pytest.mark.parametrize(
    "case, resumed_at",
    [
        ("mid_epoch", "at step 6 (epoch 2, step 2 of the epoch)"),
        ("after_epoch_end", "at step 8 (epoch 3, step 0"),
    ],
)
def test_killed_job_resumes_bit_identical(runs, case, resumed_at):
    model_dir = runs["dirs"][case]
    assert not runs["finished_early"][case]
    assert f"resumed from {model_dir}/checkpoints/" in runs["stdout"][case]
    assert resumed_at in runs["stdout"][case]
    assert_same_as_uninterrupted(model_dir, runs["dirs"]["uninterrupted"])


def test_kill_during_save_leaves_a_restorable_checkpoint(runs):
    model_dir = runs["dirs"]["during_save"]
    assert {"ckpt-3_temp", "checkpoint.tmp0123abcd", "ckpt-3.index"} <= set(runs["after_kill"]["during_save"])
    assert "at step 4 " in runs["stdout"]["during_save"]  # ckpt-2 (epoch 1 end), the last recorded one
    left = set(os.listdir(model_dir / "checkpoints"))
    assert "ckpt-3_temp" not in left and "checkpoint.tmp0123abcd" not in left
    assert_same_as_uninterrupted(model_dir, runs["dirs"]["uninterrupted"])
