"""The Fashion-MNIST-sized classifiers that the example program and the benchmark both train.

One definition serves `python -m tftrain.examples.fashion_mnist` and the
`mlp`/`cnn` workloads of `python -m tftrain.bench`, so the program's numbers
and the benchmark's are about the same networks.
"""

from __future__ import annotations

import keras

NUM_CLASSES = 10
"""Classes of the classifiers' output (logits)."""


def build_mlp() -> keras.Model:
    """The MLP 784-20-20-10: Flatten(28x28) -> Dense20 relu -> Dense20 relu -> Dense10 (logits)."""
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input((28, 28)),
            layers.Flatten(),
            layers.Dense(20, activation="relu"),
            layers.Dense(20, activation="relu"),
            layers.Dense(NUM_CLASSES),
        ],
        name="mlp",
    )


def build_cnn() -> keras.Model:
    """The small CNN: three 3x3 relu convs (32, 64, 64) with max pooling, Dense64, Dense10."""
    layers = keras.layers
    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            layers.Conv2D(32, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.SpatialDropout2D(0.3),
            layers.Conv2D(64, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(64, activation="relu"),
            layers.Dense(NUM_CLASSES),
        ],
        name="cnn",
    )
