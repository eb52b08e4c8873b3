"""Checkpoints for exact resume: what is saved, crash-safe saving, validated restore.

The storage layer. It knows nothing of the loop or of services: it imports
only lower layers (`tftrain.fit_inputs` for a shuffled pass's order, `summaries`,
`arguments`, `options`, `compat`, `errors`).

- `checkpointer`: `Checkpointer` (save; find -> validate -> restore).
- `state`: what a checkpoint holds (`Progress`, `training_state`), and
  `restore_model`.
- `files`: a checkpoint directory's files (recorded checkpoints, leftovers
  of interrupted saves, damaged ones set aside).
- `native_log`: TensorFlow's per-save INFO lines kept out of the log.
- `validation`: reading a checkpoint whole and checking it against the model
  before anything is assigned.
- `warm_start`: initializing a new run from another run's checkpoint.
- `layout`: every path under a `model_dir`.
- `writer_lock`: one writer per `model_dir`, and the check that the
  directory is still the run's.
- `data_position`: `DataPosition`, the input pipeline's position as one piece of a
  run's state (its mode, a pass's offset and order, the iterator), saved and loaded as one.
- `run_record`: what a run's results depend on, saved with its checkpoints
  and compared at every resume (changes taken, or refused).
"""

from tftrain.arguments import check_directory_path
from tftrain.checkpoint.checkpointer import Checkpointer, ValidatedCheckpoint
from tftrain.checkpoint.files import CHECKPOINT_NAME
from tftrain.checkpoint.state import Progress, restore_model, seed_generator_states, training_state
from tftrain.checkpoint.validation import VARIABLE_SUFFIX, ensure_writable_directory, open_checkpoint
from tftrain.checkpoint.warm_start import WarmStartReport, warm_start
from tftrain.errors import (
    CheckpointError,
    CheckpointWriteError,
    CorruptCheckpointError,
    IncompatibleCheckpointError,
    ModelDirError,
    ModelDirInUseError,
    NonFiniteStateError,
    RunChangedError,
)

__all__ = [
    "restore_model",
    "warm_start",
    "WarmStartReport",
    "ModelDirInUseError",
    "ModelDirError",
    "CHECKPOINT_NAME",
    "CheckpointError",
    "CheckpointWriteError",
    "Checkpointer",
    "CorruptCheckpointError",
    "IncompatibleCheckpointError",
    "NonFiniteStateError",
    "Progress",
    "RunChangedError",
    "ValidatedCheckpoint",
    "VARIABLE_SUFFIX",
    "check_directory_path",
    "open_checkpoint",
    "ensure_writable_directory",
    "seed_generator_states",
    "training_state",
]
