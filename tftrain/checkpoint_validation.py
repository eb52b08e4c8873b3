"""Checks a checkpoint before restoring it: readable, and of the same variables and shapes.

Restoring with `tf.train.Checkpoint` assigns variables one by one, so a
mismatch found half-way leaves a model partly restored. These checks run first.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

VARIABLE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"


class CheckpointError(RuntimeError):
    """A checkpoint could not be used."""


class CorruptCheckpointError(CheckpointError):
    """No recorded checkpoint in a directory can be read."""


class IncompatibleCheckpointError(CheckpointError, ValueError):
    """A checkpoint does not fit the model (variables missing, extra, or of another shape)."""


def _escape(name: str) -> str:
    # How tf.train.Checkpoint escapes an object's name inside a checkpoint key.
    return name.replace(".", "..").replace("/", ".S")


def _variables_by_key(root: Any) -> dict[str, Any]:
    """Checkpoint key -> variable for everything `root` saves.

    A breadth-first walk over the object graph, naming each object by its
    first (shortest) path, as `tf.train.Checkpoint` names them.
    """
    view = tf.train.TrackableView(root)
    paths: dict[int, tuple[str, ...]] = {id(root): ()}
    queue, found = [root], {}
    while queue:
        parent = queue.pop(0)
        for name, child in view.children(parent).items():
            if id(child) in paths:
                continue
            paths[id(child)] = paths[id(parent)] + (name,)
            queue.append(child)
            if isinstance(child, (tf.Variable, keras.Variable)):
                key = "/".join(_escape(part) for part in paths[id(child)]) + VARIABLE_SUFFIX
                found[key] = child
    return found


def _describe(key: str, variable: Any = None) -> str:
    short = key[: -len(VARIABLE_SUFFIX)] if key.endswith(VARIABLE_SUFFIX) else key
    path = getattr(variable, "path", None) or getattr(variable, "name", None)
    return f"`{path}` (checkpoint key {short})" if path else f"checkpoint key {short}"


def _shape(shape: Any) -> tuple[int | None, ...]:
    return tuple(tf.TensorShape(shape).as_list())


def check_compatible(path: str, reader: tf.train.CheckpointReader, root: Any) -> None:
    """Raises `IncompatibleCheckpointError` if `root`'s variables do not match the checkpoint.

    Args:
        path: The checkpoint (for the message).
        reader: `tf.train.load_checkpoint(path)`.
        root: What would be restored (a `tf.train.Checkpoint`).
    """
    saved = {
        key: _shape(shape)
        for key, shape in reader.get_variable_to_shape_map().items()
        if key.endswith(VARIABLE_SUFFIX)
    }
    expected = _variables_by_key(root)
    problems = []
    for key, variable in expected.items():
        if key not in saved:
            problems.append(f"variable {_describe(key, variable)} of shape {_shape(variable.shape)} is not in the checkpoint")
        elif saved[key] != _shape(variable.shape):
            problems.append(
                f"variable {_describe(key, variable)} has shape {saved[key]} in the checkpoint "
                f"but {_shape(variable.shape)} in the model"
            )
    problems += [
        f"the checkpoint has {_describe(key)} of shape {shape}, which the model lacks"
        for key, shape in saved.items()
        if key not in expected
    ]
    if problems:
        listed = "\n  - ".join(problems[:10])
        more = f"\n  (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise IncompatibleCheckpointError(
            f"The checkpoint {path} does not fit this model; nothing was restored:\n  - {listed}{more}\n"
            "Expected the same model (and optimizer) as the run that wrote it. To train this model "
            "from scratch, use another `model_dir` (or move this one away)."
        )


def read_all_tensors(reader: tf.train.CheckpointReader) -> None:
    """Reads (and so checksums) every tensor of a checkpoint; raises on a damaged file.

    Variant tensors (a data iterator's state) cannot be read here; they are
    checked when they are restored.
    """
    for key, dtype in reader.get_variable_to_dtype_map().items():
        if dtype != tf.variant:
            reader.get_tensor(key)
