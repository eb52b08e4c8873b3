"""Benchmark workloads: models, their synthetic in-memory data, optimizer and loss.

Nothing is downloaded. `mlp` and `cnn` are Fashion-MNIST sized classifiers
(28x28 grayscale images, 10 classes, learnable labels: the argmax of a fixed
random linear map of the pixels); `linear` is the three-layer linear
regression of the classic TensorFlow-vs-PyTorch comparison; `simclr` is a
SimCLR pretraining step on a ResNet-18 (CIFAR stem). Data comes from a fixed
seed, so every variant of a run trains on exactly the same batches in the
same order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tftrain.bench import config
from tftrain.bench.config import BATCH_SIZE
from tftrain.examples.models import NUM_CLASSES, build_cnn, build_mlp

__all__ = ["NUM_CLASSES", "build_cnn", "build_mlp"]  # the classifiers live with the programs that train them


LINEAR_WIDTH = 1000


def build_linear() -> keras.Model:
    """The linear model 1000-1000-1000-1: three Dense layers without activations."""
    return keras.Sequential(
        [
            keras.Input((LINEAR_WIDTH,)),
            keras.layers.Dense(LINEAR_WIDTH),
            keras.layers.Dense(LINEAR_WIDTH),
            keras.layers.Dense(1),
        ],
        name="linear",
    )


def build_simclr(width_multiplier: float = 1.0) -> keras.Model:
    """SimCLR's model with a ResNet-18 encoder (CIFAR stem), built for 32x32 images.

    The SimCLR program's defaults otherwise: a 2-layer nonlinear projection
    head to 128 dimensions, an online linear probe, temperature 0.5.
    """
    from tftrain.examples.simclr import model as simclr_model  # only this workload needs it

    model = simclr_model.SimCLRModel(
        NUM_CLASSES, resnet_depth=18, width_multiplier=width_multiplier, cifar_stem=True, num_proj_layers=2
    )
    model.build_for(32)
    return model


def classifier_compile_args() -> dict[str, Any]:
    """Fresh Adam (default settings), loss on logits and accuracy, as every classifier variant uses."""
    return dict(
        optimizer=keras.optimizers.Adam(),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


def linear_compile_args() -> dict[str, Any]:
    """Plain SGD with learning rate 1e-4 and the mean squared error, as in the TF-vs-PyTorch comparison."""
    return dict(optimizer=keras.optimizers.SGD(1e-4), loss=keras.losses.MeanSquaredError())


def simclr_compile_args() -> dict[str, Any]:
    """LARS (momentum 0.9, weight decay 1e-4) at the program's learning rate for batch 64: 1.0 x 64 / 256."""
    from tftrain.examples.simclr import model as simclr_model

    return dict(optimizer=simclr_model.lars_optimizer(0.25, momentum=0.9, weight_decay=1e-4))


@dataclasses.dataclass(frozen=True)
class Workload:
    """A model, its data, optimizer and loss, and the sizes of a run.

    Attributes:
        name: The name used on the command line.
        description: One line for the report.
        input_shape: Shape of one example (without the batch dimension).
        build_model: Builds a fresh, uncompiled model (its weights are set
            from the workload's initial weights before each run); takes the
            workload's model options as keywords.
        make_arrays: `(input_shape, num_examples, seed) -> (x, y)`, the data.
        compile_args: Fresh `optimizer`, `loss`, `metrics` for one run.
        evaluate: `(model, dataset) -> dict` with at least `val_loss`: an untimed check
            that a run trained; None for none.
        compiled_by_model: The model's own `train_step` computes the loss, so
            it is `model.compile(**compile_args)`d and given to the Trainer
            alone (a `tftrain.CustomModel`).
        num_train: Training examples in a full run.
        num_val: Validation examples in a full run.
        quick_num_train: Training examples with `quick=True`.
        quick_num_val: Validation examples with `quick=True`.
        batch_size: Batch size.
        steps_per_loop: `k` of the k-steps-per-call variants.
        segment_steps: Steps per measured segment (a multiple of every k
            compared, 1, 5, 20 and 100 included, where the step is short).
        quick_segment_steps: Steps per segment with `quick=True`.
        data_description: What the data is, for the report.
    """

    name: str
    description: str
    input_shape: tuple[int, ...]
    build_model: Callable[..., keras.Model]
    make_arrays: Callable[[Sequence[int], int, int], tuple[np.ndarray, np.ndarray]]
    compile_args: Callable[[], dict[str, Any]] = classifier_compile_args
    evaluate: Callable[[keras.Model, tf.data.Dataset], dict[str, float]] | None = None
    compiled_by_model: bool = False
    num_train: int = 60_000
    num_val: int = 10_000
    quick_num_train: int = 6_000
    quick_num_val: int = 1_000
    batch_size: int = BATCH_SIZE
    steps_per_loop: int = 20
    segment_steps: int = 300
    quick_segment_steps: int = 100
    data_description: str = "synthetic, in memory"

    def segment(self, quick: bool) -> int:
        """Steps per segment for a full or quick run."""
        return self.quick_segment_steps if quick else self.segment_steps

    def sizes(self, quick: bool) -> tuple[int, int]:
        """Returns `(num_train, num_val)` for a full or quick run."""
        return (self.quick_num_train, self.quick_num_val) if quick else (self.num_train, self.num_val)


def classifier_arrays(
    input_shape: Sequence[int], num_examples: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
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


def regression_arrays(
    input_shape: Sequence[int], num_examples: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Standard normal inputs and a target that is a fixed linear map of them plus noise.

    Args:
        input_shape: Shape of one example, e.g. `(1000,)`.
        num_examples: Number of examples.
        seed: Seed for the inputs and the noise.

    Returns:
        `(x, y)`: float32 inputs and float32 targets of shape `(num_examples, 1)`.
    """
    features = int(np.prod(input_shape))
    weights = np.random.default_rng(12345).standard_normal((features, 1)).astype(np.float32) / np.sqrt(
        features
    )
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((num_examples, *input_shape), dtype=np.float32)
    y = x.reshape(num_examples, features) @ weights + 0.1 * rng.standard_normal(
        (num_examples, 1), dtype=np.float32
    )
    return x, y.astype(np.float32)


def image_pair_arrays(
    input_shape: Sequence[int], num_examples: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Random "augmented view pairs" for the SimCLR step: uniform pixels, random labels.

    The step's cost does not depend on the pixels; augmentation is left out so
    the benchmark times the training step, not the input pipeline.

    Args:
        input_shape: `(height, width, 6)`: two RGB views stacked on channels.
        num_examples: Number of pairs.
        seed: Seed.

    Returns:
        `(x, y)`: float32 pairs and int32 labels in `[0, 10)`.
    """
    rng = np.random.default_rng(seed)
    x = rng.random((num_examples, *input_shape), dtype=np.float32)
    return x, rng.integers(0, NUM_CLASSES, num_examples).astype(np.int32)


def make_dataset(
    x: np.ndarray,
    y: np.ndarray,
    batch_size: int = BATCH_SIZE,
    *,
    autotune: bool = False,
    shuffle_buffer: int | None = None,
    seed: int = 0,
    repeat: bool = False,
) -> tf.data.Dataset:
    """The input pipeline every variant reads: in-memory tensors, batched, cached, prefetched.

    The cache is filled here (one full pass), so no variant pays for filling
    it and partial passes (eager variants) read a complete cache. With
    `shuffle_buffer`, the pipeline is the other common one instead: examples
    reshuffled each pass through a buffer of that size (seeded), then
    batched, with no cache.

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
        shuffle_buffer: Shuffle examples through a buffer of this size
            instead of caching the batches.
        seed: The shuffle's seed.
        repeat: Repeat the passes endlessly (the stream the interleaved
            segments read; before the prefetch, so a new pass costs nothing).

    Returns:
        A `tf.data.Dataset` of `(images, labels)` batches.
    """
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    if shuffle_buffer is None:
        dataset = dataset.batch(batch_size).cache()
    else:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True).batch(batch_size)
    if repeat:
        dataset = dataset.repeat()
    if autotune:
        dataset = dataset.prefetch(tf.data.AUTOTUNE)
    else:
        options = tf.data.Options()
        options.autotune.enabled = False
        dataset = dataset.prefetch(2).with_options(options)
    if shuffle_buffer is None:
        # One pass and one batch more: the cache is complete only once its input has ended.
        batches = -(-len(x) // batch_size)
        for _ in dataset.take(batches + 1) if repeat else dataset:
            pass
    return dataset


@dataclasses.dataclass
class WorkloadData:
    """One workload's data and starting point, shared by all its runs.

    Attributes:
        workload: The workload.
        train: The training stream (`make_dataset(..., repeat=True)`): endless,
            so segments read on where the previous one stopped.
        val: The validation pipeline, used only for an untimed check.
        num_train: Training examples.
        num_val: Validation examples.
        batch_size: Batch size.
        steps_per_epoch: Batches in one pass over the data.
        initial_weights: Weights every run starts from.
        seed: Seed set before building each run's model.
        model_options: Keywords for the workload's `build_model`.
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
    model_options: dict[str, Any] = dataclasses.field(default_factory=dict)

    def fresh_model(self) -> keras.Model:
        """A new model with the initial weights (and the same random seed state)."""
        keras.utils.set_random_seed(self.seed)
        model = self.workload.build_model(**self.model_options)
        model.set_weights(self.initial_weights)
        return model

    def num_params(self) -> int:
        """Number of weights (trainable and not, e.g. batch-norm statistics)."""
        return int(sum(np.prod(w.shape) for w in self.initial_weights))


def prepare(
    workload: Workload,
    num_train: int,
    num_val: int,
    *,
    batch_size: int | None = None,
    seed: int = 0,
    autotune: bool = False,
    shuffle_buffer: int | None = None,
    model_options: dict[str, Any] | None = None,
) -> WorkloadData:
    """Builds a workload's data pipelines and initial weights once.

    Args:
        workload: The workload.
        num_train: Training examples (>= 1).
        num_val: Validation examples (>= 1).
        batch_size: Batch size; None means the workload's own.
        seed: Seed for data and initial weights.
        autotune: tf.data autotuning for the pipelines (see `make_dataset`).
        shuffle_buffer: Train on a shuffled pipeline with this buffer
            instead of the cached one (see `make_dataset`).
        model_options: Keywords for the workload's `build_model`.

    Returns:
        The `WorkloadData`.

    Raises:
        ValueError: a size is below 1.
    """
    batch_size = workload.batch_size if batch_size is None else batch_size
    model_options = dict(model_options or {})
    for name, value in (("num_train", num_train), ("num_val", num_val), ("batch_size", batch_size)):
        config.check_int(name, value, 1)
    x, y = workload.make_arrays(workload.input_shape, num_train, seed)
    val_x, val_y = workload.make_arrays(workload.input_shape, num_val, seed + 1)
    keras.utils.set_random_seed(seed)
    model = workload.build_model(**model_options)
    return WorkloadData(
        workload=workload,
        train=make_dataset(
            x, y, batch_size, autotune=autotune, shuffle_buffer=shuffle_buffer, seed=seed, repeat=True
        ),
        val=make_dataset(val_x, val_y, batch_size, autotune=autotune),
        num_train=num_train,
        num_val=num_val,
        batch_size=batch_size,
        steps_per_epoch=-(-num_train // batch_size),
        initial_weights=model.get_weights(),
        seed=seed,
        model_options=model_options,
    )


def evaluate_classifier(model: keras.Model, dataset: tf.data.Dataset) -> dict[str, float]:
    """Untimed check of a trained classifier: mean loss and accuracy over `dataset`.

    Args:
        model: A trained model (logits out).
        dataset: Batches of `(images, labels)`.

    Returns:
        A dict with `val_loss` and `val_accuracy` as Python floats.
    """
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return _evaluate(model, dataset, loss, val_accuracy=keras.metrics.SparseCategoricalAccuracy())


def evaluate_regression(model: keras.Model, dataset: tf.data.Dataset) -> dict[str, float]:
    """Untimed check of a trained regression model: mean squared error over `dataset`."""
    return _evaluate(model, dataset, keras.losses.MeanSquaredError())


def _evaluate(model: keras.Model, dataset: tf.data.Dataset, loss: Any, **metrics: Any) -> dict[str, float]:
    """`val_loss`, the example-weighted mean of `loss`, and each of `metrics` over `dataset`."""
    mean_loss = keras.metrics.Mean()
    for x, y in dataset:  # eagerly: a few forward passes, no tracing
        outputs = model(x, training=False)
        mean_loss.update_state(loss(y, outputs), sample_weight=tf.cast(tf.shape(y)[0], tf.float32))
        for metric in metrics.values():
            metric.update_state(y, outputs)
    return {"val_loss": float(mean_loss.result())} | {name: float(m.result()) for name, m in metrics.items()}


WORKLOADS: dict[str, Workload] = {
    "mlp": Workload(
        name="mlp",
        description="MLP 784-20-20-10 (Flatten, Dense20 relu, Dense20 relu, Dense10)",
        input_shape=(28, 28),
        build_model=build_mlp,
        make_arrays=classifier_arrays,
        evaluate=evaluate_classifier,
    ),
    "cnn": Workload(
        name="cnn",
        description=(
            "CNN Conv32-MaxPool-Conv64-MaxPool-SpatialDropout2D(0.3)-Conv64-MaxPool-"
            "Flatten-Dense64-Dense10 (3x3 relu convs)"
        ),
        input_shape=(28, 28, 1),
        build_model=build_cnn,
        make_arrays=classifier_arrays,
        evaluate=evaluate_classifier,
        # 50 steps per epoch: a step takes ~35 ms on 2 CPU cores, and per-step
        # times do not depend on the dataset's size (--num_train sets 60,000).
        num_train=6_400,
        num_val=2_560,
        quick_num_train=640,
        quick_num_val=256,
        segment_steps=100,
        quick_segment_steps=20,
    ),
    "linear": Workload(
        name="linear",
        description="linear model 1000-1000-1000-1 (no activations), SGD 1e-4, mean squared error",
        input_shape=(LINEAR_WIDTH,),
        build_model=build_linear,
        make_arrays=regression_arrays,
        compile_args=linear_compile_args,
        evaluate=evaluate_regression,
        num_train=20 * 1024,
        num_val=2 * 1024,
        quick_num_train=10 * 1024,
        quick_num_val=1024,
        batch_size=1024,
        steps_per_loop=10,
        segment_steps=100,
        quick_segment_steps=10,
    ),
    "simclr": Workload(
        name="simclr",
        description="SimCLR pretraining step: ResNet-18 (CIFAR stem), batch of 64 pairs of 32x32 views, LARS",
        input_shape=(32, 32, 6),
        build_model=build_simclr,
        make_arrays=image_pair_arrays,
        compile_args=simclr_compile_args,
        compiled_by_model=True,
        num_train=4 * 64,
        num_val=64,
        quick_num_train=2 * 64,
        quick_num_val=64,
        batch_size=64,
        steps_per_loop=1,
        segment_steps=2,
        quick_segment_steps=1,
        data_description="synthetic pairs of views, in memory, augmentation left out",
    ),
}
