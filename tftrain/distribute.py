"""Choose and build the `tf.distribute.Strategy` a program trains with.

`setup_strategy` turns plain options into one strategy: a TPU (`TPUStrategy`),
the visible GPUs (`MirroredStrategy`), several workers named by TF_CONFIG or
by a SLURM job step (`MultiWorkerMirroredStrategy`), logical CPUs (to try a distributed program on
one machine), or the default strategy. Call it once at program start, before
any tensor or model exists; it logs what it chose on the `tftrain` logger.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import warnings
from typing import Any

import tensorflow as tf

from tftrain import slurm
from tftrain.arguments import check_port
from tftrain.errors import StrategySetupError

_LOGGER = logging.getLogger("tftrain")
_TF_CONFIG_EXAMPLE = (
    '{"cluster": {"worker": ["host0:2222", "host1:2222"]}, "task": {"type": "worker", "index": 0}}'
)
# The HTTP/2 client preface and an empty SETTINGS frame (type 4); a gRPC server answers with its SETTINGS.
_HTTP2_SETTINGS = 4
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, _HTTP2_SETTINGS, 0, 0, 0, 0, 0])
_PUBLIC_NAMES = {
    "CollectiveAllReduceStrategy": "MultiWorkerMirroredStrategy",
    "TPUStrategyV2": "TPUStrategy",
    "_DefaultDistributionStrategy": "default strategy",
}


def setup_strategy(
    use_gpu: bool = False,
    use_tpu: bool = False,
    tpu: str | None = None,
    *,
    tf_config: str | None = None,
    num_cpu_devices: int | None = None,
    collective_timeout_s: float | None = 300.0,
    tpu_timeout_s: float = 30.0,
    slurm_port: int | None = None,
) -> tf.distribute.Strategy:
    """Builds the distribution strategy for this program and logs what it chose.

    The first that applies: `use_tpu`; a TF_CONFIG naming more than one worker
    (MultiWorkerMirroredStrategy); without TF_CONFIG, a SLURM job step with
    more than one task (`srun`: MultiWorkerMirroredStrategy over its tasks,
    placed as TensorFlow's `SlurmClusterResolver` places them, task 0 the
    chief; `tftrain.slurm.read_step`);
    `use_gpu`; `num_cpu_devices`; else the default strategy. Call it at
    program start, before any op runs.

    Args:
        use_gpu: Train on the visible GPUs (MirroredStrategy, NCCL all-reduce with
            more than one; NCCL across workers). None visible: a warning, and the CPU.
        use_tpu: Train on a TPU.
        tpu: The TPU's name or `grpc://` address (None: the resolver's default,
            e.g. the local TPU on a TPU VM). Used with `use_tpu` only.
        tf_config: TensorFlow's cluster description (JSON). None reads the
            `TF_CONFIG` environment variable, TensorFlow's own cluster contract
            and the one environment variable tftrain reads; `""` means no cluster.
            A TF_CONFIG with a single worker is ignored; with `use_tpu`, so is TF_CONFIG.
        num_cpu_devices: Split the first CPU into this many logical devices under
            MirroredStrategy (None: leave it). Not with a GPU, TPU or multi-worker setup.
        collective_timeout_s: Multi-worker only: a collective that waits longer
            (e.g. for a dead peer) fails instead of hanging. None or 0: no timeout.
        tpu_timeout_s: Seconds to wait for the TPU to connect and initialize. The
            address is first checked to answer gRPC, as TensorFlow can block there
            holding the GIL once its runtime is initialized (no timeout fires then).
        slurm_port: Under SLURM, the port of each node's first task (the
            node's task k listens on it + k). None: the `TFTRAIN_SLURM_PORT`
            environment variable, else 8888.

    Returns:
        The strategy; create the model and optimizer in its `scope()`.

    Raises:
        ValueError: a bad argument, an impossible combination, a malformed
            TF_CONFIG or SLURM variable, or fewer GPUs than SLURM tasks on a node.
        StrategySetupError: no TPU answered, or the CPU cannot be split because
            TensorFlow's devices are already initialized.
    """
    _check_arguments(use_gpu, use_tpu, tpu, tf_config, num_cpu_devices, collective_timeout_s, tpu_timeout_s)
    check_port("slurm_port", slurm_port, optional=True)
    if use_tpu:
        strategy = tf.distribute.TPUStrategy(_connect_tpu(tpu, tpu_timeout_s))
    else:
        source = "argument `tf_config`" if tf_config is not None else "the TF_CONFIG environment variable"
        text = os.environ.get("TF_CONFIG") if tf_config is None else tf_config
        config = _parse_tf_config(text, source) if text else None
        step = None
        if config is None and slurm.step_tasks() > 1:
            step = slurm.read_step(port=slurm_port, use_gpu=use_gpu)
            config = step.config
            if step.gpus:  # this task's share of the node's GPUs, before TensorFlow looks for them
                os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(step.gpus)
        elif config is None and os.environ.get("SLURM_NTASKS", "1") != "1" and not slurm.step_tasks():
            _LOGGER.info(
                "tftrain: the SLURM job has %s tasks, but this process runs in no `srun` step: one process "
                "(start the program with `srun` for a worker in each task).", os.environ["SLURM_NTASKS"],
            )  # fmt: skip
        workers = _num_workers(config["cluster"]) if config else 0
        if workers > 1 and num_cpu_devices is not None:
            where = step.describe() if step else f"a {workers}-worker TF_CONFIG"
            raise _conflict(f"num_cpu_devices={num_cpu_devices!r}", where)
        if config and workers <= 1:
            _LOGGER.info("tftrain: TF_CONFIG names a single worker; it is ignored (one-machine setup).")
        gpus = _visible_gpus() if use_gpu else []
        if workers > 1:
            if step is not None:
                _LOGGER.info("tftrain: %s", step.describe())
            strategy = _multi_worker_strategy(config, gpus, collective_timeout_s)
        elif gpus:
            strategy = _gpu_strategy(len(gpus))
        else:  # With use_gpu but no GPU visible (warned above): the CPU path.
            strategy = _cpu_strategy(num_cpu_devices)
    _LOGGER.info("tftrain: distribution strategy: %s", describe(strategy))
    return strategy


def describe(strategy: tf.distribute.Strategy) -> str:
    """A one-line description: strategy name, replicas in sync, and devices.

    Args:
        strategy: Any `tf.distribute.Strategy`.

    Returns:
        E.g. ``"MirroredStrategy: 2 replicas on /job:localhost/replica:0/task:0/device:CPU:0, ..."``.
    """
    name = type(strategy).__name__
    replicas = strategy.num_replicas_in_sync
    try:
        devices = ", ".join(strategy.extended.worker_devices)
    except (AttributeError, RuntimeError, NotImplementedError):
        devices = "the default device"
    return f"{_PUBLIC_NAMES.get(name, name)}: {replicas} replica{'' if replicas == 1 else 's'} on {devices}"


def is_default_strategy(strategy: tf.distribute.Strategy) -> bool:
    """Whether `strategy` is TensorFlow's default strategy, with no strategy's scope entered.

    The default strategy is one device without distribution: no
    `strategy.run`, no distributed dataset and no distributed variable is
    needed under it. Inside another strategy's scope it is not the default.

    Args:
        strategy: Any `tf.distribute.Strategy`.

    Returns:
        True for the default strategy outside every scope.
    """
    return strategy is tf.distribute.get_strategy() and not tf.distribute.has_strategy()


def _check_arguments(
    use_gpu, use_tpu, tpu, tf_config, num_cpu_devices, collective_timeout, tpu_timeout
) -> None:
    """Raises a ValueError for a bad argument or an impossible combination, before anything happens."""
    for name, value in (("use_gpu", use_gpu), ("use_tpu", use_tpu)):
        if not isinstance(value, bool):
            raise _invalid(name, value, "True or False")
    if use_gpu and use_tpu:
        raise _conflict("use_gpu=True", "use_tpu=True")
    for name, value in (("tpu", tpu), ("tf_config", tf_config)):
        if value is not None and not isinstance(value, str):
            raise _invalid(name, value, "a string or None")
    if num_cpu_devices is not None:
        if isinstance(num_cpu_devices, bool) or not isinstance(num_cpu_devices, int) or num_cpu_devices < 1:
            raise _invalid(
                "num_cpu_devices", num_cpu_devices, "an integer >= 1 (one replica per device) or None"
            )
        if use_gpu or use_tpu:
            raise _conflict(f"num_cpu_devices={num_cpu_devices!r}", f"use_{'gpu' if use_gpu else 'tpu'}=True")
    if collective_timeout is not None and not (_is_seconds(collective_timeout) and collective_timeout >= 0):
        raise _invalid("collective_timeout_s", collective_timeout, "seconds >= 0 (0: no timeout) or None")
    if not (_is_seconds(tpu_timeout) and tpu_timeout > 0):
        raise _invalid("tpu_timeout_s", tpu_timeout, "seconds > 0")


def _is_seconds(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _invalid(name: str, value: Any, expected: str) -> ValueError:
    return ValueError(
        f"Invalid value for argument `{name}`. Received: {name}={value!r}. Expected {expected}."
    )


def _conflict(first: str, second: str) -> ValueError:
    return ValueError(
        f"Invalid combination of arguments. Received: {first} with {second}. Expected one of them."
    )


def _connect_tpu(tpu: str | None, timeout_s: float) -> Any:
    """Resolves, connects to and initializes the TPU in a daemon thread: a missing TPU never hangs."""
    outcome: dict[str, Any] = {}

    def connect() -> None:
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu)
            _check_grpc_server(resolver.master(), timeout_s / 2)
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
            outcome["resolver"] = resolver
        except Exception as error:  # Any failure means no usable TPU; re-raised clearly below.
            outcome["error"] = error

    thread = threading.Thread(target=connect, name="tftrain-tpu-connect", daemon=True)
    thread.start()
    thread.join(timeout_s)
    advice = (
        "Expected a reachable TPU: pass its name (e.g. from `gcloud compute tpus list`, or 'local' on a "
        "TPU VM) or grpc:// address as `tpu`, or turn `use_tpu` off (--use_tpu=false) to train on the CPU/GPU."
    )
    if thread.is_alive():
        raise StrategySetupError(
            f"No TPU was found: tpu={tpu!r} did not connect within tpu_timeout_s={timeout_s} s. {advice} "
            "The unfinished connection may leave TensorFlow unusable in this process: restart it."
        )
    if "error" in outcome:
        error = outcome["error"]
        raise StrategySetupError(
            f"No TPU was found for tpu={tpu!r}: {type(error).__name__}: {str(error).rstrip('.')}. {advice}"
        ) from error
    return outcome["resolver"]


def _check_grpc_server(master: str, timeout_s: float) -> None:
    """Raises ConnectionError unless a gRPC server answers at a `grpc://host:port` master.

    Sends the HTTP/2 preface and waits for the server's SETTINGS frame. TensorFlow
    itself can block on a dead address while holding the GIL (once its runtime is
    initialized), where the thread timeout could not fire.
    """
    if not master.startswith("grpc://"):
        return  # E.g. "local" on a TPU VM.
    host, _, port = master[len("grpc://") :].rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as connection:
            connection.sendall(_HTTP2_PREFACE)
            header = connection.recv(9)
    except (OSError, ValueError) as error:
        raise ConnectionError(f"no gRPC server answers at {master} ({error})") from error
    if len(header) < 4 or header[3] != _HTTP2_SETTINGS:
        raise ConnectionError(f"{master} accepts connections but does not answer as a gRPC server")


def _visible_gpus() -> list[Any]:
    """The visible GPUs; warns loudly (and logs) when there is none."""
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        message = (
            "tftrain: use_gpu=True but TensorFlow sees no GPU, so training runs on the CPU. Check the "
            "driver and CUDA install (`nvidia-smi`; `tf.config.list_physical_devices('GPU')`), or pass use_gpu=False."
        )
        warnings.warn(message, stacklevel=3)
        _LOGGER.warning(message)
    return gpus


def _gpu_strategy(num_gpus: int) -> tf.distribute.Strategy:
    if num_gpus > 1:
        return tf.distribute.MirroredStrategy(cross_device_ops=tf.distribute.NcclAllReduce())
    return tf.distribute.MirroredStrategy()


def _cpu_strategy(num_cpu_devices: int | None) -> tf.distribute.Strategy:
    if num_cpu_devices is None or num_cpu_devices == 1:
        return tf.distribute.get_strategy()
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    if current is None or len(current) != num_cpu_devices:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(num_cpu_devices)]
            )
        except RuntimeError as error:
            split = f"{len(current)} logical devices" if current else "one device"
            raise StrategySetupError(
                f"Cannot split the CPU into num_cpu_devices={num_cpu_devices}: TensorFlow's devices are already "
                f"initialized (the CPU is {split}). Call `setup_strategy(num_cpu_devices=...)` at program "
                "start, before any op runs and before any tensor, dataset or model is created."
            ) from error
    return tf.distribute.MirroredStrategy([f"/cpu:{index}" for index in range(num_cpu_devices)])


def _parse_tf_config(text: str, source: str) -> dict[str, Any]:
    """TF_CONFIG text -> its dict, checked; raises a ValueError naming the problem."""

    def invalid(problem: str) -> ValueError:
        shown = text[:200] + ("..." if len(text) > 200 else "")
        return ValueError(
            f"Invalid value for {source}: {problem}. Received: TF_CONFIG={shown!r}. "
            f"Expected a JSON object like {_TF_CONFIG_EXAMPLE}."
        )

    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise invalid(f"it is not valid JSON ({error})") from None
    if not isinstance(config, dict):
        raise invalid(f"it is a JSON {type(config).__name__}, not a JSON object")
    for key in ("cluster", "task"):
        if not isinstance(config.get(key), dict) or not config[key]:
            raise invalid(f"`{key}` is missing or not a non-empty object")
    cluster, task = config["cluster"], config["task"]
    for job, addresses in cluster.items():
        if not isinstance(addresses, list) or not addresses or not all(map(_is_address, addresses)):
            raise invalid(f"cluster[{job!r}]={addresses!r} is not a non-empty list of 'host:port' strings")
    task_type, index = task.get("type"), task.get("index")
    if task_type not in cluster:
        raise invalid(
            f"task type {task_type!r} is missing or not in the cluster (task types: {sorted(cluster)})"
        )
    count = len(cluster[task_type])
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise invalid(
            f"task index {index!r} is missing or out of range: the cluster has {count} {task_type!r} "
            f"task(s), so the index must be in 0..{count - 1}"
        )
    return config


def _is_address(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    host, _, port = value.rpartition(":")
    try:
        return bool(host) and port.isdigit() and bool(check_port("port", int(port)))
    except ValueError:
        return False


def _num_workers(cluster: dict[str, list[str]]) -> int:
    return len(cluster.get("chief", [])) + len(cluster.get("worker", []))


def _multi_worker_strategy(
    config: dict[str, Any], gpus: list[Any], timeout_s: float | None
) -> tf.distribute.Strategy:
    """MultiWorkerMirroredStrategy on the validated cluster; NCCL with GPUs, ring on CPUs."""
    task_type, index = config["task"]["type"], config["task"]["index"]
    if task_type not in ("chief", "worker"):
        raise ValueError(
            f"Invalid TF_CONFIG task. Received: task type {task_type!r}. Expected 'chief' or 'worker': "
            "MultiWorkerMirroredStrategy has no other task types."
        )
    # An explicit resolver: the strategy uses exactly the TF_CONFIG validated above, wherever it came from.
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(config["cluster"]),
        task_type=task_type,
        task_id=index,
        num_accelerators={"GPU": len(gpus)} if gpus else None,
        rpc_layer=config.get("rpc_layer") or "grpc",
    )
    implementation = tf.distribute.experimental.CommunicationImplementation
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=implementation.NCCL if gpus else implementation.RING, timeout_seconds=timeout_s
    )
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options)


def num_workers(strategy: tf.distribute.Strategy) -> int:
    """How many worker processes `strategy` spans (1 unless it is multi-worker)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None:
        return 1
    return max(1, _num_workers(resolver.cluster_spec().as_dict()))


def worker_role(strategy: tf.distribute.Strategy) -> tuple[bool, str]:
    """Whether this process is the chief of `strategy`'s workers, and its task name.

    The chief (the `chief` task, else worker 0) writes a run's checkpoints and
    TensorBoard files; the others take part in saves (they hold replicas of
    the variables) but write to a scratch directory. One process: the chief.

    Returns:
        `(is_chief, name)`, e.g. `(False, "worker-1")` or `(True, "worker-0")`.
    """
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or num_workers(strategy) <= 1:
        return True, "chief"
    task_type, task_id = resolver.task_type, int(resolver.task_id or 0)
    cluster = resolver.cluster_spec().as_dict()
    is_chief = task_type == "chief" or (task_type == "worker" and task_id == 0 and "chief" not in cluster)
    return is_chief, f"{task_type}-{task_id}"
