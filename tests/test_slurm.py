"""tftrain.slurm: a SLURM job step's variables read into a cluster (no subprocess), and `scontrol requeue`."""

import os
import time

import pytest
import tensorflow as tf
from helpers import sbatch_scripts, srun_env, stand_in_scontrol

from tftrain import distribute, slurm

ONE_NODE, SEVERAL_NODES = sbatch_scripts()


@pytest.fixture
def step(monkeypatch):
    """Sets a task's SLURM variables (and clears any the test machine has): `step(env)`."""
    for name in list(os.environ):
        if name.startswith("SLURM_") or name in ("TF_CONFIG", "CUDA_VISIBLE_DEVICES", slurm.PORT_VARIABLE):
            monkeypatch.delenv(name)

    def set_env(env):
        for name, value in env.items():
            monkeypatch.setenv(name, value)

    return set_env


def test_the_several_node_script_splits_each_nodes_gpus_among_its_tasks(step):
    step(srun_env(SEVERAL_NODES, rank=5, gpus=True))  # node02's second task; each node shows 4 GPUs
    found = slurm.read_step(use_gpu=True)
    workers = found.config["cluster"]["worker"]
    assert len(workers) == 16 and workers[:5] == [*(f"node01:{p}" for p in range(8888, 8892)), "node02:8888"]
    assert found.config["task"] == {"type": "worker", "index": 5} and workers[5] == "node02:8889"
    assert found.gpus == ("1",)
    assert found.describe() == (
        "SLURM job 4242 step: 16 tasks on nodes node01,node02,node03,node04 (4 per node), ports from 8888; "
        "this is task 5, GPUs 1"
    )
    assert slurm.read_step(use_gpu=False).gpus is None  # the CPU: the same layout, no GPU touched


def test_the_layout_is_tensorflows_resolvers_but_in_srun_s_node_order(step):
    step(srun_env(SEVERAL_NODES, rank=5))
    resolver = tf.distribute.cluster_resolver.SlurmClusterResolver(gpus_per_node=4, auto_set_gpu=False)
    assert slurm.read_step().config["cluster"] == resolver.cluster_spec().as_dict()
    # srun numbers tasks in node-list order (node9 before node10); the resolver sorts names as strings.
    step(dict(srun_env(SEVERAL_NODES, rank=0, node_list="node[9-10]"), SLURM_STEP_TASKS_PER_NODE="1(x2)",
              SLURM_STEP_NUM_TASKS="2"))  # fmt: skip
    assert slurm.read_step().config["cluster"]["worker"] == ["node9:8888", "node10:8888"]


def test_the_one_node_script_keeps_the_gpus_slurm_bound_and_takes_the_port_override(step):
    step({**srun_env(ONE_NODE, rank=0, gpus=True), slurm.PORT_VARIABLE: "9100"})
    found = slurm.read_step(use_gpu=True)
    assert found.config["cluster"] == {"worker": ["localhost:9100", "localhost:9101"]}
    assert found.gpus is None  # --gpus-per-task: each task trains on what it sees
    assert "this is task 0 (the chief)" in found.describe()
    assert slurm.read_step(port=7000).config["cluster"]["worker"][1] == "localhost:7001"


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"SLURM_STEP_NODELIST": "node[01-"}, "SLURM_STEP_NODELIST"),
        ({"SLURM_STEP_TASKS_PER_NODE": "4(x"}, "SLURM_STEP_TASKS_PER_NODE"),
        ({"SLURM_STEP_TASKS_PER_NODE": "4(x3)"}, "the step's variables disagree"),
        ({"SLURM_PROCID": "16"}, "the step's variables disagree"),
        ({"SLURM_PROCID": "first"}, "SLURM_PROCID='first'"),
        ({"SLURM_STEP_NODELIST": ""}, "SLURM_STEP_NODELIST unset"),
        ({slurm.PORT_VARIABLE: "99999"}, "TFTRAIN_SLURM_PORT='99999'"),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, "2 GPU(s) on the node for 4 tasks"),
    ],
)
def test_a_malformed_slurm_variable_is_a_clear_error(step, changes, named):
    step({**srun_env(SEVERAL_NODES, rank=5), **changes})
    with pytest.raises(ValueError, match="Invalid") as error:
        slurm.read_step(use_gpu=True)
    assert named in str(error.value)


def test_only_an_srun_step_of_several_tasks_makes_workers_and_tf_config_wins(step):
    step({"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "2"})  # the batch script itself: one process
    assert slurm.step_tasks() == 0
    assert distribute.is_default_strategy(distribute.setup_strategy())
    step({**srun_env(ONE_NODE, rank=0), "SLURM_STEP_NODELIST": "node[01-"})
    with pytest.raises(ValueError, match="SLURM_STEP_NODELIST"):
        distribute.setup_strategy()
    with pytest.raises(ValueError, match="num_cpu_devices=2 with SLURM job 4242 step"):
        step({"SLURM_STEP_NODELIST": "localhost"})
        distribute.setup_strategy(num_cpu_devices=2)
    with pytest.raises(ValueError, match="slurm_port"):
        distribute.setup_strategy(slurm_port=0)
    # A TF_CONFIG wins: the SLURM variables are not read (this one names a single worker: one process).
    step({"SLURM_STEP_NODELIST": "node[01-", "TF_CONFIG": '{"cluster": {"worker": ["localhost:1"]}, '
          '"task": {"type": "worker", "index": 0}}'})  # fmt: skip
    assert distribute.is_default_strategy(distribute.setup_strategy())


@pytest.mark.parametrize(
    "body, said",
    [
        ("exit 0", None),
        ("echo 'Invalid job id specified' >&2; exit 1", "exited with 1: Invalid job id specified"),
        ("sleep 10", "did not answer within 0.5 s"),
    ],
)
def test_requeue_runs_scontrol_and_says_a_failure_in_one_line(step, monkeypatch, tmp_path, caplog, body, said):
    step({"SLURM_JOB_ID": "4242"})
    calls = stand_in_scontrol(tmp_path, body)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    start = time.monotonic()
    if said is None:
        with caplog.at_level("INFO", logger="tftrain"):
            assert slurm.requeue(timeout_s=0.5)
        assert "requeued SLURM job 4242" in caplog.text
    else:
        with pytest.warns(UserWarning, match="the SLURM job was not requeued") as warned:
            assert not slurm.requeue(timeout_s=0.5)
        assert said in str(warned[0].message) and "\n" not in str(warned[0].message)
    assert time.monotonic() - start < 5
    assert calls.read_text() == "requeue 4242\n"


def test_requeue_without_scontrol_or_outside_a_job_warns(step, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol there
    with pytest.warns(UserWarning, match="SLURM_JOB_ID is unset"):
        assert not slurm.requeue()
    step({"SLURM_JOB_ID": "4242"})
    with pytest.warns(UserWarning, match="`scontrol` is not on PATH"):
        assert not slurm.requeue()
