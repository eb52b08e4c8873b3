"""Optional packages of the benchmark (PyTorch): finding them and loading them safely.

tftrain never depends on PyTorch; the `linear` workload runs its PyTorch
variant only when PyTorch is installed. PyTorch must then be loaded before
TensorFlow: with TensorFlow already loaded, PyTorch 2.14's CUDA wheel crashed
the process (a segmentation fault loading its bundled triton library during
the first optimizer step; seen on this project's CPU machine), while the
reverse order works. `python -m tftrain.bench` therefore loads PyTorch first,
and the variant is skipped, with this reason, in a process that loaded
TensorFlow first.

This module does not load TensorFlow.
"""

from __future__ import annotations

import importlib.util
import sys

TORCH_INSTALL_HINT = "pip install torch"


def is_installed(module: str) -> bool:
    """Whether `module` can be imported (without importing it)."""
    if module in sys.modules:
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def preload_torch() -> bool:
    """Loads PyTorch and runs one tiny SGD step (which loads its lazy native parts), before TensorFlow.

    Returns:
        Whether PyTorch is loaded (False when it is not installed).

    Raises:
        RuntimeError: TensorFlow is already loaded in this process.
    """
    if not is_installed("torch"):
        return False
    if "torch" not in sys.modules and "tensorflow" in sys.modules:
        raise RuntimeError(
            "PyTorch must be loaded before TensorFlow in one process; TensorFlow is already loaded. "
            "Import torch first (python -m tftrain.bench does)."
        )
    import torch

    layer = torch.nn.Linear(2, 1)
    layer(torch.ones(1, 2)).sum().backward()
    torch.optim.SGD(layer.parameters(), lr=0.1).step()
    return True


def torch_unavailable_reason() -> str | None:
    """Why the PyTorch variant cannot run in this process, or None if it can."""
    if not is_installed("torch"):
        return f"torch is not installed (optional: {TORCH_INSTALL_HINT})"
    if "torch" not in sys.modules and "tensorflow" in sys.modules:
        return (
            "torch was not loaded before TensorFlow in this process (loading it afterwards can crash); "
            "python -m tftrain.bench loads it first"
        )
    return None
