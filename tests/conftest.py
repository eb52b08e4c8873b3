"""Shared test setup: quiet TensorFlow, tiny data, fresh seeds."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from helpers import ENGINES  # noqa: E402
from tensorflow.python.framework import config as _tf_config  # noqa: E402


@pytest.fixture(params=sorted(ENGINES), ids=sorted(ENGINES))
def engine(request):
    """Trainer keyword arguments for each engine."""
    return ENGINES[request.param]


@pytest.fixture
def tiny_data():
    """(x, y): 50 examples of 6 features, 3 classes, learnable."""
    rng = np.random.RandomState(0)
    x = rng.rand(50, 6).astype("float32")
    y = (x[:, 0] * 3).astype("int32").clip(0, 2)
    return x, y


@pytest.fixture
def tiny_dataset(tiny_data):
    """The tiny data as a dataset of batches of 8 (the last batch has 2)."""
    return tf.data.Dataset.from_tensor_slices(tiny_data).batch(8)


@pytest.fixture(scope="module")
def deterministic():
    """Op determinism for the fit tests (process-global: switched back off afterwards)."""
    was_enabled = _tf_config.is_op_determinism_enabled()
    tf.config.experimental.enable_op_determinism()
    yield
    if not was_enabled:
        _tf_config.disable_op_determinism()


# The test tiers (setup.cfg registers the markers; README.md's Development section and
# docs/install.md say who runs which).
# `fast`: every test function once, at smoke depth: of a function's parametrized cases the one
# on the default engine ("graph") where it has one, else its first; less the programs', the
# benchmark's and the guides' tests, the two-worker jobs, and single tests of a minute or more.
# `floor`: what the oldest TensorFlow/Keras pair is there to check (docs/install.md, "Why these
# floors"): the comparisons against Keras itself, distribution, mixed precision and the version
# shims. .ci/oldest-pair runs `fast or floor`.
_NOT_FAST = (
    "tests/examples/",
    "tests/bench/",
    "tests/test_docs_guides.py",
    "tests/test_trainer_multiworker.py",
)
_SLOW_TESTS = frozenset()
_FLOOR = (
    "tests/compat/",
    "tests/fit_inputs/",
    "tests/test_trainer_parity.py",
    "tests/test_optimizer_features_parity.py",
    "tests/test_callbacks.py",
    "tests/test_distribute.py",
    "tests/test_trainer_mirrored.py",
    "tests/test_trainer_distributed_dataset.py",
    "tests/test_trainer_multiworker.py",
    "tests/test_precision.py",
    "tests/test_trainer_precision.py",
)


def _uses_a_module_fixture_of(item, path: str) -> bool:
    """Whether the test uses a module-scoped fixture its own file defines (one trained model, a job run once).

    Under `pytest -n 2 --dist loadgroup` such a file's tests share one process (its `xdist_group`), so
    the fixture is made once, and the two-worker jobs of tests/test_trainer_multiworker.py run one at a time.
    """
    for definitions in item._fixtureinfo.name2fixturedefs.values():
        if definitions and definitions[-1].scope != "function" and definitions[-1].baseid == path:
            return True
    return False


def pytest_collection_modifyitems(config, items):
    """Marks the `fast` and `floor` tiers (above)."""
    cases = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        if path.startswith(_FLOOR):
            item.add_marker(pytest.mark.floor)
        if _uses_a_module_fixture_of(item, path):
            item.add_marker(pytest.mark.xdist_group(path))
        if path.startswith(_NOT_FAST) or f"{path}::{item.name}" in _SLOW_TESTS:
            continue
        key = (path, item.cls, getattr(item, "originalname", item.name))
        params = getattr(getattr(item, "callspec", None), "params", {})
        if key not in cases or params.get("engine") == "graph":
            cases[key] = item
    for item in cases.values():
        item.add_marker(pytest.mark.fast)
