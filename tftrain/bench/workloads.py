"""Benchmark workloads: Fashion-MNIST sized models and synthetic data made in memory.

Nothing is downloaded. The data has the real shapes (28x28 grayscale images,
10 classes) and learnable labels (the argmax of a fixed random linear map of
the pixels), generated from a fixed seed, so every variant of a run trains on
exactly the same batches in the same order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

from tftrain.bench.config import BATCH_SIZE

NUM_CLASSES = 10


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


@dataclasses.dataclass(frozen=True)
class Workload:
    """A model and the shape and size of its data.

    Attributes:
        name: The name used on the command line.
        description: One line for the report.
        input_shape: Shape of one example (without the batch dimension).
        build_model: Builds a fresh, uncompiled model (its weights are set
            from the workload's initial weights before each run).
        num_train: Training examples in a full run.
        num_val: Validation examples in a full run.
        quick_num_train: Training examples with `quick=True`.
        quick_num_val: Validation examples with `quick=True`.
    """

    name: str
    description: str
    input_shape: tuple[int, ...]
    build_model: Callable[[], keras.Model]
    num_train: int = 60_000
    num_val: int = 10_000
    quick_num_train: int = 6_000
    quick_num_val: int = 1_000

    def sizes(self, quick: bool) -> tuple[int, int]:
        """Returns `(num_train, num_val)` for a full or quick run."""
        if quick:
            return self.quick_num_train, self.quick_num_val
        return self.num_train, self.num_val


WORKLOADS: dict[str, Workload] = {
    "mlp": Workload(
        name="mlp",
        description="MLP 784-20-20-10 (Flatten, Dense20 relu, Dense20 relu, Dense10)",
        input_shape=(28, 28),
        build_model=build_mlp,
    ),
    "cnn": Workload(
        name="cnn",
        description=(
            "CNN Conv32-MaxPool-Conv64-MaxPool-SpatialDropout2D(0.3)-Conv64-MaxPool-"
            "Flatten-Dense64-Dense10 (3x3 relu convs)"
        ),
        input_shape=(28, 28, 1),
        build_model=build_cnn,
        quick_num_train=640,
        quick_num_val=256,
    ),
}


def make_arrays(input_shape: Sequence[int], num_examples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic images and learnable labels of the real shapes.

    Pixels are uniform in [0, 1); a label is the argmax of a fixed random
    linear map of the centered pixels (the map depends only on the shape, so
    training and validation data share it).

    Args:
        input_shape: Shape of one example, e.g. `(28, 28)`.
        num_examples: Number of examples.
        seed: Seed for the pixels.

    Returns:
        `(x, y)`: float32 images of shape `(num_examples, *input_shape)` and
        int32 labels in `[0, 10)`.
    """
    features = int(np.prod(input_shape))
    projection = np.random.default_rng(12345).standard_normal((features, NUM_CLASSES)).astype(np.float32)
    x = np.random.default_rng(seed).random((num_examples, *input_shape), dtype=np.float32)
    y = np.argmax((x.reshape(num_examples, features) - 0.5) @ projection, axis=1).astype(np.int32)
    return x, y


def make_dataset(
    x: np.ndarray, y: np.ndarray, batch_size: int = BATCH_SIZE, *, autotune: bool = False
) -> tf.data.Dataset:
    """The input pipeline every variant reads: in-memory tensors, batched, cached, prefetched.

    The cache is filled here (one full pass), so no variant pays for filling
    it and partial passes (eager variants) read a complete cache.

    By default the prefetch buffer is fixed (2 batches) and tf.data
    autotuning is off. On a 2-core machine the autotuner's background thread
    competes with training, and dropping an iterator that it tunes sometimes
    stalls for 0.1-1 s, which lands in whichever epoch drops it; the fixed
    buffer keeps that noise out of comparisons between training loops.

    Args:
        x: Images.
        y: Labels.
        batch_size: Batch size (the last batch may be smaller).
        autotune: Use `prefetch(tf.data.AUTOTUNE)` with autotuning on instead.

    Returns:
        A `tf.data.Dataset` of `(images, labels)` batches.
    """
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size).cache()
    if autotune:
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
    else:
        options = tf.data.Options()
        options.autotune.enabled = False
        dataset = dataset.prefetch(2).with_options(options)
    for _ in dataset:
        pass
    return dataset


@dataclasses.dataclass
class WorkloadData:
    """One workload's data and starting point, shared by all its runs.

    Attributes:
        workload: The workload.
        train: The training pipeline (`make_dataset`).
        val: The validation pipeline, used only for an untimed check.
        num_train: Training examples.
        num_val: Validation examples.
        batch_size: Batch size.
        steps_per_epoch: Batches in one pass over `train`.
        initial_weights: Weights every run starts from.
        seed: Seed set before building each run's model.
    """

    workload: Workload
    train: tf.data.Dataset
    val: tf.data.Dataset
    num_train: int
    num_val: int
    batch_size: int
    steps_per_epoch: int
    initial_weights: list[np.ndarray]
    seed: int

    def fresh_model(self) -> keras.Model:
        """A new model with the initial weights (and the same random seed state)."""
        keras.utils.set_random_seed(self.seed)
        model = self.workload.build_model()
        model.set_weights(self.initial_weights)
        return model

    def num_params(self) -> int:
        """Number of trainable parameters."""
        return int(sum(np.prod(w.shape) for w in self.initial_weights))


def prepare(
    workload: Workload,
    num_train: int,
    num_val: int,
    *,
    batch_size: int = BATCH_SIZE,
    seed: int = 0,
    autotune: bool = False,
) -> WorkloadData:
    """Builds a workload's data pipelines and initial weights once.

    Args:
        workload: The workload.
        num_train: Training examples (>= 1).
        num_val: Validation examples (>= 1).
        batch_size: Batch size.
        seed: Seed for data and initial weights.
        autotune: tf.data autotuning for the pipelines (see `make_dataset`).

    Returns:
        The `WorkloadData`.

    Raises:
        ValueError: a size is below 1.
    """
    for name, value in (("num_train", num_train), ("num_val", num_val), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(
                f"Invalid value for argument `{name}`. Received: {name}={value!r}. Expected an integer >= 1."
            )
    x, y = make_arrays(workload.input_shape, num_train, seed)
    val_x, val_y = make_arrays(workload.input_shape, num_val, seed + 1)
    keras.utils.set_random_seed(seed)
    model = workload.build_model()
    return WorkloadData(
        workload=workload,
        train=make_dataset(x, y, batch_size, autotune=autotune),
        val=make_dataset(val_x, val_y, batch_size, autotune=autotune),
        num_train=num_train,
        num_val=num_val,
        batch_size=batch_size,
        steps_per_epoch=-(-num_train // batch_size),
        initial_weights=model.get_weights(),
        seed=seed,
    )
