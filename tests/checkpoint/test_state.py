"""What a checkpoint holds of a run: the services' states under `SERVICE_STATES`, also read where older checkpoints hold them."""

import json

import numpy as np
import tensorflow as tf
from helpers import make_mlp

import tftrain
from tftrain.checkpoint import Checkpointer
from tftrain.checkpoint.state import SERVICE_STATES, SERVICE_STATES_KEY, saved_service_states
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
