"""The run record: what it holds, and how a resume sorts each difference (taken or refused)."""

import json
import os

import keras
import numpy as np
import pytest
from helpers import make_mlp

from tftrain.checkpoint import run_record
from tftrain.errors import IncompatibleCheckpointError, RunChangedError
from tftrain.fit_inputs import inputs


def _record(optimizer=None, *, model=None, batch_size=8, examples=64, settings=None):
    model = model or make_mlp()
    model.compile(optimizer or keras.optimizers.SGD(0.1), "mse")
    x = np.zeros((examples, 6), "float32")
    data = inputs.adapt(x, x[:, :3], batch_size=batch_size)
    return run_record.build(
        model=model,
        dataset=data.dataset,
        adapter=data.adapter,
        replicas=1,
        settings=settings or {"ema_decay": None, "epochs": 3},
    )


def test_the_record_holds_what_results_depend_on():
    model = make_mlp()
    record = _record(keras.optimizers.SGD(0.5, momentum=0.9), model=model, batch_size=8, examples=60)
    assert record["optimizer"] == "keras.optimizers.SGD"
    assert record["optimizer.learning_rate"] == 0.5
    assert record["optimizer.momentum"] == 0.9
    assert record["loss"] == "mse"
    assert record["data.global_batch_size"] == 8
    assert record["data.examples"] == 60
    assert record["data.batches_per_pass"] == 8
    assert record["data.element_spec"] == ["float32[6]", "float32[3]"]
    assert record["dtype_policy"] == "float32"
    assert record["model.layers"] == ["Dense[6x8, 8]", "Dense[8x3, 3]"]
    assert record["model.layer_names"] == [layer.name for layer in model.layers]  # named in messages, not compared
    assert record["versions.keras"] == keras.__version__
    json.dumps(record)  # saved as JSON with every checkpoint


def test_an_unchanged_call_has_no_differences():
    assert run_record.compare(_record(), _record(), mid_epoch=True) == run_record.Comparison()


def test_a_record_missing_from_an_older_checkpoint_compares_as_nothing():
    assert run_record.compare(None, _record(), mid_epoch=True) == run_record.Comparison()


def test_a_new_learning_rate_and_target_are_taken_in_the_users_terms():
    saved = _record(keras.optimizers.SGD(1.0), settings={"ema_decay": None, "epochs": 3})
    now = _record(keras.optimizers.SGD(0.01), settings={"ema_decay": None, "epochs": 5})
    comparison = run_record.compare(saved, now, mid_epoch=True)
    assert not comparison.refused
    assert comparison.taken_lines() == [
        "epochs: 3 in the checkpoint, 5 now (yours)",
        "learning_rate: 1.0 in the checkpoint, 0.01 now (yours)",
    ]


def test_the_users_values_are_recorded_and_compared_but_the_command_line_only_recorded():
    saved = _record()
    saved.update({"hparams.seed": 0, "hparams.command_line": "train.py --seed=0 --flagfile=a.flags"})
    now = _record()
    now.update({"hparams.seed": 1, "hparams.command_line": "train.py --flagfile=/abs/a.flags --seed=1"})
    comparison = run_record.compare(saved, now, mid_epoch=True)
    assert comparison.taken_lines() == ["hparams.seed: 0 in the checkpoint, 1 now (yours)"]
    built = run_record.build(
        model=make_mlp(), dataset=None, adapter=None, replicas=1, settings={}, hparams={"seed": np.int64(3)}
    )
    assert built["hparams.seed"] == 3


def test_a_programs_flag_for_an_option_is_compared_once_and_an_older_records_text_of_it_is_the_same_value():
    older = _record(settings={"steps_per_loop": 8})  # its flags as their text, under `hparams.<option>`
    older.update({"hparams.steps_per_loop": "8", "hparams.jit_compile": "False", "hparams.max_to_keep": 5})
    now = _record(settings={"steps_per_loop": 8})
    now.update({"hparams.trainer.steps_per_loop": 8, "hparams.trainer.jit_compile": False, "hparams.trainer.max_to_keep": 5})
    assert run_record.compare(older, now, mid_epoch=True).taken_lines() == []
    now.update({"steps_per_loop": 4, "hparams.trainer.steps_per_loop": 4, "hparams.trainer.max_to_keep": 2})
    assert run_record.compare(older, now, mid_epoch=True).taken_lines() == [
        "hparams.trainer.max_to_keep: 5 in the checkpoint, 2 now (yours)",
        "steps_per_loop: 8 in the checkpoint, 4 now (yours)",  # said once, by the record's own field
    ]


def test_another_optimizer_class_is_refused_once_not_per_hyperparameter():
    comparison = run_record.compare(
        _record(keras.optimizers.SGD(0.1)), _record(keras.optimizers.Adam(0.1)), mid_epoch=False
    )
    assert [change.key for change in comparison.refused] == ["optimizer"]
    assert not [change for change in comparison.taken if change.key.startswith("optimizer")]
    error = run_record.refusal(comparison, "the checkpoint of step 8", "runs/a")
    assert isinstance(error, IncompatibleCheckpointError)
    assert "optimizer: keras.optimizers.SGD in the checkpoint, keras.optimizers.Adam now" in str(error)
    assert "new `model_dir`" in str(error) and "runs/a" in str(error)


def test_a_hyperparameter_that_changes_the_optimizers_variables_is_refused_by_name():
    saved = _record(keras.optimizers.Adam(0.1))
    now = _record(keras.optimizers.Adam(0.1, amsgrad=True))
    for record in (saved, now):
        assert "optimizer.variables" not in record  # not built: compared by hyperparameter alone
    model = make_mlp()
    built = []
    for amsgrad in (False, True):
        optimizer = keras.optimizers.Adam(0.1, amsgrad=amsgrad)
        optimizer.build(model.trainable_variables)
        built.append(_record(optimizer, model=make_mlp()))
    comparison = run_record.compare(built[0], built[1], mid_epoch=False)
    assert [change.key for change in comparison.refused] == ["optimizer.amsgrad"]
    assert "amsgrad: False in the checkpoint, True now" in str(run_record.refusal(comparison, "c", None))


def test_ema_switched_on_is_refused_and_another_decay_taken():
    off = _record(settings={"ema_decay": None})
    on = _record(settings={"ema_decay": 0.99})
    refused = run_record.compare(off, on, mid_epoch=False).refused
    assert [change.line() for change in refused] == ["ema_decay: None in the checkpoint, 0.99 now"]
    taken = run_record.compare(on, _record(settings={"ema_decay": 0.999}), mid_epoch=False)
    assert not taken.refused and taken.taken_lines() == ["ema_decay: 0.99 in the checkpoint, 0.999 now (yours)"]


def test_another_model_is_refused_naming_the_layer_not_tensor_shapes():
    wider = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16), keras.layers.Dense(3)])
    comparison = run_record.compare(_record(), _record(model=wider), mid_epoch=False)
    lines = [change.line() for change in comparison.refused]
    name = wider.layers[0].name
    assert lines == [f"the model's layers: layer 0 ({name}) is Dense[6x8, 8] in the checkpoint, Dense[6x16, 16] now"]


@pytest.mark.parametrize("mid_epoch", [True, False])
def test_a_data_change_is_refused_mid_epoch_and_taken_at_an_epoch_boundary(mid_epoch):
    comparison = run_record.compare(_record(batch_size=8), _record(batch_size=16), mid_epoch=mid_epoch)
    keys = {"data.batches_per_pass", "data.global_batch_size"}
    assert {change.key for change in (comparison.refused if mid_epoch else comparison.taken)} == keys
    if mid_epoch:
        message = str(run_record.refusal(comparison, "the checkpoint of step 3", "runs/a"))
        assert "global_batch_size: 8 in the checkpoint, 16 now" in message
        assert "skip or repeat examples" in message and "epoch end" in message


def test_the_readable_copy_keeps_every_change_taken(tmp_path):
    saved, now = _record(keras.optimizers.SGD(1.0)), _record(keras.optimizers.SGD(0.1))
    run_record.write_file(str(tmp_path), saved, run_record.Comparison(), 0)
    run_record.write_file(str(tmp_path), now, run_record.compare(saved, now, mid_epoch=False), 8)
    written = json.loads((tmp_path / "run_record.json").read_text())
    assert written["record"]["optimizer.learning_rate"] == 0.1
    assert written["changes"] == [{"step": 8, "key": "optimizer.learning_rate", "saved": 1.0, "now": 0.1}]
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]



def test_the_readable_copy_reads_back_as_the_record_and_a_missing_or_damaged_one_as_none(tmp_path):
    record = _record(keras.optimizers.SGD(0.1))
    assert run_record.read_file(str(tmp_path)) is None
    run_record.write_file(str(tmp_path), record, run_record.Comparison(), 0)
    assert run_record.read_file(str(tmp_path)) == json.loads(json.dumps(record))
    (tmp_path / "run_record.json").write_text('["not a record"]')
    assert run_record.read_file(str(tmp_path)) is None
    (tmp_path / "run_record.json").write_text('{"record": ')
    assert run_record.read_file(str(tmp_path)) is None

def test_the_refusal_is_a_run_changed_error():
    assert issubclass(RunChangedError, IncompatibleCheckpointError)


def test_orders_recorded_from_several_threads_leave_tensorflows_shuffle_as_it_was():
    import threading

    import tensorflow as tf

    from tftrain.fit_inputs.epoch_order import EpochOrder

    original = tf.random.shuffle
    data = inputs.adapt(np.zeros((16, 2), "float32"), np.zeros((16,), "float32"), batch_size=4, shuffle=True)

    recorded = []

    def record_orders():
        for _ in range(10):
            recorded.append(EpochOrder(data.adapter).recording_dataset() is not None)

    threads = [threading.Thread(target=record_orders) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert recorded == [True] * 30
    assert tf.random.shuffle is original


def _with_dropout(rate):
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8), keras.layers.Dropout(rate), keras.layers.Dense(3)])


def test_a_layers_configuration_change_with_the_same_weights_is_taken_and_said():
    model = _with_dropout(0.5)
    comparison = run_record.compare(_record(model=_with_dropout(0.1)), _record(model=model), mid_epoch=True)
    assert not comparison.refused
    assert comparison.taken_lines() == [
        f"the model's layers: layer 1 ({model.layers[1].name}) rate: 0.1 in the checkpoint, 0.5 now (yours)"
    ]
    older = _record(model=_with_dropout(0.1))
    del older["model.layer_configs"]  # a record from before configurations were kept: nothing to compare
    assert run_record.compare(older, _record(model=model), mid_epoch=True) == run_record.Comparison()


def _gan_record(d_optimizer, **kwargs):
    model = make_mlp()
    model.compile(keras.optimizers.SGD(0.1), "mse")
    optimizers = run_record.optimizers_of(model, {"owner_d_optimizer": d_optimizer, "owner_step": object()})
    assert list(optimizers) == ["optimizer", "optimizers.d_optimizer"]
    return run_record.build(
        model=model, dataset=None, adapter=None, replicas=1, settings={}, optimizers=optimizers, **kwargs
    )


def test_a_trainers_other_optimizer_is_compared_as_the_models():
    saved = _gan_record(keras.optimizers.Adam(0.01))
    assert saved["optimizers.d_optimizer"] == "keras.optimizers.Adam"
    assert saved["optimizers.d_optimizer.learning_rate"] == 0.01
    taken = run_record.compare(saved, _gan_record(keras.optimizers.Adam(0.001)), mid_epoch=True)
    assert taken.taken_lines() == ["d_optimizer.learning_rate: 0.01 in the checkpoint, 0.001 now (yours)"]
    refused = run_record.compare(saved, _gan_record(keras.optimizers.SGD(0.01)), mid_epoch=True).refused
    assert [change.line() for change in refused] == [
        "d_optimizer: keras.optimizers.Adam in the checkpoint, keras.optimizers.SGD now"
    ]
    older = {key: value for key, value in saved.items() if not key.startswith("optimizers.")}
    assert run_record.compare(older, _gan_record(keras.optimizers.SGD(0.01)), mid_epoch=True) == run_record.Comparison()


def test_the_record_reads_the_built_fields_at_each_save_until_the_model_and_optimizer_are_built(monkeypatch):
    model = keras.Sequential([keras.layers.Dense(2)])  # built in its first step
    model.compile("adam", "mse")
    reads = []
    real = run_record.built_fields
    monkeypatch.setattr(run_record, "built_fields", lambda *args: reads.append(1) or real(*args))
    record = run_record.RunRecord({}, model)
    record.state_dict()
    model.build((None, 3))
    record.state_dict()
    assert "optimizer.variables" not in record.state_dict()  # the optimizer is not built yet: read again
    model.optimizer.build(model.trainable_variables)
    assert record.state_dict()["optimizer.variables"] == [list(v.shape) for v in model.optimizer.variables]
    record.state_dict()
    assert len(reads) == 4  # the last save reads nothing: each layer's config costs time at every save
