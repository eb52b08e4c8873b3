"""Every private TensorFlow API tftrain relies on, in one place.

Where TensorFlow has no public name for what tftrain needs (AutoGraph's marks,
distributed datasets, a checkpoint's object graph, the preemption handler's
coordination, asynchronous saves, op statistics), the accessors below reach
the private code, each saying why and checking, on first use, that the
installed TensorFlow still has it. A missing one raises `KerasInternalsError`
naming both versions; there is never a silent fallback. Keras's private APIs
are in `tftrain.compat.keras_internals`.
"""

from __future__ import annotations

import atexit
import functools
import inspect
import types
import warnings
from typing import Any

import tensorflow as tf

from tftrain.compat.private_api import attribute as _attribute
from tftrain.compat.private_api import method as _method
from tftrain.compat.private_api import missing as _missing

# ------------------------------------------------------------------ AutoGraph


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


# ------------------------------------------------------------------ distributed datasets


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


# ------------------------------------------------------------------ SLURM

_SLURM = "reading a SLURM job step's host list as TensorFlow's SlurmClusterResolver does"
_SLURM_MODULE = "tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver"


def slurm_host_lists() -> tuple[Any, Any, Any]:
    """TensorFlow's SLURM helpers: `expand_hostlist`, `expand_tasks_per_node` and `get_num_gpus`.

    `tf.distribute.cluster_resolver.SlurmClusterResolver` is public; the
    helpers it reads SLURM's compressed lists with (`node[01-04]`, `2(x3)`)
    and counts GPUs with are not exported, so tftrain reads the same
    variables with the same code.
    """
    return tuple(_attribute(_SLURM_MODULE, name, _SLURM) for name in ("expand_hostlist", "expand_tasks_per_node", "get_num_gpus"))


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
    eager_copy = getattr(_method(type(helper), "_copy_to_cpu", _ASYNC), "python_function", None)
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


# ------------------------------------------------------------------ summary writers

_SUMMARY = (
    "closing the event file of the writer a traced training step captured, between `fit` calls "
    "(`tf.summary` inside the step)"
)


def close_summary_file(writer: Any) -> None:
    """Flushes and closes `writer`'s event file; the writer object stays usable by the steps traced with it.

    `SummaryWriter.close` marks the Python object closed for good, but a
    traced step holds the writer's resource: re-tracing at every `fit` only
    to release a file is what this avoids. The resource's file is closed by
    the op `close()` itself runs, and `reopen_summary_file` opens a new one.
    """
    close = _attribute("tensorflow.python.ops.gen_summary_ops", "close_summary_writer", _SUMMARY)
    close(_method(writer, "_resource", _SUMMARY))


def reopen_summary_file(writer: Any, logdir: str) -> None:
    """Opens a new event file in `logdir` for `writer` after `close_summary_file`, with `create_file_writer`'s defaults."""
    create = _attribute("tensorflow.python.ops.gen_summary_ops", "create_summary_file_writer", _SUMMARY)
    create(_method(writer, "_resource", _SUMMARY), logdir=logdir, max_queue=10, flush_millis=120_000, filename_suffix=".v2")


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
    body = getattr(_method(graph, "_get_function", _FLOPS)(name), "graph", None)
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
