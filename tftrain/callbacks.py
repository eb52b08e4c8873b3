"""Keras callbacks that tftrain provides; each works in `model.fit` and `Trainer.fit`."""

from tftrain.timing import Timing

__all__ = ["Timing"]
