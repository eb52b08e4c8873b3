"""Helpers shared by tests (importable as `helpers`: setup.cfg puts tests/ on the path)."""

import json
import os
import re
import subprocess
import sys
import textwrap

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.ops import io_ops

# Engines every step must run under: name -> Trainer keyword arguments.
ENGINES = {
    "eager": dict(use_tf_function=False),
    "graph": dict(),
    "xla": dict(jit_compile=True),
    "loop3": dict(steps_per_loop=3),
    "xla_loop3": dict(jit_compile=True, steps_per_loop=3),
}


def make_mlp(seed: int = 1) -> keras.Model:
    """A small seeded classifier: 6 -> 8 -> 3 logits."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]
    )


def compile_args():
    """Optimizer, loss and metrics, fresh each call."""
    return dict(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


def max_weight_difference(a: keras.Model, b: keras.Model) -> float:
    """Largest absolute difference between two models' weights."""
    return max(float(np.abs(x - y).max()) for x, y in zip(a.get_weights(), b.get_weights(), strict=True))


# The timing report's fields, as DESIGN.md names them.
TIMING_REPORT_KEYS = {
    "first_step_s",
    "step_time_median_s",
    "step_time_p90_s",
    "examples_per_sec",
    "steps",
    "trace_count",
    "checkpoint_saves",
    "checkpoint_save_median_s",
    "engine",
    "flops_per_step",
    "flops_per_sec",
    "peak_flops",
    "utilization",
}


def read_run(run_dir) -> dict:
    """Every summary of a TensorBoard run's event files: {tag: [(step, value), ...]} in write order.

    `tf.summary.scalar` in TF2 writes tensor events; older writers wrote scalar
    events. Both are read; scalars as floats, other tensors (histograms,
    images) as NumPy arrays.
    """
    import tensorflow as tf
    from tensorboard.backend.event_processing import event_accumulator

    accumulator = event_accumulator.EventAccumulator(
        str(run_dir), size_guidance={event_accumulator.TENSORS: 0, event_accumulator.SCALARS: 0}
    )
    accumulator.Reload()
    tags = accumulator.Tags()
    values = {}
    for tag in tags[event_accumulator.SCALARS]:
        values[tag] = [(event.step, float(event.value)) for event in accumulator.Scalars(tag)]
    for tag in tags[event_accumulator.TENSORS]:
        arrays = [(event.step, tf.make_ndarray(event.tensor_proto)) for event in accumulator.Tensors(tag)]
        values[tag] = [(step, float(array) if array.ndim == 0 else array) for step, array in arrays]
    return values


# The NaN guard's cases (tests/loops/test_training_run.py, tests/engine/test_pipelined_calls.py).
BATCH_SIZE = 4
STEPS_PER_EPOCH = 8
BAD_BATCH = 3  # 0-based batch of the first epoch: global step 4
BAD_STEP = BAD_BATCH + 1


def regression_data(nan_batch=BAD_BATCH):
    """32 examples in batches of 4; one target of batch `nan_batch` is NaN (None: no NaN)."""
    rng = np.random.RandomState(0)
    x = rng.rand(STEPS_PER_EPOCH * BATCH_SIZE, 6).astype("float32")
    y = rng.rand(STEPS_PER_EPOCH * BATCH_SIZE, 3).astype("float32")
    if nan_batch is not None:
        y[nan_batch * BATCH_SIZE + 1, 2] = np.nan
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH_SIZE)


def mse_args():
    return dict(optimizer=keras.optimizers.SGD(0.01), loss="mse", metrics=["mae"])


def assert_checkpoints_finite(model_dir, bad_step: int) -> str:
    """Every checkpoint in `model_dir` is of a step before `bad_step` and holds only finite floats; returns the latest."""
    latest = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
    assert latest is not None
    checked = 0
    for path in tf.train.get_checkpoint_state(str(model_dir / "checkpoints")).all_model_checkpoint_paths:
        reader = tf.train.load_checkpoint(path)
        assert int(reader.get_tensor("progress/global_step/.ATTRIBUTES/VARIABLE_VALUE")) < bad_step
        for key, dtype in reader.get_variable_to_dtype_map().items():
            if dtype.is_floating:
                assert np.all(np.isfinite(reader.get_tensor(key))), (path, key)
                checked += 1
    assert checked > 0
    return latest


def loss_of_batch(batch):
    return {"loss": tf.reduce_mean(batch), "other": tf.constant(1.0)}


def values_dataset():
    """Batches [1.], [2.], [3.], [nan], [5.], ... [9.]."""
    values = np.arange(1, 10, dtype="float32")
    values[3] = np.nan
    return tf.data.Dataset.from_tensor_slices(values).batch(1)


# The start of a script run in a fresh process: the CPU split into two logical devices, a
# MirroredStrategy over them, and a small classification dataset (x, y, batches of 16).
TWO_CPU_MIRRORED_SETUP = textwrap.dedent(
    """
    import json, tempfile, warnings
    import keras, numpy as np, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import tftrain

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    rng = np.random.RandomState(0)
    x = rng.rand(64, 6).astype("float32")
    y = (x[:, 0] * 3).astype("int32").clip(0, 2)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)
    """
)


def start_job(*command: str, env: dict | None = None) -> subprocess.Popen:
    """Starts a job script in a process of its own (quiet TensorFlow, fixed hash seed, `env` added); see `finish_job`."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONHASHSEED="0", **(env or {}))
    return subprocess.Popen(
        [sys.executable, *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def finish_job(process: subprocess.Popen, returncode: int = 0, timeout: float = 300) -> tuple[str, str]:
    """Waits for a `start_job` process; fails the test unless it exits with `returncode`. Returns (stdout, stderr)."""
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        process.kill()
    assert process.returncode == returncode, stderr[-3000:]
    return stdout, stderr


def run_result_script(script: str, timeout: float) -> dict:
    """Runs `script` in a fresh Python process; returns the JSON it printed after `RESULT`.

    For tests that need a process of their own (logical CPU devices, a
    strategy): the script prints one line `RESULT<json>`; a failed run fails
    the test with the end of its stderr.
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    line = next(line for line in completed.stdout.splitlines() if line.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


class TensorBoardServer:
    """A real `tensorboard --logdir` on a free local port, for tests that read its plugins' data over HTTP.

    Use as a context manager; `post(route, body)` sends a JSON request to a
    plugin route (e.g. `"/data/plugin/hparams/experiment"`) and returns the
    decoded answer. The process is stopped on exit.
    """

    def __init__(self, logdir: str, timeout_s: float = 60.0):
        self.logdir = logdir
        self.timeout_s = timeout_s
        self.url = None
        self._process = None

    def __enter__(self) -> "TensorBoardServer":
        import re
        import tempfile
        import time

        command = [
            sys.executable, "-m", "tensorboard.main", "--logdir", self.logdir, "--host", "127.0.0.1",
            "--port", "0", "--load_fast", "false", "--reload_interval", "1",
        ]  # fmt: skip
        # Its output goes to a file: a pipe nobody reads would block it once full.
        self._log = tempfile.NamedTemporaryFile("w+", suffix=".log")
        self._process = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline and self._process.poll() is None:
            found = re.search(r"(http://127\.0\.0\.1:\d+)/", open(self._log.name).read())
            if found:
                self.url = found.group(1)
                return self
            time.sleep(0.2)
        output = open(self._log.name).read()
        self.__exit__(None, None, None)
        raise RuntimeError("tensorboard did not start:\n" + output[-3000:])

    def __exit__(self, *exc_info) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait(timeout=30)
            self._process = None
            self._log.close()

    def post(self, route: str, body: dict) -> dict:
        import urllib.request

        request = urllib.request.Request(
            self.url + route, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())


NO_SPACE = "No space left on device"


def fail_after_writing(monkeypatch, error=None):
    """Makes each checkpoint write its shard's files (in `ckpt-N_temp/`), then fail as a full disk does.

    TensorFlow's own `save_v2` writes; the error is raised where its `SaveV2`
    op raises one, before the checkpoint is merged and recorded.
    """
    original = io_ops.save_v2

    def save_v2(*args, **kwargs):
        original(*args, **kwargs)
        raise error or tf.errors.ResourceExhaustedError(None, None, NO_SPACE)

    monkeypatch.setattr(io_ops, "save_v2", save_v2)


DISTRIBUTION_DOC = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "distribution.md")


def sbatch_scripts() -> list[dict]:
    """docs/distribution.md's `sbatch` scripts, in order: each `{"options": {name: value}, "srun": [words]}`."""
    with open(DISTRIBUTION_DOC) as file:
        blocks = re.findall(r"```bash\n(#!/bin/bash\n.*?)```", file.read(), flags=re.DOTALL)
    scripts = []
    for block in blocks:
        options = {
            name: value
            for name, _, value in (
                line[len("#SBATCH --") :].partition("=") for line in block.splitlines() if line.startswith("#SBATCH --")
            )
        }
        srun = next(line.split() for line in block.splitlines() if line.startswith("srun "))
        scripts.append({"options": options, "srun": srun})
    return scripts


def srun_env(script: dict, rank: int, job_id: str = "4242", node_list: str | None = None, gpus: bool = False) -> dict:
    """The SLURM variables `srun` sets in task `rank` of an `sbatch_scripts()` script's step (its nodes `node_list`).

    With `gpus`, also what SLURM sets for the script's GPUs: `--gpus-per-task` binds each task its own
    (renumbered from 0), `--gres=gpu:N` shows every task of a node the node's N.
    """
    nodes, per_node = int(script["options"]["nodes"]), int(script["options"]["ntasks-per-node"])
    options, gpu_env = script["options"], {}
    if gpus and "gpus-per-task" in options:
        count = int(options["gpus-per-task"])
        gpu_env = {"SLURM_GPUS_PER_TASK": str(count), "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(count)))}
    elif gpus and "gres" in options:
        gpu_env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(int(options["gres"].split(":")[-1]))))}
    return {
        **gpu_env,
        "SLURM_JOB_ID": job_id,
        "SLURM_PROCID": str(rank),
        "SLURM_LOCALID": str(rank % per_node),
        "SLURM_NTASKS": str(nodes * per_node),
        "SLURM_STEP_NUM_TASKS": str(nodes * per_node),
        "SLURM_STEP_NODELIST": node_list or ("localhost" if nodes == 1 else f"node[01-{nodes:02d}]"),
        "SLURM_STEP_TASKS_PER_NODE": str(per_node) if nodes == 1 else f"{per_node}(x{nodes})",
    }


def stand_in_scontrol(directory, body: str = "exit 0"):
    """Writes an `scontrol` into `directory` that records its arguments to `directory/calls`, then runs `body`.

    Returns the path of `calls`; put `directory` first on PATH.
    """
    path = directory / "scontrol"
    path.write_text(f'#!/bin/sh\necho "$@" >> "{directory}/calls"\n{body}\n')
    path.chmod(0o755)
    return directory / "calls"
