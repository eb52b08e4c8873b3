"""Checks before checkpointing: a writable directory; a readable checkpoint with the same variables.

Restoring with `tf.train.Checkpoint` assigns variables one by one, so a
mismatch found half-way leaves a model partly restored. These checks run first.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

import keras
import tensorflow as tf

from tftrain.arguments import check_directory_path
from tftrain.compat import tf_internals
from tftrain.errors import CheckpointError, CorruptCheckpointError, IncompatibleCheckpointError

VARIABLE_SUFFIX = "/.ATTRIBUTES/VARIABLE_VALUE"
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"


def is_variable(value: Any) -> bool:
    """Whether `value` is a TensorFlow or Keras variable."""
    return isinstance(value, (tf.Variable, keras.Variable))


def live_variables(root: Any) -> list[Any]:
    """Every variable reachable from `root` in its object graph (what a save would write)."""
    view = tf.train.TrackableView(root)
    seen, queue, found = {id(root)}, [root], []
    while queue:
        for child in view.children(queue.pop(0)).values():
            if id(child) not in seen:
                seen.add(id(child))
                queue.append(child)
                if is_variable(child):
                    found.append(child)
    return found


class SavedMatch(NamedTuple):
    """A saved variable found by walking a checkpoint's object graph."""

    key: str
    """Its tensor's key in the checkpoint (the first path it was saved under)."""
    path: str
    """The path of objects by which the walk reached it, e.g. `model/encoder/.../kernel`."""
    saved_name: str = ""
    """The name the saving run gave the variable (empty if not recorded)."""


def saved_object_graph(reader: tf.train.CheckpointReader) -> Any:
    """The object graph a `tf.train.Checkpoint` recorded (a `TrackableObjectGraph` proto)."""
    graph = tf_internals.trackable_object_graph()
    graph.ParseFromString(reader.get_tensor(OBJECT_GRAPH_KEY))
    return graph


def match_saved_graph(
    graph: Any,
    root: Any,
    *,
    start: int = 0,
    prefix: str = "",
    prune: Callable[[str, Any], bool] | None = None,
) -> tuple[dict[int, tuple[Any, SavedMatch]], list[SavedMatch]]:
    """Walks a checkpoint's object graph alongside the live one, as a restore does.

    Args:
        graph: `saved_object_graph(reader)`.
        root: The live object that corresponds to saved node `start`.
        start: The saved node to start from (0: the checkpoint's root).
        prefix: The path of node `start` (for the paths reported).
        prune: Called with a saved child's attribute name and its live
            counterpart (None if missing); True: that subtree is neither
            walked nor reported.

    Returns:
        `(matched, unmatched)`: live variable id -> (variable, its `SavedMatch`),
        and a `SavedMatch` for each saved variable under `start` with no live
        counterpart, in key order.
    """
    view = tf.train.TrackableView(root)
    matched: dict[int, tuple[Any, SavedMatch]] = {}
    orphans: dict[str, SavedMatch] = {}
    # A saved object can be reached by several paths (a kernel is both a layer's and
    # the optimizer's); a path that is missing live must not hide one that exists.
    visited_live: set[int] = set()
    visited_orphan: set[int] = set()
    queue: list[tuple[int, Any, str]] = [(start, root, prefix)]
    while queue:
        node_id, live, path = queue.pop(0)
        visited = visited_orphan if live is None else visited_live
        if node_id in visited:
            continue
        visited.add(node_id)
        node = graph.nodes[node_id]
        for attribute in node.attributes:
            if attribute.name != "VARIABLE_VALUE":
                continue
            if is_variable(live):
                matched[id(live)] = (live, SavedMatch(attribute.checkpoint_key, path))
            else:
                orphans.setdefault(
                    attribute.checkpoint_key, SavedMatch(attribute.checkpoint_key, path, attribute.full_name)
                )
        children = view.children(live) if live is not None and not is_variable(live) else {}
        for reference in node.children:
            if prune is not None and prune(reference.local_name, children.get(reference.local_name)):
                continue
            child_path = f"{path}/{reference.local_name}" if path else reference.local_name
            queue.append((reference.node_id, children.get(reference.local_name), child_path))
    matched_keys = {match.key for _, match in matched.values()}
    return matched, [orphans[key] for key in sorted(orphans.keys() - matched_keys)]


def variable_name(variable: Any) -> str:
    """A variable's Keras path (e.g. `net/encoder/dense/kernel`), else its TensorFlow name."""
    return getattr(variable, "path", None) or variable.name


def _describe(key: str, variable: Any = None, saved_name: str = "") -> str:
    short = key[: -len(VARIABLE_SUFFIX)] if key.endswith(VARIABLE_SUFFIX) else key
    name = variable_name(variable) if variable is not None else saved_name
    return f"`{name}` (checkpoint key {short})" if name else f"checkpoint key {short}"


def shape_of(shape: Any) -> tuple[int | None, ...]:
    """A shape as a tuple (for messages and comparisons)."""
    return tuple(tf.TensorShape(shape).as_list())


def bullet_list(problems: list[str], limit: int = 10) -> str:
    """`problems` as indented lines for an error message, the first `limit` of them."""
    more = f"\n  (and {len(problems) - limit} more)" if len(problems) > limit else ""
    return "".join(f"\n  - {problem}" for problem in problems[:limit]) + more


def open_checkpoint(path: Any, argument: str = "path") -> tuple[str, tf.train.CheckpointReader]:
    """Resolves a checkpoint path or directory and opens it for reading (nothing is assigned).

    Args:
        path: A checkpoint path prefix (`.../ckpt-3000`), or a directory
            (its latest recorded checkpoint).
        argument: The caller's argument name, for messages.

    Returns:
        `(checkpoint path prefix, reader)`.

    Raises:
        TypeError: `path` is not a path.
        CheckpointError: nothing is there, or a directory holds no checkpoint.
        CorruptCheckpointError: the checkpoint cannot be read.
    """
    if not isinstance(path, (str, bytes)) and not hasattr(path, "__fspath__"):
        raise TypeError(
            f"Invalid value for argument `{argument}`. Received: {argument}={path!r}. Expected a "
            "checkpoint path (str or os.PathLike)."
        )
    path = os.fsdecode(os.fspath(path))
    if tf.io.gfile.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest is None:
            nested = [name for name in ("checkpoints", "best") if tf.io.gfile.isdir(f"{path}/{name}")]
            hint = f" (a tftrain `model_dir`? pass {path}/{nested[0]})" if nested else ""
            raise CheckpointError(
                f"No checkpoint in {path}{hint}. Expected a directory a tftrain run saved checkpoints "
                "to, or a checkpoint path prefix such as .../checkpoints/ckpt-3000."
            )
        path = latest
    elif not tf.io.gfile.exists(path + ".index"):
        raise CheckpointError(
            f"Invalid value for argument `{argument}`. Received: {argument}={path!r}, which does not "
            "exist. Expected a checkpoint path prefix such as runs/exp1/checkpoints/ckpt-3000 (the "
            "files ckpt-3000.index and ckpt-3000.data-*), or a directory holding checkpoints."
        )
    try:
        return path, tf.train.load_checkpoint(path)
    except (tf.errors.NotFoundError, ValueError) as error:
        raise CheckpointError(f"No readable checkpoint at {path}: {error}") from error
    except tf.errors.OpError as error:
        raise CorruptCheckpointError(f"The checkpoint {path} cannot be read: {error}") from error


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
    matched, unmatched = match_saved_graph(saved_object_graph(reader), root)
    problems = []
    for variable in live_variables(root):
        if id(variable) not in matched:
            problems.append(
                f"variable `{variable_name(variable)}` of shape {shape_of(variable.shape)} is not in the checkpoint"
            )
            continue
        key = matched[id(variable)][1].key
        if shape_of(shapes[key]) != shape_of(variable.shape):
            problems.append(
                f"variable {_describe(key, variable)} has shape {shape_of(shapes[key])} in the checkpoint "
                f"but {shape_of(variable.shape)} in the model"
            )
    if only is not None:
        unmatched = [match for match in unmatched if match.key.split("/", 1)[0] in only]
    problems += [
        f"the checkpoint has {_describe(match.key, saved_name=match.saved_name)} of shape "
        f"{shape_of(shapes[match.key])}, which the model lacks"
        for match in unmatched
    ]
    if problems:
        raise IncompatibleCheckpointError(
            f"The checkpoint {path} does not fit this model; nothing was restored:{bullet_list(problems)}\n"
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
        try:
            with tf.io.gfile.GFile(probe, "w") as handle:
                handle.write("ok")
        finally:
            if tf.io.gfile.exists(probe):  # a full disk creates the file, then fails to write it
                tf.io.gfile.remove(probe)
    except (tf.errors.OpError, OSError) as error:
        raise ValueError(
            f"Invalid value for argument `{argument}`. Received: {argument}={path!r}, which cannot be "
            f"written ({error}). Expected a writable directory."
        ) from error
    return path
