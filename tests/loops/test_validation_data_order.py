"""Validation data is opened when Keras's `fit` opens it: a source that draws random numbers sees the same draws.

A `keras.utils.PyDataset` (like a shuffled `torch.utils.data.DataLoader`)
may draw from a global generator when it is read and at its epoch hooks.
Keras adapts `validation_data` at the first validation, after the first
epoch's training; the Trainer must make the same draws in the same order,
or a seeded script gets other batches under the Trainer than under `fit`.
"""

import keras
import numpy as np
import pytest

import tftrain


class DrawingDataset(keras.utils.PyDataset):
    """Logs a draw from NumPy's global generator at each epoch hook and each pass's first batch."""

    def __init__(self, name, log, batches):
        super().__init__()
        self.name, self.log, self.batches = name, log, batches
        rng = np.random.RandomState(len(name))
        self.x = rng.rand(batches * 8, 6).astype("float32")
        self.y = rng.randint(0, 3, batches * 8)

    def __len__(self):
        return self.batches

    def __getitem__(self, index):
        if index == 0:
            self.log.append((self.name, "first batch", int(np.random.randint(1000))))
        return self.x[index * 8 : (index + 1) * 8], self.y[index * 8 : (index + 1) * 8]

    def on_epoch_begin(self):
        self.log.append((self.name, "epoch begin", int(np.random.randint(1000))))

    def on_epoch_end(self):
        self.log.append((self.name, "epoch end", int(np.random.randint(1000))))


def draws(fit):
    log = []
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    np.random.seed(0)
    fit(model)(
        DrawingDataset("train", log, 4),
        validation_data=DrawingDataset("validation", log, 2),
        epochs=2,
        verbose=0,
    )
    return log


@pytest.mark.parametrize("steps_per_loop", [1, "auto"])
def test_a_drawing_validation_source_sees_the_draws_it_sees_under_fit(steps_per_loop):
    expected = draws(lambda model: model.fit)
    actual = draws(lambda model: tftrain.Trainer(model, steps_per_loop=steps_per_loop).fit)
    assert actual == expected
    # Keras opens the validation data after the first epoch's training.
    first_validation = next(index for index, entry in enumerate(expected) if entry[0] == "validation")
    assert any(entry[:2] == ("train", "epoch end") for entry in expected[:first_validation])


def test_array_validation_data_is_still_adapted_before_any_step():
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    model.compile("sgd", "mse")
    batches = []
    on_batch = keras.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: batches.append(batch))
    x, y = np.zeros((16, 6), "float32"), np.zeros((16, 3), "float32")
    with pytest.raises(ValueError, match="cardinality"):  # 8 inputs, 7 targets: Keras's adapter refuses them
        tftrain.Trainer(model).fit(x, y, validation_data=(x[:8], y[:7]), callbacks=[on_batch], verbose=0)
    assert batches == []
