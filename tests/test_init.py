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
