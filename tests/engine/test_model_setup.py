"""`Trainer(jit_compile="auto")` resolves as `model.compile(jit_compile="auto")` does, and says so in its timing."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import config as tf_framework_config

import tftrain
from tftrain.engine import model_setup


def dense_model(supports_jit=True):
    class NoXla(keras.layers.Layer):
        def __init__(self):
            super().__init__()
            self.supports_jit = False

        def call(self, x):
            return x

    layers = [keras.Input((6,)), keras.layers.Dense(3)] + ([] if supports_jit else [NoXla()])
    return keras.Sequential(layers)


def keras_resolution(model, **compile_kwargs):
    """What Keras's `compile(jit_compile="auto")` sets `model.jit_compile` to (as a bool: Keras may leave None)."""
    model.compile(optimizer="sgd", loss="mse", jit_compile="auto", **compile_kwargs)
    return bool(model.jit_compile)


@pytest.fixture
def fake_gpu(monkeypatch):
    """A machine with a GPU, as Keras's resolution sees it (`tf.config.list_physical_devices`)."""
    real = tf.config.list_physical_devices
    gpu = tf.config.PhysicalDevice(name="/physical_device:GPU:0", device_type="GPU")

    def list_physical_devices(device_type=None):
        found = real(device_type)
        return found + [gpu] if device_type in (None, "GPU") else found

    monkeypatch.setattr(tf.config, "list_physical_devices", list_physical_devices)
    return monkeypatch


@pytest.fixture
def deterministic_off(monkeypatch):
    """Op determinism off as Keras reads it (it turns `"auto"` off when on)."""
    monkeypatch.setattr(tf_framework_config, "is_op_determinism_enabled", lambda: False)


def test_auto_on_this_machine_is_what_compile_resolves():
    trainer = tftrain.Trainer(dense_model(), jit_compile="auto")
    assert trainer.options.jit_compile is keras_resolution(dense_model())
    if not [device for device in tf.config.list_physical_devices() if device.device_type != "CPU"]:
        assert trainer.options.jit_compile is False  # no XLA on a CPU-only machine
        assert trainer.options.name == "graph+auto"


@pytest.mark.parametrize(
    "case, expected",
    [("xla_layers", True), ("layer_without_xla", False), ("op_determinism", False), ("eager", False)],
)
def test_auto_with_a_gpu_is_what_compile_resolves(fake_gpu, case, expected):
    fake_gpu.setattr(tf_framework_config, "is_op_determinism_enabled", lambda: case == "op_determinism")
    supports_jit = case != "layer_without_xla"
    eager = case == "eager"
    trainer = tftrain.Trainer(
        dense_model(supports_jit), "sgd", "mse", jit_compile="auto", use_tf_function=not eager
    )
    assert trainer.options.jit_compile is keras_resolution(dense_model(supports_jit), run_eagerly=eager)
    assert trainer.options.jit_compile is expected


def test_auto_under_a_strategy_is_off_as_under_compile(fake_gpu, deterministic_off):
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model, reference = dense_model(), dense_model()
    assert tftrain.Trainer(model, strategy=strategy, jit_compile="auto").options.jit_compile is False
    assert keras_resolution(reference) is False
    assert model_setup.resolve_jit_compile("auto", dense_model(), strategy, use_tf_function=True) is False


def test_auto_resolved_to_xla_runs_xla_and_the_timing_report_says_so(fake_gpu, deterministic_off):
    keras.utils.set_random_seed(0)
    trainer = tftrain.Trainer(dense_model(), "sgd", "mse", jit_compile="auto", steps_per_loop=4)
    fake_gpu.undo()  # resolved at construction; the steps run on this machine's CPU
    assert trainer.options.jit_compile is True
    rng = np.random.default_rng(0)
    trainer.fit(rng.random((32, 6), "float32"), rng.random((32, 3), "float32"), batch_size=4, verbose=0)
    assert trainer.timing.engine == "xla+loop4"
    assert trainer.timing.summary().splitlines()[0].split() == ["engine", "xla+loop4"]


@pytest.mark.parametrize("value", ["yes", "Auto", None, 1, "true"])
def test_a_bad_jit_compile_is_refused_naming_what_was_received_and_expected(value):
    with pytest.raises(ValueError) as info:
        tftrain.Trainer(dense_model(), jit_compile=value)
    message = str(info.value)
    assert f"Received: jit_compile={value!r}" in message
    assert 'Expected True (XLA), False, or "auto"' in message


def test_true_and_false_are_kept_as_given():
    assert tftrain.Trainer(dense_model(), jit_compile=True).options.jit_compile is True
    assert tftrain.Trainer(dense_model()).options.jit_compile is False  # the default: never XLA unasked
    with pytest.raises(ValueError, match="jit_compile=True with use_tf_function=False"):
        tftrain.Trainer(dense_model(), jit_compile=True, use_tf_function=False)
