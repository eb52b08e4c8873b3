"""The startup benchmark: a first run, Trainer against Keras, each side in fresh processes.

Most runs people start are short, and there tracing, conversion and input
setup weigh as much as the steps. Each round starts one process per side
(the sides alternate which goes first), and each process builds the model,
then times one call each, in this order: `fit` for one epoch (its first
batch's end, read by a callback, and the whole call), then `evaluate` and
`predict` on the evaluation rows. TensorFlow's import and the model's
construction are outside every timing. The ratios are Trainer / Keras, paired
by round, with a t-interval on the log scale (`stats.ratio_interval`).

Workloads, with numpy inputs and every default:

- `mlp`: the seeds' MNIST MLP, 60,000 x 784 -> 20 -> 20 -> 10, batch 128;
- `convnet`: keras-io's MNIST convnet, 6,000 x 28 x 28 x 1, batch 128.

Each evaluates and predicts on 10,000 rows. The data is random (the shapes
are the tutorials'); no download.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from tftrain.bench import config, report, stats

__all__ = ["METRICS", "SIDES", "STARTUP_WORKLOADS", "format_startup", "run_startup", "summarize"]

STARTUP_WORKLOADS = ("mlp", "convnet")
SIDES = ("trainer", "keras")
METRICS = ("first_batch_s", "fit_s", "evaluate_s", "predict_s")
_EVALUATION_ROWS = 10_000
_TRAINING_ROWS = {"mlp": 60_000, "convnet": 6_000}
_RESULT_PREFIX = "STARTUP_RESULT"


def _build(workload: str) -> tuple[Any, Any, Any, Any, Any]:
    """The workload's compiled model, training arrays and evaluation arrays (seeded)."""
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    rng = np.random.RandomState(0)
    if workload == "mlp":
        rows, shape = _TRAINING_ROWS["mlp"], (784,)
        model = keras.Sequential(
            [
                keras.Input(shape),
                keras.layers.Dense(20, activation="relu"),
                keras.layers.Dense(20, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    else:
        rows, shape = _TRAINING_ROWS["convnet"], (28, 28, 1)
        model = keras.Sequential(
            [
                keras.Input(shape),
                keras.layers.Conv2D(32, kernel_size=(3, 3), activation="relu"),
                keras.layers.MaxPooling2D(pool_size=(2, 2)),
                keras.layers.Conv2D(64, kernel_size=(3, 3), activation="relu"),
                keras.layers.MaxPooling2D(pool_size=(2, 2)),
                keras.layers.Flatten(),
                keras.layers.Dropout(0.5),
                keras.layers.Dense(10, activation="softmax"),
            ]
        )
        loss = "sparse_categorical_crossentropy"
    model.compile(optimizer="adam", loss=loss, metrics=["accuracy"])
    x = rng.rand(rows, *shape).astype("float32")
    y = rng.randint(0, 10, rows)
    x_eval = rng.rand(_EVALUATION_ROWS, *shape).astype("float32")
    y_eval = rng.randint(0, 10, _EVALUATION_ROWS)
    return model, x, y, x_eval, y_eval


def measure_once(workload: str, side: str) -> dict[str, float]:
    """One process's timings (seconds) of a first `fit`, `evaluate` and `predict` of `workload` on `side`."""
    import keras

    if workload not in STARTUP_WORKLOADS or side not in SIDES:
        raise ValueError(
            f"Invalid value for argument `workload` or `side`. Received: workload={workload!r}, side={side!r}. "
            f"Expected a workload of {STARTUP_WORKLOADS} and a side of {SIDES}."
        )
    model, x, y, x_eval, y_eval = _build(workload)
    if side == "trainer":
        import tftrain

        runner: Any = tftrain.Trainer(model)
    else:
        runner = model
    first_batch: list[float] = []

    class FirstBatch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if not first_batch:
                first_batch.append(time.perf_counter())

    start = time.perf_counter()
    runner.fit(x, y, batch_size=128, epochs=1, verbose=0, callbacks=[FirstBatch()])
    fit_end = time.perf_counter()
    runner.evaluate(x_eval, y_eval, batch_size=128, verbose=0)
    evaluate_end = time.perf_counter()
    runner.predict(x_eval, batch_size=128, verbose=0)
    predict_end = time.perf_counter()
    return {
        "first_batch_s": first_batch[0] - start,
        "fit_s": fit_end - start,
        "evaluate_s": evaluate_end - fit_end,
        "predict_s": predict_end - evaluate_end,
    }


def _run_child(workload: str, side: str, timeout: float) -> dict[str, float]:
    """Runs `measure_once` in a fresh Python process and returns its timings."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    command = [sys.executable, "-m", "tftrain.bench.startup", workload, side]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    for line in completed.stdout.splitlines():
        if line.startswith(_RESULT_PREFIX):
            return json.loads(line[len(_RESULT_PREFIX) :])
    raise RuntimeError(
        f"The startup benchmark's {side} process for {workload} failed (exit status {completed.returncode}):\n"
        f"{completed.stderr[-3000:]}"
    )


def summarize(runs: dict[str, list[dict[str, float]]], confidence: float = 0.95) -> dict[str, Any]:
    """Per metric: each side's median and the Trainer / Keras ratio with its interval, paired by round.

    Args:
        runs: Side -> one timing dict per round (`measure_once`'s), rounds in the same order.
        confidence: The intervals' confidence level.
    """
    summary = {}
    for metric in METRICS:
        trainer = [run[metric] for run in runs["trainer"]]
        keras_side = [run[metric] for run in runs["keras"]]
        interval = stats.ratio_interval(trainer, keras_side, confidence)
        summary[metric] = {
            "trainer_median_s": statistics.median(trainer),
            "keras_median_s": statistics.median(keras_side),
            "ratio": None if interval is None else interval.to_dict(),
        }
    return summary


def run_startup(
    workloads: tuple[str, ...] = STARTUP_WORKLOADS,
    rounds: int = 5,
    confidence: float = 0.95,
    progress: Callable[[str], None] | None = None,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Runs the startup benchmark: `rounds` rounds of one fresh process per side and workload.

    Returns:
        `{"rounds": ..., "workloads": {name: {"runs": {side: [...]}, "summary": summarize(...)}}}`.

    Raises:
        ValueError: an unknown workload, or fewer than 2 rounds (no interval).
    """
    unknown = sorted(set(workloads) - set(STARTUP_WORKLOADS))
    if unknown:
        raise ValueError(
            f"Invalid value for argument `workloads`. Received: {unknown}. Expected some of {STARTUP_WORKLOADS}."
        )
    config.check_int("rounds", rounds, 2, hint=" (the interval needs two paired rounds)")
    results: dict[str, Any] = {"rounds": rounds, "confidence": confidence, "workloads": {}}
    for workload in workloads:
        runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
        for index in range(rounds):
            order = SIDES if index % 2 == 0 else SIDES[::-1]  # alternate which side goes first
            for side in order:
                runs[side].append(_run_child(workload, side, timeout))
            if progress is not None:
                progress(f"startup {workload}: round {index + 1}/{rounds} done")
        results["workloads"][workload] = {"runs": runs, "summary": summarize(runs, confidence)}
    return results


def format_startup(results: dict[str, Any]) -> str:
    """The startup benchmark's table: medians per side, and Trainer / Keras with its interval."""
    lines = [
        f"startup (fresh processes, {results['rounds']} rounds, Trainer / Keras with a "
        f"{results['confidence']:.0%} interval):"
    ]
    lines.append(f"  {'workload':<8} {'measure':<14} {'Trainer':>9} {'Keras':>9}  {'ratio':<22}")
    for workload, result in results["workloads"].items():
        for metric, row in result["summary"].items():
            shown = "n/a" if row["ratio"] is None else report.format_interval(row["ratio"], ".2f")
            lines.append(
                f"  {workload:<8} {metric[:-2]:<14} {row['trainer_median_s']:>8.2f}s {row['keras_median_s']:>8.2f}s"
                f"  {shown:<22}"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # a child process: python -m tftrain.bench.startup WORKLOAD SIDE
    print(_RESULT_PREFIX + json.dumps(measure_once(sys.argv[1], sys.argv[2])), flush=True)
