"""`import tftrain`: light at import, every public name reachable."""

import subprocess
import sys

import tftrain


def test_public_names_resolve():
    for name in tftrain.__all__:
        assert getattr(tftrain, name) is not None, name
    assert tftrain.NonFiniteLossError is tftrain.errors.NonFiniteLossError
    assert tftrain.services.Service is tftrain.services.protocol.Service
    assert issubclass(tftrain.NonFiniteLossError, FloatingPointError)


def test_import_does_not_load_tensorflow():
    code = "import sys, tftrain; print('tensorflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


def test_import_names_a_keras_outside_the_declared_range():
    code = (
        "import importlib.metadata as metadata\n"
        "found = metadata.version\n"
        "metadata.version = lambda name: '2.15.0' if name == 'keras' else found(name)\n"
        "import tftrain\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "ImportError: tftrain cannot run with the installed TensorFlow/Keras" in result.stderr
    assert (
        "keras 2.15.0 is installed (Keras 2; tftrain needs Keras 3); tftrain needs keras>=" in result.stderr
    )
    assert 'pip install --upgrade "keras>=' in result.stderr
