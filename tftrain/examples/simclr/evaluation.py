"""SimCLR's evaluation: the probe on every checkpoint of a run, result keys, linear evaluation.

`--mode=eval` runs as the reference's `run.py` does: it evaluates each
checkpoint of `--model_dir` as the training run writes it, until the one at
the run's last step (with `tftrain.evaluation.evaluate_continuously`, which
also writes `model_dir/eval/results.json` and TensorBoard at each step). The
results carry the reference's keys (`eval/label_top_1_accuracy`, ...,
`global_step`) next to tftrain's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

import tftrain
from tftrain.examples.simclr import probe

PROBE_KEYS = ("label_top_1_accuracy", "label_top_5_accuracy")


def reference_results(model: keras.Model, logs: dict[str, float], global_step: int) -> dict[str, Any]:
    """The reference's `result.json` keys for one evaluation of `model` at `global_step`.

    Args:
        model: The `SimCLRModel` holding the evaluated weights.
        logs: `Trainer.evaluate`'s logs of the probe on the eval split.
        global_step: The step the evaluated weights were trained to.

    Returns:
        tftrain's keys (`label_top_1_accuracy`, `label_top_5_accuracy`) and the
        reference's (`eval/label_top_1_accuracy`, `eval/label_top_5_accuracy`,
        `eval/regularization_loss`: the weight decay term of these weights,
        `global_step`).
    """
    results: dict[str, Any] = {key: float(logs[key]) for key in PROBE_KEYS}
    results.update({f"eval/{key}": float(logs[key]) for key in PROBE_KEYS})
    results["eval/regularization_loss"] = float(model.weight_decay_loss())
    results["global_step"] = int(global_step)
    return results


def evaluate_checkpoints(
    trainer: tftrain.Trainer,
    eval_data: tf.data.Dataset,
    *,
    model_dir: str,
    last_step: int,
    timeout_s: float,
    steps: int | None = None,
    verbose: int = 0,
) -> dict[str, Any]:
    """Evaluates the probe on each checkpoint of `model_dir` as it appears, until `last_step`.

    Leaves `trainer.model` holding the newest checkpoint's weights (for the
    linear evaluation that may follow).

    Args:
        trainer: A Trainer of the run's model (built, of its architecture).
        eval_data: The eval split, a dataset that can be iterated again.
        model_dir: The pretraining or fine-tuning run's directory.
        last_step: The run's last global step: evaluation stops after its checkpoint.
        timeout_s: Seconds to wait for a new checkpoint.
        steps: Eval batches per checkpoint (None: the whole eval split).
        verbose: As for `Trainer.evaluate`.

    Returns:
        `reference_results` for the last checkpoint, `eval_results` (step ->
        logs of every checkpoint evaluated in `model_dir`, steps as strings as
        in JSON) and `restored` (the checkpoint the model holds at the end).

    Raises:
        tftrain.evaluation.EvaluationTimeoutError: no new checkpoint within `timeout_s`.
    """
    per_step = tftrain.evaluation.evaluate_continuously(
        trainer,
        eval_data,
        model_dir=model_dir,
        last_step=last_step,
        timeout_s=timeout_s,
        steps=steps,
        verbose=verbose,
    )
    # An evaluator rerun on a finished directory evaluates nothing new: restore the newest weights anyway.
    restored = restore_latest(trainer.model, model_dir)
    step = max(per_step)
    results = reference_results(trainer.model, per_step[step], step)
    return {**results, "eval_results": {str(s): logs for s, logs in per_step.items()}, "restored": restored}


def restore_latest(model: keras.Model, model_dir: str) -> str:
    """Restores `model_dir`'s newest checkpoint into `model` and its optimizer; returns its path.

    Raises:
        ValueError: `model_dir` holds no checkpoint.
    """
    latest = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
    if latest is None:
        raise ValueError(
            f"--mode=eval found no checkpoint in {model_dir}/checkpoints. Expected the --model_dir of a "
            "training run (--mode=train)."
        )
    tftrain.checkpoint.restore_model(model, latest)
    return latest


def linear_eval(
    encoder: keras.Model,
    random_encoder: Callable[[], keras.Model],
    train_data: tf.data.Dataset,
    test_data: tf.data.Dataset,
    num_classes: int,
) -> dict[str, float]:
    """Linear probes on the frozen trained encoder and on a random one of the same architecture.

    Args:
        encoder: The trained encoder.
        random_encoder: Builds a freshly initialized encoder of the same architecture.
        train_data: Unaugmented training split (images, labels) the probe is fitted on.
        test_data: Eval split the probe is scored on.
        num_classes: Number of classes.

    Returns:
        `linear_eval_top_1`, `random_encoder_linear_eval_top_1` and `linear_eval_seconds`.
    """
    start = time.perf_counter()
    trained = probe.linear_probe_accuracy(
        *probe.encoder_features(encoder, train_data, test_data), num_classes
    )
    baseline = probe.linear_probe_accuracy(
        *probe.encoder_features(random_encoder(), train_data, test_data), num_classes
    )
    return {
        "linear_eval_top_1": trained,
        "random_encoder_linear_eval_top_1": baseline,
        "linear_eval_seconds": round(time.perf_counter() - start, 1),
    }
