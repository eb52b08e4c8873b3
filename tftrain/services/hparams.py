"""The run in TensorBoard's HParams tab: its record as the run's hyperparameters, its last epoch's logs as its metrics.

TensorBoard's HParams plugin reads a "session" from a run directory that
holds a session-start summary: the hyperparameters of the run, with the
scalars of that directory and of its subdirectories (`train/`,
`validation/`) as the run's metrics, each at its last value. With a
`model_dir`, the Trainer writes at the start of every `fit`:

* the run record (`tftrain.checkpoint.run_record`) as the hyperparameters:
  the optimizer and its hyperparameters, the loss and metrics, the data,
  the options, the target, the versions, and the user's own values
  (`Trainer(hparams=...)`, e.g. a program's flags and command line). Lists
  are shown as JSON text; the model's layers and the optimizer's variables
  are left out (structure, not hyperparameters); None is not shown;

named by the run directory's name and a short hash of its full path (a row
per run, readable in the table: `lr0.1-3f2a9c`), and at each epoch end the
epoch's logs under their Keras names (`loss`,
`val_accuracy`, ...) in `model_dir` itself, so the last epoch's are the
run's final metrics, then, when `fit` ends without an error, the session's
end. Several runs under one log directory (`tensorboard --logdir root`
over `root/run_a`, `root/run_b`) compare as rows of the HParams tab's table
and lines of its parallel-coordinates view.

A resumed run writes to the same directory and so stays one session.
TensorBoard keeps the first session-start summary a directory holds: a
value a resume changed (a learning rate) is shown as the run started it;
the change is logged and kept in `model_dir/run_record.json`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow as tf

from tftrain import summaries
from tftrain.services.protocol import RunState, Service
from tftrain.services.tensorboard import WriteGuard

__all__ = ["HIDDEN_KEYS", "HParamsService", "hparams_of", "trial_id"]

HIDDEN_KEYS = frozenset({"model.layers", "model.layer_names", "model.layer_configs", "optimizer.variables"})
"""Record entries not shown as hyperparameters: the model's and optimizer's structure (checked at resume)."""


def hparams_of(record: Mapping[str, Any]) -> dict[str, bool | int | float | str]:
    """The record's entries as TensorBoard hyperparameters: plain values as they are, lists as JSON, None left out.

    Args:
        record: A run record (`tftrain.checkpoint.run_record.build`).

    Returns:
        The hyperparameters by the record's names (`optimizer.learning_rate`, `hparams.<yours>`).
    """
    values: dict[str, bool | int | float | str] = {}
    for key, value in sorted(record.items()):
        if key in HIDDEN_KEYS or key.endswith(".variables") or value is None:
            continue
        values[key] = value if isinstance(value, bool | int | float | str) else json.dumps(value, sort_keys=True)
    return values


def trial_id(log_dir: str) -> str:
    """The run's name in the HParams tab: its directory's name and a short hash of its full path, e.g. `lr0.1-3f2a9c`.

    TensorBoard makes one row of the runs that share a name (repeats of one
    configuration): the hash keeps runs of the same name in other
    directories apart.
    """
    path = os.path.abspath(log_dir) if "://" not in log_dir else log_dir
    digest = hashlib.sha256(path.encode()).hexdigest()[:6]
    return f"{os.path.basename(os.path.normpath(log_dir)) or 'run'}-{digest}"


class HParamsService(Service):
    """Writes the run to TensorBoard's HParams plugin: its record at the start, its epochs' logs, its end.

    Args:
        log_dir: The run's directory (`model_dir`): the session's TensorBoard run.
        record: The call's run record.
    """

    name = "hparams"

    def __init__(self, log_dir: str, record: Mapping[str, Any]):
        self.log_dir = str(log_dir)
        self.hparams = hparams_of(record)
        self.trial_id = trial_id(self.log_dir)
        self._guard = WriteGuard(self.log_dir)
        self._writer: Any = None
        self._started = False

    def _write(self, step: int, write: Callable[[], Any]) -> None:
        """Runs `write` with the run directory's writer as the default, at `step`, and flushes it."""

        def run() -> None:
            if self._writer is None:
                with tf.init_scope():
                    self._writer = tf.summary.create_file_writer(self.log_dir)
            with tf.init_scope(), self._writer.as_default(step=step), tf.summary.record_if(True):
                write()
            self._writer.flush()

        self._guard.run(run)

    def before_call(self, run: RunState) -> None:
        if not self._started:
            self._started = True
            from tensorboard.plugins.hparams import summary_v2  # only runs with a model_dir need it

            self._write(run.progress.global_step, lambda: summary_v2.hparams(self.hparams, trial_id=self.trial_id))

    def end_epoch(self, run: RunState, logs: dict[str, Any]) -> None:
        def write() -> None:
            for name, value in summaries.scalars(logs).items():
                tf.summary.scalar(name, value)

        self._write(run.progress.global_step, write)

    def close(self) -> None:
        # Called as the run ends, by its `finally`: an exception in flight is the run's own.
        if self._started and sys.exc_info()[0] is None:
            from tensorboard.plugins.hparams import api_pb2
            from tensorboard.plugins.hparams import summary as hparams_summary

            end = hparams_summary.session_end_pb(api_pb2.STATUS_SUCCESS).SerializeToString()
            self._write(0, lambda: tf.summary.experimental.write_raw_pb(end, step=0))
        if self._writer is not None:
            try:
                self._writer.close()
            except (tf.errors.OpError, OSError):
                pass  # what could not be flushed was warned
