"""Fetches Keras's own `fit` tests from the Keras source distribution on PyPI into a folder.

Keras's tests are not copied into this repository: this script downloads the
source distribution of a pinned Keras version from PyPI (the only place CI can
reach; the Keras 3.15 source distributions are the first to ship their tests),
checks its SHA-256, and extracts the test files that call `fit`, `evaluate` or
`predict`, with Keras's license and a note of where they came from. One edit
is made to them, listed in `SOURCE.md` beside them: a test model written as a
layer mixed with Keras's backend trainer (`class M(Trainer, layers.Dense)`) is
made a `keras.Model` (`class M(layers.Dense, keras.Model)`), because the
Trainer trains `keras.Model`s; the model's own methods and the trainer state
are unchanged.

Usage: `python tests/keras_conformance/fetch.py DEST` (DEST is replaced).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# The Keras version whose tests are fetched, and its source distribution's SHA-256 (from PyPI).
KERAS_VERSION = "3.15.1"
SDIST_SHA256 = "92ae7c1dd7f61041953dc2d42253181ee099086f0b58ae36fcf98147a6f08a29"

# The test files that call `fit`, `evaluate` or `predict`, relative to `keras/src/`.
TEST_FILES = (
    "trainers/trainer_test.py",
    "models/model_test.py",
    "trainers/data_adapters/tf_dataset_adapter_test.py",
    "callbacks/backup_and_restore_test.py",
    "callbacks/callback_test.py",
    "callbacks/csv_logger_test.py",
    "callbacks/early_stopping_test.py",
    "callbacks/lambda_callback_test.py",
    "callbacks/learning_rate_scheduler_test.py",
    "callbacks/model_checkpoint_test.py",
    "callbacks/monitor_callback_test.py",
    "callbacks/reduce_lr_on_plateau_test.py",
    "callbacks/remote_monitor_test.py",
    "callbacks/swap_ema_weights_test.py",
    "callbacks/tensorboard_test.py",
    "callbacks/terminate_on_nan_test.py",
)

_MIXIN_MODEL = re.compile(r"^(\s*class \w+)\(Trainer, (layers\.\w+)\):", re.MULTILINE)
_HERE = Path(__file__).resolve().parent


def download_sdist(directory: Path) -> Path:
    """Downloads Keras's source distribution from PyPI and checks its hash."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
         f"keras=={KERAS_VERSION}", "--dest", str(directory)],
        check=True,
    )  # fmt: skip
    sdist = directory / f"keras-{KERAS_VERSION}.tar.gz"
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise SystemExit(f"{sdist.name}: SHA-256 {digest}, expected {SDIST_SHA256}.")
    return sdist


def make_keras_model(source: str) -> tuple[str, list[str]]:
    """Rewrites `class M(Trainer, layers.X):` as `class M(layers.X, keras.Model):`.

    The layer's methods come first in the new class's MRO, so they win over
    `keras.Model`'s (`call`); `class M(Trainer, layers.Layer)` becomes
    `class M(keras.Model)`; `Trainer.__init__(self)` in the test
    still sets up the trainer state. Returns the new source and the classes changed.
    """
    changed = [match.group(1).split()[-1] for match in _MIXIN_MODEL.finditer(source)]
    # `keras.Model` is a `Layer` already: a plain-layer mixin becomes a plain subclass.
    source = _MIXIN_MODEL.sub(
        lambda match: (
            f"{match.group(1)}({'' if match.group(2) == 'layers.Layer' else match.group(2) + ', '}"
            "_ConformanceKerasModel):"
        ),
        source,
    )
    if changed:
        source = "from keras import Model as _ConformanceKerasModel\n" + source
    return source, changed


def extract(sdist: Path, dest: Path) -> None:
    """Writes the test files, Keras's license, a pytest config, the conftest and SOURCE.md into `dest`."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    root = f"keras-{KERAS_VERSION}"
    edits = []
    with tarfile.open(sdist) as archive:
        (dest / "LICENSE").write_bytes(archive.extractfile(f"{root}/LICENSE").read())
        for name in TEST_FILES:
            source = archive.extractfile(f"{root}/keras/src/{name}").read().decode()
            source, changed = make_keras_model(source)
            if changed:
                edits.append(f"- `{name}`: {', '.join(changed)} made `keras.Model` subclasses.")
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(source)
    shutil.copy(_HERE / "keras_conftest.py", dest / "conftest.py")
    shutil.copy(_HERE / "pytest.ini", dest / "pytest.ini")
    (dest / "SOURCE.md").write_text(
        f"Keras {KERAS_VERSION}'s tests, from `{sdist.name}` on PyPI (SHA-256 {SDIST_SHA256}),\n"
        "under Keras's license (LICENSE). Fetched by tftrain's tests/keras_conformance/fetch.py.\n\n"
        "Edits:\n" + "\n".join(edits) + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="folder to write the tests into (replaced)")
    parser.add_argument("--sdist", type=Path, help="a downloaded keras sdist to use instead of PyPI's")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as downloads:
        sdist = args.sdist or download_sdist(Path(downloads))
        extract(sdist, args.dest)
    print(f"Keras {KERAS_VERSION}'s tests written to {args.dest}")


if __name__ == "__main__":
    main()
