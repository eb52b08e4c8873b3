"""conftest.py for Keras's fetched tests (copied beside them by fetch.py as `conftest.py`).

Keras's own conftest.py is not in its source distribution; this one gives the
tests what they import from it, and lets them import on a machine without JAX
or PyTorch (some import them at the top, and use them only on those backends).
"""

import importlib.util
import sys
import types

import pytest
from keras.src import backend


def _missing_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)

    def __getattr__(attribute):
        raise ModuleNotFoundError(f"{name} is not installed (a Keras test used {name}.{attribute}).")

    module.__getattr__ = __getattr__
    return module


for _name in ("jax", "torch"):
    if importlib.util.find_spec(_name) is None:
        sys.modules[_name] = _missing_module(_name)


def skip_if_backend(given_backend, reason):
    """Keras's conftest helper: skip the test on the given backend(s)."""
    backends = given_backend if isinstance(given_backend, (list, tuple)) else [given_backend]
    return pytest.mark.skipif(backend.backend() in backends, reason=reason)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "multi_device" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="Keras's multi-device tests need several accelerators"))
