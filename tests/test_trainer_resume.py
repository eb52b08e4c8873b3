"""Kill-and-resume: a job killed by SIGKILL and rerun ends bit-identical to an uninterrupted one.

Each case runs `tests/jobs/resume_job.py` in fresh processes (op determinism,
Dropout, a shuffled repeating dataset, checkpoints every 3 steps of 4-step
epochs) and compares the final weights to the bit and the step count. The
independent processes of all cases run side by side to keep the suite short.
"""

import os
import signal
import warnings

import keras
import numpy as np
import pytest
from helpers import compile_args, finish_job, make_mlp, sbatch_scripts, stand_in_scontrol, start_job

import tftrain

JOB = os.path.join(os.path.dirname(__file__), "jobs", "resume_job.py")
TOTAL_STEPS = 12  # 3 epochs x 4 steps
KILLS = {
    # Killed after step 7: the last checkpoint is step 6, 2 steps into epoch 2.
    "mid_epoch": "step:7",
    # Killed as epoch 3 begins, just after epoch 2's checkpoint (step 8).
    "after_epoch_end": "epoch:2",
    # The 3rd save (step 6) dies after writing a truncated data file and temporary files.
    "during_save": "save:3",
    # SIGTERM after steps 5 (mid epoch 2) and 4 (an epoch's last step): a checkpoint at that step.
    "sigterm_mid_epoch": "sigterm:5",
    "sigterm_epoch_end": "sigterm:4",
    # The same with checkpoints written in the background (async_checkpoint=True).
    "async_mid_epoch": "step:7",
    "async_during_save": "save:3",
    "async_sigterm_mid_epoch": "sigterm:5",
    # docs/distribution.md's sbatch time-limit signal (USR1@90) after step 5, with slurm_requeue=True.
    "slurm_requeue": sbatch_scripts()[0]["options"]["signal"].split("@")[0].lower() + ":5",
}
PREEMPTED = {"sigterm_mid_epoch", "sigterm_epoch_end", "async_sigterm_mid_epoch", "slurm_requeue"}


def job_args(name):
    args = [f"--kill={KILLS[name]}"] if name in KILLS else []
    return args + (["--async-checkpoint"] if name.startswith("async_") else [])


def start_resume_job(model_dir, *args, env=None):
    return start_job(JOB, str(model_dir), *args, env=env)


def finish(process, expect_killed=False, expect_preempted=False):
    expected = 3 if expect_preempted else (-signal.SIGKILL if expect_killed else 0)
    return finish_job(process, expected)[0]


def final_state(model_dir):
    with np.load(os.path.join(model_dir, "final.npz")) as data:
        return {key: data[key] for key in data.files}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs every job: the uninterrupted one and the killed ones, then the reruns."""
    dirs = {name: tmp_path_factory.mktemp(name) for name in ["uninterrupted", *KILLS]}
    # The SLURM job: its id, and a stand-in `scontrol` first on PATH; the requeued job runs the same command.
    scontrol_dir = tmp_path_factory.mktemp("bin")
    calls = stand_in_scontrol(scontrol_dir)
    slurm = {"SLURM_JOB_ID": "4242", "PATH": f"{scontrol_dir}{os.pathsep}{os.environ['PATH']}"}
    env = {name: slurm if name == "slurm_requeue" else None for name in dirs}
    requeue = {name: ["--slurm-requeue"] if name == "slurm_requeue" else [] for name in dirs}
    first = {name: start_resume_job(dirs[name], *job_args(name), *requeue[name], env=env[name]) for name in dirs}
    first_stdout = {}
    for name, process in first.items():
        first_stdout[name] = finish(
            process, expect_killed=name in KILLS and name not in PREEMPTED, expect_preempted=name in PREEMPTED
        )
    after_kill = {name: sorted(os.listdir(dirs[name] / "checkpoints")) for name in KILLS}
    finished_early = {name: os.path.exists(dirs[name] / "final.npz") for name in KILLS}
    calls_after_kill = calls.read_text() if calls.exists() else ""
    reruns = {
        name: start_resume_job(
            dirs[name], *[a for a in job_args(name) if a.startswith("--async")], *requeue[name], env=env[name]
        )
        for name in KILLS
    }
    stdout = {name: finish(process) for name, process in reruns.items()}
    return dict(
        scontrol_calls=(calls_after_kill, calls.read_text()),
        dirs=dirs,
        after_kill=after_kill,
        finished_early=finished_early,
        stdout=stdout,
        first_stdout=first_stdout,
    )


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


@pytest.mark.parametrize(
    "case, stopped_at, resumed_at",
    [
        ("sigterm_mid_epoch", "step=5", "at step 5 (epoch 2, step 1 of the epoch)"),
        ("sigterm_epoch_end", "step=4", "at step 4 (epoch 2, step 0"),
    ],
)
def test_sigterm_checkpoints_the_step_reached_and_the_rerun_resumes_bit_identical(
    runs, case, stopped_at, resumed_at
):
    model_dir = runs["dirs"][case]
    assert f"PREEMPTED {stopped_at} checkpoint={model_dir}/checkpoints/" in runs["first_stdout"][case]
    assert "Training stopped on SIGTERM" in runs["first_stdout"][case]
    assert not runs["finished_early"][case]
    assert resumed_at in runs["stdout"][case]
    assert_same_as_uninterrupted(model_dir, runs["dirs"]["uninterrupted"])


def test_slurm_time_limit_signal_saves_requeues_and_the_requeued_job_resumes_bit_identical(runs):
    model_dir = runs["dirs"]["slurm_requeue"]
    first = runs["first_stdout"]["slurm_requeue"]
    assert f"PREEMPTED step=5 checkpoint={model_dir}/checkpoints/ckpt-5" in first
    assert "Training stopped on SIGUSR1" in first
    # The chief requeued the job once, after the save; the rerun that finished did not.
    assert runs["scontrol_calls"] == ("requeue 4242\n", "requeue 4242\n")
    assert "at step 5 (epoch 2, step 1 of the epoch)" in runs["stdout"]["slurm_requeue"]
    assert_same_as_uninterrupted(model_dir, runs["dirs"]["uninterrupted"])


def test_async_checkpoints_resume_bit_identical_after_a_kill_and_a_sigterm(runs):
    for case in ("async_mid_epoch", "async_sigterm_mid_epoch"):
        model_dir = runs["dirs"][case]
        assert not runs["finished_early"][case]
        assert f"resumed from {model_dir}/checkpoints/" in runs["stdout"][case]
        assert_same_as_uninterrupted(model_dir, runs["dirs"]["uninterrupted"])
    # A preemption waits for its background write: the checkpoint it names is on disk.
    model_dir = runs["dirs"]["async_sigterm_mid_epoch"]
    assert (
        f"PREEMPTED step=5 checkpoint={model_dir}/checkpoints/ckpt-5"
        in runs["first_stdout"]["async_sigterm_mid_epoch"]
    )
    assert "ckpt-5.index" in runs["after_kill"]["async_sigterm_mid_epoch"]
    assert "at step 5 (epoch 2, step 1 of the epoch)" in runs["stdout"]["async_sigterm_mid_epoch"]


def test_kill_in_the_background_write_leaves_the_previous_checkpoint_latest(runs):
    # The 3rd save (step 6) dies in the writer thread: it was never recorded.
    model_dir = runs["dirs"]["async_during_save"]
    assert {"ckpt-6_temp", "checkpoint.tmp0123abcd", "ckpt-6.index"} <= set(
        runs["after_kill"]["async_during_save"]
    )
    assert "ckpt-4 at step 4 " in runs["stdout"]["async_during_save"]
    assert_same_as_uninterrupted(model_dir, runs["dirs"]["uninterrupted"])


def test_kill_during_save_leaves_a_restorable_checkpoint(runs):
    model_dir = runs["dirs"]["during_save"]
    assert {"ckpt-6_temp", "checkpoint.tmp0123abcd", "ckpt-6.index"} <= set(runs["after_kill"]["during_save"])
    assert "ckpt-4 at step 4 " in runs["stdout"]["during_save"]  # epoch 1's end, the last recorded one
    left = set(os.listdir(model_dir / "checkpoints"))
    assert "ckpt-6_temp" not in left and "checkpoint.tmp0123abcd" not in left
    assert_same_as_uninterrupted(model_dir, runs["dirs"]["uninterrupted"])


def test_a_kill_while_a_new_batch_size_is_converted_reruns_bit_identical(tmp_path):
    """Arrays in batches of 8, killed after step 4 (checkpoint: step 3, 24 of 48 examples); rerun in batches of 16."""
    chains = {name: tmp_path / name for name in ("converted", "killed_while_converting")}
    first = [start_resume_job(d, "--arrays", "--kill=step:4") for d in chains.values()]
    for process in first:
        finish(process, expect_killed=True)
    # The converting rerun killed after step 5 (the end of the converted pass, before its checkpoint).
    reference = start_resume_job(chains["converted"], "--arrays", "--batch-size=16")
    killed = start_resume_job(chains["killed_while_converting"], "--arrays", "--batch-size=16", "--kill=step:5")
    finish(killed, expect_killed=True)
    rerun = start_resume_job(chains["killed_while_converting"], "--arrays", "--batch-size=16")
    stdout = finish(rerun)
    finish(reference)
    assert "global_batch_size: 8 in the checkpoint, 16 now (yours; the epoch goes on at its next unread example)" in stdout
    converted, killed_state = final_state(chains["converted"]), final_state(chains["killed_while_converting"])
    assert int(converted["steps"]) == 3 + 2 + 2 * 3  # 24 examples left in batches of 16: 2 steps; then 3 a pass
    for key in converted:
        np.testing.assert_array_equal(killed_state[key], converted[key], err_msg=key)


# ------------------------------------------------------------------ inputs other than tf.data, in process


class _Crash(Exception):
    pass


class _CrashAtStep(keras.callbacks.Callback):
    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) == self.step:
            raise _Crash()


def _orderly_batches():
    class Batches(keras.utils.PyDataset):
        def __init__(self):
            super().__init__()
            rng = np.random.RandomState(0)
            self.x = rng.rand(40, 6).astype("float32")
            self.y = (self.x[:, 0] * 3).astype("int32").clip(0, 2)

        def __len__(self):
            return 5

        def __getitem__(self, index):
            return self.x[index * 8 : (index + 1) * 8], self.y[index * 8 : (index + 1) * 8]

    return Batches()


def _endless_batches():
    batches = _orderly_batches()
    while True:
        for index in range(len(batches)):
            yield batches[index]


@pytest.mark.parametrize("kind", ["arrays", "shuffled_arrays", "py_dataset", "generator"])
def test_array_and_py_dataset_inputs_resume_mid_epoch(kind, tmp_path):
    def fit(model_dir, callbacks=()):
        model = make_mlp()
        trainer = tftrain.Trainer(model, **compile_args(), model_dir=str(model_dir), checkpoint_every_steps=2)
        if kind.endswith("arrays"):
            batches = _orderly_batches()
            args = (batches.x, batches.y)
            kwargs = dict(batch_size=8, shuffle=kind == "shuffled_arrays")  # make_mlp sets the seed
        elif kind == "py_dataset":
            args, kwargs = (_orderly_batches(),), dict(shuffle=False)  # fit shuffles a PyDataset's batches
        else:
            args, kwargs = (_endless_batches(),), dict(steps_per_epoch=5)
        trainer.fit(*args, epochs=3, verbose=0, callbacks=list(callbacks), **kwargs)
        return model

    reference = fit(tmp_path / "uninterrupted")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(_Crash):
            fit(tmp_path / "killed", [_CrashAtStep(7)])  # last checkpoint: step 6, mid epoch 2
        resumed = fit(tmp_path / "killed")
    assert int(resumed.optimizer.iterations.numpy()) == 15
    for left, right in zip(resumed.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(left, right, atol=1e-6)
    skip_warnings = [w for w in caught if "cannot be checkpointed" in str(w.message)]
    # A PyDataset's or generator's tf.data pipeline wraps Python code: resumed by skipping
    # batches, warned once per fit (the killed one and the rerun), not once per save. Arrays: restored.
    assert len(skip_warnings) == (0 if kind.endswith("arrays") else 2)
