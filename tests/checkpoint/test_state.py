"""What a checkpoint holds of a run: the services' states under `SERVICE_STATES` (also where older checkpoints hold them), the call's target."""

import json

import numpy as np
import tensorflow as tf
from helpers import make_mlp

import tftrain
from tftrain.checkpoint import Checkpointer
from tftrain.checkpoint.state import (
    SERVICE_STATES,
    SERVICE_STATES_KEY,
    CallTarget,
    Progress,
    saved_service_states,
)
from tftrain.services import Service

OLD_KEY = "timing/.ATTRIBUTES/VARIABLE_VALUE"  # where earlier tftrain versions saved the services' states


def written(path, **variables):
    """A checkpoint of string variables by name; its reader."""
    root = tf.train.Checkpoint(**{name: tf.Variable(value) for name, value in variables.items()})
    return tf.train.load_checkpoint(root.write(str(path / "ckpt")))


def test_the_services_states_are_read_under_their_key_else_under_timing(tmp_path):
    states = {"counter": {"calls": 3}, "timing": {"trace_count": 1}}
    assert SERVICE_STATES_KEY == f"{SERVICE_STATES}/.ATTRIBUTES/VARIABLE_VALUE"
    assert saved_service_states(written(tmp_path / "new", service_states=json.dumps(states))) == states
    assert saved_service_states(written(tmp_path / "old", timing=json.dumps(states))) == states
    both = written(tmp_path / "both", service_states=json.dumps(states), timing=json.dumps({"x": {}}))
    assert saved_service_states(both) == states
    assert saved_service_states(written(tmp_path / "none", other="")) == {}
    assert saved_service_states(written(tmp_path / "empty", service_states="")) == {}
    # The oldest form: the step timer's state alone, which the timing service reads.
    assert saved_service_states(written(tmp_path / "timer", timing=json.dumps({"timer": {}}))) == {
        "timing": {"timer": {}}
    }


class CallCounter(Service):
    """Counts host calls; its count is its checkpointed state."""

    name = "counter"

    def __init__(self):
        self.calls = 0
        self.restored = None

    def after_call(self, run, result):
        self.calls += 1

    def state_dict(self):
        return {"calls": self.calls}

    def load_state_dict(self, state):
        self.restored = dict(state)
        self.calls = state["calls"]


def regression():
    rng = np.random.RandomState(0)
    x, y = rng.rand(20, 6).astype("float32"), rng.rand(20, 3).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(4)


def fit(model_dir, epochs):
    counter = CallCounter()
    trainer = tftrain.Trainer(make_mlp(), "sgd", "mse", model_dir=str(model_dir), services=[counter])
    trainer.fit(regression(), epochs=epochs, verbose=0)
    return trainer, counter


def latest(model_dir):
    return tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir / "checkpoints")))


def test_a_checkpoint_holding_the_services_states_under_timing_resumes_with_them(tmp_path, monkeypatch):
    make_root = Checkpointer._new_root

    def old_layout(self):
        root = make_root(self)
        del root.service_states
        root.timing = self._service_states
        return root

    with monkeypatch.context() as patch:
        patch.setattr(Checkpointer, "_new_root", old_layout)
        fit(tmp_path / "old", epochs=1)
    fit(tmp_path / "new", epochs=1)
    old = latest(tmp_path / "old")
    assert old.has_tensor(OLD_KEY) and not old.has_tensor(SERVICE_STATES_KEY)
    assert json.loads(old.get_tensor(OLD_KEY))["counter"] == {"calls": 5}

    resumed, counter = fit(tmp_path / "old", epochs=2)
    control, _ = fit(tmp_path / "new", epochs=2)
    assert counter.restored == {"calls": 5} and counter.calls == 10
    assert resumed.timing.steps == control.timing.steps  # the timing service's state came back too
    assert resumed.timing.trace_count == control.timing.trace_count
    again = latest(tmp_path / "old")
    assert saved_service_states(again)["counter"] == {"calls": 10}
    assert again.has_tensor(SERVICE_STATES_KEY)


def test_a_call_target_records_itself_and_counts_the_epochs_left_from_a_progress(tmp_path):
    assert CallTarget(3).record() == {"epochs": 3, "total_steps": None}
    budget = CallTarget(epochs=5, total_steps=20)  # 8 steps an epoch
    assert budget.planned_steps(8) == 20 and CallTarget(3).planned_steps(8) == 24 and CallTarget(3).planned_steps(None) is None
    assert budget.end_epoch(Progress(epoch=1, step_in_epoch=3, global_step=11), 8, resumed=False) == 5
    assert budget.end_epoch(Progress(epoch=1, step_in_epoch=3, global_step=11), 8, resumed=True) == 3  # 5 + 4 steps
    assert budget.end_epoch(Progress(epoch=2, global_step=16), 8, resumed=True) == 3
    assert budget.end_epoch(Progress(epoch=2, global_step=20), 8, resumed=True) == 2  # reached: nothing to train
    assert budget.reached_message(Progress(epoch=2, global_step=20)) == ("total_steps=20", "total_steps > 20")
    assert CallTarget(2).reached_message(Progress(epoch=2)) == ("epochs=2", "epochs > 2")
    # The run record of a fit holds the target's fields under the target's names.
    trainer = tftrain.Trainer(make_mlp(), "sgd", "mse", model_dir=str(tmp_path))
    trainer.fit(np.zeros((8, 6), "float32"), np.zeros((8, 3), "float32"), batch_size=4, total_steps=3, verbose=0)
    record = json.loads((tmp_path / "run_record.json").read_text())["record"]
    assert {key: record[key] for key in CallTarget(0).record()} == {"epochs": 2, "total_steps": 3}
