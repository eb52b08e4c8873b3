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
