"""Continuous evaluation: evaluate each checkpoint of a `model_dir` as training writes it.

Orbit's `evaluate_continuously` for tftrain. A second process (or the same
one, after training) watches `model_dir/checkpoints`, restores each new
checkpoint into its own model (validated first, as `restore_model` does),
evaluates it with `Trainer.evaluate`, and writes the logs at that checkpoint's
global step to TensorBoard (`model_dir/eval`) and to
`model_dir/eval/results.json`. The evaluator only reads the checkpoints and the
writer lock: it never writes into `model_dir/checkpoints` nor takes the lock.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tftrain import arguments, layout, summaries
from tftrain.arguments import check_int
from tftrain.checkpoint import CheckpointError, IncompatibleCheckpointError, Progress, restore_model
from tftrain.checkpoint.writer_lock import live_writer, write_json
from tftrain.errors import EvaluationTimeoutError
from tftrain.layout import EVAL_RUN, LOCK_NAME, RESULTS_FILE, ModelDirLayout

__all__ = ["EVAL_RUN", "RESULTS_FILE", "EvaluationTimeoutError", "evaluate_continuously", "read_results"]

_GLOBAL_STEP_KEY = Progress.key("global_step")
_LOGGER = logging.getLogger("tftrain")


def read_results(model_dir: str) -> dict[int, dict[str, float]]:
    """The results a continuous evaluator wrote for `model_dir`: global step -> logs, by step.

    Args:
        model_dir: The training run's directory.

    Returns:
        The logs of every evaluated checkpoint (empty if none was evaluated).

    Raises:
        ValueError: `model_dir/eval/results.json` exists but is not such a file.
    """
    path = ModelDirLayout(os.fspath(model_dir)).results
    if not tf.io.gfile.exists(path):
        return {}
    with tf.io.gfile.GFile(path) as handle:
        text = handle.read()
    try:
        saved = json.loads(text)
        results = {
            int(step): {str(key): float(value) for key, value in logs.items()} for step, logs in saved.items()
        }
    except (ValueError, TypeError, AttributeError) as error:
        raise ValueError(
            f"The evaluation results file {path} cannot be read ({error}). Expected the JSON object "
            "{step: {log: value}} a continuous evaluator writes; move it away to evaluate every "
            "checkpoint again."
        ) from error
    return dict(sorted(results.items()))


def evaluate_continuously(
    trainer: Any,
    x: Any = None,
    y: Any = None,
    *,
    model_dir: str | None = None,
    batch_size: int | None = None,
    steps: int | None = None,
    sample_weight: Any = None,
    callbacks: list[keras.callbacks.Callback] | None = None,
    verbose: int | str = 0,
    timeout_s: float | None = 3600.0,
    poll_interval_s: float = 1.0,
    last_step: int | None = None,
) -> dict[int, dict[str, float]]:
    """Evaluates each checkpoint of `model_dir` as training writes it (Orbit's `evaluate_continuously`).

    Waits for checkpoints in `model_dir/checkpoints`, oldest first. Each one
    not evaluated yet is restored into `trainer.model` (its weights only:
    not the optimizer nor a Trainer subclass's extra state; every variable is
    checked by name and shape first) and evaluated with
    `trainer.evaluate(x, y, ...)`. Its logs go to TensorBoard at the
    checkpoint's global step (run `model_dir/eval`, one scalar per log key)
    and to `model_dir/eval/results.json` (written atomically), so an evaluator
    restarted on the same directory skips the steps evaluated already.

    It returns after evaluating a checkpoint at `last_step` or later; without
    `last_step`, once no live training process holds `model_dir/writer.lock`
    and every checkpoint there is evaluated (so after training it evaluates
    what is there and returns). A checkpoint rotated away (`max_to_keep`)
    before it could be read is skipped with a warning on the `tftrain`
    logger.

    Args:
        trainer: The `tftrain.Trainer` whose model and steps evaluate (its
            model built, with the training run's architecture).
        x: Evaluation inputs, as for `Trainer.evaluate`; data that can be
            iterated again for each checkpoint (arrays, a `tf.data.Dataset`, a
            `keras.utils.PyDataset`), not an iterator or generator.
        y: Targets, for array inputs only.
        model_dir: The training run's directory (default: `trainer.model_dir`).
            It may not exist yet: training may not have started.
        batch_size: Batch size for array inputs, as for `evaluate`.
        steps: Evaluation steps per checkpoint; None: one pass over the data.
        sample_weight: Per-example weights, for array inputs only.
        callbacks: Keras callbacks for each evaluation (`on_test_*` hooks).
        verbose: As for `evaluate`; 0 (the default) is silent.
        timeout_s: Seconds to wait for a new checkpoint before giving up
            (`EvaluationTimeoutError`); None waits without limit.
        poll_interval_s: Seconds between looks at `model_dir`.
        last_step: Stop after evaluating a checkpoint at this global step or
            later (the run's last step); a training process that stops and is
            restarted (preemption) is then waited for. None: stop when no
            training process runs and everything present is evaluated.

    Returns:
        Global step -> logs of every checkpoint evaluated in `model_dir`
        (those of earlier evaluators on it included), by step.

    Raises:
        EvaluationTimeoutError: no new checkpoint within `timeout_s`.
        tftrain.checkpoint.IncompatibleCheckpointError: a checkpoint does not
            fit the model (nothing of it restored).
        tftrain.checkpoint.CheckpointError: a checkpoint cannot be read.
        ValueError, TypeError: a bad argument.
    """
    model_dir = _check_arguments(trainer, x, model_dir, verbose, timeout_s, poll_interval_s, last_step)
    evaluate = functools.partial(
        trainer.evaluate,
        x,
        y,
        batch_size=batch_size,
        verbose=verbose,
        sample_weight=sample_weight,
        steps=steps,
        callbacks=callbacks,
        return_dict=True,
    )
    checkpoint_dir = ModelDirLayout(model_dir).checkpoints
    results = read_results(model_dir)
    writer = summaries.TrainingSummaries(model_dir)
    step_of: dict[str, int | None] = {}  # checkpoint path -> its global step (None: rotated away)
    newest = None
    waiting_since = time.monotonic()
    try:
        # Our own wait rather than `tf.train.checkpoints_iterator`: that one yields only the latest
        # checkpoint (a slow evaluation misses those written meanwhile) and cannot tell a finished
        # run (no writer left) from a slow one.
        while True:
            # The writer first: a run records its last checkpoint before it releases the lock.
            training = live_writer(model_dir) is not None
            listed = _recorded(checkpoint_dir)
            for path in listed:
                newest = path
                if path not in step_of:
                    step_of[path] = _global_step(path)
                step = step_of[path]
                if step is None or step in results:
                    continue
                logs = _evaluate(trainer.model, path, evaluate)
                if logs is None:
                    step_of[path] = None
                    continue
                results[step] = logs
                writer.write(EVAL_RUN, step, logs)
                writer.flush()
                _write_results(model_dir, results)
                waiting_since = time.monotonic()
                if last_step is not None and step >= last_step:
                    return dict(sorted(results.items()))
            if last_step is not None and results and max(results) >= last_step:
                return dict(sorted(results.items()))
            if last_step is None and listed and not training:
                return dict(sorted(results.items()))
            waited = time.monotonic() - waiting_since
            if timeout_s is not None and waited >= timeout_s:
                raise _timeout_error(model_dir, waited, newest, last_step, training)
            remaining = float("inf") if timeout_s is None else timeout_s - waited
            time.sleep(min(poll_interval_s, remaining))
    finally:
        writer.close()


def _check_arguments(
    trainer: Any, x: Any, model_dir: Any, verbose: Any, timeout_s: Any, poll_interval_s: Any, last_step: Any
) -> str:
    """Every argument checked before any waiting; returns the model directory."""
    # A Trainer by what it does (tftrain.trainer imports this module, not the reverse).
    if not (
        callable(getattr(trainer, "evaluate", None))
        and isinstance(getattr(trainer, "model", None), keras.Model)
    ):
        raise TypeError(
            f"Invalid value for argument `trainer`. Received: trainer={trainer!r}. Expected a "
            "tftrain.Trainer (its model and eval_step evaluate each checkpoint)."
        )
    if x is None or isinstance(x, Iterator):
        raise TypeError(
            f"Invalid value for argument `x`. Received: x={x!r}. Expected data that can be iterated "
            "again for each checkpoint: arrays, a tf.data.Dataset or a keras.utils.PyDataset (a "
            "generator or iterator would be used up by the first evaluation)."
        )
    arguments.check_verbose(verbose)
    _check_seconds("timeout_s", timeout_s, optional=True)
    _check_seconds("poll_interval_s", poll_interval_s)
    check_int("last_step", last_step, optional=True)
    model_dir = trainer.model_dir if model_dir is None else model_dir
    if model_dir is None:
        raise ValueError(
            "Invalid value for argument `model_dir`. Received: model_dir=None, and the trainer has no "
            "`model_dir`. Expected the directory of the training run to evaluate "
            "(`Trainer(..., model_dir=...)` or `model_dir=...`)."
        )
    given = arguments.check_path_not_empty(model_dir, "model_dir")
    model_dir = layout.resolve(given, "model_dir")  # once: the evaluation reads and writes there throughout
    if tf.io.gfile.exists(model_dir) and not tf.io.gfile.isdir(model_dir):
        raise ValueError(
            f"Invalid value for argument `model_dir`. Received: model_dir={given!r}, a file. "
            "Expected the directory of a training run (`Trainer(..., model_dir=...)`)."
        )
    return model_dir


def _check_seconds(argument: str, value: Any, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float | np.integer | np.floating)
        or not value > 0
    ):
        expected = f"{'None or ' if optional else ''}a number of seconds > 0"
        raise ValueError(
            f"Invalid value for argument `{argument}`. Received: {argument}={value!r}. Expected {expected}."
        )


def _recorded(checkpoint_dir: str) -> list[str]:
    """The checkpoints the training run has recorded (oldest first): complete ones only."""
    state = tf.train.get_checkpoint_state(checkpoint_dir)
    if state is None:  # no checkpoint recorded yet, or no directory
        return []
    # The state file may name the directory as the writer saw it: join the base names to ours.
    return [os.path.join(checkpoint_dir, os.path.basename(path)) for path in state.all_model_checkpoint_paths]


def _gone(path: str) -> bool:
    return not tf.io.gfile.exists(path + ".index")


def _skip_rotated(path: str) -> None:
    _LOGGER.warning(
        "tftrain: skipping %s: it was deleted (rotated away by `max_to_keep`) before it could be evaluated.",
        path,
    )


def _global_step(path: str) -> int | None:
    """The global step a checkpoint was saved at (from its progress), or None if it is gone."""
    try:
        reader = tf.train.load_checkpoint(path)
    except (tf.errors.NotFoundError, ValueError):
        if _gone(path):
            _skip_rotated(path)
            return None
        raise
    if not reader.has_tensor(_GLOBAL_STEP_KEY):
        raise CheckpointError(
            f"The checkpoint {path} holds no training progress (global step). Expected a checkpoint a "
            "tftrain training run wrote to `model_dir/checkpoints`."
        )
    return int(reader.get_tensor(_GLOBAL_STEP_KEY))


def _evaluate(
    model: keras.Model, path: str, evaluate: Callable[[], dict[str, Any]]
) -> dict[str, float] | None:
    """Restores and evaluates one checkpoint; None if it was rotated away before it could be restored."""
    try:
        restore_model(model, path, include_optimizer=False)
    except IncompatibleCheckpointError:
        raise
    except (CheckpointError, tf.errors.OpError):
        if _gone(path):
            _skip_rotated(path)
            return None
        raise
    logs = evaluate()
    _LOGGER.info("tftrain: evaluated %s: %s", path, logs)
    return summaries.scalars(logs)


def _write_results(model_dir: str, results: dict[int, dict[str, float]]) -> None:
    """Writes results.json atomically: a reader (or a restarted evaluator) sees the old or the new file."""
    paths = ModelDirLayout(model_dir)
    tf.io.gfile.makedirs(paths.evaluation)
    write_json(paths.results, {str(step): logs for step, logs in sorted(results.items())}, indent=1)


def _timeout_error(
    model_dir: str, waited: float, newest: str | None, last_step: int | None, training: bool
) -> EvaluationTimeoutError:
    if not tf.io.gfile.isdir(model_dir):
        seen = f"{model_dir} does not exist"
    elif newest is None:
        seen = f"{ModelDirLayout(model_dir).checkpoints} holds no checkpoint"
    else:
        seen = f"the newest checkpoint seen is {newest}"
    writer = (
        "a training process is writing to it" if training else f"no training process holds its {LOCK_NAME}"
    )
    goal = f" (waiting for step {last_step})" if last_step is not None else ""
    return EvaluationTimeoutError(
        f"No new checkpoint in {model_dir} for {waited:.1f} s{goal}: {seen}, and {writer}. "
        "Expected a training run writing checkpoints there (`Trainer(..., model_dir=...)`): check the "
        "path and that training runs, or raise `timeout_s` if checkpoints are far apart."
    )
