"""The tftrain modules a `fit` enters, counted as docs/architecture.md counts them (`sys.setprofile`)."""

import sys

import keras
import numpy as np

import tftrain

SECOND_FIT_MODULES = 22  # docs/architecture.md: a second fit without a model_dir
RESUMED_FIT_MODULES = 48  # a new Trainer's fit resumed from a model_dir


def entered(call):
    """The tftrain modules whose functions `call` calls."""
    seen = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_globals.get("__name__", "").startswith("tftrain"):
            seen.add(frame.f_globals["__name__"])

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return seen


def test_a_second_fit_and_a_resumed_fit_enter_no_more_modules_than_documented(tmp_path):
    x = np.random.RandomState(0).rand(32, 4).astype("float32")
    y = x[:, :1]

    def trainer(**kwargs):
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        return tftrain.Trainer(model, "sgd", "mse", **kwargs)

    def fit(trainer, epochs=1):
        return lambda: trainer.fit(x, y, batch_size=8, epochs=epochs, verbose=0)

    again = trainer()
    fit(again)()
    second = entered(fit(again))
    trainer(model_dir=str(tmp_path)).fit(x, y, batch_size=8, epochs=1, verbose=0)
    resumed = entered(fit(trainer(model_dir=str(tmp_path)), epochs=2))
    assert len(second) <= SECOND_FIT_MODULES, sorted(second)
    assert len(resumed) <= RESUMED_FIT_MODULES, sorted(resumed)
