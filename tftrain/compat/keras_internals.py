"""Every private Keras API tftrain relies on, in one place.

tftrain mirrors `keras.Model.fit`, and where Keras has no public name for what
`fit` itself does, tftrain calls the same private code rather than writing a
second copy that could drift. Each accessor below says why it is needed and
checks, on first use, that the installed Keras still has it. A missing one
raises `KerasInternalsError` naming both versions; there is never a silent
fallback. TensorFlow's private APIs are in `tftrain.compat.tf_internals`.
"""

from __future__ import annotations

import threading
import types
from typing import Any

import keras
import tensorflow as tf

# The tested range and the error are read here too (`keras_internals.TESTED_KERAS`, `.KerasInternalsError`).
from tftrain.compat.private_api import TESTED_KERAS as TESTED_KERAS
from tftrain.compat.private_api import TESTED_TENSORFLOW as TESTED_TENSORFLOW
from tftrain.compat.private_api import attribute as _attribute
from tftrain.compat.private_api import method as _checked_method
from tftrain.compat.private_api import missing as _missing
from tftrain.errors import KerasInternalsError as KerasInternalsError


def _method(obj: Any, name: str, why: str) -> Any:
    """`obj.name`, a private method of Keras's; where it is gone, `private_api.method` raises, naming it and why.

    Found here first: a fit looks methods up on every call, and stays out of `private_api` while they exist.
    """
    return getattr(obj, name, None) or _checked_method(obj, name, why)


def _keras_at_least(major: int, minor: int) -> bool:
    parts = keras.__version__.split(".")
    return (int(parts[0]), int(parts[1])) >= (major, minor)


# ------------------------------------------------------------------ what fit reports


def batch_end_index(begin: int, steps_per_call: int) -> int:
    """The batch index `fit`/`evaluate`/`predict` pass to `on_*_batch_end` for a host call.

    A call starts at batch `begin` and runs up to `steps_per_call` steps
    (Keras's `steps_per_execution`). Keras 3.11 and later report
    `begin + steps_per_call - 1`, also for a call that ran fewer steps because
    the data ended; earlier versions report `begin`. User callbacks count
    batches by these indices, so the Trainer reports what the installed Keras does.
    """
    return begin + steps_per_call - 1 if _keras_at_least(3, 11) else begin


# ------------------------------------------------------------------ models


def functional_class() -> type:
    """Keras's functional model class (no public name).

    Needed to build a functional `CustomModel` (`CustomModel(inputs, outputs)`)
    without Keras rewriting the user's class bases itself.
    """
    return _attribute("keras.src.models.functional", "Functional", "functional CustomModels")


def functional_init_arguments(args: tuple, kwargs: dict) -> bool:
    """Whether model constructor arguments are `(inputs, outputs)`, as Keras decides it.

    Keras makes a `Model` subclass called with them functional; `CustomModel`
    must decide the same way to give such a class its functional twin.
    """
    decide = _attribute("keras.src.models.model", "functional_init_arguments", "functional CustomModels")
    return bool(decide(args, kwargs))


def replace_base(cls: type, old: type, new: type) -> None:
    """Replaces base class `old` by `new` wherever it appears in `cls`'s hierarchy (except in `new`).

    What Keras itself does to make a subclass functional (it rewrites
    `__bases__` in `inject_functional_model_class`); done for `CustomModel`
    so that Keras's rewrite never reaches `CustomModel` itself.
    """
    for klass in cls.__mro__:
        if old in klass.__bases__ and klass is not new:
            klass.__bases__ = tuple(new if base is old else base for base in klass.__bases__)


def symbolic_build(model: keras.Model, data_batch: Any) -> None:
    """Creates a compiled model's variables (layers, metrics, loss, optimizer) from a batch spec.

    What `model.fit` runs before its first step. Creating the variables
    inside the first `tf.function` call instead would trace it twice.
    """
    _method(model, "_symbolic_build", "creating variables before the first trace")(data_batch=data_batch)


def loss_tracker(model: keras.Model) -> Any:
    """The `Mean` metric behind the `loss` log (`compile` creates it), or None.

    Keras's own `train_step` updates it; a `CustomModel`'s pieces must too, so
    its logs read as Keras's do.
    """
    if not hasattr(model, "_loss_tracker"):
        if getattr(model, "compiled", False):
            raise _missing("`keras.Model._loss_tracker`", "the `loss` log of a CustomModel")
        return None
    return model._loss_tracker


_STEP_FUNCTIONS = {"train": "train_function", "eval": "test_function", "predict": "predict_function"}


def _keras_function_on_call(kind: str) -> Any:
    """A stand-in for `model.<kind>_function`: called (by `model.fit`, ...), it builds Keras's own and runs it."""
    attribute = _STEP_FUNCTIONS[kind]
    make = "make_" + attribute

    def call(model: keras.Model, *args: Any, **kwargs: Any) -> Any:
        setattr(model, attribute, None)
        _method(model, make, "the model's own fit, evaluate and predict after the Trainer's")()
        return getattr(model, attribute)(*args, **kwargs)

    call.__name__ = call.__qualname__ = f"built_on_call_{attribute}"
    return call


_STAND_INS = {kind: _keras_function_on_call(kind) for kind in _STEP_FUNCTIONS}


def step_function_reset(model: keras.Model, kind: str) -> bool:
    """Whether `model`'s step function of `kind` ("train", "eval", "predict") was reset since `hold_step_function`.

    Keras rebuilds `model.train_function` (`test_function`,
    `predict_function`) at the next `fit` (`evaluate`, `predict`) where it is
    None: `compile` and `quantize` set it so, and so may a callback in
    `set_model` (`tftrain.callbacks.Timing` does, after wrapping
    `train_step`), or `make_train_function(force=True)` replaces it. The
    Trainer keeps its own engine per kind instead, and puts a stand-in in the
    attribute when it builds one: anything else there means "rebuild".
    """
    held = getattr(model, _STEP_FUNCTIONS[kind], None)
    return not (isinstance(held, types.MethodType) and held.__func__ is _STAND_INS[kind])


def hold_step_function(model: keras.Model, kind: str) -> None:
    """Puts the stand-in in `model.<kind>_function`, so that a later reset is seen (`step_function_reset`).

    The stand-in is a Keras step function as good as Keras's own: called by
    `model.fit` (`evaluate`, `predict`, `train_on_batch`, ...) it builds
    Keras's function with `make_train_function` (...), puts it in its place
    and runs it. Bound to the model, so a copy of the model gets its own.
    """
    _method(model, "make_" + _STEP_FUNCTIONS[kind], "the model's own fit, evaluate and predict after the Trainer's")
    setattr(model, _STEP_FUNCTIONS[kind], types.MethodType(_STAND_INS[kind], model))


def moving_averages(optimizer: Any, variables: list[Any]) -> list[tuple[Any, Any]]:
    """Each of `variables` with the optimizer's moving average of it (`use_ema=True`), where it has one.

    Keras keeps the averages in `_model_variables_moving_average`, indexed as
    the optimizer's trainable variables (`_get_variable_index`).
    """
    averages = getattr(optimizer, "_model_variables_moving_average", None)
    if averages is None or not hasattr(optimizer, "_get_variable_index"):
        raise _missing("the optimizer's `_model_variables_moving_average`", "the EMA weights of `ema_decay`")
    pairs = []
    for variable in variables:
        try:
            average = averages[optimizer._get_variable_index(variable)]
        except KeyError:  # not trained by this optimizer
            continue
        if average is not None:
            pairs.append((variable, average))
    return pairs


def resolve_auto_jit_compile(model: keras.Model) -> bool:
    """Whether `model.compile(jit_compile="auto")` would compile the model's steps with XLA.

    Keras resolves `"auto"` in the model's `_resolve_auto_jit_compile` (no
    public name): off on a machine without a GPU or TPU, off under a
    `tf.distribute` strategy, off where a layer has `supports_jit=False` or
    op determinism is on. The Trainer's `jit_compile="auto"` asks the same
    code, so the two never disagree. (Eager runs are decided by the caller,
    as `compile` decides them before asking.)
    """
    return bool(_method(model, "_resolve_auto_jit_compile", 'jit_compile="auto"')())


def flatten_layers(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    """Every sublayer of `layer`, itself included, at any depth.

    Keras has no public recursive iterator; this is what `Layer.layers` and
    its variable tracking use. Needed to switch the dtype policy of every layer.
    """
    flatten = _method(layer, "_flatten_layers", "switching every layer's dtype policy")
    return list(flatten(include_self=True, recursive=True))


def initial_epoch(model: keras.Model) -> int | None:
    """The epoch a callback asked `fit` to start at (`BackupAndRestore`'s resume protocol).

    Keras's `BackupAndRestore` restores a backup in `on_train_begin` and sets
    `model._initial_epoch`, which `fit` reads right after `on_train_begin`.
    """
    if not hasattr(model, "_initial_epoch"):
        raise _missing("`keras.Model._initial_epoch`", "BackupAndRestore's resume protocol")
    return model._initial_epoch


def set_initial_epoch(model: keras.Model, epoch: int | None) -> None:
    """Sets the epoch `fit` starts at (see `initial_epoch`); None clears it."""
    initial_epoch(model)  # checks the attribute exists
    model._initial_epoch = epoch


def metrics_result_or_logs(model: keras.Model, logs: Any) -> Any:
    """`fit`'s epoch logs: the model's metric results when they match the step's logs, else the logs."""
    return _method(model, "_get_metrics_result_or_logs", "epoch logs as fit gives them")(logs)


def flatten_metrics_in_order(model: keras.Model, logs: dict[str, Any]) -> Any:
    """`evaluate(return_dict=False)`'s list (or scalar): logs in the order of `model.metrics_names`."""
    return _method(model, "_flatten_metrics_in_order", "evaluate's list result")(logs)


# ------------------------------------------------------------------ inputs and logs


def get_data_adapter(**kwargs: Any) -> Any:
    """Keras's input adapter for what `fit` accepts (arrays, datasets, PyDatasets, generators).

    The code `model.fit` itself runs to batch, shuffle, weight and convert its
    inputs; tftrain uses it so the Trainer takes exactly the same inputs.
    """
    return _attribute("keras.src.trainers.data_adapters", "get_data_adapter", "fit's inputs")(**kwargs)


_SHUFFLE_WRAPPED = threading.Lock()


def array_dataset_with_order(adapter: Any, num_samples: int, order: Any) -> tf.data.Dataset:
    """Keras's array pipeline (`adapter.get_tf_dataset()`) with each pass's order passed through `order`.

    Keras's array adapter draws a pass's order inside its pipeline (one
    `tf.random.shuffle` of the example indices per iterator) and exposes it
    nowhere, so a checkpoint cannot keep it. While the pipeline is traced,
    `tf.random.shuffle` is wrapped: a call on all `num_samples` indices gives
    its result to `order(indices) -> indices`, which may record it (and
    return it) or return a saved order instead. The shuffle op is made as
    Keras makes it (the same seed derivation), so the orders drawn are the
    ones `model.fit` draws. Other calls (a per-batch shuffle) pass unchanged.

    Args:
        adapter: Keras's `ArrayDataAdapter` of shuffled array inputs.
        num_samples: Examples per pass.
        order: Called in the pipeline's graph with the drawn order (an int64 tensor of `num_samples`).

    Returns:
        The batched dataset, as `adapter.get_tf_dataset()` returns it.
    """
    random = tf.random  # the module object Keras's adapter reaches (an import by name may load another)
    owner = threading.get_ident()

    def shuffle_through_order(value: Any, seed: Any = None, name: Any = None) -> Any:
        drawn = shuffle(value, seed=seed, name=name)
        if threading.get_ident() == owner and drawn.shape.rank == 1 and drawn.shape[0] == num_samples:
            return order(drawn)
        return drawn

    with _SHUFFLE_WRAPPED:  # one wrap at a time: a second thread must not save the first's wrapper as the original
        shuffle = random.shuffle
        random.shuffle = shuffle_through_order  # the one module Keras's adapter calls through
        try:
            return adapter.get_tf_dataset()
        finally:
            random.shuffle = shuffle


def train_validation_split(arrays: Any, validation_split: float) -> Any:
    """`fit`'s `validation_split`: the last fraction of the arrays becomes validation data."""
    function = _attribute(
        "keras.src.trainers.data_adapters.array_slicing", "train_validation_split", "validation_split"
    )
    return function(arrays, validation_split=validation_split)


def pythonify_logs(logs: Any) -> dict[str, Any]:
    """Keras's conversion of logs for callbacks: nested dicts flattened, values to floats where possible."""
    return _attribute("keras.src.utils.python_utils", "pythonify_logs", "logs as fit returns them")(logs)


def py_dataset_class() -> type:
    """`keras.utils.PyDataset` (public), here so every input type check lives in one module."""
    return keras.utils.PyDataset


def batches_read_for_spec() -> int:
    """How many batches Keras reads from a PyDataset or generator to learn its tensor spec."""
    return _attribute(
        "keras.src.trainers.data_adapters.data_adapter_utils",
        "NUM_BATCHES_FOR_TENSOR_SPEC",
        "naming the PyDataset index that failed",
    )


# ------------------------------------------------------------------ predict


def concat_replica_outputs(outputs: Any, strategy: tf.distribute.Strategy) -> Any:
    """Per-replica predictions -> one batch in example order (TPU and multi-worker orders included).

    `predict` concatenates replica outputs the way Keras's TensorFlow trainer
    does (`reduce_per_replica(..., "concat")`), which knows each strategy's
    replica order.
    """
    reduce = _attribute("keras.src.backend.tensorflow.trainer", "reduce_per_replica", "predict")
    return reduce(outputs, strategy, reduction="concat")


def concat_batches(batches: list[Any]) -> Any:
    """`predict`'s join of per-batch outputs: NumPy where shapes agree, ragged where they do not."""
    return _attribute("keras.src.backend.tensorflow.trainer", "potentially_ragged_concat", "predict")(batches)


# ------------------------------------------------------------------ the learning-rate range test

_LR_SWEEP = "the learning-rate range test (`find_learning_rate`)"


def _applying_optimizer(optimizer: Any) -> Any:
    """The optimizer whose learning rate applies the updates (a `LossScaleOptimizer`'s inner one)."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.inner_optimizer
    return optimizer


def learning_rate_object(optimizer: Any) -> Any:
    """What an optimizer's learning rate is: its variable, its `LearningRateSchedule`, or its callable.

    `optimizer.learning_rate` gives the schedule's current value, not the
    schedule; the range test replaces a schedule for its sweep and must put
    the same object back. Keras keeps it in `_learning_rate` (3.10 to 3.15).
    """
    target = _applying_optimizer(optimizer)
    if not hasattr(target, "_learning_rate"):
        raise _missing(f"`{type(target).__name__}._learning_rate`", _LR_SWEEP)
    return target._learning_rate


def set_learning_rate_object(optimizer: Any, value: Any) -> None:
    """Sets what `learning_rate_object` returns (a variable, a schedule or a callable), tracking nothing.

    Keras's `learning_rate` setter refuses a variable over a schedule, and
    the optimizer's attribute assignment tracks what it is given; the range
    test sets a callable returning its own variable, then the original
    object back, tracking neither.
    """
    learning_rate_object(optimizer)  # checks the attribute exists
    object.__setattr__(_applying_optimizer(optimizer), "_learning_rate", value)


def backend_variable(variable: Any) -> tf.Variable:
    """The `tf.Variable` behind a Keras variable (itself for a `tf.Variable`); a distributed one under a strategy.

    A Keras 3 variable on the TensorFlow backend holds a `tf.Variable` (its
    `value` outside an autocast scope). The range test copies each replica's
    part of it (`strategy.experimental_local_results`), which a Keras
    variable does not expose: assigning the Keras variable in a cross-replica
    context would split a summed metric's total over the replicas, not
    restore each replica's own value.
    """
    if isinstance(variable, tf.Variable):
        return variable
    value = getattr(variable, "value", None)
    if not isinstance(value, tf.Variable):
        raise _missing(f"`{type(variable).__name__}.value` as a tf.Variable", _LR_SWEEP)
    return value
