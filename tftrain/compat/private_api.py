"""How tftrain finds a private Keras or TensorFlow API: named, checked, both versions in the error.

`keras_internals` and `tf_internals` reach every private name through these
helpers. A missing one raises `KerasInternalsError` naming the installed Keras
and TensorFlow and the tested range; there is never a silent fallback.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import keras
import tensorflow as tf

from tftrain.errors import KerasInternalsError

TESTED_KERAS = ("3.10.0", "3.15.1")
"""The oldest and newest Keras versions tftrain's tests run against."""

TESTED_TENSORFLOW = ("2.16.2", "2.21.0")
"""The oldest and newest TensorFlow versions tftrain's tests run against."""


def missing(what: str, why: str) -> KerasInternalsError:
    """The error for a private API `what` that is missing, saying `why` tftrain needs it and the versions."""
    return KerasInternalsError(
        f"tftrain needs {what} ({why}), but it is missing from the installed Keras "
        f"{keras.__version__} / TensorFlow {tf.__version__}. tftrain is tested with Keras "
        f"{TESTED_KERAS[0]} to {TESTED_KERAS[1]} and TensorFlow {TESTED_TENSORFLOW[0]} to "
        f"{TESTED_TENSORFLOW[1]}: install versions in those ranges "
        f'(e.g. pip install "keras=={TESTED_KERAS[1]}").'
    )


@functools.cache
def attribute(module: str, name: str, why: str) -> Any:
    """`module.name`, imported once and cached; `missing(...)` where the module or the name is gone."""
    try:
        value = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise missing(f"`{module}.{name}`", why) from error
    return value


def method(obj: Any, name: str, why: str) -> Any:
    """`obj.name` (a method or attribute Keras or TensorFlow keeps private); `missing(...)` where it is gone."""
    found = getattr(obj, name, None)
    if found is None:
        raise missing(f"`{type(obj).__name__}.{name}`", why)
    return found
