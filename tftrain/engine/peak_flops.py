"""Peak dense FLOP/s of common accelerators, looked up by the device name and the compute dtype.

The utilisation in `trainer.timing` (`Trainer(count_flops=True)`) is the
measured FLOP/s over the peak of every device the run used: a figure the
user gives (`Trainer(peak_flops=...)`), or this table's peak of one device
times the devices of the strategy. The figures are the vendors' datasheet
peaks for dense math (NVIDIA publishes tensor-core figures with 2:4 sparsity;
these are half of those), per device as TensorFlow sees it: one GPU, one TPU
v2/v3 core, one TPU v4/v5p chip (a megacore device), one v5e/v6e chip.

GPUs are named by `tf.config.experimental.get_device_details` ("device_name",
e.g. "NVIDIA A100-SXM4-40GB"). TensorFlow does not report a TPU's generation:
it is read from the accelerator type in the `TPU_ACCELERATOR_TYPE` environment
variable (e.g. "v4-8", "v5litepod-16"; set it where the TPU VM does not). A
CPU has no entry (its peak depends on the cores, clock and vector units):
pass `peak_flops` for one.
"""

from __future__ import annotations

import dataclasses
import os
import re

import tensorflow as tf

from tftrain import distribute

__all__ = ["DEVICE_PEAKS", "DevicePeak", "available_peak_flops", "find_device", "lookup_peak_flops"]


@dataclasses.dataclass(frozen=True)
class DevicePeak:
    """One device's peak dense FLOP/s by compute dtype (None: the device has no such peak).

    Attributes:
        name: The device, as the table names it.
        aliases: Each a set of words that all appear in the reported device
            name (lowercased, split at anything not a letter or digit) to
            name this device, e.g. `("h100", "pcie")`.
        float32: Peak in float32 (CUDA cores; a TPU's is not listed).
        tensorfloat32: Peak in TensorFloat-32, which TensorFlow uses for
            float32 matrix multiplications and convolutions on Ampere and
            newer GPUs unless `tf.config.experimental.enable_tensor_float_32_execution(False)`.
        bfloat16: Peak in bfloat16.
        float16: Peak in float16.
    """

    name: str
    aliases: tuple[tuple[str, ...], ...]
    float32: float | None = None
    tensorfloat32: float | None = None
    bfloat16: float | None = None
    float16: float | None = None


# Most specific first: a name is matched by the first entry one of whose aliases it holds.
DEVICE_PEAKS: tuple[DevicePeak, ...] = (
    DevicePeak("NVIDIA H200 NVL", (("h200", "nvl"),), 60e12, 835e12 / 2, 1671e12 / 2, 1671e12 / 2),
    DevicePeak("NVIDIA H200", (("h200",),), 67e12, 989e12 / 2, 1979e12 / 2, 1979e12 / 2),
    DevicePeak("NVIDIA H100 NVL", (("h100", "nvl"),), 60e12, 835e12 / 2, 1671e12 / 2, 1671e12 / 2),
    DevicePeak("NVIDIA H100 PCIe", (("h100", "pcie"),), 51e12, 756e12 / 2, 1513e12 / 2, 1513e12 / 2),
    DevicePeak("NVIDIA H100 SXM", (("h100",),), 67e12, 989e12 / 2, 1979e12 / 2, 1979e12 / 2),
    DevicePeak("NVIDIA L40S", (("l40s",),), 91.6e12, 366e12 / 2, 362.05e12, 362.05e12),
    DevicePeak("NVIDIA L4", (("l4",),), 30.3e12, 120e12 / 2, 242e12 / 2, 242e12 / 2),
    DevicePeak("NVIDIA A100", (("a100",),), 19.5e12, 156e12, 312e12, 312e12),
    DevicePeak("NVIDIA A10", (("a10",),), 31.2e12, 62.5e12, 125e12, 125e12),
    DevicePeak("NVIDIA T4", (("t4",),), 8.1e12, None, None, 65e12),
    DevicePeak("NVIDIA V100 PCIe", (("v100", "pcie"),), 14e12, None, None, 112e12),
    DevicePeak("NVIDIA V100 SXM2", (("v100",),), 15.7e12, None, None, 125e12),
    DevicePeak("TPU v2 (per core)", (("tpu", "v2"), ("v2",)), bfloat16=45e12 / 2),
    DevicePeak("TPU v3 (per core)", (("tpu", "v3"), ("v3",)), bfloat16=123e12 / 2),
    DevicePeak("TPU v4", (("tpu", "v4"), ("v4",)), bfloat16=275e12),
    DevicePeak("TPU v5e", (("v5litepod",), ("v5e",), ("v5", "lite")), bfloat16=197e12),
    DevicePeak("TPU v5p", (("v5p",), ("tpu", "v5")), bfloat16=459e12),
    DevicePeak("TPU v6e", (("v6e",), ("v6", "lite")), bfloat16=918e12),
)

_DTYPES = ("float32", "bfloat16", "float16")


def find_device(device_name: str) -> DevicePeak | None:
    """The table's entry for a device name as TensorFlow or the TPU VM reports it, or None.

    Example: `find_device("NVIDIA A100-SXM4-80GB").name == "NVIDIA A100"`.
    """
    words = set(re.split(r"[^a-z0-9]+", device_name.lower()))
    for entry in DEVICE_PEAKS:
        if any(set(alias) <= words for alias in entry.aliases):
            return entry
    return None


def lookup_peak_flops(device_name: str, dtype: str, *, tensor_float_32: bool = True) -> float | None:
    """Peak dense FLOP/s of one device for a compute dtype, or None where the table has none.

    Args:
        device_name: E.g. "NVIDIA H100 80GB HBM3", "Tesla T4", "v4-8".
        dtype: The compute dtype: "float32", "bfloat16" or "float16".
        tensor_float_32: float32 runs as TensorFloat-32 where the device has it
            (TensorFlow's default on Ampere and newer GPUs).

    Returns:
        FLOP/s of one device, or None for a device or dtype not in the table.
    """
    entry = find_device(device_name)
    if entry is None or dtype not in _DTYPES:
        return None
    if dtype == "float32" and tensor_float_32 and entry.tensorfloat32 is not None:
        return entry.tensorfloat32
    return getattr(entry, dtype)


def available_peak_flops(strategy: tf.distribute.Strategy, dtype: str) -> tuple[float | None, str | None]:
    """The peak FLOP/s of every device the strategy's replicas run on, from the table.

    Without a strategy (the default one) the run uses one device: the first
    GPU if there is one. Under a strategy, each replica has a device of its
    own (`num_replicas_in_sync` devices, all workers together).

    Args:
        strategy: The run's strategy.
        dtype: The model's compute dtype (`model.compute_dtype`).

    Returns:
        `(peak, None)`, or `(None, why)`: `why` is None on CPUs (no table entry,
        nothing to warn about) and says what is missing otherwise.
    """
    default = distribute.is_default_strategy(strategy)
    devices = () if default else tuple(strategy.extended.worker_devices)
    if any("TPU" in device.upper() for device in devices):
        device_name = os.environ.get("TPU_ACCELERATOR_TYPE")
        if not device_name:
            return None, (
                "TensorFlow does not report the TPU's generation: set TPU_ACCELERATOR_TYPE (e.g. v4-8) "
                "or pass `peak_flops` for the utilisation"
            )
    else:
        on_gpu = (
            tf.config.list_logical_devices("GPU") if default else [d for d in devices if "GPU" in d.upper()]
        )
        if not on_gpu or (devices and len(on_gpu) < len(devices)):
            return None, None  # CPUs: no peak to look up
        gpus = tf.config.get_visible_devices("GPU")
        if len(tf.config.list_logical_devices("GPU")) > len(gpus):
            return None, "logical GPUs share a physical GPU: pass `peak_flops` for the utilisation"
        names = {tf.config.experimental.get_device_details(gpu).get("device_name", "") for gpu in gpus}
        if len(names) != 1:
            return None, f"the GPUs differ ({sorted(names)}): pass `peak_flops` for the utilisation"
        device_name = names.pop()
    peak = lookup_peak_flops(
        device_name, dtype, tensor_float_32=tf.config.experimental.tensor_float_32_execution_enabled()
    )
    if peak is None:
        return None, (
            f"no peak FLOP/s is known for {device_name!r} in {dtype} (tftrain.engine.peak_flops): pass "
            "`peak_flops` for the utilisation"
        )
    return peak * (1 if default else strategy.num_replicas_in_sync), None
