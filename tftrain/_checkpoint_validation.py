"""Checks before checkpointing: a writable directory; a readable checkpoint with the same variables.

Restoring with `tf.train.Checkpoint` assigns variables one by one, so a
mismatch found half-way leaves a model partly restored. These checks run first.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import keras
import tensorflow as tf

from tftrain import _keras_compat

VARIABLE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


class CheckpointError(RuntimeError):
    """A checkpoint could not be used."""


class CorruptCheckpointError(CheckpointError):
    """No recorded checkpoint in a directory can be read."""


class IncompatibleCheckpointError(CheckpointError, ValueError):
    """A checkpoint does not fit the model (variables missing, extra, or of another shape)."""


def _is_variable(value: Any) -> bool:
    return isinstance(value, (tf.Variable, keras.Variable))


def _live_variables(root: Any) -> list[Any]:
    """Every variable reachable from `root` in its object graph (what a save would write)."""
    view = tf.train.TrackableView(root)
    seen, queue, found = {id(root)}, [root], []
    while queue:
        for child in view.children(queue.pop(0)).values():
            if id(child) not in seen:
                seen.add(id(child))
                queue.append(child)
                if _is_variable(child):
                    found.append(child)
    return found


def _match_saved_graph(reader: tf.train.CheckpointReader, root: Any):
    """Walks the checkpoint's object graph alongside the live one, as a restore does.

    Returns:
        `(matched, unmatched)`: live variable id -> (variable, checkpoint key),
        and `(checkpoint key, saved name)` of each saved variable with no live
        counterpart (the name the saving run gave it; empty if not recorded).
    """
    graph = _keras_compat.trackable_object_graph()
    graph.ParseFromString(reader.get_tensor(OBJECT_GRAPH_KEY))
    view = tf.train.TrackableView(root)
    matched: dict[int, tuple[Any, str]] = {}
    orphans: dict[str, str] = {}
    # A saved object can be reached by several paths (a kernel is both a layer's and
    # the optimizer's); a path that is missing live must not hide one that exists.
    visited_live: set[int] = set()
    visited_orphan: set[int] = set()
    queue: list[tuple[int, Any]] = [(0, root)]
    while queue:
        node_id, live = queue.pop(0)
        visited = visited_orphan if live is None else visited_live
        if node_id in visited:
            continue
        visited.add(node_id)
        node = graph.nodes[node_id]
        for attribute in node.attributes:
            if attribute.name != "VARIABLE_VALUE":
                continue
            if _is_variable(live):
                matched[id(live)] = (live, attribute.checkpoint_key)
            else:
                orphans[attribute.checkpoint_key] = attribute.full_name
        children = view.children(live) if live is not None and not _is_variable(live) else {}
        for reference in node.children:
            queue.append((reference.node_id, children.get(reference.local_name)))
    matched_keys = {key for _, key in matched.values()}
    return matched, [(key, orphans[key]) for key in sorted(orphans.keys() - matched_keys)]


def _name(variable: Any) -> str:
    return getattr(variable, "path", None) or variable.name


def _describe(key: str, variable: Any = None, saved_name: str = "") -> str:
    short = key[: -len(VARIABLE_SUFFIX)] if key.endswith(VARIABLE_SUFFIX) else key
    name = _name(variable) if variable is not None else saved_name
    return f"`{name}` (checkpoint key {short})" if name else f"checkpoint key {short}"


def _shape(shape: Any) -> tuple[int | None, ...]:
    return tuple(tf.TensorShape(shape).as_list())


def check_compatible(
    path: str, reader: tf.train.CheckpointReader, root: Any, *, only: tuple[str, ...] | None = None
) -> None:
    """Raises `IncompatibleCheckpointError` if `root`'s variables do not match the checkpoint.

    The checkpoint's object graph is matched to the live objects by name, as
    `tf.train.Checkpoint` does when it restores; every live variable must find
    a saved tensor of its shape, and every saved variable a live one.

    Args:
        path: The checkpoint (for the message).
        reader: `tf.train.load_checkpoint(path)`.
        root: What would be restored (a `tf.train.Checkpoint`).
        only: Compare only the saved objects under these names of the
            checkpoint's root (e.g. `("model",)`); None: everything saved.
    """
    shapes = reader.get_variable_to_shape_map()
    matched, unmatched = _match_saved_graph(reader, root)
    problems = []
    for variable in _live_variables(root):
        if id(variable) not in matched:
            problems.append(
                f"variable `{_name(variable)}` of shape {_shape(variable.shape)} is not in the checkpoint"
            )
            continue
        _, key = matched[id(variable)]
        if _shape(shapes[key]) != _shape(variable.shape):
            problems.append(
                f"variable {_describe(key, variable)} has shape {_shape(shapes[key])} in the checkpoint "
                f"but {_shape(variable.shape)} in the model"
            )
    if only is not None:
        unmatched = [(key, name) for key, name in unmatched if key.split("/", 1)[0] in only]
    problems += [
        f"the checkpoint has {_describe(key, saved_name=name)} of shape {_shape(shapes[key])}, "
        "which the model lacks"
        for key, name in unmatched
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


def check_directory_path(path: Any, argument: str) -> str:
    """Checks, without creating or writing anything, that `path` can be a writable directory.

    Local paths only are checked for permissions (a remote one, e.g. `gs://`,
    is checked when the run creates it).

    Returns:
        `path` as a string.

    Raises:
        TypeError: `path` is not a path.
        ValueError: `path` is a file, or it (or the directory it would be
            created in) is not writable.
    """
    if not isinstance(path, (str, bytes)) and not hasattr(path, "__fspath__"):
        raise TypeError(
            f"Invalid value for argument `{argument}`. Received: {argument}={path!r}. "
            "Expected a directory path (str or os.PathLike)."
        )
    path = str(path.__fspath__() if hasattr(path, "__fspath__") else path)
    if tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path):
        raise ValueError(
            f"Invalid value for argument `{argument}`. Received: {argument}={path!r}, which is a "
            "file. Expected a directory (it is created if missing)."
        )
    if "://" not in path:
        existing = os.path.abspath(path)
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ValueError(
                f"Invalid value for argument `{argument}`. Received: {argument}={path!r}, which "
                f"cannot be written ({existing} is not writable). Expected a writable directory."
            )
    return path


def ensure_writable_directory(path: Any, argument: str) -> str:
    """Creates `path` if needed and checks that it is a writable directory.

    Raises:
        TypeError: `path` is not a path.
        ValueError: `path` is a file, or cannot be created or written.
    """
    path = check_directory_path(path, argument)
    try:
        tf.io.gfile.makedirs(path)
        # A name of this process's own: the workers of a multi-worker run check the same directory.
        probe = tf.io.gfile.join(path, f".tftrain_write_test.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        with tf.io.gfile.GFile(probe, "w") as handle:
            handle.write("ok")
        tf.io.gfile.remove(probe)
    except (tf.errors.OpError, OSError) as error:
        raise ValueError(
            f"Invalid value for argument `{argument}`. Received: {argument}={path!r}, which cannot be "
            f"written ({error}). Expected a writable directory."
        ) from error
    return path
