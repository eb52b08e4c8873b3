"""`Trainer.save` (a .keras file with the optimizer) and `Trainer.export` (a SavedModel for serving)."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import compile_args, make_mlp

from tftrain import Trainer


def test_save_writes_a_keras_file_with_the_optimizer(tmp_path, tiny_dataset, tiny_data):
    trainer = Trainer(make_mlp(), **compile_args())
    trainer.fit(tiny_dataset, epochs=1, verbose=0)
    path = tmp_path / "model.keras"
    trainer.save(str(path))
    loaded = keras.models.load_model(path)
    x, _ = tiny_data
    np.testing.assert_allclose(loaded.predict(x, verbose=0), trainer.model.predict(x, verbose=0), rtol=1e-6)
    assert int(loaded.optimizer.iterations) == int(trainer.model.optimizer.iterations) == 7
    for saved, live in zip(loaded.optimizer.variables, trainer.model.optimizer.variables, strict=True):
        np.testing.assert_array_equal(np.asarray(saved), np.asarray(live))


def test_save_needs_a_keras_suffix(tmp_path):
    trainer = Trainer(make_mlp(), **compile_args())
    with pytest.raises(ValueError, match=r"\.keras") as info:
        trainer.save(str(tmp_path / "model.h5"))
    assert "model.h5" in str(info.value) and "export" in str(info.value)


def test_export_writes_a_servable_saved_model(tmp_path, tiny_dataset, tiny_data):
    trainer = Trainer(make_mlp(), **compile_args())
    trainer.fit(tiny_dataset, epochs=1, verbose=0)
    path = str(tmp_path / "served")
    trainer.export(path, verbose=False)
    served = tf.saved_model.load(path)
    x, _ = tiny_data
    np.testing.assert_allclose(served.serve(x).numpy(), trainer.model.predict(x, verbose=0), rtol=1e-5)


def test_export_of_an_unbuilt_model_is_a_clear_error(tmp_path):
    class Unbuilt(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    with pytest.raises(ValueError, match="not built"):
        Trainer(Unbuilt()).export(str(tmp_path / "served"))
