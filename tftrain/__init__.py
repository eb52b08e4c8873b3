"""tftrain: fast, measurable, resumable custom TensorFlow training.

`import tftrain` is light: TensorFlow loads when a name below is first used.
"""

from __future__ import annotations

import importlib
from typing import Any

from tftrain.compat import versions as _versions

# A TensorFlow or Keras outside the declared range fails here, naming which (not later, in a private API).
_versions.check_installed_versions()

__version__ = "0.1.0"

_LAZY_NAMES = {
    "Trainer": ("tftrain.trainer", "Trainer"),
    "CustomModel": ("tftrain.model", "CustomModel"),
    "TimingReport": ("tftrain.timing", "TimingReport"),
    "NonFiniteLossError": ("tftrain.errors", "NonFiniteLossError"),
    "PreemptedError": ("tftrain.errors", "PreemptedError"),
    "LearningRateSweep": ("tftrain.loops.lr_sweep", "LearningRateSweep"),
    "DryRunReport": ("tftrain.loops.dry_run", "DryRunReport"),
    "DryRunError": ("tftrain.errors", "DryRunError"),
}
_SUBMODULES = {
    "callbacks",
    "checkpoint",
    "data",
    "distribute",
    "ema",
    "errors",
    "evaluation",
    "model",
    "precision",
    "services",
    "summaries",
    "timing",
    "trainer",
}

__all__ = [
    "Trainer",
    "CustomModel",
    "TimingReport",
    "NonFiniteLossError",
    "PreemptedError",
    "LearningRateSweep",
    "DryRunReport",
    "DryRunError",
    *sorted(_SUBMODULES),
]


def __getattr__(name: str) -> Any:
    if name in _LAZY_NAMES:
        module_name, attribute = _LAZY_NAMES[name]
        value = getattr(importlib.import_module(module_name), attribute)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"tftrain.{name}")
    raise AttributeError(f"module 'tftrain' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
