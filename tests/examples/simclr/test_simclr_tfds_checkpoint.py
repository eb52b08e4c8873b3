"""SimCLR on a tensorflow-datasets split: no cache and no shuffle buffer in its checkpoints, exact resume.

The split is tensorflow-datasets' own `dummy_mnist` (20 training images of
28x28x1), prepared offline in a temporary data_dir and read through the real
`builder.as_dataset` path (where tensorflow-datasets would insert its
automatic cache of small datasets). Runs of `python -m tftrain.examples.simclr`
in fresh processes: one uninterrupted, one SIGKILLed after step 3 (its last
checkpoint is step 2) then rerun with the same command.
"""

import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
import test_simclr_exact_resume as exact_resume  # its checkpoint helpers, on the path as a sibling module

from tftrain.checkpoint import data_position
from tftrain.compat import tf_internals
from tftrain.examples.simclr import pipeline

STEPS, BATCH, IMAGE_SIZE = 6, 8, 16
# A cache or shuffle buffer would hold some of the 20 images (784 bytes each; 15,680 in all); an iterator
# of positions and random states is under 3 KB (2,753 bytes measured with TF 2.21).
ITERATOR_BYTES_BOUND = 4096


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tfds"))
    tfds.testing.DummyMnist(data_dir=path).download_and_prepare()
    return path


def training_ops(data_dir, **kwargs):
    dataset = pipeline.build_dataset(
        "dummy_mnist",
        "train",
        batch_size=BATCH,
        image_size=IMAGE_SIZE,
        is_training=True,
        repeat=True,
        data_dir=data_dir,
        **kwargs,
    )
    return dataset, {node.op for node in tf_internals.dataset_graph_nodes(dataset)}


def test_a_small_split_is_held_in_memory_without_cache_or_shuffle_buffer(data_dir):
    dataset, ops = training_ops(data_dir)
    assert not any(op.startswith(("CacheDataset", "ShuffleDataset")) for op in ops), sorted(ops)
    assert data_position.prepare(dataset, None)[0] == data_position.SYMBOLIC
    # --cache_dataset asks for what the split already has: memory.
    assert not any(op.startswith("CacheDataset") for op in training_ops(data_dir, cache_dataset=True)[1])


def test_a_split_over_the_memory_limit_is_shuffled_and_cached_only_when_asked(data_dir, monkeypatch):
    monkeypatch.setattr(pipeline, "IN_MEMORY_MAX_BYTES", 20 * 28 * 28 - 1)  # one byte short of the split
    _, ops = training_ops(data_dir)
    assert any(op.startswith("ShuffleDataset") for op in ops)
    assert not any(op.startswith("CacheDataset") for op in ops)
    dataset, cached_ops = training_ops(data_dir, cache_dataset=True)
    assert any(op.startswith("CacheDataset") for op in cached_ops)
    with pytest.warns(UserWarning, match="cannot checkpoint symbolically"):
        assert data_position.prepare(dataset, None)[0] == data_position.FULL


FLAGS = [
    "--use_tpu=False",
    "--global_bn=False",
    "--resnet_depth=18",
    "--width_multiplier=0.0625",
    f"--image_size={IMAGE_SIZE}",
    "--proj_out_dim=16",
    f"--train_batch_size={BATCH}",
    f"--train_steps={STEPS}",
    "--checkpoint_steps=2",
    "--keep_checkpoint_max=10",
    "--learning_rate=1.0",
    "--temperature=0.5",
    "--warmup_epochs=1",
    "--mode=train",
    "--seed=1",
    "--verbose=0",
]


def start(model_dir, data_dir, kill_at=None):
    command = [sys.executable, "-m", "tftrain.examples.simclr"]
    if kill_at is not None:
        command = [sys.executable, exact_resume.JOB, str(kill_at)]
    env = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    return subprocess.Popen(
        [*command, *FLAGS, "--dataset=dummy_mnist", f"--data_dir={data_dir}", f"--model_dir={model_dir}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def iterator_bytes(model_dir, step):
    """Bytes of a checkpoint's data file that are not its readable tensors: the data iterator's state."""
    path = os.path.join(model_dir, "checkpoints", f"ckpt-{step}")
    reader = tf.train.load_checkpoint(path)
    dtypes = reader.get_variable_to_dtype_map()
    assert [name for name, dtype in dtypes.items() if dtype == tf.variant] == [
        "data/iterator/.ATTRIBUTES/ITERATOR_STATE"
    ]
    readable = 0
    for name, dtype in dtypes.items():
        if dtype != tf.variant:
            value = reader.get_tensor(name)
            readable += len(value) if isinstance(value, bytes) else value.nbytes
    return os.path.getsize(f"{path}.data-00000-of-00001") - readable


@pytest.fixture(scope="module")
def runs(tmp_path_factory, data_dir):
    dirs = {name: tmp_path_factory.mktemp(name) for name in ("uninterrupted", "killed")}
    uninterrupted = start(dirs["uninterrupted"], data_dir)
    killed = start(dirs["killed"], data_dir, kill_at=3)
    logs = {
        "uninterrupted": exact_resume.finish(uninterrupted),
        "killed": exact_resume.finish(killed, -signal.SIGKILL),
    }
    assert os.path.exists(dirs["killed"] / "checkpoints" / "ckpt-2.index")
    assert not os.path.exists(dirs["killed"] / "checkpoints" / "ckpt-4.index")
    logs["resumed"] = exact_resume.finish(start(dirs["killed"], data_dir))
    return dirs, logs


def test_each_checkpoint_holds_positions_only(runs):
    dirs, logs = runs
    for step in range(2, STEPS + 1, 2):
        for name in ("uninterrupted", "killed"):
            assert iterator_bytes(dirs[name], step) < ITERATOR_BYTES_BOUND, (name, step)
    for log in logs.values():
        assert "cannot checkpoint symbolically" not in log and "being cached" not in log, log[-3000:]


def test_a_killed_run_on_tfds_data_resumes_bit_exactly(runs):
    dirs, logs = runs
    assert "tftrain: resumed from" in logs["resumed"] and "ckpt-2" in logs["resumed"]
    assert "skip" not in logs["resumed"].lower()  # the iterator was restored, no batches skipped
    resumed = exact_resume.checkpoint_values(dirs["killed"], STEPS)
    exact_resume.assert_same(resumed, exact_resume.checkpoint_values(dirs["uninterrupted"], STEPS))
    assert exact_resume.final_logs(dirs["killed"]) == exact_resume.final_logs(dirs["uninterrupted"])
    # The runs trained: the weights moved from the first checkpoint's.
    first = exact_resume.checkpoint_values(dirs["uninterrupted"], 2)
    assert any(not np.array_equal(first[name], resumed[name]) for name in first if name.startswith("model/"))
