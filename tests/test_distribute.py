"""tftrain.distribute: which strategy `setup_strategy` builds, and its clear errors.

No GPU here, and a real MultiWorkerMirroredStrategy waits for its peers, so
those tests replace the constructors and check their arguments. Splitting the
CPU and the real TPU errors run in one fresh process: logical devices must be
set before TensorFlow starts, and a failed TPU connection can leave it unusable.
"""

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import threading
import time
import types
import warnings

import pytest
import tensorflow as tf

from tftrain import distribute

REPO = pathlib.Path(__file__).resolve().parents[1]
TWO_WORKERS = {"worker": ["localhost:12345", "localhost:23456"]}
Implementation = tf.distribute.experimental.CommunicationImplementation


@pytest.fixture(autouse=True)
def no_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)


def record(monkeypatch, name):
    """Replaces `tf.distribute.<name>` by a fake strategy; returns the keyword arguments of each call."""
    calls = []

    class Fake:
        num_replicas_in_sync = 2
        extended = types.SimpleNamespace(worker_devices=("/gpu:0", "/gpu:1"))

        def __init__(self, *args, **kwargs):
            assert not args, args
            calls.append(kwargs)

    Fake.__name__ = name
    monkeypatch.setattr(tf.distribute, name, Fake)
    return calls


def fake_gpus(monkeypatch, count):
    real = tf.config.list_physical_devices

    def list_physical_devices(device_type=None):
        if device_type == "GPU":
            return [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(count)]
        return real(device_type)

    monkeypatch.setattr(tf.config, "list_physical_devices", list_physical_devices)


def tf_config(cluster, task_type="worker", index=0):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def test_gpu_and_tpu_together_fail_before_anything(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("nothing may be set up")

    monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", forbidden)
    monkeypatch.setattr(tf.config, "list_physical_devices", forbidden)
    with pytest.raises(ValueError, match="use_gpu=True with use_tpu=True"):
        distribute.setup_strategy(use_gpu=True, use_tpu=True)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(num_cpu_devices=0), "num_cpu_devices=0"),
        (dict(num_cpu_devices=2.0), "num_cpu_devices=2.0"),
        (dict(num_cpu_devices=True), "num_cpu_devices=True"),
        (dict(num_cpu_devices="2"), "num_cpu_devices='2'"),
        (dict(num_cpu_devices=2, use_gpu=True), "combination.*num_cpu_devices=2 with use_gpu=True"),
        (dict(num_cpu_devices=2, use_tpu=True), "combination.*num_cpu_devices=2 with use_tpu=True"),
        (dict(use_gpu="yes"), "use_gpu='yes'"),
        (dict(tpu=3, use_tpu=True), "tpu=3"),
        (dict(tf_config={"cluster": {}}), "tf_config="),
        (dict(tpu_timeout_s=0), "tpu_timeout_s=0"),
        (dict(collective_timeout_s=-1.0), "collective_timeout_s=-1.0"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, fragment):
    with pytest.raises(ValueError, match=f"Invalid .*{fragment}"):
        distribute.setup_strategy(**kwargs)


@pytest.mark.parametrize("kwargs", [{}, {"num_cpu_devices": 1}, {"tf_config": ""}])
def test_default_strategy_is_logged(kwargs, caplog):
    with caplog.at_level("INFO", logger="tftrain"):
        strategy = distribute.setup_strategy(**kwargs)
    assert strategy is tf.distribute.get_strategy()
    assert "default strategy: 1 replica on the default device" in caplog.text


def test_describe_names_the_strategy_replicas_and_devices():
    assert distribute.describe(tf.distribute.OneDeviceStrategy("/cpu:0")) == (
        "OneDeviceStrategy: 1 replica on /job:localhost/replica:0/task:0/device:CPU:0"
    )
    assert (
        distribute.describe(tf.distribute.get_strategy())
        == "default strategy: 1 replica on the default device"
    )


def test_is_default_strategy_only_outside_every_scope():
    default, one_device = tf.distribute.get_strategy(), tf.distribute.OneDeviceStrategy("/cpu:0")
    assert distribute.is_default_strategy(default)
    assert not distribute.is_default_strategy(one_device)
    with one_device.scope():
        assert not distribute.is_default_strategy(default)
        assert not distribute.is_default_strategy(tf.distribute.get_strategy())


@pytest.mark.parametrize("num_gpus", [1, 2, 4])
def test_gpus_give_mirrored_strategy_with_nccl_above_one(num_gpus, monkeypatch, caplog):
    fake_gpus(monkeypatch, num_gpus)
    calls = record(monkeypatch, "MirroredStrategy")
    with caplog.at_level("INFO", logger="tftrain"):
        strategy = distribute.setup_strategy(use_gpu=True)
    assert type(strategy).__name__ == "MirroredStrategy"
    assert len(calls) == 1
    if num_gpus == 1:
        assert calls[0] == {}
    else:
        assert set(calls[0]) == {"cross_device_ops"}
        assert isinstance(calls[0]["cross_device_ops"], tf.distribute.NcclAllReduce)
    assert "MirroredStrategy: 2 replicas on /gpu:0, /gpu:1" in caplog.text


def test_no_gpu_warns_and_runs_on_the_cpu(monkeypatch, caplog):
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("this machine has a GPU")
    calls = record(monkeypatch, "MirroredStrategy")
    with caplog.at_level("INFO", logger="tftrain"), pytest.warns(UserWarning, match="sees no GPU"):
        strategy = distribute.setup_strategy(use_gpu=True)
    assert strategy is tf.distribute.get_strategy()
    assert calls == []
    assert any(r.levelname == "WARNING" and "sees no GPU" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(
    "cluster, task_type, index, use_gpu, num_gpus, implementation",
    [
        (TWO_WORKERS, "worker", 1, False, 2, Implementation.RING),  # GPUs present but not asked for.
        (
            {"chief": ["localhost:1111"], "worker": ["localhost:2222"]},
            "chief",
            0,
            True,
            2,
            Implementation.NCCL,
        ),
        (TWO_WORKERS, "worker", 0, True, 0, Implementation.RING),  # No GPU visible: warned, ring.
    ],
)
def test_multi_worker_tf_config_gives_multi_worker_strategy(
    cluster, task_type, index, use_gpu, num_gpus, implementation, monkeypatch, caplog
):
    fake_gpus(monkeypatch, num_gpus)
    calls = record(monkeypatch, "MultiWorkerMirroredStrategy")
    mirrored = record(monkeypatch, "MirroredStrategy")
    with warnings.catch_warnings(record=True) as caught, caplog.at_level("INFO", logger="tftrain"):
        warnings.simplefilter("always")
        distribute.setup_strategy(
            use_gpu=use_gpu, tf_config=tf_config(cluster, task_type, index), collective_timeout_s=42.0
        )
    assert mirrored == [] and len(calls) == 1
    resolver, options = calls[0]["cluster_resolver"], calls[0]["communication_options"]
    assert resolver.cluster_spec().as_dict() == cluster
    assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == (task_type, index, "grpc")
    assert resolver.num_accelerators() == ({"GPU": num_gpus} if use_gpu and num_gpus else {})
    assert options.implementation == implementation
    assert options.timeout_seconds == 42.0
    assert any("sees no GPU" in str(w.message) for w in caught) == (use_gpu and not num_gpus)
    assert "MultiWorkerMirroredStrategy: 2 replicas" in caplog.text


def test_tf_config_is_read_from_the_environment_by_default(monkeypatch):
    calls = record(monkeypatch, "MultiWorkerMirroredStrategy")
    monkeypatch.setenv("TF_CONFIG", tf_config(TWO_WORKERS, index=1))
    distribute.setup_strategy()
    assert len(calls) == 1
    assert calls[0]["cluster_resolver"].task_id == 1
    assert calls[0]["communication_options"].timeout_seconds == 300.0
    assert distribute.setup_strategy(tf_config="") is tf.distribute.get_strategy()  # "" overrides it.
    assert len(calls) == 1
    monkeypatch.setenv("TF_CONFIG", "{oops")
    with pytest.raises(ValueError, match="the TF_CONFIG environment variable: it is not valid JSON"):
        distribute.setup_strategy()


def test_single_worker_tf_config_is_ignored(monkeypatch, caplog):
    calls = record(monkeypatch, "MultiWorkerMirroredStrategy")
    with caplog.at_level("INFO", logger="tftrain"):
        strategy = distribute.setup_strategy(tf_config=tf_config({"worker": ["localhost:1"]}))
    assert strategy is tf.distribute.get_strategy()
    assert calls == []
    assert "single worker; it is ignored" in caplog.text


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("{not json", ["not valid JSON (Expecting property name", "'{not json'"]),
        ("[" + "7," * 300, ["not valid JSON", "'" + "[" + "7," * 99 + "7...'"]),
        ("[1, 2]", ["a JSON list, not a JSON object"]),
        (json.dumps({"task": {"type": "worker", "index": 0}}), ["`cluster` is missing"]),
        (json.dumps({"cluster": TWO_WORKERS}), ["`task` is missing"]),
        (json.dumps({"cluster": TWO_WORKERS, "task": {"index": 0}}), ["task type None is missing or not in"]),
        (tf_config(TWO_WORKERS, "ps"), ["task type 'ps'", "task types: ['worker']"]),
        (tf_config(TWO_WORKERS, index=2), ["task index 2", "2 'worker' task(s)", "0..1"]),
        (tf_config(TWO_WORKERS, index="1"), ["task index '1'"]),
        (json.dumps({"cluster": TWO_WORKERS, "task": {"type": "worker"}}), ["task index None"]),
        (tf_config({"worker": ["localhost", "localhost:2"]}), ["cluster['worker']", "'host:port'"]),
        (tf_config({"worker": ["localhost:1", 2222]}), ["cluster['worker']"]),
        (tf_config({"worker": ["localhost:99999"]}), ["cluster['worker']"]),
        (tf_config({"worker": "localhost:1"}), ["cluster['worker']='localhost:1'"]),
    ],
)
def test_invalid_tf_config_is_rejected_clearly(text, fragments, monkeypatch):
    calls = record(monkeypatch, "MultiWorkerMirroredStrategy")
    with pytest.raises(ValueError, match="Invalid value for argument `tf_config`") as raised:
        distribute.setup_strategy(tf_config=text)
    for fragment in fragments:
        assert fragment in str(raised.value)
    assert calls == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_cpu_devices=2), "num_cpu_devices=2 with a 2-worker TF_CONFIG"),
        (
            dict(tf_config=tf_config({**TWO_WORKERS, "evaluator": ["localhost:3"]}, "evaluator")),
            "'chief' or 'worker'",
        ),
    ],
)
def test_multi_worker_conflicts_are_rejected(kwargs, message, monkeypatch):
    calls = record(monkeypatch, "MultiWorkerMirroredStrategy")
    kwargs.setdefault("tf_config", tf_config(TWO_WORKERS))
    with pytest.raises(ValueError, match=message):
        distribute.setup_strategy(**kwargs)
    assert calls == []


RESOLVER = types.SimpleNamespace(master=lambda: "")  # As a TPU VM's local TPU: no address to check.


class FakeTpu:
    """Fake TPU resolver and setup calls, so the TPU path runs without a TPU (or TF's runtime)."""

    def __init__(self, monkeypatch, connect=None):
        self.calls = []
        monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver", self.resolver)
        monkeypatch.setattr(tf.config, "experimental_connect_to_cluster", connect or self.step("connect"))
        monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system", self.step("initialize"))
        monkeypatch.setattr(tf.distribute, "TPUStrategy", self.step("strategy"))

    def resolver(self, tpu):
        self.calls.append(("resolver", tpu))
        return RESOLVER

    def step(self, name):
        def call(resolver):
            self.calls.append((name, resolver))
            return types.SimpleNamespace(
                num_replicas_in_sync=8, extended=types.SimpleNamespace(worker_devices=["t"])
            )

        return call


def test_tpu_connects_initializes_then_builds_the_strategy(monkeypatch, caplog):
    tpu = FakeTpu(monkeypatch)
    with caplog.at_level("INFO", logger="tftrain"):
        distribute.setup_strategy(use_tpu=True, tpu="my-tpu")
    assert tpu.calls == [
        ("resolver", "my-tpu"),
        ("connect", RESOLVER),
        ("initialize", RESOLVER),
        ("strategy", RESOLVER),
    ]
    assert "8 replicas on t" in caplog.text


def test_tpu_connection_that_hangs_times_out(monkeypatch):
    release = threading.Event()
    tpu = FakeTpu(monkeypatch, connect=lambda resolver: release.wait(10))
    start = time.monotonic()
    with pytest.raises(distribute.StrategySetupError, match="No TPU was found: tpu='my-tpu' did not connect"):
        distribute.setup_strategy(use_tpu=True, tpu="my-tpu", tpu_timeout_s=0.3)
    release.set()
    assert time.monotonic() - start < 3
    assert ("strategy", RESOLVER) not in tpu.calls


SCRIPT = textwrap.dedent(
    """
    import json, os, socket, time
    import tensorflow as tf
    from tftrain import distribute

    results = {}
    strategy = distribute.setup_strategy(num_cpu_devices=2)
    results["replicas"] = strategy.num_replicas_in_sync
    results["describe"] = distribute.describe(strategy)
    again = distribute.setup_strategy(num_cpu_devices=2)
    per_replica = again.run(lambda: tf.constant(1.0))
    results["again"] = [again.num_replicas_in_sync, float(again.reduce("SUM", per_replica, axis=None))]

    def error_of(**kwargs):
        start = time.monotonic()
        try:
            distribute.setup_strategy(**kwargs)
        except Exception as error:
            return {"type": type(error).__name__, "message": str(error), "seconds": time.monotonic() - start}

    results["three"] = error_of(num_cpu_devices=3)
    results["tpu_none"] = error_of(use_tpu=True, tpu_timeout_s=5)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        results["port"] = closed.getsockname()[1]
    results["tpu_closed"] = error_of(use_tpu=True, tpu=f"grpc://127.0.0.1:{results['port']}", tpu_timeout_s=5)
    with socket.socket() as silent:  # Accepts connections (the kernel does), never answers.
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        results["silent_port"] = silent.getsockname()[1]
        address = f"grpc://127.0.0.1:{results['silent_port']}"
        results["tpu_silent"] = error_of(use_tpu=True, tpu=address, tpu_timeout_s=5)
    print("RESULT" + json.dumps(results), flush=True)
    os._exit(0)  # Do not wait for anything a failed TPU connection left behind.
    """
)


@pytest.fixture(scope="module")
def fresh_process():
    """Runs SCRIPT in a fresh process (no TPU settings in its environment); returns its RESULT."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("TPU", "TF_CONFIG"))}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    completed = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env, cwd=REPO
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    line = next(line for line in completed.stdout.splitlines() if line.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


def test_num_cpu_devices_splits_the_cpu_into_mirrored_replicas(fresh_process):
    assert fresh_process["replicas"] == 2
    assert fresh_process["describe"] == (
        "MirroredStrategy: 2 replicas on /job:localhost/replica:0/task:0/device:CPU:0, "
        "/job:localhost/replica:0/task:0/device:CPU:1"
    )
    assert fresh_process["again"] == [2, 2.0]  # The same split again is accepted, and runs.


def test_num_cpu_devices_after_initialization_is_a_clear_error(fresh_process):
    error = fresh_process["three"]
    assert error["type"] == "StrategySetupError"
    for fragment in ("num_cpu_devices=3", "already initialized", "2 logical devices", "at program start"):
        assert fragment in error["message"]


@pytest.mark.parametrize(
    "case, tpu, cause",
    [
        ("tpu_none", "None", "Please provide a TPU Name"),  # TensorFlow's resolver, re-raised clearly.
        ("tpu_closed", "'grpc://127.0.0.1:{port}'", "Connection refused"),
        ("tpu_silent", "'grpc://127.0.0.1:{silent_port}'", "no gRPC server answers"),
    ],
)
def test_no_tpu_is_a_clear_error_within_seconds(case, tpu, cause, fresh_process):
    error = fresh_process[case]
    assert error["type"] == "StrategySetupError"
    message = error["message"]
    assert f"No TPU was found for tpu={tpu.format(**fresh_process)}" in message
    assert cause in message and "turn `use_tpu` off" in message
    assert error["seconds"] < 5 + 5
