"""Fashion-MNIST: the classic eager vs graph vs XLA vs `model.fit` experiment.

Usage:
    python -m tftrain.examples.fashion_mnist --model=mlp|cnn --mode=eager|graph|xla|fit
        [--epochs=3] [--batch_size=128] [--steps_per_loop=1] [--num_examples=N]
        [--dataset=fashion_mnist|synthetic] [--data_dir=DIR]

Trains the benchmark's models (`tftrain.examples.models.build_mlp` /
`build_cnn`) on Fashion-MNIST from tensorflow-datasets. When the dataset
cannot be downloaded (offline), it says so and trains on synthetic data of
the same shape instead (28x28x1 uint8 images, 10 classes, random: the timings
compare, the accuracy is chance). Modes: eager = `Trainer(use_tf_function=False)`,
graph = `Trainer` (tf.function), xla = `Trainer(jit_compile=True)`, fit =
`keras.Model.fit`; `--steps_per_loop` is the Trainer's `steps_per_loop` and
fit's `steps_per_execution`. Prints one line per epoch, the timing report and
a one-line summary: mode, model, steady-state ms/step, examples/sec, test
accuracy.
"""

from __future__ import annotations

import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from absl import app, flags

import tftrain
from tftrain import data as data_lib
from tftrain.examples import models

FLAGS = flags.FLAGS

MODELS = {"mlp": models.build_mlp, "cnn": models.build_cnn}
MODES = ("eager", "graph", "xla", "fit")
DATASETS = ("fashion_mnist", "synthetic")
IMAGE_SIZE = 28
SPLIT_SIZES = {"train": 60_000, "test": 10_000}  # Fashion-MNIST's; the synthetic stand-in copies them


def define_flags(flag_values: flags.FlagValues = FLAGS) -> None:
    """Defines the program's flags (only when it runs as a program, so importing defines nothing)."""
    flags.DEFINE_enum("model", "mlp", list(MODELS), "The benchmark's model.", flag_values=flag_values)
    flags.DEFINE_enum("mode", "graph", list(MODES), "How the step runs.", flag_values=flag_values)
    flags.DEFINE_integer("epochs", 3, "Epochs to train.", flag_values=flag_values)
    flags.DEFINE_integer("batch_size", 128, "Batch size.", flag_values=flag_values)
    flags.DEFINE_integer(
        "steps_per_loop", 1, "Steps per host call (fit: steps_per_execution).", flag_values=flag_values
    )
    flags.DEFINE_integer(
        "num_examples",
        None,
        "Train on this many examples (and test on at most as many); default: the whole splits.",
        flag_values=flag_values,
    )
    flags.DEFINE_enum(
        "dataset",
        "fashion_mnist",
        list(DATASETS),
        "fashion_mnist (falls back to synthetic when it cannot be loaded) or synthetic.",
        flag_values=flag_values,
    )
    flags.DEFINE_string("data_dir", None, "tensorflow-datasets data directory.", flag_values=flag_values)


def _check_choice(name: str, value: Any, choices) -> None:
    if value not in choices:
        raise ValueError(
            f"Invalid value for argument `{name}`. Received: {name}={value!r}. "
            f"Expected one of: {', '.join(map(str, choices))}."
        )


def _check_positive(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"Invalid value for argument `{name}`. Received: {name}={value!r}. Expected an integer >= 1"
            f"{' or None' if allow_none else ''}."
        )


def load_arrays(
    dataset: str, num_examples: int | None = None, data_dir: str | None = None, verbose: bool = True
) -> tuple[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Loads both splits into memory as `(uint8 images (n, 28, 28, 1), int64 labels)`.

    Args:
        dataset: "fashion_mnist" (from tensorflow-datasets; on
            `tftrain.data.DatasetUnavailableError`, prints a notice and uses
            synthetic data) or "synthetic".
        num_examples: Training examples (None: the whole split); the test
            split is cut to at most as many.
        data_dir: tensorflow-datasets data directory.
        verbose: Print the fallback notice.

    Returns:
        `(name of the data used, {"train": (x, y), "test": (x, y)})`.
    """
    sizes = {
        "train": num_examples,
        "test": None if num_examples is None else min(num_examples, SPLIT_SIZES["test"]),
    }
    if dataset == "fashion_mnist":
        try:
            return "fashion_mnist", _load_splits("fashion_mnist", sizes, data_dir=data_dir)
        except data_lib.DatasetUnavailableError as error:
            if verbose:
                print(
                    f"NOTICE: Fashion-MNIST is not available ({error}).\n"
                    "NOTICE: Training on synthetic data of the same shape instead (28x28x1 uint8 "
                    "images, 10 classes, random): timings compare, test accuracy is chance (~10%).",
                    flush=True,
                )
    sizes = {split: count or SPLIT_SIZES[split] for split, count in sizes.items()}
    return "synthetic", _load_splits("synthetic", sizes, image_size=IMAGE_SIZE)


def _load_splits(
    name: str, sizes: dict[str, int | None], **options: Any
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each split of dataset `name`, of `sizes[split]` examples, as arrays (`_to_arrays`)."""
    return {
        split: _to_arrays(data_lib.load(name, split, num_examples=count, **options))
        for split, count in sizes.items()
    }


def _to_arrays(dataset: tf.data.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """An unbatched `(image, label)` dataset -> NumPy arrays, images as 28x28x1 uint8."""
    images, labels = [], []
    for x, y in dataset.batch(10_000).as_numpy_iterator():
        images.append(x)
        labels.append(y)
    x, y = np.concatenate(images), np.concatenate(labels).astype(np.int64)
    if x.shape[-1] == 3:  # e.g. a colour stand-in
        x = tf.image.rgb_to_grayscale(x).numpy()
    elif x.shape[-1] != 1:
        x = x[..., :1]
    if x.shape[1:3] != (IMAGE_SIZE, IMAGE_SIZE):
        x = tf.cast(tf.image.resize(x, (IMAGE_SIZE, IMAGE_SIZE)), tf.uint8).numpy()
    return x, y


def make_dataset(
    x: np.ndarray, y: np.ndarray, batch_size: int, model_name: str, training: bool, seed: int = 0
) -> tf.data.Dataset:
    """Batches of float images in [0, 1] shaped for the model; training batches are shuffled, all full."""
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    if training:
        dataset = dataset.shuffle(len(x), seed=seed, reshuffle_each_iteration=True)
    # Full training batches only: one input shape, so XLA compiles once and no step retraces.
    dataset = dataset.batch(batch_size, drop_remainder=training)

    def preprocess(images, labels):
        images = tf.cast(images, tf.float32) / 255.0
        if model_name == "mlp":
            images = tf.squeeze(images, axis=-1)  # the MLP takes (28, 28)
        return images, labels

    return dataset.map(preprocess).prefetch(2)


class EpochPrinter(keras.callbacks.Callback):
    """Prints one line per epoch (the same under every mode)."""

    def __init__(self, epochs: int):
        super().__init__()
        self.epochs = epochs
        self._start = 0.0

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        print(
            f"epoch {epoch + 1}/{self.epochs}: loss {logs.get('loss', float('nan')):.4f}, "
            f"accuracy {logs.get('accuracy', float('nan')):.4f}, {time.perf_counter() - self._start:.1f} s",
            flush=True,
        )


def run(
    model_name: str = "mlp",
    mode: str = "graph",
    *,
    epochs: int = 3,
    batch_size: int = 128,
    steps_per_loop: int = 1,
    num_examples: int | None = None,
    dataset: str = "fashion_mnist",
    data_dir: str | None = None,
    seed: int = 0,
    verbose: bool = True,
) -> dict[str, Any]:
    """Trains and tests one model under one mode.

    Args:
        model_name: "mlp" or "cnn".
        mode: "eager", "graph", "xla" or "fit".
        epochs: Epochs to train.
        batch_size: Batch size (training uses full batches only).
        steps_per_loop: Steps per host call (`steps_per_execution` under fit).
        num_examples: Training examples (None: all); the test set is cut to at most as many.
        dataset: "fashion_mnist" (synthetic if it cannot be loaded) or "synthetic".
        data_dir: tensorflow-datasets data directory.
        seed: Seed for the weights and the shuffling.
        verbose: Print the fallback notice and one line per epoch.

    Returns:
        A dict: `model`, `mode`, `dataset` (the data used), `num_train`,
        `num_test`, `epochs`, `step_time_ms` (steady-state median),
        `examples_per_sec`, `test_accuracy`, `test_loss`, `train_seconds`,
        `history` (per-epoch logs) and `timing` (the `TimingReport` as a dict).

    Raises:
        ValueError: an unknown model, mode or dataset, or a bad size, or fewer
            training examples than one batch.
    """
    _check_choice("model_name", model_name, list(MODELS))
    _check_choice("mode", mode, MODES)
    _check_choice("dataset", dataset, DATASETS)
    for name, value in (("epochs", epochs), ("batch_size", batch_size), ("steps_per_loop", steps_per_loop)):
        _check_positive(name, value)
    _check_positive("num_examples", num_examples, allow_none=True)

    used, arrays = load_arrays(dataset, num_examples, data_dir, verbose)
    (train_x, train_y), (test_x, test_y) = arrays["train"], arrays["test"]
    if len(train_x) < batch_size:
        raise ValueError(
            f"Invalid value for argument `batch_size`. Received: batch_size={batch_size} with "
            f"{len(train_x)} training examples. Expected at most as many as there are examples."
        )
    train_data = make_dataset(train_x, train_y, batch_size, model_name, training=True, seed=seed)
    test_data = make_dataset(test_x, test_y, batch_size, model_name, training=False)

    keras.utils.set_random_seed(seed)
    model = MODELS[model_name]()
    optimizer = keras.optimizers.Adam(1e-3)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    callbacks = [EpochPrinter(epochs)] if verbose else []
    start = time.perf_counter()
    if mode == "fit":
        model.compile(
            optimizer, loss, metrics=["accuracy"], jit_compile=False, steps_per_execution=steps_per_loop
        )
        timing = tftrain.callbacks.Timing()
        history = model.fit(train_data, epochs=epochs, callbacks=[*callbacks, timing], verbose=0)
        train_seconds = time.perf_counter() - start
        report = timing.report
        test_logs = model.evaluate(test_data, verbose=0, return_dict=True)
    else:
        trainer = tftrain.Trainer(
            model,
            optimizer,
            loss,
            ["accuracy"],
            use_tf_function=mode != "eager",
            jit_compile=mode == "xla",
            steps_per_loop=steps_per_loop,
        )
        history = trainer.fit(train_data, epochs=epochs, callbacks=callbacks, verbose=0)
        train_seconds = time.perf_counter() - start
        report = trainer.timing
        test_logs = trainer.evaluate(test_data, verbose=0, return_dict=True)
    median = report.step_time_median_s
    return {
        "model": model_name,
        "mode": mode,
        "dataset": used,
        "num_train": len(train_x),
        "num_test": len(test_x),
        "epochs": epochs,
        "step_time_ms": None if median is None else median * 1e3,
        "examples_per_sec": report.examples_per_sec,
        "test_accuracy": float(test_logs["accuracy"]),
        "test_loss": float(test_logs["loss"]),
        "train_seconds": train_seconds,
        "history": {key: list(values) for key, values in history.history.items()},
        "timing": report.to_dict(),
        "timing_summary": report.summary(),
    }


def summary_line(result: dict[str, Any]) -> str:
    """The one-line summary of a `run` result."""
    step = "n/a" if result["step_time_ms"] is None else f"{result['step_time_ms']:.3f} ms/step"
    throughput = result["examples_per_sec"]
    rate = "n/a" if throughput is None else f"{throughput:,.0f} examples/sec"
    return (
        f"mode={result['mode']} model={result['model']} data={result['dataset']}: {step} (steady-state median), "
        f"{rate}, test accuracy {result['test_accuracy']:.4f}"
    )


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    # The flags named as `run`'s keyword arguments.
    keywords = ("epochs", "batch_size", "steps_per_loop", "num_examples", "dataset", "data_dir")
    result = run(FLAGS.model, FLAGS.mode, **{name: FLAGS[name].value for name in keywords})
    print(f"timing ({result['mode']}):\n{result['timing_summary']}")
    print(summary_line(result))


if __name__ == "__main__":
    define_flags()
    app.run(main)
