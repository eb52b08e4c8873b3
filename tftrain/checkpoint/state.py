"""What a checkpoint holds of a run: its progress, the training state, and the services' states.

`restore_model` loads a model (and its optimizer) from any tftrain checkpoint,
validated as a resume is.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import keras
import tensorflow as tf

from tftrain.checkpoint.validation import VARIABLE_SUFFIX, check_compatible, open_checkpoint, read_all_tensors
from tftrain.errors import CorruptCheckpointError

__all__ = [
    "CallTarget",
    "SERVICE_STATES",
    "SERVICE_STATES_KEY",
    "Progress",
    "check_built",
    "parse_service_states",
    "restore_model",
    "saved_service_states",
    "seed_generator_states",
    "training_state",
]

SERVICE_STATES = "service_states"
"""The name a checkpoint holds the services' states under: one JSON string, by service name."""

SERVICE_STATES_KEY = SERVICE_STATES + VARIABLE_SUFFIX
"""The checkpoint key of the services' states."""

# Where checkpoints written by earlier tftrain versions hold the services' states (read, never written).
_TIMING_KEY = "timing" + VARIABLE_SUFFIX


@dataclasses.dataclass
class Progress:
    """Where a training run is; it saves and loads itself under `progress/` in a checkpoint.

    Attributes:
        epoch: The epoch being trained (epochs completed, at an epoch end).
        step_in_epoch: Steps done in `epoch`.
        global_step: Training steps done in the whole run.
        batches_in_pass: Batches the training iterator has yielded since it
            started its current pass over the data (used to resume by
            skipping batches where the iterator itself cannot be saved).
    """

    name: ClassVar[str] = "progress"
    """The progress's name in a checkpoint: each field is the variable `progress/<field>`."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0
    batches_in_pass: int = 0

    @classmethod
    def key(cls, field: str) -> str:
        """A field's checkpoint key, e.g. `progress/global_step/.ATTRIBUTES/VARIABLE_VALUE`."""
        return f"{cls.name}/{field}{VARIABLE_SUFFIX}"

    @classmethod
    def variables(cls, global_step: tf.Variable | None = None) -> dict[str, tf.Variable]:
        """New variables to save a progress in, by field; `global_step`: the run's own counter, shared."""
        names = [f.name for f in dataclasses.fields(cls) if f.name != "global_step" or global_step is None]
        with tf.init_scope():
            made = {name: tf.Variable(0, dtype=tf.int64, trainable=False, name=name) for name in names}
        return {**made, "global_step": global_step} if global_step is not None else made

    def save_to(self, variables: Mapping[str, tf.Variable], shared: tf.Variable | None = None) -> None:
        """Assigns this progress to its variables (`variables`); `shared`, the run's counter, must agree already."""
        for field, variable in variables.items():
            if variable is shared and int(variable.numpy()) != self.global_step:
                raise RuntimeError(
                    f"tftrain internal error: the global step variable holds {int(variable.numpy())} "
                    f"but the run counted {self.global_step} steps; nothing was saved."
                )
            if variable is not shared:
                variable.assign(getattr(self, field))

    @classmethod
    def load(cls, variables: Mapping[str, tf.Variable]) -> Progress:
        """The progress its variables hold (restored from a checkpoint)."""
        return cls(**{field: int(variable.numpy()) for field, variable in variables.items()})

    @classmethod
    def read(cls, reader: tf.train.CheckpointReader) -> Progress:
        """A checkpoint's progress, read without restoring anything (a field it lacks reads 0)."""
        keys = {f.name: cls.key(f.name) for f in dataclasses.fields(cls)}
        return cls(**{field: int(reader.get_tensor(key)) for field, key in keys.items() if reader.has_tensor(key)})


@dataclasses.dataclass(frozen=True)
class CallTarget:
    """What a `fit` call trains to: `epochs`, or a step budget `total_steps`; saved in the run record.

    The target is not a variable of the checkpoint: a resume compares it as
    part of the run record (`tftrain.checkpoint.run_record`), where
    `record()` puts it, and takes a new one.

    Attributes:
        epochs: The epoch to train up to (exclusive), as `fit`'s `epochs`
            (with `total_steps`, the epochs the budget spans from the start).
        total_steps: The step budget, or None.
    """

    epochs: int
    total_steps: int | None = None

    def record(self) -> dict[str, int | None]:
        """The target's fields in the run record, by name."""
        return {"epochs": self.epochs, "total_steps": self.total_steps}

    def end_epoch(self, progress: Progress, steps_per_epoch: int | None, *, resumed: bool) -> int:
        """The epoch (exclusive) at which the call reaches its target, from `progress`.

        With `epochs`, that is `epochs`. A step budget counts steps, not
        epochs: a resumed run trains the steps left to `total_steps` (none if
        it is reached), so a rerun finishes the budget and a larger one
        extends it, whatever epoch the restored progress is in.
        """
        if self.total_steps is None or not resumed:
            return self.epochs
        remaining = self.total_steps - progress.global_step
        if remaining <= 0:
            return progress.epoch
        per_epoch = steps_per_epoch or self.total_steps
        left_in_epoch = per_epoch - progress.step_in_epoch if progress.step_in_epoch else 0
        more_epochs = math.ceil(max(0, remaining - left_in_epoch) / per_epoch)
        return progress.epoch + (1 if left_in_epoch else 0) + more_epochs

    def planned_steps(self, steps_per_epoch: int | None) -> int | None:
        """The steps the call trains from the start, where known."""
        if self.total_steps is not None:
            return self.total_steps
        return self.epochs * steps_per_epoch if steps_per_epoch else None

    def reached_message(self, progress: Progress) -> tuple[str, str]:
        """The target as the user wrote it, and the larger target that would train on from `progress`."""
        if self.total_steps is not None:
            return f"total_steps={self.total_steps}", f"total_steps > {progress.global_step}"
        return f"epochs={self.epochs}", f"epochs > {progress.epoch}"


def seed_generator_states(model: keras.Model) -> list[keras.Variable]:
    """The model's random-generator states: its variables that are not weights.

    Keras layers that draw random numbers (Dropout, GaussianNoise, random
    augmentation) keep a `SeedGenerator` whose state is a variable listed in
    `model.variables` but not in `model.weights`.
    """
    weights = {id(variable) for variable in model.weights}
    return [variable for variable in model.variables if id(variable) not in weights]


def training_state(
    model: keras.Model, extra: Mapping[str, Any] | None = None, *, metrics: bool = True
) -> dict[str, Any]:
    """The trackable objects that make up a model's training state.

    Args:
        model: The model (its optimizer comes with it).
        extra: More trackables to save by name, e.g. a second optimizer.
        metrics: Include the metrics' state (needed to resume mid-epoch).

    Returns:
        A dict of name -> trackable for `tf.train.Checkpoint`.
    """
    state: dict[str, Any] = {"model": model, "seed_states": seed_generator_states(model)}
    if metrics:
        state["metrics"] = [variable for metric in model.metrics for variable in metric.variables]
    if getattr(model, "optimizer", None) is not None:
        state["optimizer"] = model.optimizer
    state.update(extra or {})
    return state


def restore_model(model: keras.Model, path: str, *, include_optimizer: bool = True) -> str:
    """Restores a model (and its optimizer) from a tftrain checkpoint, validated first.

    For evaluating or exporting a saved state: the best checkpoint
    (`model_dir/best`), a chosen step (`model_dir/checkpoints/ckpt-3000`).
    Every tensor is read and every variable checked by name and shape before
    anything is assigned, as a resuming `fit` does; the rest of the saved
    state (progress, data iterator, metrics) is left alone.

    Args:
        model: The model, built (its variables exist).
        path: A checkpoint path prefix (`.../ckpt-3000`), or a directory
            (its latest checkpoint is used).
        include_optimizer: Also restore `model.optimizer`'s state (its
            variables are created first if needed).

    Returns:
        The checkpoint path restored.

    Raises:
        CheckpointError: `path` holds no checkpoint.
        CorruptCheckpointError: the checkpoint cannot be read.
        IncompatibleCheckpointError: it does not fit the model (nothing restored).
        ValueError: the model is not built.
    """
    path, reader = open_checkpoint(path)
    check_built(model, f"restore {path}")
    _read_every_tensor(path, reader)
    state: dict[str, Any] = {"model": model}
    optimizer = getattr(model, "optimizer", None)
    if include_optimizer and optimizer is not None:
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        state["optimizer"] = optimizer
    root = tf.train.Checkpoint(**state)
    check_compatible(path, reader, root, only=tuple(state))
    root.read(path).expect_partial()
    return path


def check_built(model: keras.Model, what: str, where: str = "") -> None:
    """Raises a ValueError where the model is not built: its variables do not exist to `what` (e.g. "resume from ...") into."""
    if not model.built:
        raise ValueError(
            f"Cannot {what}: the model is not built yet, so its variables do not exist to be restored. Expected a "
            f"built model: call it once on a batch, or `model.build(input_shape)`{where}."
        )


def _read_every_tensor(path: str, reader: tf.train.CheckpointReader) -> None:
    """Reads every tensor once, so a damaged file fails before anything is assigned."""
    try:
        read_all_tensors(reader)
    except tf.errors.OpError as error:
        raise CorruptCheckpointError(f"The checkpoint {path} cannot be read: {error}") from error


def saved_service_states(reader: tf.train.CheckpointReader) -> dict[str, Any]:
    """The services' states a checkpoint holds, by service name, read without restoring anything.

    Read under `SERVICE_STATES`, else under "timing", where checkpoints of
    earlier tftrain versions hold them; empty if the checkpoint holds none.
    """
    for key in (SERVICE_STATES_KEY, _TIMING_KEY):
        if reader.has_tensor(key):
            return parse_service_states(reader.get_tensor(key))
    return {}


def parse_service_states(saved: bytes) -> dict[str, Any]:
    """The services' states from a checkpoint's JSON string."""
    text = saved.decode() if isinstance(saved, bytes) else str(saved)
    states = json.loads(text) if text else {}
    if "timer" in states:  # a checkpoint written before services kept state: the timer's alone
        states = {"timing": states}
    return states
