"""Tests for `tftrain.engine.peak_flops`: the peak FLOP/s table and the lookup of the run's devices."""

import types

import pytest
import tensorflow as tf

from tftrain.engine import peak_flops
from tftrain.engine.peak_flops import DEVICE_PEAKS, available_peak_flops, find_device, lookup_peak_flops


@pytest.mark.parametrize(
    "device_name, dtype, expected",
    [
        ("NVIDIA A100-SXM4-80GB", "bfloat16", 312e12),
        ("NVIDIA A100 80GB PCIe", "float16", 312e12),
        ("NVIDIA A100-SXM4-40GB", "float32", 156e12),  # TensorFloat-32
        ("NVIDIA H100 80GB HBM3", "bfloat16", 989.5e12),
        ("NVIDIA H100 PCIe", "bfloat16", 756.5e12),
        ("NVIDIA H100 NVL", "float16", 835.5e12),
        ("NVIDIA H200", "bfloat16", 989.5e12),
        ("NVIDIA H200 NVL", "float32", 417.5e12),
        ("NVIDIA L40S", "bfloat16", 362.05e12),
        ("NVIDIA L4", "float16", 121e12),
        ("NVIDIA A10", "bfloat16", 125e12),
        ("Tesla T4", "float16", 65e12),
        ("Tesla T4", "float32", 8.1e12),  # no TensorFloat-32 before Ampere
        ("Tesla V100-SXM2-16GB", "float16", 125e12),
        ("Tesla V100-PCIE-32GB", "float16", 112e12),
        ("v2-8", "bfloat16", 22.5e12),  # per core: TensorFlow's device
        ("v3-32", "bfloat16", 61.5e12),
        ("v4-8", "bfloat16", 275e12),
        ("v5litepod-16", "bfloat16", 197e12),
        ("TPU v5 lite", "bfloat16", 197e12),
        ("v5p-8", "bfloat16", 459e12),
        ("v6e-8", "bfloat16", 918e12),
    ],
)
def test_lookup_by_device_name_and_dtype(device_name, dtype, expected):
    assert lookup_peak_flops(device_name, dtype) == pytest.approx(expected)


@pytest.mark.parametrize(
    "device_name, dtype",
    [
        ("Tesla T4", "bfloat16"),  # no bfloat16 on Turing
        ("NVIDIA A10G", "bfloat16"),  # not the A10
        ("v4-8", "float32"),
        ("NVIDIA A100-SXM4-40GB", "float64"),
        ("Intel(R) Xeon(R) CPU", "float32"),
    ],
)
def test_lookup_is_none_outside_the_table(device_name, dtype):
    assert lookup_peak_flops(device_name, dtype) is None


def test_float32_without_tensor_float_32_is_the_float32_peak():
    assert lookup_peak_flops("NVIDIA A100-SXM4-40GB", "float32", tensor_float_32=False) == 19.5e12


def test_each_entry_is_found_by_each_of_its_aliases():
    for entry in DEVICE_PEAKS:
        assert any(getattr(entry, dtype) for dtype in ("float32", "bfloat16", "float16")), entry.name
        for alias in entry.aliases:
            assert find_device("x " + " ".join(alias) + " 8") is entry, (entry.name, alias)


def test_a_cpu_has_no_peak_and_nothing_to_warn():
    if tf.config.list_logical_devices("GPU"):
        pytest.skip("this machine has a GPU")
    assert available_peak_flops(tf.distribute.get_strategy(), "float32") == (None, None)


@pytest.fixture
def fake_gpus(monkeypatch):
    """Two visible GPUs of the names given (`fake_gpus.names`); TensorFloat-32 on."""
    gpus = types.SimpleNamespace(names=["NVIDIA A100-SXM4-80GB"] * 2, tf32=True)
    devices = [types.SimpleNamespace(name=f"/physical_device:GPU:{i}", index=i) for i in range(2)]
    monkeypatch.setattr(tf.config, "get_visible_devices", lambda kind=None: devices if kind == "GPU" else [])
    monkeypatch.setattr(tf.config, "list_logical_devices", lambda kind=None: devices if kind == "GPU" else [])
    monkeypatch.setattr(
        tf.config.experimental, "get_device_details", lambda device: {"device_name": gpus.names[device.index]}
    )
    monkeypatch.setattr(tf.config.experimental, "tensor_float_32_execution_enabled", lambda: gpus.tf32)
    return gpus


def fake_strategy(*devices):
    return types.SimpleNamespace(
        extended=types.SimpleNamespace(worker_devices=devices), num_replicas_in_sync=len(devices)
    )


def test_one_gpu_without_a_strategy(fake_gpus):
    default = tf.distribute.get_strategy()
    assert available_peak_flops(default, "bfloat16") == (312e12, None)
    assert available_peak_flops(default, "float32") == (156e12, None)
    fake_gpus.tf32 = False
    assert available_peak_flops(default, "float32") == (19.5e12, None)


def test_every_replica_of_a_strategy_counts(fake_gpus):
    strategy = fake_strategy("/job:localhost/replica:0/task:0/device:GPU:0", "/gpu:1")
    assert available_peak_flops(strategy, "float16") == (2 * 312e12, None)
    assert available_peak_flops(fake_strategy("/cpu:0", "/cpu:1"), "float16") == (None, None)


def test_unknown_or_mixed_gpus_say_why(fake_gpus):
    default = tf.distribute.get_strategy()
    fake_gpus.names = ["NVIDIA A10G"] * 2
    peak, why = available_peak_flops(default, "bfloat16")
    assert peak is None and "'NVIDIA A10G'" in why and "peak_flops" in why
    fake_gpus.names = ["NVIDIA A10G", "Tesla T4"]
    peak, why = available_peak_flops(default, "bfloat16")
    assert peak is None and "differ" in why


def test_tpus_are_named_by_the_accelerator_type(monkeypatch):
    strategy = fake_strategy(*[f"/job:worker/replica:0/task:0/device:TPU:{i}" for i in range(4)])
    monkeypatch.delenv("TPU_ACCELERATOR_TYPE", raising=False)
    peak, why = available_peak_flops(strategy, "bfloat16")
    assert peak is None and "TPU_ACCELERATOR_TYPE" in why
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v4-8")
    assert available_peak_flops(strategy, "bfloat16") == (4 * 275e12, None)
    assert peak_flops.available_peak_flops(strategy, "float32")[0] is None
