"""Warm start: initialise some variables from another run's checkpoint.

The checkpoint's object graph is matched to the live objects by name, as
`tf.train.Checkpoint` matches them when it restores (the walk is
`tftrain.checkpoint.validation.match_saved_graph`, shared with the compatibility check).
The values are then assigned from the checkpoint reader rather than through
`Checkpoint.read(...).expect_partial()`: a partial read keeps a pending restore
for every saved object it did not find, and TensorFlow applies it to a
matching variable created later (a head built on the first batch would
silently get the other run's weights), which would make the report wrong.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import types
from collections.abc import Iterable, Mapping
from typing import Any

import keras
import tensorflow as tf

from tftrain.checkpoint.validation import (
    CorruptCheckpointError,
    IncompatibleCheckpointError,
    SavedMatch,
    bullet_list,
    is_variable,
    live_variables,
    match_saved_graph,
    open_checkpoint,
    saved_object_graph,
    shape_of,
    variable_name,
)

_LISTED = 10  # names listed in a message before "and N more"


@dataclasses.dataclass(frozen=True)
class WarmStartReport:
    """What `warm_start` loaded.

    Variables of the target are named by their Keras path
    (`variable.path`, e.g. `net/encoder/dense/kernel`); variables of the
    checkpoint by their object path (e.g. `model/encoder/_functional/_operations/0/kernel`:
    the attributes by which the saving run reached them).

    Attributes:
        checkpoint: The checkpoint path read.
        loaded: Target variable -> the checkpoint variable it was set from.
        not_loaded: Target variables the checkpoint has no counterpart for
            (left as they were).
        skipped: Target variables with a counterpart that `skip` excluded
            (left as they were).
        unused: Checkpoint variables under the source path(s) that no target
            variable corresponds to.
    """

    checkpoint: str
    loaded: Mapping[str, str]
    not_loaded: tuple[str, ...]
    skipped: tuple[str, ...]
    unused: tuple[str, ...]

    def summary(self) -> str:
        """A readable summary: the counts, then every name."""
        lines = [
            f"Warm start from {self.checkpoint}: loaded {len(self.loaded)} variables; "
            f"{len(self.not_loaded)} not in the checkpoint, {len(self.skipped)} skipped, "
            f"{len(self.unused)} checkpoint variables unused."
        ]
        lines += [f"  loaded      {target} <- {source}" for target, source in self.loaded.items()]
        lines += [f"  not loaded  {name}" for name in self.not_loaded]
        lines += [f"  skipped     {name}" for name in self.skipped]
        lines += [f"  unused      {name}" for name in self.unused]
        return "\n".join(lines)


def _listing(names: Iterable[str]) -> str:
    names = list(names)
    listed = ", ".join(names[:_LISTED])
    return listed + (f" (and {len(names) - _LISTED} more)" if len(names) > _LISTED else "")


def _children(graph: Any, node_id: int) -> dict[str, int]:
    return {reference.local_name: reference.node_id for reference in graph.nodes[node_id].children}


def _resolve(graph: Any, path: str, checkpoint: str, argument: str, received: str) -> int:
    """The saved node at `path` (attribute names joined by `/`), or a clear error."""
    node, walked = 0, []
    for part in path.split("/"):
        children = _children(graph, node)
        if part not in children:
            where = f"under `{'/'.join(walked)}`" if walked else "at its top level"
            raise ValueError(
                f"Invalid value for argument `{argument}`. Received: {received}. The "
                f"checkpoint {checkpoint} has no object `{part}` {where}; there it has: "
                f"{_listing(sorted(children)) or 'nothing'}. Expected a path of attribute names in "
                "the checkpoint, e.g. 'model' or 'model/encoder' for the `encoder` layer of the "
                "saved model."
            )
        node = children[part]
        walked.append(part)
    return node


def _matches(pattern: str, path: str) -> bool:
    """Whether `pattern` (a glob) matches `path` or a run of its whole components."""
    parts = path.split("/")
    return any(
        fnmatch.fnmatchcase("/".join(parts[i:j]), pattern)
        for i in range(len(parts))
        for j in range(i + 1, len(parts) + 1)
    )


def _check_arguments(target: Any, source: str | None, skip: Any) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The `{checkpoint path: live object}` map and the skip patterns, checked."""
    if isinstance(target, Mapping):
        if source is not None:
            raise ValueError(
                f"Invalid value for argument `source`. Received: source={source!r} with a dict "
                "`target`. Expected source=None: the dict's keys are the checkpoint paths."
            )
        if not target:
            raise ValueError(
                "Invalid value for argument `target`. Received: target={}. Expected a layer, or a "
                "non-empty dict of checkpoint path -> layer or variable."
            )
        mapping = dict(target)
    else:
        mapping = {"model" if source is None else source: target}
    for path, live in mapping.items():
        if not isinstance(path, str) or not path.strip("/"):
            raise ValueError(
                f"Invalid value for argument `source`. Received: {path!r}. Expected a path of "
                "attribute names in the checkpoint, e.g. 'model' or 'model/encoder'."
            )
        if path.strip("/").split("/")[0] == "optimizer" or isinstance(live, keras.optimizers.Optimizer):
            raise ValueError(
                f"Invalid warm-start map entry {path!r} -> {type(live).__name__}: optimizer state is "
                "never warm-started (its slots belong to the other run's training). Expected model "
                "variables, e.g. source='model/encoder'; the optimizer starts fresh."
            )
        if not (is_variable(live) or isinstance(live, tf.__internal__.tracking.Trackable)):
            raise TypeError(
                f"Invalid value for argument `target`. Received: {live!r} for {path!r}. Expected a "
                "Keras layer or model, a `tf.Module`, or a variable."
            )
        if isinstance(live, keras.layers.Layer) and not live.built:
            raise ValueError(
                f"Invalid value for argument `target`. Received: the layer `{live.name}`, which is "
                "not built, so its variables do not exist. Expected a built layer: call the model "
                "once on a batch (or `build` it) before `warm_start`."
            )
    mapping = {path.strip("/"): live for path, live in mapping.items()}
    patterns = (skip,) if isinstance(skip, str) else tuple(skip or ())
    if not all(isinstance(pattern, str) for pattern in patterns):
        raise TypeError(
            f"Invalid value for argument `skip`. Received: skip={skip!r}. Expected a name or glob "
            "pattern of variable paths (str), or a list of them."
        )
    return mapping, patterns


def _is_optimizer(name: str, live: Any) -> bool:
    """Whether a saved child is an optimizer (a Keras model keeps its own as `optimizer`).

    Its slots belong to the other run's training, and its `_trainable_variables`
    alias the model's own weights by position, not by name.
    """
    return name == "optimizer" or isinstance(live, keras.optimizers.Optimizer)


def _target_variables(live: Any) -> list[Any]:
    if is_variable(live):
        return [live]
    found = live_variables(live)
    optimizer = getattr(live, "optimizer", None)
    if isinstance(optimizer, keras.optimizers.Optimizer):
        slots = {id(variable) for variable in optimizer.variables}
        found = [variable for variable in found if id(variable) not in slots]
    return found


def _unique_names(variables: list[Any]) -> dict[int, str]:
    """Variable id -> its Keras path, numbered where two variables share one."""
    names: dict[int, str] = {}
    taken: dict[str, int] = {}
    for variable in variables:
        if id(variable) in names:
            continue
        name = variable_name(variable)
        taken[name] = taken.get(name, 0) + 1
        names[id(variable)] = name if taken[name] == 1 else f"{name} ({taken[name]})"
    return names


def warm_start(
    target: Any, checkpoint: Any, *, source: str | None = None, skip: str | Iterable[str] | None = None
) -> WarmStartReport:
    """Initialises variables of `target` from another run's checkpoint (a warm start).

    The saved objects under `source` are matched to `target`'s by attribute
    name, as `tf.train.Checkpoint` matches them; everything is checked before
    anything is assigned (a shape or dtype mismatch, a source path that does
    not exist, a map that matches nothing are errors, and nothing changes).
    Optimizer state is never warm-started. Call it before `Trainer.fit`: on a
    rerun, `fit` restores the run's own latest checkpoint over it.

    Example:
        SimCLR-style fine-tuning: the encoder from pretraining, a new head.

        ```python
        model = FineTuneNet(num_classes=10)
        model(x[:1])  # build the variables
        tftrain.checkpoint.warm_start(model.encoder, "runs/pretrain/checkpoints", source="model/encoder")
        trainer.fit(...)  # trains from those weights
        ```

    Args:
        target: What to initialise: a built Keras layer or model (or any
            trackable, or a variable), matched to the checkpoint's object at
            `source`; or a dict `{checkpoint path: layer or variable}` to map
            several, e.g. `{"model/encoder": model.backbone}`.
        checkpoint: A checkpoint path prefix (`.../checkpoints/ckpt-3000`) or
            a directory (its latest checkpoint), e.g. `model_dir/checkpoints`
            or `model_dir/best` of the other run.
        source: The path of attribute names, in the checkpoint, of the object
            that corresponds to `target`: `"model"` (the default) is the
            saved run's whole model, `"model/encoder"` its `encoder`
            attribute. Must be None with a dict `target`.
        skip: Target variables not to load: glob patterns matched against a
            variable's Keras path (`net/head/kernel`) and its checkpoint path
            (`model/head/_kernel`), or any run of their components, so
            `"head"` skips everything under a `head` layer. Every pattern must
            match a variable.

    Returns:
        A `WarmStartReport` of what was loaded, not loaded, skipped and
        unused. Its summary is also logged to the `tftrain` logger (INFO).

    Raises:
        CheckpointError: `checkpoint` does not exist or holds no checkpoint.
        CorruptCheckpointError: the checkpoint cannot be read.
        IncompatibleCheckpointError: a matched variable has another shape or
            dtype in the checkpoint (each one named, with both shapes).
        ValueError: `source` (or a dict key) is not in the checkpoint, an
            entry matches no variable, a `skip` pattern matches nothing, a
            layer is not built, or the optimizer is named.
        TypeError: an argument of the wrong type.
    """
    mapping, patterns = _check_arguments(target, source, skip)
    path, reader = open_checkpoint(checkpoint, "checkpoint")
    matched, unused, variables = _match_map(path, reader, mapping, isinstance(target, Mapping))
    names = _unique_names(variables + [variable for variable, _ in matched.values()])

    def skipped_by(pattern: str, variable: Any) -> bool:
        saved = matched.get(id(variable))
        return _matches(pattern, names[id(variable)]) or (
            saved is not None and _matches(pattern, saved[1].path)
        )

    unmatched_patterns = [p for p in patterns if not any(skipped_by(p, v) for v in variables)]
    if unmatched_patterns:
        raise ValueError(
            f"Invalid value for argument `skip`. Received: skip={skip!r}; {unmatched_patterns} "
            f"match no target variable (they are: {_listing(names[id(v)] for v in variables)}). "
            "Expected glob patterns of the target's variable paths or checkpoint paths."
        )
    to_load = [(v, m) for v, m in matched.values() if not any(skipped_by(p, v) for p in patterns)]
    if not to_load:
        raise ValueError(
            f"Invalid value for argument `skip`. Received: skip={skip!r}, which excludes every "
            f"matched variable, so nothing would be loaded from {path}. Expected patterns that "
            "leave something to load."
        )
    _check_shapes(path, reader, to_load, names)
    try:
        values = [reader.get_tensor(match.key) for _, match in to_load]
    except tf.errors.OpError as error:
        raise CorruptCheckpointError(f"The checkpoint {path} cannot be read: {error}") from error
    for (variable, _), value in zip(to_load, values, strict=True):
        variable.assign(value)
    loaded_ids = {id(variable) for variable, _ in to_load}
    report = WarmStartReport(
        checkpoint=path,
        loaded=types.MappingProxyType({names[id(v)]: match.path for v, match in to_load}),
        not_loaded=tuple(names[id(v)] for v in variables if id(v) not in matched),
        skipped=tuple(names[id(v)] for v, _ in matched.values() if id(v) not in loaded_ids),
        unused=tuple(sorted({match.path for match in unused})),
    )
    logging.getLogger("tftrain").info(report.summary())
    return report


def _match_map(
    path: str, reader: tf.train.CheckpointReader, mapping: dict[str, Any], is_dict: bool
) -> tuple[dict[int, tuple[Any, SavedMatch]], list[SavedMatch], list[Any]]:
    """Matches each map entry's saved subtree to its live object.

    Returns:
        `(matched, unused, variables)`: live variable id -> (variable, its
        saved match); the saved variables no entry matched; every target
        variable (once each).

    Raises:
        ValueError: a path is not in the checkpoint, an entry matches no
            variable, or a variable is reached from two entries.
    """
    graph = saved_object_graph(reader)
    matched: dict[int, tuple[Any, SavedMatch]] = {}
    orphans: list[SavedMatch] = []
    variables: dict[int, Any] = {}
    for prefix, live in mapping.items():
        if is_dict:
            node = _resolve(graph, prefix, path, "target", f"the key {prefix!r}")
        else:
            node = _resolve(graph, prefix, path, "source", f"source={prefix!r}")
        found, unmatched = match_saved_graph(graph, live, start=node, prefix=prefix, prune=_is_optimizer)
        if not found:
            saved_here = sorted(_children(graph, node))
            saved_here = [n for n in saved_here if not _is_optimizer(n, None) and n[0] != "_"] or saved_here
            raise ValueError(
                f"Invalid warm-start map: no variable of {_describe_live(live)} matches the objects "
                f"under `{prefix}` in {path} (there: {_listing(saved_here) or 'no objects'}). "
                f"Expected `{prefix}` to be the saved counterpart of the target, e.g. "
                f"source='{prefix}/{saved_here[0] if saved_here else '...'}' for one of its "
                "attributes."
            )
        for variable_id, (variable, match) in found.items():
            if variable_id in matched and matched[variable_id][1].key != match.key:
                raise ValueError(
                    f"Invalid warm-start map: the variable `{variable_name(variable)}` is reached from "
                    f"`{matched[variable_id][1].path}` and from `{match.path}`. Expected each target "
                    "variable under one map entry."
                )
            matched[variable_id] = (variable, match)
        orphans += unmatched
        variables.update((id(variable), variable) for variable in _target_variables(live))
    used = {match.key for _, match in matched.values()}
    return matched, [match for match in orphans if match.key not in used], list(variables.values())


def _describe_live(live: Any) -> str:
    if is_variable(live):
        return f"the variable `{variable_name(live)}`"
    name = getattr(live, "name", None)
    return f"`{name}` ({type(live).__name__})" if name else f"the {type(live).__name__}"


def _check_shapes(
    path: str, reader: tf.train.CheckpointReader, to_load: list[tuple[Any, SavedMatch]], names: dict[int, str]
) -> None:
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    problems = []
    for variable, match in to_load:
        saved_shape, live_shape = shape_of(shapes[match.key]), shape_of(variable.shape)
        saved_dtype, live_dtype = tf.as_dtype(dtypes[match.key]), tf.as_dtype(variable.dtype)
        where = f"variable `{names[id(variable)]}` (checkpoint `{match.path}`)"
        if saved_shape != live_shape:
            problems.append(
                f"{where} has shape {saved_shape} in the checkpoint but {live_shape} in the model"
            )
        elif saved_dtype != live_dtype:
            problems.append(
                f"{where} has dtype {saved_dtype.name} in the checkpoint but {live_dtype.name} in the model"
            )
    if problems:
        raise IncompatibleCheckpointError(
            f"Cannot warm-start from {path}; nothing was loaded:{bullet_list(problems, _LISTED)}\n"
            "Expected the same shapes for the variables matched by name. Pass `skip=` with the "
            "variables to leave as they are (e.g. a head of another width), or a `source` whose "
            "layers have these shapes."
        )
