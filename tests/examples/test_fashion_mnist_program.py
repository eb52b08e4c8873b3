"""The Fashion-MNIST program: every mode on the synthetic fallback, the summary, bad flags."""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from absl import flags

from tftrain import data as data_lib
from tftrain.examples import fashion_mnist


def _learnable_images(num_examples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """28x28x3 uint8 noise with a bright band of rows at a place given by the label."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, num_examples).astype(np.int64)
    images = rng.integers(0, 128, (num_examples, 28, 28, 1)).astype(np.uint8)
    for i, label in enumerate(labels):
        images[i, 2 * label + 4 : 2 * label + 7] = 255
    return np.repeat(images, 3, axis=-1), labels


@pytest.fixture
def offline(monkeypatch):
    """`tftrain.data.load` as it behaves offline: Fashion-MNIST unavailable, synthetic made here.

    The stand-in for "synthetic" is learnable and has 3 channels (the program
    makes it 28x28x1), so the tests do not depend on the real generator.
    """
    calls = []

    def load(name, split="train", *, data_dir=None, image_size=None, num_examples=None, **kwargs):
        calls.append((name, split, num_examples))
        if name == "fashion_mnist":
            raise data_lib.DatasetUnavailableError(
                "Cannot download fashion_mnist: no internet (test stand-in).", name=name, data_dir="/none"
            )
        assert (name, image_size) == ("synthetic", 28)
        images, labels = _learnable_images(num_examples, seed=0 if split == "train" else 1)
        return tf.data.Dataset.from_tensor_slices((images, labels))

    monkeypatch.setattr(data_lib, "load", load)
    return calls


@pytest.mark.parametrize(
    "model_name, mode, steps_per_loop",
    [
        ("mlp", "eager", 1),
        ("mlp", "graph", 4),
        ("mlp", "xla", 1),
        ("mlp", "fit", 4),
        ("cnn", "graph", 1),
    ],
)
def test_run_each_mode_on_the_fallback(offline, capsys, model_name, mode, steps_per_loop):
    result = fashion_mnist.run(
        model_name, mode, epochs=2, batch_size=32, num_examples=256, steps_per_loop=steps_per_loop
    )
    assert "NOTICE: Fashion-MNIST is not available" in capsys.readouterr().out
    assert offline[0][0] == "fashion_mnist" and {call[0] for call in offline[1:]} == {"synthetic"}
    assert (result["model"], result["mode"], result["dataset"]) == (model_name, mode, "synthetic")
    assert (result["num_train"], result["num_test"]) == (256, 256)
    assert result["timing"]["steps"] == 2 * 256 // 32
    assert result["step_time_ms"] > 0 and result["examples_per_sec"] > 0
    # Keras's fit builds the optimizer inside its first trace, which makes tf.function trace twice.
    assert result["timing"]["trace_count"] in {"eager": (0,), "fit": (1, 2)}.get(mode, (1,))
    assert 0.0 <= result["test_accuracy"] <= 1.0 and np.isfinite(result["test_loss"])
    assert len(result["history"]["loss"]) == 2


def test_it_learns(offline):
    result = fashion_mnist.run("mlp", "graph", epochs=3, batch_size=32, num_examples=1024, verbose=False)
    assert result["test_accuracy"] > 0.5, result["history"]


def test_synthetic_is_used_without_trying_tfds(offline, capsys):
    result = fashion_mnist.run("mlp", "graph", epochs=1, batch_size=64, num_examples=128, dataset="synthetic")
    assert result["dataset"] == "synthetic"
    assert [call[0] for call in offline] == ["synthetic", "synthetic"]
    assert "NOTICE" not in capsys.readouterr().out


def test_main_prints_epochs_timing_and_summary(offline, monkeypatch, capsys):
    flag_values = flags.FlagValues()
    fashion_mnist.define_flags(flag_values)
    flag_values(["fashion_mnist", "--mode=fit", "--epochs=2", "--batch_size=32", "--num_examples=128"])
    monkeypatch.setattr(fashion_mnist, "FLAGS", flag_values)
    fashion_mnist.main(["fashion_mnist"])
    out = capsys.readouterr().out
    assert "epoch 1/2: loss" in out and "epoch 2/2: loss" in out
    assert "timing (fit):" in out and "step time median" in out
    summary = out.strip().splitlines()[-1]
    assert summary.startswith("mode=fit model=mlp data=synthetic: ")
    assert "ms/step (steady-state median)" in summary and "examples/sec" in summary
    assert "test accuracy" in summary


def test_bad_names_list_the_choices():
    flag_values = flags.FlagValues()
    fashion_mnist.define_flags(flag_values)
    with pytest.raises(flags.IllegalFlagValueError, match="mlp|cnn"):
        flag_values(["fashion_mnist", "--model=resnet"])
    with pytest.raises(flags.IllegalFlagValueError, match="eager|graph|xla|fit"):
        flag_values(["fashion_mnist", "--mode=jit"])
    with pytest.raises(ValueError, match=r"model_name='resnet'\. Expected one of: mlp, cnn"):
        fashion_mnist.run("resnet", "graph")
    with pytest.raises(ValueError, match=r"mode='jit'\. Expected one of: eager, graph, xla, fit"):
        fashion_mnist.run("mlp", "jit")
    with pytest.raises(ValueError, match="batch_size"):
        fashion_mnist.run("mlp", "graph", batch_size=0)


def test_batch_larger_than_the_data_is_an_error(offline):
    with pytest.raises(ValueError, match="batch_size=64 with 32 training examples"):
        fashion_mnist.run("mlp", "graph", batch_size=64, num_examples=32, verbose=False)


def test_command_line_rejects_an_unknown_mode():
    completed = subprocess.run(
        [sys.executable, "-m", "tftrain.examples.fashion_mnist", "--mode=jit"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert completed.returncode != 0
    assert "--mode=jit: value should be one of <eager|graph|xla|fit>" in completed.stderr


def test_real_loader(tmp_path, capsys):
    # An empty data_dir offline: tfds cannot download Fashion-MNIST, so the real
    # "synthetic" set (3 channels) stands in, made 28x28x1.
    result = fashion_mnist.run(
        "cnn", "graph", epochs=1, batch_size=32, num_examples=64, data_dir=str(tmp_path)
    )
    out = capsys.readouterr().out
    assert result["dataset"] in ("fashion_mnist", "synthetic")
    if result["dataset"] == "synthetic":
        assert "NOTICE: Training on synthetic data of the same shape" in out
    assert (result["num_train"], result["num_test"]) == (64, 64)
    assert result["timing"]["steps"] == 2
