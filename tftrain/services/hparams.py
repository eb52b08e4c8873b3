"""The run in TensorBoard's HParams tab: its record as the run's hyperparameters, its last epoch's logs as its metrics.

TensorBoard's HParams plugin reads a "session" from a run directory that
holds a session-start summary: the hyperparameters of the run, with the
scalars of that directory and of its subdirectories (`train/`,
`validation/`) as the run's metrics, each at its last value. With a
`model_dir`, the Trainer writes at the start of every `fit`:

* the run record (`tftrain.checkpoint.run_record`) as the hyperparameters,
  each value once, under one name, with its own type (`hparams_of`): the
  user's own values (`Trainer(hparams=...)`, e.g. a program's flags) under
  their names, the Trainer's options as `trainer.<option>`, then the
  optimizer and its hyperparameters, the loss and metrics, the data, the
  versions. Lists are shown as JSON text; the model's layers, the
  optimizer's variables, the command line and the run's directory are
  left out; None is not shown;

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
from tftrain.checkpoint.run_record import (
    COMMAND_LINE,
    HPARAMS_PREFIX,
    OPTIMIZERS_PREFIX,
    TRAINER_FLAGS_PREFIX,
)
from tftrain.services.protocol import RunState, Service
from tftrain.services.tensorboard import WriteGuard

__all__ = ["HIDDEN_KEYS", "HParamsService", "hparams_of", "trial_id"]

HIDDEN_KEYS = frozenset({"model.layers", "model.layer_names", "model.layer_configs", "optimizer.variables"})
"""Record entries not shown as hyperparameters: the model's and optimizer's structure (checked at resume)."""

# The record's entries that are no Trainer option, by their name in the table (where each is in a group).
_COLUMNS = {
    "optimizer": "optimizer.class",
    "loss": "model.loss",
    "metrics": "model.metrics",
    "dtype_policy": "model.dtype_policy",
    "replicas": "strategy.replicas",
}

# The user's values recorded but not shown: the command line (each flag in it is a column) and the
# run's directory (the row's own name, `trial_id`).
_NOT_SHOWN = (COMMAND_LINE, TRAINER_FLAGS_PREFIX + "model_dir")

_Plain = bool | int | float | str


def hparams_of(record: Mapping[str, Any]) -> dict[str, _Plain]:
    """The record as TensorBoard's hyperparameters: each value once, under one name, with its own type.

    The columns, in three groups:

    * the user's own values (`Trainer(hparams=...)`: a program's own flags)
      under their names (`learning_rate`, `width`);
    * the Trainer's options, `fit`'s budget and the strategy's flags under
      `trainer.<option>` (`trainer.steps_per_loop`), each once: the
      record's own value, or the program's flag for it;
    * the rest of the record under its groups: `optimizer.class` and
      `optimizer.<hyperparameter>`, `model.loss`, `model.metrics`,
      `model.dtype_policy`, `data.<field>`, `strategy.replicas`,
      `versions.<package>`.

    A value of the record that a user's value of the same name already
    shows (a program's `learning_rate` flag and `optimizer.learning_rate`,
    equal; a `batch_size` flag and `data.global_batch_size`, equal) is
    shown once, under the user's name. Numbers are numbers, bools
    bools, lists JSON text; None, the command line (its flags are columns),
    the run's directory (the row's own name) and the model's and optimizer's
    structure are left out.

    Args:
        record: A run record (`tftrain.checkpoint.run_record.build`).

    Returns:
        The hyperparameters by column name: the user's, then the Trainer's options, then the rest.
    """
    users: dict[str, _Plain] = {}
    flagged: dict[str, _Plain] = {}  # a program's flags for the Trainer's options
    options: dict[str, _Plain] = {}  # the options the record holds itself
    rest: dict[str, _Plain] = {}
    for key, value in sorted(record.items()):
        if key in HIDDEN_KEYS or key.endswith(".variables") or value is None:
            continue
        shown = value if isinstance(value, _Plain) else json.dumps(value, sort_keys=True)
        if key.startswith(HPARAMS_PREFIX):
            name = key[len(HPARAMS_PREFIX) :]
            if name not in _NOT_SHOWN:
                (flagged if name.startswith(TRAINER_FLAGS_PREFIX) else users)[name] = shown
        elif key.startswith(OPTIMIZERS_PREFIX) and "." not in key[len(OPTIMIZERS_PREFIX) :]:
            rest[f"{key}.class"] = shown
        elif "." in key or key in _COLUMNS:
            rest[_COLUMNS.get(key, key)] = shown
        else:  # a Trainer option the record holds itself: its value is the one in effect
            options[TRAINER_FLAGS_PREFIX + key] = shown
    library = {**flagged, **options, **rest}  # an option's value in effect over its flag's
    for name, value in users.items():
        for column in [column for column in library if _short_name(column) == name.rsplit(".", 1)[-1]]:
            if _same(library[column], value):
                del library[column]
    clashing = {name for name in users if name in library}  # a user's name that is a column of the record's
    users = {(HPARAMS_PREFIX + name if name in clashing else name): value for name, value in users.items()}
    return {**users, **library}


# Record columns a program's value of another name stands for: a `batch_size` flag is the global batch.
_ALSO_NAMED = {"data.global_batch_size": "batch_size"}


def _short_name(column: str) -> str:
    """The name a user's value shows `column` under: its last part, or the name it is also known by."""
    return _ALSO_NAMED.get(column, column.rsplit(".", 1)[-1])


def _same(one: _Plain, other: _Plain) -> bool:
    """Equal values of one kind (a bool is no number here)."""
    return isinstance(one, bool) == isinstance(other, bool) and isinstance(one, str) == isinstance(other, str) and one == other


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
