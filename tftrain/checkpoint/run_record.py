"""The run record: what a run's results depend on, kept with its checkpoints and compared at every resume.

A run with a `model_dir` records, with every checkpoint, the optimizer's class
and hyperparameters as the user gave them, the loss and metrics, the data
(global batch size, examples and batches per pass, element spec), the
replicas, the dtype policy, the Trainer options that change the math, the
call's target, the tftrain / TensorFlow / Keras versions and the user's own
values (`Trainer(hparams=...)`, as `hparams.<name>`). A resume
compares the new call with the record of the checkpoint it restores, before
anything is assigned, and each difference is one of:

* **taken**: a hyperparameter, option, target or version changed on purpose
  is in effect after the restore (the checkpoint's learning rate variable is
  set back to the user's new value), logged in one line;
* **refused**: a change that makes the checkpoint meaningless (the optimizer's
  class or its variables, the model's layers, EMA switched on or off, the
  metrics) raises `tftrain.errors.RunChangedError`, naming the change;
* **data**: a change of the data (batch size, length, element spec) is taken
  where the checkpoint is at an epoch boundary (the next epoch is a fresh
  pass). Mid-epoch, a new batch size of data whose position is kept in
  examples (arrays) is converted, the epoch going on at its next unread
  example; another change is refused, where the saved data position would
  land on other examples, unless `on_data_change="next_epoch"` takes it for
  the next epoch.

The record is a flat dict of JSON values keyed by dotted names
(`"optimizer.learning_rate"`), so a difference is named as the user knows it.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import logging
import math
import warnings
from collections.abc import Mapping
from typing import Any

import keras
import tensorflow as tf

from tftrain.checkpoint.writer_lock import write_json
from tftrain.errors import RunChangedError
from tftrain.fit_inputs.epoch_order import examples_in
from tftrain.layout import RECORD_FILE, ModelDirLayout  # noqa: F401 (RECORD_FILE stays importable here)

__all__ = [
    "COMMAND_LINE",
    "HPARAMS_PREFIX",
    "OPTIMIZERS_PREFIX",
    "RECORD_KEY",
    "TRAINER_FLAGS_PREFIX",
    "Change",
    "Comparison",
    "RunRecord",
    "apply_taken",
    "build",
    "built_fields",
    "compare",
    "learning_rate_value",
    "learning_rates",
    "log_taken",
    "optimizers_of",
    "read_file",
    "refusal",
    "write_file",
]

RECORD_KEY = "run_record"
"""The name the record is saved under among a checkpoint's service states."""

HPARAMS_PREFIX = "hparams."
"""Where the user's own values (`Trainer(hparams=...)`) are in the record: `hparams.<name>`."""

COMMAND_LINE = "command_line"
"""The user's value (`hparams["command_line"]`, e.g. from `tftrain.flags.program_hparams`) recorded, never compared:
a rerun's command line differs in form (a flag's order, a flagfile's path), and each flag that changed is its own change."""

TRAINER_FLAGS_PREFIX = "trainer."
"""Where a program's flags for the Trainer's own options are among the user's values (`tftrain.flags.program_hparams`):
`hparams.trainer.<option>`, each as the Trainer takes it (`steps_per_loop` 8, `jit_compile` False)."""

OPTIMIZERS_PREFIX = "optimizers."
"""Where a Trainer's other optimizers are (a GAN's discriminator's): `optimizers.<attribute>`, as the model's is `optimizer`."""

TAKEN, REFUSED, DATA, CONVERTED, NEXT_EPOCH = "taken", "refused", "data", "converted", "next_epoch"

_TAKEN_AS = {
    TAKEN: "",
    CONVERTED: "; the epoch goes on at its next unread example",
    NEXT_EPOCH: "; on_data_change='next_epoch': the next epoch starts on it, the rest of the checkpoint's is not trained",
}

# Keys whose change makes the checkpoint meaningless, with why (said in the error).
_REFUSED_BECAUSE = {
    "optimizer": "its slots and step count belong to the checkpoint's optimizer",
    "optimizer.variables": "the optimizer keeps other variables (slots) than the checkpoint holds",
    "ema_decay": "EMA switched on or off changes what the optimizer keeps (the averages)",
    "model.layers": "the checkpoint's weights belong to another model",
    "metrics": "the metrics' saved state belongs to other metrics",
}

# The layers' names: in the record to name a layer in a message, never compared
# (Keras numbers unnamed layers per process: `dense_3` may be the same layer as `dense`).
_LAYER_NAMES = "model.layer_names"

# Each layer's configuration, as Keras serializes it without names: a change with the same weight
# shapes (a Dropout rate, an activation) is taken and said.
_LAYER_CONFIGS = "model.layer_configs"

_NOT_COMPARED = (_LAYER_NAMES, HPARAMS_PREFIX + COMMAND_LINE)

# Fields that records of older checkpoints lack: compared only where the checkpoint's record has them.
_COMPARED_WHERE_SAVED = (_LAYER_CONFIGS, OPTIMIZERS_PREFIX)

# Keys that describe the training data: taken at an epoch boundary, refused mid-epoch.
_DATA_KEYS = ("data.global_batch_size", "data.examples", "data.batches_per_pass", "data.element_spec", "data.order")


@dataclasses.dataclass(frozen=True)
class Change:
    """One difference between a checkpoint's record and the new call.

    Attributes:
        key: The record's key, e.g. `"optimizer.learning_rate"`.
        saved: The value in the checkpoint's record.
        now: The value in the new call.
        action: `"taken"`, `"refused"`, `"data"` (a data change, refused
            mid-epoch), `"converted"` (a new batch size mid-epoch, for
            data whose position is kept in examples) or `"next_epoch"` (a
            data change mid-epoch, taken for the next epoch).
    """

    key: str
    saved: Any
    now: Any
    action: str
    names: tuple[str, ...] = ()  # the model's layer names now, for a change of its layers

    def line(self) -> str:
        """The change in one line, e.g. `learning_rate: 1.0 in the checkpoint, 0.01 now (yours)`."""
        if self.key == "optimizer.variables":
            return (
                f"the optimizer's variables: {len(self.saved)} in the checkpoint, {len(self.now)} now "
                "(e.g. layers made trainable or frozen)"
            )
        if self.key == "model.layers":
            return f"the model's layers: {_layer_difference(self.saved, self.now, self.names)}"
        if self.key == _LAYER_CONFIGS:
            return f"the model's layers: {_config_difference(self.saved, self.now, self.names)}"
        if _is_variables(self.key):
            owner = self.key.removesuffix(".variables").removeprefix(OPTIMIZERS_PREFIX)
            return f"{owner}'s variables: {len(self.saved)} in the checkpoint, {len(self.now)} now"
        name = self.key.removeprefix("optimizer.").removeprefix(OPTIMIZERS_PREFIX)
        where, saved, now = _first_difference(self.saved, self.now)
        return f"{name}{where}: {_show(saved)} in the checkpoint, {_show(now)} now"


def _first_difference(saved: Any, now: Any, where: str = "") -> tuple[str, Any, Any]:
    """Where two nested values first differ (`[0].config.curve`), and the parts there."""
    if isinstance(saved, list) and isinstance(now, list) and len(saved) == len(now):
        for index, (before, after) in enumerate(zip(saved, now, strict=True)):
            if before != after:
                return _first_difference(before, after, f"{where}[{index}]")
    if isinstance(saved, dict) and isinstance(now, dict) and set(saved) == set(now):
        for key in sorted(saved):
            if saved[key] != now[key]:
                return _first_difference(saved[key], now[key], f"{where}.{key}")
    return where, saved, now


def _config_difference(saved: list[Any], now: list[Any], names: tuple[str, ...]) -> str:
    """The first layer whose configuration differs, and where (`layer 1 (dropout) rate: 0.1 ..., 0.5 now`)."""
    where, before, after = _first_difference(saved, now)
    index = where[1 : where.index("]")] if where.startswith("[") else ""
    name = f" ({names[int(index)]})" if index.isdigit() and int(index) < len(names) else ""
    field = where[where.index("]") + 1 :].removeprefix(".") if index else where
    return f"layer {index}{name} {field or 'config'}: {_show(before)} in the checkpoint, {_show(after)} now"


def _layer_difference(saved: list[str], now: list[str], names: tuple[str, ...]) -> str:
    """The first layer that differs (as class and weight shapes), or the count if one model is longer."""
    for index, (before, after) in enumerate(zip(saved or [], now or [], strict=False)):
        if before != after:
            name = f" ({names[index]})" if index < len(names) else ""
            return f"layer {index}{name} is {before} in the checkpoint, {after} now"
    return f"{len(saved or [])} layers in the checkpoint, {len(now or [])} now"


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The differences between a checkpoint's record and the new call, sorted by what is done with each."""

    taken: tuple[Change, ...] = ()
    refused: tuple[Change, ...] = ()

    def taken_lines(self) -> list[str]:
        """One line per change taken, as logged."""
        return [
            f"{change.line()} (yours{_TAKEN_AS[change.action]})"
            for change in self.taken
            if change.key != "data.batches_per_pass" or change.action != CONVERTED  # said with the batch size
        ]

    @property
    def data_only(self) -> bool:
        """Whether every refused change is a data change mid-epoch (which `on_data_change="next_epoch"` takes)."""
        return bool(self.refused) and all(change.action == DATA for change in self.refused)

    @property
    def saved_batch_size(self) -> int | None:
        """The checkpoint's batch size, where the call's differs and the change was taken (None: the same)."""
        sizes = (change.saved for change in self.taken if change.key == "data.global_batch_size")
        return next((int(size) for size in sizes), None)

    def at_next_epoch(self) -> Comparison:
        """The data changes refused mid-epoch, taken instead for the next epoch (`on_data_change="next_epoch"`)."""
        moved = tuple(dataclasses.replace(change, action=NEXT_EPOCH) for change in self.refused)
        return Comparison(self.taken + moved, ())


def _show(value: Any) -> str:
    if isinstance(value, list | dict):
        text = json.dumps(value, sort_keys=True)
        return text if len(text) <= 120 else text[:117] + "..."
    return str(value)


def _plain(value: Any) -> Any:
    """A JSON value for `value` (floats rounded to float32's precision, so a restored variable compares equal)."""
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return value
    if isinstance(value, float):
        return float(f"{value:.7g}") if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if hasattr(value, "numpy"):
        return _plain(value.numpy().tolist())
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    return str(value)


def _optimizer_record(optimizer: Any, prefix: str = "optimizer") -> dict[str, Any]:
    """The optimizer's class and hyperparameters as the user gave them (its config), under `prefix`."""
    if optimizer is None:
        return {prefix: None}
    inner = getattr(optimizer, "inner_optimizer", None)  # a LossScaleOptimizer: the one the user built
    name = _class_name(optimizer) + (f"({_class_name(inner)})" if inner is not None else "")
    config = (inner or optimizer).get_config()
    plain = {f"{prefix}.{key}": _plain(value) for key, value in config.items() if key != "name"}
    return {prefix: name, **plain}


def optimizers_of(model: keras.Model, state: Mapping[str, Any]) -> dict[str, Any]:
    """The run's optimizers by their place in the record: the model's (`optimizer`), then the Trainer's others.

    Args:
        model: The model (its `optimizer`).
        state: The Trainer's `checkpoint_state()`: its Keras optimizers other
            than the model's are recorded as `optimizers.<attribute>`.
    """
    model_optimizer = getattr(model, "optimizer", None)
    optimizers = {"optimizer": model_optimizer}
    for key, value in sorted(state.items()):
        if isinstance(value, keras.optimizers.Optimizer) and value is not model_optimizer:
            optimizers[OPTIMIZERS_PREFIX + key.removeprefix("owner_")] = value
    return optimizers


def _class_name(value: Any) -> str:
    """`keras.optimizers.SGD` for Keras's own classes, `module.Class` for others."""
    module = type(value).__module__
    if module.startswith("keras.src.optimizers"):
        module = "keras.optimizers"
    return f"{module}.{type(value).__qualname__}"


def _layers_record(model: keras.Model) -> list[str]:
    """Each layer of the model, as `Class[shape, shape, ...]` of its weights (names vary between processes)."""
    described = []
    for layer in model.layers:
        shapes = ", ".join("x".join(str(d) for d in weight.shape) or "scalar" for weight in layer.weights)
        described.append(f"{type(layer).__name__}[{shapes}]")
    return described


def _layer_configs(model: keras.Model) -> list[Any]:
    """Each layer's configuration without names (a layer that cannot give one: its class)."""
    configs = []
    for layer in model.layers:
        try:
            configs.append(_without_names(_plain(layer.get_config())))
        except Exception:  # e.g. a custom layer with arguments and no get_config: its class still compares
            configs.append(type(layer).__name__)
    return configs


def _data_record(dataset: Any, adapter: Any, shuffled: bool | None) -> dict[str, Any]:
    """The data's global batch size, examples and batches per pass, and element spec, where known."""
    batch_size = getattr(adapter, "batch_size", None)
    examples = examples_in(adapter)
    spec = getattr(dataset, "element_spec", None)
    if batch_size is None and spec is not None:
        leading = [s.shape[0] for s in tf.nest.flatten(spec) if getattr(s, "shape", None) is not None and s.shape.rank]
        batch_size = leading[0] if leading and leading[0] is not None else None
    cardinality = int(dataset.cardinality()) if hasattr(dataset, "cardinality") else tf.data.UNKNOWN_CARDINALITY
    batches = cardinality if cardinality > 0 else ("infinite" if cardinality == tf.data.INFINITE_CARDINALITY else None)
    return {
        "data.global_batch_size": batch_size,
        "data.examples": examples,
        "data.batches_per_pass": batches,
        "data.order": None if shuffled is None else ("shuffled" if shuffled else "in order"),
        "data.element_spec": _plain(_describe_spec(spec)),
    }


def _describe_spec(spec: Any) -> Any:
    if spec is None:
        return None
    return [f"{s.dtype.name}{list(s.shape)[1:]}" if hasattr(s, "shape") else str(s) for s in tf.nest.flatten(spec)]


def build(
    *,
    model: keras.Model,
    dataset: Any,
    adapter: Any,
    replicas: int,
    shuffled: bool | None = None,
    settings: Mapping[str, Any],
    hparams: Mapping[str, Any] | None = None,
    optimizers: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The record of a `fit` call: what its results depend on, as JSON values keyed by dotted names.

    Args:
        model: The model (its optimizer, compiled loss and metrics, layers and dtype policy are read).
        dataset: The training dataset (its element spec and length).
        adapter: Keras's data adapter of the training input (its batch size and
            examples, for arrays), or None.
        replicas: Replicas in sync (the global batch is split over them).
        shuffled: For array inputs whose position is kept in examples: whether
            each pass is shuffled (another order mid-epoch cannot continue
            the saved position). None: not recorded.
        settings: The Trainer options that change the math and the call's
            target (`epochs`, `total_steps`), by name.
        hparams: The user's own values (`Trainer(hparams=...)`), recorded
            as `hparams.<name>`.
        optimizers: The run's optimizers by their place in the record
            (`optimizers_of`); None: the model's alone.

    Returns:
        The record.
    """
    optimizers = dict(optimizers or {"optimizer": getattr(model, "optimizer", None)})
    record: dict[str, Any] = {}
    for prefix, optimizer in optimizers.items():
        record.update(_optimizer_record(optimizer, prefix))
    record.update(_compiled_record(model))
    record.update(built_fields(model, optimizers))
    record.update(_data_record(dataset, adapter, shuffled))
    record["replicas"] = int(replicas)
    record["dtype_policy"] = model.dtype_policy.name
    record.update({key: _plain(value) for key, value in settings.items()})
    record["versions.tftrain"] = _tftrain_version()
    record["versions.tensorflow"] = tf.__version__
    record["versions.keras"] = keras.__version__
    record.update({f"{HPARAMS_PREFIX}{name}": _plain(value) for name, value in (hparams or {}).items()})
    return record


def _compiled_record(model: keras.Model) -> dict[str, Any]:
    """The compiled loss and metrics as Keras serializes them, without the names Keras numbers per process.

    A second `AUC()` made in one process is `auc_1`: the same metric, not a
    change. What Keras cannot serialize (a `functools.partial` loss, a lambda
    whose source cannot be read) is described by its class or function
    instead, and metrics are then not compared: the record never stops a `fit`.
    """
    if not getattr(model, "compiled", False):
        return {"loss": None, "metrics": None}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Keras warns of a lambda it serializes
            compiled = model.get_compile_config() or {}
    except Exception:  # any serialization failure: a description the record can still compare
        return {"loss": _described(getattr(model, "loss", None)), "metrics": None}
    return {
        "loss": _without_names(_plain(compiled.get("loss"))),
        "metrics": _without_names(_plain([compiled.get("metrics"), compiled.get("weighted_metrics")])),
    }


def _without_names(value: Any) -> Any:
    """A serialized Keras config with every `name` left out (Keras numbers unnamed objects per process)."""
    if isinstance(value, dict):
        return {key: _without_names(item) for key, item in value.items() if key != "name"}
    if isinstance(value, list):
        return [_without_names(item) for item in value]
    return value


def _described(value: Any) -> Any:
    """A loss Keras cannot serialize, as its function's or class's name (a partial: its function's, and its arguments)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, functools.partial):
        return {"partial": _described(value.func), "args": _plain(list(value.args)), "keywords": _plain(value.keywords)}
    if isinstance(value, list | tuple | dict):
        return _plain(value)
    target = value if inspect.isfunction(value) or inspect.isclass(value) else type(value)
    return f"{target.__module__}.{target.__qualname__}"


def built_fields(model: keras.Model, optimizers: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The record's fields that a model built in its first step fills only then: its layers, the optimizers' variables.

    A record is saved with each checkpoint with these fields read again at
    the save, so the saved record describes the model that trained.

    Args:
        model: The model.
        optimizers: The run's optimizers by their place in the record
            (`optimizers_of`); None: the model's alone.
    """
    fields: dict[str, Any] = {
        "model.layers": _layers_record(model),
        _LAYER_NAMES: [layer.name for layer in model.layers],
        _LAYER_CONFIGS: _layer_configs(model),
    }
    for prefix, optimizer in (optimizers or {"optimizer": getattr(model, "optimizer", None)}).items():
        if getattr(optimizer, "built", False):
            fields[f"{prefix}.variables"] = [list(variable.shape) for variable in optimizer.variables]
    return fields


def _tftrain_version() -> str:
    import tftrain  # the package's version, read when a record is made (no import cycle at load)

    return tftrain.__version__


def compare(
    saved: Mapping[str, Any] | None, now: Mapping[str, Any], *, mid_epoch: bool, convertible: bool = False
) -> Comparison:
    """Sorts the differences between a checkpoint's record and the new call's.

    Args:
        saved: The checkpoint's record (None: written before records existed; nothing to compare).
        now: The new call's record (`build`).
        mid_epoch: The checkpoint is inside an epoch: a data change is refused,
            but for a batch size that `convertible` data takes.
        convertible: The data's position is kept in examples (array inputs,
            `tftrain.fit_inputs.epoch_plan.EpochPlan.keep_array_position`): a new
            batch size alone is converted, the epoch going on at its next
            unread example.

    Returns:
        The `Comparison`. Keys present on one side only are compared with None.
    """
    if not saved:
        return Comparison()
    saved = _with_todays_names(saved, now)
    taken, refused = [], []
    names = tuple(now.get(_LAYER_NAMES) or ())
    for key in sorted(set(saved) | set(now)):
        before, after = saved.get(key), now.get(key)
        if before == after or key in _NOT_COMPARED or (_is_variables(key) and None in (before, after)):
            continue
        if _is_recorded_option(key, now):
            continue  # the record's own field for the option is compared
        if key.startswith(_COMPARED_WHERE_SAVED) and key not in saved:
            continue  # a record from before this field was kept
        if key in ("model.layers", _LAYER_CONFIGS):
            action = REFUSED if key == "model.layers" else TAKEN
            (refused if action == REFUSED else taken).append(Change(key, before, after, action, names))
        elif key == "ema_decay" and None not in (before, after):
            taken.append(Change(key, before, after, TAKEN))  # another decay: a hyperparameter
        elif _is_optimizer_class(key) or _is_variables(key):
            refused.append(Change(key, before, after, REFUSED))
        elif key in _REFUSED_BECAUSE or (key in _DATA_KEYS and mid_epoch):
            action = DATA if key in _DATA_KEYS else REFUSED
            refused.append(Change(key, before, after, action))
        else:
            taken.append(Change(key, before, after, TAKEN))
    if convertible and mid_epoch:
        taken, refused = _batch_size_converted(taken, refused)
    return Comparison(*_consequences_dropped(taken, refused))


def _is_recorded_option(key: str, record: Mapping[str, Any]) -> bool:
    """Whether `key` is a program's flag for a Trainer option (`hparams.trainer.<option>`) that the record holds itself."""
    flagged = HPARAMS_PREFIX + TRAINER_FLAGS_PREFIX
    return key.startswith(flagged) and key[len(flagged) :] in record


def _with_todays_names(saved: Mapping[str, Any], now: Mapping[str, Any]) -> Mapping[str, Any]:
    """A record that kept a program's flags for the Trainer's options as `hparams.<option>` (each as its flag's text,
    `steps_per_loop` "8"), with each under today's name (`hparams.trainer.<option>`) where the call records it there,
    and the call's value where its text is the flag's."""
    flagged = HPARAMS_PREFIX + TRAINER_FLAGS_PREFIX
    renamed = dict(saved)
    for key, value in saved.items():
        today = flagged + key[len(HPARAMS_PREFIX) :]
        if not key.startswith(HPARAMS_PREFIX) or today not in now or today in saved or key in now:
            continue
        del renamed[key]
        same_text = isinstance(value, str) and not isinstance(now[today], str) and value.lower() == str(now[today]).lower()
        renamed[today] = now[today] if same_text else value
    return renamed


def _is_optimizer_class(key: str) -> bool:
    """Whether the key names an optimizer's class: the model's (`optimizer`) or another (`optimizers.<name>`)."""
    return key == "optimizer" or (key.startswith(OPTIMIZERS_PREFIX) and "." not in key[len(OPTIMIZERS_PREFIX) :])


def _is_variables(key: str) -> bool:
    """Whether the key names an optimizer's variables (`optimizer.variables`, `optimizers.<name>.variables`)."""
    return key.endswith(".variables") and _is_optimizer_class(key.removesuffix(".variables"))


def _optimizer_prefix(key: str) -> str | None:
    """The optimizer a key belongs to (`optimizer`, `optimizers.d_optimizer`), or None."""
    if key == "optimizer" or key.startswith("optimizer."):
        return "optimizer"
    if key.startswith(OPTIMIZERS_PREFIX):
        return OPTIMIZERS_PREFIX + key[len(OPTIMIZERS_PREFIX) :].split(".")[0]
    return None


class RunRecord:
    """The run record as a piece of run state: saved with every checkpoint under its name, compared at a resume.

    Args:
        record: The call's record (`build`).
        model: The model trained: its layers and optimizer variables are
            read again at each save until the model and its optimizers are
            built (a model may be built in its first step); not after.
        optimizers: The run's optimizers by their place in the record
            (`optimizers_of`); None: the model's alone.
    """

    name = RECORD_KEY

    def __init__(self, record: Mapping[str, Any], model: Any, optimizers: Mapping[str, Any] | None = None):
        self.record = dict(record)
        self.model = model
        self.optimizers = optimizers
        self._final = False  # the built fields no longer change (reading them costs ~0.1 ms a layer)

    def state_dict(self) -> dict[str, Any]:
        """The record as a checkpoint saves it (among the services' states, under `name`)."""
        if not self._final:
            self.record.update(built_fields(self.model, self.optimizers))
            optimizers = (self.optimizers or {"optimizer": getattr(self.model, "optimizer", None)}).values()
            self._final = self.model.built and all(getattr(o, "built", True) for o in optimizers if o is not None)
        return self.record

    def compare(self, states: Mapping[str, Any], *, mid_epoch: bool, convertible: bool = False) -> Comparison:
        """The call against the record a checkpoint saved (`states`: its services' states), as `compare` sorts them."""
        return compare(states.get(self.name), self.record, mid_epoch=mid_epoch, convertible=convertible)


def _batch_size_converted(taken: list[Change], refused: list[Change]) -> tuple[list[Change], list[Change]]:
    """A new batch size alone (the same examples and element spec) is converted, not refused."""
    data = [change for change in refused if change.action == DATA]
    if not data or {change.key for change in data} - {"data.global_batch_size", "data.batches_per_pass"}:
        return taken, refused
    converted = [dataclasses.replace(change, action=CONVERTED) for change in data]
    return taken + converted, [change for change in refused if change.action != DATA]


def _consequences_dropped(taken: list[Change], refused: list[Change]) -> tuple[tuple[Change, ...], ...]:
    """Names each refused change once, by its cause: not the differences that follow from it.

    Another optimizer class differs in every hyperparameter; EMA switched
    on or off differs in `use_ema`; a hyperparameter that changes the
    optimizer's variables (e.g. `amsgrad`) is refused itself, for the
    variables' difference it causes; a model change changes them too.
    """
    keys = {change.key for change in refused}
    if "model.layers" in keys:  # the layers' configurations differ with them
        taken = [c for c in taken if c.key != _LAYER_CONFIGS]
    if "ema_decay" in keys:
        dropped = ("optimizer.use_ema", "optimizer.ema_momentum", "optimizer.variables")
        taken = [c for c in taken if c.key not in dropped]
        refused = [c for c in refused if c.key not in dropped]
        keys = {change.key for change in refused}
    for prefix in sorted({_optimizer_prefix(key) for key in keys} - {None}):
        taken, refused = _optimizer_consequences_dropped(prefix, keys, taken, refused)
    return tuple(taken), tuple(refused)


def _optimizer_consequences_dropped(
    prefix: str, keys: set[str], taken: list[Change], refused: list[Change]
) -> tuple[list[Change], list[Change]]:
    """One optimizer's refused changes, each named once by its cause (`_consequences_dropped`)."""
    variables = f"{prefix}.variables"
    if prefix in keys:  # another class: every hyperparameter differs with it
        return (
            [c for c in taken if _optimizer_prefix(c.key) != prefix],
            [c for c in refused if _optimizer_prefix(c.key) != prefix or c.key == prefix],
        )
    if variables in keys and "model.layers" in keys:
        return taken, [c for c in refused if c.key != variables]
    if variables in keys:
        causes = [
            c
            for c in taken
            if _optimizer_prefix(c.key) == prefix
            # a new rate keeps the variables; a schedule instead of a float (or back) does not
            and (c.key != f"{prefix}.learning_rate" or isinstance(c.saved, dict) != isinstance(c.now, dict))
        ]
        if causes:
            taken = [c for c in taken if c not in causes]
            refused = [c for c in refused if c.key != variables]
            refused += [dataclasses.replace(c, action=REFUSED) for c in causes]
    return taken, refused


def refusal(comparison: Comparison, path: str, model_dir: str | None) -> RunChangedError:
    """The error for a comparison with refused changes: each change, why, and the ways forward."""
    lines = []
    for change in comparison.refused:
        why = _REFUSED_BECAUSE.get(change.key)
        if why is None and _is_optimizer_class(change.key):
            why = _REFUSED_BECAUSE["optimizer"]
        if change.action == DATA:
            why = "the saved data position counts this data's batches, so the rest of the epoch would skip or repeat examples"
        elif why is None:  # a hyperparameter that changes the optimizer's variables
            why = _REFUSED_BECAUSE["optimizer.variables"]
        lines.append(f"  - {change.line()}: {why}")
    where = f" (move {model_dir} away, or pass another `model_dir`)" if model_dir else ""
    forward = f"Start a new run with these settings in a new `model_dir`{where}"
    if comparison.data_only:
        forward += (
            ", or resume at the next epoch end: pass `on_data_change='next_epoch'` to the Trainer (the rest of "
            "this epoch is not trained), or keep the data as it was until the epoch ends"
        )
    else:
        forward += ", or rerun with the settings the checkpoint was written with"
    return RunChangedError(
        f"Cannot resume from {path}: the run changed in a way its checkpoint cannot follow:\n"
        + "\n".join(lines)
        + f"\nNothing was restored. {forward}."
    )


def apply_taken(comparison: Comparison, optimizers: Mapping[str, Any], learning_rates: Mapping[str, Any]) -> Comparison:
    """Puts the user's new learning rates back after a restore assigned the checkpoint's.

    The restore assigns the checkpoint's value to each optimizer's learning
    rate variable; the other hyperparameters are Python values the restore
    leaves as the user set them. A learning rate that differs from the
    record's but equals the checkpoint's (the run itself changed it, e.g.
    `ReduceLROnPlateau` in a `fit` before this one on the same Trainer) is
    the run's state, not a change: it is not said.

    Args:
        comparison: The comparison of the record with the new call.
        optimizers: The run's optimizers by their place in the record (`optimizers_of`).
        learning_rates: Their values before the restore (the user's), as `learning_rates` read them.

    Returns:
        The comparison, less the learning rate changes that were none.
    """
    none = set()
    for prefix, optimizer in optimizers.items():
        key = f"{prefix}.learning_rate"
        if not any(change.key == key for change in comparison.taken):
            continue
        restored, users = learning_rate_value(optimizer), learning_rates.get(prefix)
        if restored is None or users is None:
            continue
        if restored == users:
            none.add(key)
        else:
            optimizer.learning_rate.assign(users)
    return dataclasses.replace(comparison, taken=tuple(c for c in comparison.taken if c.key not in none))


def learning_rates(optimizers: Mapping[str, Any]) -> dict[str, Any]:
    """Each optimizer's float learning rate by its place in the record (`learning_rate_value`)."""
    return {prefix: learning_rate_value(optimizer) for prefix, optimizer in optimizers.items()}


def learning_rate_value(optimizer: Any) -> Any:
    """The optimizer's float learning rate as a NumPy value (None for a schedule, or no optimizer)."""
    variable = getattr(optimizer, "learning_rate", None)
    return variable.numpy() if isinstance(variable, keras.Variable | tf.Variable) else None


def log_taken(comparison: Comparison, verbose: int) -> None:
    """Says each change taken in one line: printed (and logged at INFO) unless `verbose` is 0, else a WARNING log."""
    logger = logging.getLogger("tftrain")
    for line in comparison.taken_lines():
        message = f"tftrain: resuming with a change: {line}"
        if verbose:
            logger.info(message)
            print(message)
        else:
            logger.warning(message)


def write_file(directory: str, record: Mapping[str, Any], comparison: Comparison, step: int) -> str:
    """Writes the readable copy of the record (`model_dir/run_record.json`), keeping the changes taken before.

    Written to a temporary file and renamed, so a kill leaves the old copy or the new one.

    Returns:
        The file's path.
    """
    path = ModelDirLayout(directory).run_record
    changes: list[dict[str, Any]] = []
    if tf.io.gfile.exists(path):
        try:
            with tf.io.gfile.GFile(path) as file:
                changes = list(json.load(file).get("changes", []))
        except (ValueError, tf.errors.OpError):  # an unreadable copy: the checkpoints hold the record
            changes = []
    changes += [
        {"step": step, "key": change.key, "saved": change.saved, "now": change.now} for change in comparison.taken
    ]
    write_json(path, {"record": dict(record), "changes": changes}, indent=1, sort_keys=True)
    return path


def read_file(directory: str) -> dict[str, Any] | None:
    """The record of a model directory's readable copy (`model_dir/run_record.json`), as `write_file` wrote it.

    A Trainer with a `model_dir` writes it at the start of every `fit`, before
    the callbacks' `on_train_begin`.

    Args:
        directory: The model directory.

    Returns:
        The record (without its changes), or None where the file is missing or
        cannot be read as a record.
    """
    path = ModelDirLayout(directory).run_record
    if not tf.io.gfile.exists(path):
        return None
    try:
        with tf.io.gfile.GFile(path) as file:
            record = json.load(file).get("record")
    except (ValueError, AttributeError, tf.errors.OpError):  # not JSON, or not an object
        return None
    return dict(record) if isinstance(record, dict) else None
