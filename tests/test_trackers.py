"""Experiment trackers' Keras callbacks record a `Trainer.fit` as they record `model.fit`, offline.

MLflow (`mlflow.keras.MlflowCallback`, a local SQLite tracking database) and
Weights & Biases (`WandbMetricsLogger`, an offline run whose records are read
back from its `.wandb` file) each record the same tiny run twice, once under
`model.fit` and once under `Trainer.fit`; what they recorded is compared.
`tftrain.callbacks.RunRecordLogger` hands the run record to each as
parameters. The tests skip where the `trackers` extra is not installed.
"""

import json
import struct
import time

import keras
import numpy as np
import pytest

import tftrain
from tftrain.callbacks import RunRecordLogger
from tftrain.checkpoint import run_record
from tftrain.services.hparams import hparams_of

_MISSING = "not installed: the `trackers` extra (pip install '.[trackers]')"
_RNG = np.random.RandomState(0)
X = _RNG.rand(16, 6).astype("float32")
Y = (X[:, 0] * 3).astype("int32").clip(0, 2)
# 12 training examples (batches of 8 and 4), 4 validation examples, 2 epochs.
FIT = dict(batch_size=8, epochs=2, verbose=0, validation_split=0.25)


def _model() -> keras.Model:
    """A tiny classifier, named so that what the trackers record of it is the same in both runs."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, name="dense")], name="net")
    model.compile(
        optimizer=keras.optimizers.Adam(0.01, name="adam"),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=False,
    )
    return model


def _fit(side: str, callbacks: list, **trainer_kwargs) -> None:
    """The same run under `model.fit` ("keras") or `Trainer.fit` ("trainer")."""
    model = _model()
    keras.utils.set_random_seed(0)
    if side == "keras":
        model.fit(X, Y, callbacks=callbacks, **FIT)
    else:
        tftrain.Trainer(model, **trainer_kwargs).fit(X, Y, callbacks=callbacks, **FIT)


@pytest.fixture(scope="module")
def mlflow_store(tmp_path_factory):
    """MLflow on one SQLite database for the module (made once: its migrations take seconds).

    MLflow's file store takes no new runs, and `mlflow-skinny` has no SQLite backend: the full `mlflow`.
    """
    mlflow = pytest.importorskip("mlflow", reason=f"MLflow is {_MISSING}")
    path = tmp_path_factory.mktemp("mlflow")
    uri = f"sqlite:///{path / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_TRACKING_URI", uri)  # MLflow sets both variables: put back afterwards
        patch.setenv("MLFLOW_EXPERIMENT_ID", "0")
        mlflow.set_tracking_uri(uri)
        yield mlflow, path
        mlflow.set_tracking_uri(None)


@pytest.fixture
def mlflow(mlflow_store, request):
    """MLflow, in an experiment of the test's own, its artifacts under the module's directory (not ./mlruns)."""
    mlflow, path = mlflow_store
    name = request.node.name
    mlflow.set_experiment(experiment_id=mlflow.create_experiment(name, artifact_location=(path / name).as_uri()))
    return mlflow


def _mlflow_run(mlflow, run_id: str) -> dict:
    """What a run recorded: its parameters, each metric's (step, value) history, its model summary."""
    client = mlflow.MlflowClient()
    run = client.get_run(run_id)
    metrics = {}
    for key in run.data.metrics:
        history = sorted(client.get_metric_history(run_id, key), key=lambda entry: (entry.step, entry.timestamp))
        metrics[key] = [(entry.step, entry.value) for entry in history]
    with open(client.download_artifacts(run_id, "model_summary.txt")) as file:
        # Less the optimizer's variables: the Trainer creates them before `on_train_begin`, where `fit`
        # without a strategy creates them in its first step (docs/trainer.md's differences).
        summary = [line for line in file if not line.startswith((" Total params", " Optimizer params"))]
    return {"params": run.data.params, "metrics": metrics, "summary": summary}


def test_mlflow_callback_records_a_trainer_fit_as_model_fit(mlflow):
    recorded = {}
    for side in ("keras", "trainer"):
        with mlflow.start_run() as run:
            _fit(side, [mlflow.keras.MlflowCallback()])  # each epoch's logs, and each validation's
        recorded[side] = _mlflow_run(mlflow, run.info.run_id)
    keras_run, trainer_run = recorded["keras"], recorded["trainer"]
    assert trainer_run["params"] == keras_run["params"]
    assert trainer_run["params"]["optimizer_learning_rate"].startswith("0.0099")
    assert trainer_run["summary"] == keras_run["summary"]
    assert sorted(trainer_run["metrics"]) == sorted(keras_run["metrics"])
    assert {"loss", "accuracy", "validation_loss"} <= set(keras_run["metrics"])
    for key, history in keras_run["metrics"].items():
        steps = [step for step, _ in history]
        assert [step for step, _ in trainer_run["metrics"][key]] == steps, key
        np.testing.assert_allclose(
            [value for _, value in trainer_run["metrics"][key]], [value for _, value in history], rtol=1e-5, err_msg=key
        )
    assert [step for step, _ in keras_run["metrics"]["loss"]] == [0, 1]  # the epochs


def test_mlflow_autolog_records_nothing_of_a_trainer_fit(mlflow, request):
    """Autolog patches `keras.Model.fit`, which a Trainer does not call: no run (docs/trackers.md)."""
    experiment = mlflow.get_experiment_by_name(request.node.name).experiment_id

    def runs():
        return mlflow.MlflowClient().search_runs([experiment])

    mlflow.keras.autolog(log_models=False, log_datasets=False, silent=True)
    try:
        _fit("trainer", [])
        assert runs() == []
        _fit("keras", [])  # the same run under model.fit: autolog records it
        recorded = runs()
        assert len(recorded) == 1 and {"loss", "val_loss"} <= set(recorded[0].data.metrics)
    finally:
        mlflow.keras.autolog(disable=True)


def test_run_record_logger_gives_mlflow_the_run_record_as_parameters(mlflow, tmp_path):
    model_dir = str(tmp_path / "run")
    with mlflow.start_run() as run:
        _fit(
            "trainer",
            [mlflow.keras.MlflowCallback(), RunRecordLogger(mlflow.log_params, model_dir)],
            model_dir=model_dir,
            hparams={"width": 8},
        )
    params = mlflow.MlflowClient().get_run(run.info.run_id).data.params
    record = hparams_of(run_record.read_file(model_dir))
    assert {key: params[key] for key in record} == {key: str(value) for key, value in record.items()}
    assert params["width"] == "8" and params["optimizer.learning_rate"] == "0.01"
    assert params["optimizer_learning_rate"].startswith("0.0099")  # MLflow's callback's own, beside the record


@pytest.fixture(scope="module")
def wandb(tmp_path_factory):
    """W&B offline, every file it writes under the module's directory; its service process started once."""
    wandb = pytest.importorskip("wandb", reason=f"Weights & Biases is {_MISSING}")
    path = tmp_path_factory.mktemp("wandb")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_SILENT", "true")
        for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
            patch.setenv(name, str(path))
        yield wandb
        wandb.teardown()


def _finish(run) -> None:
    """Ends the run and waits until W&B's service process has written the run's file to its end (the exit record)."""
    run.finish()
    deadline = time.monotonic() + 60
    while not any(record.WhichOneof("record_type") == "exit" for record in _wandb_records(_wandb_file(run))):
        assert time.monotonic() < deadline, "W&B wrote no exit record"
        time.sleep(0.05)


def _wandb_file(run) -> str:
    """The offline run's records: `run-<id>.wandb` beside its `files/` directory."""
    return f"{run.dir}/../run-{run.id}.wandb"


def _wandb_records(path: str):
    """The records of an offline run's `.wandb` file (LevelDB's log format: 32 KiB blocks of framed chunks)."""
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as file:
        data = file.read()
    identifier, magic, _ = struct.unpack("<4sHB", data[:7])
    assert (identifier, magic) == (b":W&B", 0xBEE1), (identifier, magic)
    block, header, position, pending = 32768, 7, 7, b""
    while position + header <= len(data):
        if block - position % block < header:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + header])
        if (length, kind) == (0, 0):
            break
        pending += data[position + header : position + header + length]
        position += header + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def _wandb_run(run) -> dict:
    """What an offline run recorded: each `wandb.log` row (less its clock) and its configuration."""
    rows, config = [], {}
    for record in _wandb_records(_wandb_file(run)):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            rows.append({key: value for key, value in row.items() if key not in ("_timestamp", "_runtime")})
        elif kind in ("config", "run"):
            updates = record.config.update if kind == "config" else record.run.config.update
            config.update({item.key: json.loads(item.value_json) for item in updates if item.key != "_wandb"})
    return {"rows": rows, "config": config}


def test_wandb_metrics_logger_records_a_trainer_fit_as_model_fit(wandb):
    from wandb.integration.keras import WandbMetricsLogger

    recorded = {}
    for side in ("keras", "trainer"):
        run = wandb.init(project="tftrain", name=side)
        _fit(side, [WandbMetricsLogger(log_freq="batch")])  # each batch, and each epoch
        _finish(run)
        recorded[side] = _wandb_run(run)["rows"]
    keras_rows, trainer_rows = recorded["keras"], recorded["trainer"]
    assert [sorted(row) for row in trainer_rows] == [sorted(row) for row in keras_rows]
    assert [row.get("epoch/epoch", row.get("batch/batch_step")) for row in keras_rows] == [0, 1, 0, 2, 3, 1]
    assert {"epoch/loss", "epoch/val_accuracy", "epoch/learning_rate"} <= set(keras_rows[2])
    for expected, got in zip(keras_rows, trainer_rows, strict=True):
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, rel=1e-5), key


def test_run_record_logger_gives_wandb_the_run_record_as_configuration(wandb, tmp_path):
    from wandb.integration.keras import WandbMetricsLogger

    model_dir = str(tmp_path / "run")
    run = wandb.init(project="tftrain", config={"seed": 0})
    _fit(
        "trainer",
        [WandbMetricsLogger(), RunRecordLogger(wandb.config.update, model_dir)],
        model_dir=model_dir,
        hparams={"width": 8},
    )
    _finish(run)
    config = _wandb_run(run)["config"]
    assert config == {"seed": 0, **hparams_of(run_record.read_file(model_dir))}
    assert config["width"] == 8 and config["optimizer.learning_rate"] == pytest.approx(0.01)
