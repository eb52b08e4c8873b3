"""A checkpoint written by an earlier tftrain still resumes, its data position read as it was saved.

The fixture `fixtures/shuffled_arrays_mid_epoch` was written at commit 59e85bb
by its `make.py`: shuffled arrays stopped at step 6 of 8 (mid-epoch), the data
position saved as the services' state "data" (mode, pass offset) and the
pass's order under `data/epoch_order`.
"""

import shutil
from pathlib import Path

import keras
import numpy as np

import tftrain

FIXTURE = Path(__file__).parent / "fixtures" / "shuffled_arrays_mid_epoch"


def test_a_run_resumes_mid_epoch_from_the_earlier_checkpoint_in_its_saved_order(tmp_path):
    model_dir = tmp_path / "run"
    shutil.copytree(FIXTURE, model_dir / "checkpoints", ignore=shutil.ignore_patterns("*.py", "*.npy"))
    keras.utils.set_random_seed(1)  # another seed: the order of the pass comes from the checkpoint
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x = np.arange(48, dtype="float32").reshape(16, 3) / 48
    y = np.arange(32, dtype="float32").reshape(16, 2) / 32
    tftrain.Trainer(model, model_dir=str(model_dir)).fit(x, y, batch_size=4, epochs=2, verbose=0)
    assert int(model.optimizer.iterations) == 8
    np.testing.assert_allclose(model.layers[0].kernel.numpy(), np.load(FIXTURE / "reference.npy"), rtol=1e-6)
