"""Every private Keras and TensorFlow API tftrain relies on, in one place.

tftrain mirrors `keras.Model.fit`, and where Keras has no public name for what
`fit` itself does, tftrain calls the same private code rather than writing a
second copy that could drift. Each accessor below says why it is needed and
checks, on first use, that the installed Keras or TensorFlow still has it. A
missing one raises `KerasInternalsError` naming both versions; there is never a
silent fallback.
"""

from __future__ import annotations

import atexit
import functools
import importlib
import inspect
import threading
import types
import warnings
from typing import Any

import keras
import tensorflow as tf

from tftrain.errors import KerasInternalsError

TESTED_KERAS = ("3.10.0", "3.15.1")
"""The oldest and newest Keras versions tftrain's tests run against."""

TESTED_TENSORFLOW = ("2.16.2", "2.21.0")
"""The oldest and newest TensorFlow versions tftrain's tests run against."""


def _missing(what: str, why: str) -> KerasInternalsError:
    return KerasInternalsError(
        f"tftrain needs {what} ({why}), but it is missing from the installed Keras "
        f"{keras.__version__} / TensorFlow {tf.__version__}. tftrain is tested with Keras "
        f"{TESTED_KERAS[0]} to {TESTED_KERAS[1]} and TensorFlow {TESTED_TENSORFLOW[0]} to "
        f"{TESTED_TENSORFLOW[1]}: install versions in those ranges "
        f'(e.g. pip install "keras=={TESTED_KERAS[1]}").'
    )


@functools.cache
def _attribute(module: str, name: str, why: str) -> Any:
    try:
        value = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise _missing(f"`{module}.{name}`", why) from error
    return value


def _method(obj: Any, name: str, why: str) -> Any:
    method = getattr(obj, name, None)
    if method is None:
        raise _missing(f"`{type(obj).__name__}.{name}`", why)
    return method


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


def autograph_converted(function: Any) -> Any:
    """`function` converted by AutoGraph (`tf.autograph.to_graph`), a bound method bound again; as is if marked `do_not_convert`.

    `to_graph` converts a bound method's function and drops its `self`;
    `tf.autograph.experimental.do_not_convert` marks a function with
    `autograph_info__` (TensorFlow's own test, `is_autograph_artifact`).
    A `tf.function` is returned as is: it converts itself when traced.
    Where AutoGraph cannot convert it (its source is not readable: a
    function defined in `python -c` or a notebook cell's exec), it runs as
    is, with TensorFlow's warning, as `tf.function` itself does.
    """
    target = function.__func__ if inspect.ismethod(function) else function
    if hasattr(target, "autograph_info__") or isinstance(target, tf.types.experimental.GenericFunction):
        return function
    try:
        converted = tf.autograph.to_graph(target)
    except Exception as error:  # what `tf.function`'s own conversion falls back on, too
        warnings.warn(
            f"AutoGraph could not transform {function} and will run it as-is: {type(error).__name__}: {error}. "
            "Python control flow on tensors (`if tensor:`) then fails inside tf.function; mark the step "
            "`@tf.autograph.experimental.do_not_convert` if it needs no conversion.",
            stacklevel=3,
        )
        return function
    return types.MethodType(converted, function.__self__) if inspect.ismethod(function) else converted


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
    function = _attribute("keras.src.trainers.data_adapters", "get_data_adapter", "fit's inputs")
    return function(**kwargs)


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


def distributed_dataset_strategy(dataset: Any) -> tf.distribute.Strategy:
    """The strategy that made a `tf.distribute.DistributedDataset` (TensorFlow has no public name for it).

    A distributed dataset's batches hold one value per replica of that
    strategy, so the Trainer checks it is the strategy its steps run under.
    """
    strategy = getattr(dataset, "_strategy", None)
    if not isinstance(strategy, tf.distribute.Strategy):
        raise _missing(f"`{type(dataset).__name__}._strategy`", "the strategy of a distributed dataset")
    return strategy


def made_from_function(dataset: Any) -> bool:
    """Whether a distributed dataset came from `distribute_datasets_from_function` (no public class tells).

    Its `cardinality` counts the batches of one input pipeline, each of which
    feeds one replica: with several replicas per pipeline a step reads
    several of them, so the count is not the steps.
    """
    cls = _attribute(
        "tensorflow.python.distribute.input_lib", "DistributedDatasetsFromFunction", "distributed datasets"
    )
    return isinstance(dataset, cls)


def per_replica_spec(spec: Any) -> Any:
    """One replica's `TypeSpec` of a distributed dataset's element part (itself if not per replica).

    A `DistributedDataset` of several replicas has `PerReplicaSpec` parts,
    one spec per replica (all alike); the model's checks read one replica's.
    """
    per_replica = _attribute("tensorflow.python.distribute.values", "PerReplicaSpec", "distributed datasets")
    if not isinstance(spec, per_replica):
        return spec
    specs = getattr(spec, "_value_specs", None)
    if not specs:
        raise _missing("`PerReplicaSpec._value_specs`", "the batch spec of a distributed dataset")
    return specs[0]


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
    function = _attribute("keras.src.backend.tensorflow.trainer", "potentially_ragged_concat", "predict")
    return function(batches)


# ------------------------------------------------------------------ checkpoints


def trackable_object_graph() -> Any:
    """An empty `TrackableObjectGraph` proto, to read the object graph stored in a checkpoint.

    TensorFlow has no public reader of a checkpoint's object graph; tftrain
    walks it to check a checkpoint against the live model before restoring.
    """
    proto = _attribute(
        "tensorflow.core.protobuf.trackable_object_graph_pb2",
        "TrackableObjectGraph",
        "checking a checkpoint before restoring it",
    )
    return proto()


def dataset_graph_nodes(dataset: tf.data.Dataset) -> list[Any]:
    """The nodes (`NodeDef`s) of a `tf.data` pipeline's graph, its functions' bodies (map, filter, ...) included.

    tf.data has no public view of a pipeline's transformations; tftrain reads
    them to choose how a checkpoint keeps the pipeline's position (which ops
    can be saved symbolically, and whether every pass reads the same order).
    """
    serialize = _method(dataset, "_as_serialized_graph", "choosing how to checkpoint the data position")
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(serialize().numpy())
    nodes = list(graph.node)
    for function in graph.library.function:
        nodes.extend(function.node_def)
    return nodes


# ------------------------------------------------------------------ multi-worker preemption

_PREEMPTION = "checkpointing all workers on preemption"
_FAILURE_HANDLING = "tensorflow.python.distribute.failure_handling.failure_handling"


def coordination_context() -> Any:
    """TensorFlow's eager context, whose coordination service shares keys and barriers between workers.

    `tf.distribute.experimental.PreemptionCheckpointHandler` talks to the
    workers through it; tftrain uses the same store to clear the handler's
    keys between runs and to tell every worker which signal arrived.
    """
    context = _attribute("tensorflow.python.eager.context", "context", _PREEMPTION)()
    for name in (
        "set_config_key_value",
        "get_config_key_value",
        "delete_config_key_value",
        "wait_at_barrier",
    ):
        _method(context, name, _PREEMPTION)
    if not hasattr(context, "coordination_service"):
        raise _missing("`Context.coordination_service`", _PREEMPTION)
    return context


def preemption_handler_keys(num_workers: int) -> list[str]:
    """The coordination-service keys a `PreemptionCheckpointHandler` sets.

    They outlive the handler (TensorFlow expects the job to exit after a
    preemption); a second handler in the same job would read them as its own
    notices, so tftrain deletes them before it creates one.
    """

    def key(name: str) -> str:
        return _attribute(_FAILURE_HANDLING, name, _PREEMPTION)

    run_keys = [key("_INITIAL_RUN_COUNT_KEY"), key("_FINAL_RUN_COUNT_KEY")]
    acknowledged = [f"{key('_ACKNOWLEDGE_KEY')}_{run}_{i}" for run in run_keys for i in range(num_workers)]
    return [key("_PREEMPTION_WORKER_KEY"), *run_keys, *acknowledged]


def preemption_handler_coordinates(handler: Any) -> bool:
    """Whether a `PreemptionCheckpointHandler` shares notices between workers.

    TensorFlow makes it local (no cluster) or inert (GCP CPU and TPU VMs)
    where it does not apply; then it must not be relied on.
    """
    if not hasattr(handler, "_local_mode"):
        raise _missing("`PreemptionCheckpointHandler._local_mode`", _PREEMPTION)
    return not handler._local_mode


def stop_preemption_handler(handler: Any) -> None:
    """Stops a `PreemptionCheckpointHandler`'s watcher threads.

    TensorFlow stops them only when it saves for a preemption or in `__del__`,
    which never runs while the threads hold the handler; a run that ends
    normally must stop them itself.
    """
    _method(handler, "_stop_poll_termination_signal_thread", _PREEMPTION)()
    _method(handler, "_stop_cluster_wise_termination_watcher_thread", _PREEMPTION)()


# ------------------------------------------------------------------ asynchronous checkpoints

_ASYNC = "asynchronous checkpoint saving"


def check_async_checkpoint_support() -> None:
    """Raises `KerasInternalsError` unless TensorFlow's asynchronous checkpointing can serve Keras models."""
    if not hasattr(tf.train.CheckpointOptions(), "experimental_enable_async_checkpoint"):
        raise _missing("`tf.train.CheckpointOptions(experimental_enable_async_checkpoint=...)`", _ASYNC)
    _method(tf.train.Checkpoint, "_async_checkpointer", _ASYNC)
    _method(tf.train.Checkpoint, "sync", _ASYNC)


def async_checkpoint_options(root: tf.train.Checkpoint) -> tf.train.CheckpointOptions:
    """Options that make `root`'s saves asynchronous, working around a Keras 3 incompatibility.

    TensorFlow copies the variables to host memory in a `tf.function`; a Keras
    3 variable makes a new `tf.Variable` at each copy, which a traced function
    refuses from its second save on. Running the copy eagerly keeps every save
    working (the copy is a few assignments; the file write stays in the
    background thread).
    """
    helper = _method(root, "_async_checkpointer", _ASYNC)()
    copy = _method(type(helper), "_copy_to_cpu", _ASYNC)
    eager_copy = getattr(copy, "python_function", None)
    if eager_copy is None:
        raise _missing("`AsyncCheckpointHelper._copy_to_cpu.python_function`", _ASYNC)
    helper._copy_to_cpu = functools.partial(eager_copy, helper)
    return tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)


def wait_for_async_checkpoint(root: tf.train.Checkpoint) -> None:
    """Waits for `root`'s pending asynchronous save; raises the error it met, if any.

    `tf.train.Checkpoint.sync` waits but leaves a failed write's error for the
    next save to raise; a run that ends or stops needs it now.
    """
    helper = getattr(root, "_async_checkpointer_impl", None)
    if helper is not None:
        root.sync()
        _method(helper, "_check_async_thread_error", _ASYNC)()


def stop_async_checkpoint(root: tf.train.Checkpoint) -> None:
    """Waits for `root`'s pending asynchronous save and stops its writer thread.

    TensorFlow stops the thread, and frees the host copies of the variables,
    only at interpreter exit; a checkpoint root that is replaced must stop its
    own, or each replacement leaves a thread and a copy of the model behind.
    """
    helper = getattr(root, "_async_checkpointer_impl", None)
    if helper is not None:
        join = _method(helper, "_join_async_save_thread", _ASYNC)
        atexit.unregister(join)
        join()


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
    target = _applying_optimizer(optimizer)
    object.__setattr__(target, "_learning_rate", value)


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


# ------------------------------------------------------------------ FLOP counting

_FLOPS = "counting the FLOPs of a traced step (`Trainer(count_flops=True)`)"


def op_flops(graph: tf.Graph, node_def: Any) -> int | None:
    """TensorFlow's registered "flops" statistic of one op, as its profiler counts it; None if none is registered.

    The statistics functions (`ops.RegisterStatistics(op_type, "flops")`, in
    `tensorflow.python.profiler.internal.flops_registry` and the op modules)
    have no public name in TF2; `tf.compat.v1.profiler` reads them the same
    way. They read shapes from `graph` by the names in `node_def`.

    Raises:
        ValueError: a shape the statistic needs is not fully defined.
    """
    # Importing the registry registers the profiler's statistics.
    _attribute("tensorflow.python.profiler.internal.flops_registry", "IMPLEMENTED_OPS", _FLOPS)
    stats = _attribute("tensorflow.python.framework.ops", "get_stats_for_node_def", _FLOPS)
    # They read shapes with `graph_util.tensor_shape_from_node_def_name`, which logs a deprecation.
    with _attribute("tensorflow.python.util.deprecation", "silence", _FLOPS)():
        value = stats(graph, node_def, "flops").value
    return None if value is None else int(value)


def function_body_graph(graph: tf.Graph, name: str) -> tf.Graph:
    """The graph of function `name` that an op of `graph` calls (a nested `tf.function`, a branch, a loop body).

    `Graph._get_function` returns the `AtomicFunction` the graph holds (2.16
    to 2.21); its `graph` is the `FuncGraph` it was traced into, with the
    shapes and variable handle data of that trace.
    """
    function = _method(graph, "_get_function", _FLOPS)(name)
    body = getattr(function, "graph", None)
    if body is None:
        raise _missing(f"the graph of function `{name}` (`AtomicFunction.graph`)", _FLOPS)
    return body


def function_arguments(graph: tf.Graph) -> list[tf.Tensor]:
    """A traced function's argument placeholders, without those of captured tensors (`FuncGraph.internal_captures`)."""
    captured = getattr(graph, "internal_captures", None)
    if captured is None:
        raise _missing("`FuncGraph.internal_captures`", _FLOPS)
    captured_ids = {id(tensor) for tensor in captured}
    return [tensor for tensor in graph.inputs if id(tensor) not in captured_ids]


def copy_handle_data(source: tf.Tensor, target: tf.Tensor) -> None:
    """Gives a resource placeholder the variable shape and dtype `source` carries (no public API sets it).

    Without it, shape inference cannot see through a `ReadVariableOp` on `target`.
    """
    _attribute("tensorflow.python.ops.handle_data_util", "copy_handle_data", _FLOPS)(source, target)
