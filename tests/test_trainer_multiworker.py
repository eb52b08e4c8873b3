"""MultiWorkerMirroredStrategy for real: two processes on localhost ports train one job.

Keras 3's own `model.fit` fails under this strategy (keras-team/keras#20585);
the Trainer runs a Keras model, a k-step loop, a CustomModel's own step and a
hand-written step there. Both workers must end with the same weights as one
device on the same global batches, and log the global (not their own) metrics.
The kill-and-resume and preemption cases name their workers by the SLURM
variables `srun` sets for docs/distribution.md's one-node sbatch script (the
preempted chief requeues the job), the others by TF_CONFIG.
"""

import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
from helpers import sbatch_scripts, srun_env, stand_in_scontrol

JOB = os.path.join(os.path.dirname(__file__), "jobs", "multiworker_job.py")
CONFIGS = ["keras_model", "steps_per_loop", "custom_model", "hand_written", "outside_optimizer"]
TIMEOUT_S = 240


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("localhost", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port_pair():
    """A free localhost port whose next one is free too (SLURM's layout: a node's tasks on consecutive ports)."""
    for _ in range(50):
        port = free_ports(1)[0]
        with socket.socket() as first, socket.socket() as second:
            try:
                first.bind(("localhost", port))
                second.bind(("localhost", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


def run_workers(tmp_path_factory, *args, expect_returncode=0, task_envs=None):
    """Runs the job on two workers (free localhost ports); returns their output dirs and outputs.

    `task_envs`: each worker's environment instead of a TF_CONFIG (e.g. the variables `srun` sets).
    """
    cluster = {"worker": [f"localhost:{port}" for port in free_ports(2)]}
    dirs, processes, outputs = [], [], []
    try:
        for index in range(2):
            output = tmp_path_factory.mktemp(f"worker{index}")
            tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
            task_env = task_envs[index] if task_envs else {"TF_CONFIG": tf_config}
            env = {name: value for name, value in os.environ.items() if name != "TF_CONFIG" and "SLURM_" not in name}
            env.update(task_env, TF_CPP_MIN_LOG_LEVEL="3")
            processes.append(
                subprocess.Popen(
                    [sys.executable, JOB, str(output), *map(str, args)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=env,
                )
            )
            dirs.append(output)
        for index, process in enumerate(processes):
            output, _ = process.communicate(timeout=TIMEOUT_S)
            outputs.append(output)
            assert process.returncode == expect_returncode, f"worker {index}:\n{output[-4000:]}"
    finally:
        for process in processes:  # a failed or hung peer must not outlive the test
            if process.poll() is None:
                process.kill()
                process.communicate()
    return dirs, outputs


@pytest.fixture(scope="module")
def worker_dirs(tmp_path_factory):
    """Runs the two workers once; returns their output directories."""
    return run_workers(tmp_path_factory)[0]


@pytest.mark.parametrize("config", CONFIGS)
def test_both_workers_match_one_device(worker_dirs, config):
    first, second = (np.load(os.path.join(d, f"{config}.npz")) for d in worker_dirs)
    np.testing.assert_array_equal(first["worker"], second["worker"])  # replicas stay in sync
    np.testing.assert_allclose(first["worker"], first["reference"], rtol=1e-5, atol=1e-6)
    assert np.abs(first["worker"] - first["initial"]).max() > 1e-3  # it did train


def test_workers_log_global_values(worker_dirs):
    first, second = (json.load(open(os.path.join(d, "logs.json"))) for d in worker_dirs)
    for config in CONFIGS:
        assert first[config] == second[config], config
        for key, value in first[config].items():
            assert value == pytest.approx(first[config + "_reference"][key], rel=1e-5), (config, key)


def slurm_task_envs():
    """The two tasks of docs/distribution.md's one-node sbatch script on localhost, as `srun` starts them."""
    port = str(free_port_pair())
    return port, [dict(srun_env(sbatch_scripts()[0], rank), TFTRAIN_SLURM_PORT=port) for rank in range(2)]


def test_a_killed_slurm_job_step_resumes_from_the_chiefs_checkpoint(tmp_path_factory):
    # The workers are the two SLURM tasks of the documented script (no TF_CONFIG): task 0 is the chief.
    port, task_envs = slurm_task_envs()
    model_dir = tmp_path_factory.mktemp("model_dir")
    # Checkpoints at steps 3, 4 (epoch end) and 6; both workers die after step 7.
    _, outputs = run_workers(tmp_path_factory, model_dir, 7, expect_returncode=3, task_envs=task_envs)
    for rank, output in enumerate(outputs):
        assert (
            f"SLURM job 4242 step: 2 tasks on nodes localhost (2 per node), ports from {port}; this is task {rank}"
            in output
        )
    checkpoints = sorted(os.listdir(model_dir / "checkpoints"))
    assert "ckpt-6.index" in checkpoints  # written by the chief only (numbered by step)
    assert os.listdir(model_dir / "train")  # the chief's event files
    assert not (model_dir / "workers" / "worker-0").exists()

    dirs, outputs = run_workers(tmp_path_factory, model_dir, task_envs=slurm_task_envs()[1])
    for output in outputs:
        assert f"resumed from {model_dir}/checkpoints/ckpt-6 at step 6 (epoch 2, step 2" in output
    first, second = (np.load(os.path.join(d, "resumed.npz")) for d in dirs)
    np.testing.assert_array_equal(first["worker"], second["worker"])
    np.testing.assert_allclose(first["worker"], first["reference"], rtol=1e-5, atol=1e-6)
    assert int(first["steps"]) == int(second["steps"]) == 8
    assert not (model_dir / "workers").exists() or not os.listdir(model_dir / "workers")
    assert "ckpt-8.index" in os.listdir(model_dir / "checkpoints")  # the chief saved the rest


def test_sigterm_to_one_worker_checkpoints_every_worker_at_one_step_requeues_and_resumes(tmp_path_factory):
    # Two SLURM tasks with slurm_requeue=True and a stand-in `scontrol` on PATH.
    _, task_envs = slurm_task_envs()
    scontrol_dir = tmp_path_factory.mktemp("bin")
    calls = stand_in_scontrol(scontrol_dir)
    task_envs = [dict(env, PATH=f"{scontrol_dir}{os.pathsep}{os.environ['PATH']}") for env in task_envs]
    model_dir = tmp_path_factory.mktemp("model_dir")
    # worker-1 (not the chief) gets SIGTERM after step 5; the workers agree to save after the next
    # host call (step 6), so every worker saves at step 7 and stops.
    dirs, _ = run_workers(tmp_path_factory, model_dir, "sigterm:5", expect_returncode=4, task_envs=task_envs)
    assert calls.read_text() == "requeue 4242\n"  # by the chief alone, after the save
    reports = [json.load(open(os.path.join(d, "preempted.json"))) for d in dirs]
    checkpoint = f"{model_dir}/checkpoints/ckpt-7"
    for report in reports:
        assert report["step"] == 7 and report["checkpoint"] == checkpoint, report
        assert report["signal_number"] == signal.SIGTERM, report
        assert "stopped on SIGTERM (sent to worker-1) at step 7 (epoch 2, step 3" in report["message"]
        assert report["handlers_restored"]
        assert report["later_fit_steps"] == 8  # a later fit in the same processes is not preempted
    assert os.path.exists(checkpoint + ".index")  # written by the chief
    assert not (model_dir / "workers" / "worker-1").exists()  # the other worker's copy is gone

    dirs, outputs = run_workers(tmp_path_factory, model_dir, task_envs=slurm_task_envs()[1])  # the requeued job
    for output in outputs:
        assert f"resumed from {checkpoint} at step 7 (epoch 2, step 3" in output
    first, second = (np.load(os.path.join(d, "resumed.npz")) for d in dirs)
    assert int(first["steps"]) == int(second["steps"]) == 8
    np.testing.assert_array_equal(first["worker"], second["worker"])
    np.testing.assert_array_equal(first["worker"], first["two_workers"])  # bit for bit

