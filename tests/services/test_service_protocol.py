"""The services' protocol: `EveryNSteps`, and services of a user's own through `Trainer(services=...)`."""

import json
import os
import signal

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import make_mlp

import tftrain
from tftrain.checkpoint.state import SERVICE_STATES_KEY
from tftrain.services import EveryNSteps, Service
from tftrain.services.protocol import json_ready_state


def test_every_n_steps_next_stop_and_reached():
    when = EveryNSteps(3)
    assert [when.next_stop(step) for step in (0, 1, 2, 3, 5, 6)] == [3, 3, 3, 6, 6, 9]
    assert not when.reached(0, 1)
    assert not when.reached(1, 2)
    assert when.reached(2, 3)
    assert not when.reached(3, 4)
    assert when.reached(4, 7)  # a host call of 3 steps crossing the mark at 6
    assert when.reached(0, 10)
    assert not when.reached(6, 8)
    assert EveryNSteps(1).reached(5, 6)
    never = EveryNSteps(None)
    assert never.next_stop(4) is None and not never.reached(0, 100)


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_every_n_steps_rejects_bad_values(value):
    with pytest.raises(ValueError, match="every_steps"):
        EveryNSteps(value)


class CallRecorder(Service):
    """Records each host call's end step, acts every N steps, and keeps a count in its checkpointed state."""

    name = "recorder"

    def __init__(self, every_steps):
        self.when = EveryNSteps(every_steps)
        self.call_ends, self.acted_at, self.epochs = [], [], []
        self.acted = 0
        self.closed = False

    def next_stop(self, step):
        return self.when.next_stop(step)

    def after_call(self, run, result):
        step = run.progress.global_step
        self.call_ends.append(step)
        if self.when.reached(step - result.steps, step):
            self.acted += 1
            self.acted_at.append(step)

    def end_epoch(self, run, logs):
        self.epochs.append((run.progress.epoch, sorted(logs)))

    def state_dict(self):
        return {"acted": self.acted}

    def load_state_dict(self, state):
        self.acted = state["acted"]

    def close(self):
        self.closed = True


def regression(batches=10):
    rng = np.random.RandomState(0)
    x = rng.rand(batches * 4, 6).astype("float32")
    y = rng.rand(batches * 4, 3).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(4)


def test_a_user_service_cuts_k_step_calls_at_its_boundaries():
    recorder = CallRecorder(every_steps=3)
    trainer = tftrain.Trainer(make_mlp(), "sgd", "mse", steps_per_loop=4, services=[recorder])
    trainer.fit(regression(), epochs=2, verbose=0)
    # Calls of up to 4 steps, cut at each multiple of 3 and at each epoch's end (10 steps).
    assert recorder.call_ends == [3, 6, 9, 10, 12, 15, 18, 20]
    assert recorder.acted_at == [3, 6, 9, 12, 15, 18]
    assert recorder.epochs == [(1, ["loss"]), (2, ["loss"])]
    assert recorder.closed


def test_a_user_service_state_is_checkpointed_and_restored(tmp_path):
    first = CallRecorder(every_steps=3)
    trainer = tftrain.Trainer(make_mlp(), "sgd", "mse", model_dir=str(tmp_path), services=[first])
    trainer.fit(regression(), epochs=1, verbose=0)
    assert first.acted == 3
    saved = tf.train.load_checkpoint(str(tmp_path / "checkpoints" / "ckpt-10"))
    states = json.loads(saved.get_tensor(SERVICE_STATES_KEY))
    assert states["recorder"] == {"acted": 3}
    second = CallRecorder(every_steps=3)
    tftrain.Trainer(make_mlp(), "sgd", "mse", model_dir=str(tmp_path), services=[second]).fit(
        regression(), epochs=2, verbose=0
    )
    assert second.acted_at == [12, 15, 18]
    assert second.acted == 6  # 3 restored + 3 in the second epoch


class ExportEvery(Service):
    """The docs' example service: a SavedModel every N steps."""

    name = "export"

    def __init__(self, model, directory, every_steps):
        self.model, self.directory = model, directory
        self.when = EveryNSteps(every_steps)

    def next_stop(self, step):
        return self.when.next_stop(step)

    def after_call(self, run, result):
        step = run.progress.global_step
        if self.when.reached(step - result.steps, step):
            self.model.export(f"{self.directory}/{step}")


def test_the_docs_export_service_exports_at_its_steps_under_auto_steps(tmp_path):
    model = make_mlp()
    trainer = tftrain.Trainer(model, "sgd", "mse", services=[ExportEvery(model, str(tmp_path), 4)])
    trainer.fit(regression(batches=8), epochs=1, verbose=0)
    assert sorted(os.listdir(tmp_path)) == ["4", "8"]  # the last one holds the trained model
    served = tf.saved_model.load(str(tmp_path / "8"))
    np.testing.assert_allclose(
        served.serve(tf.ones((2, 6))).numpy(), model(tf.ones((2, 6))).numpy(), rtol=1e-5, atol=1e-6
    )


def test_services_must_be_services_with_distinct_names(tmp_path):
    with pytest.raises(TypeError, match=r"Invalid value for argument `services`.*CallbackList"):
        tftrain.Trainer(make_mlp(), "sgd", "mse", services=[keras.callbacks.CallbackList()])
    with pytest.raises(ValueError, match=r"services named \['recorder', 'recorder'\]"):
        tftrain.Trainer(make_mlp(), "sgd", "mse", services=[CallRecorder(2), CallRecorder(3)])
    clash = CallRecorder(2)
    clash.name = "checkpoint"  # a built-in service's name: its state would overwrite the checkpointer's
    with pytest.raises(ValueError, match=r"services named \['checkpoint'\], a name of a built-in service"):
        tftrain.Trainer(make_mlp(), "sgd", "mse", model_dir=str(tmp_path), services=[clash])
    renamed = CallRecorder(2)
    trainer = tftrain.Trainer(make_mlp(), "sgd", "mse", model_dir=str(tmp_path), services=[renamed])
    renamed.name = "timing"  # renamed after the Trainer checked it: fit checks again, before any step
    with pytest.raises(ValueError, match=r"services named \['timing'\]"):
        trainer.fit(regression(), epochs=1, verbose=0)
    assert renamed.call_ends == [] and renamed.closed
    assert not os.path.exists(tmp_path / "writer.lock")  # the lock is released on the error


def test_one_service_is_taken_as_a_list_of_one_and_a_non_service_is_refused():
    recorder = CallRecorder(2)
    trainer = tftrain.Trainer(make_mlp(), "sgd", "mse", services=recorder)
    assert trainer.services == (recorder,)
    trainer.fit(regression(batches=4), epochs=1, verbose=0)
    assert recorder.call_ends  # it ran as a service of the run
    with pytest.raises(TypeError, match=r"Invalid value for argument `services`. Received: services=3 of type int"):
        tftrain.Trainer(make_mlp(), "sgd", "mse", services=3)


class FailsToClose(Service):
    name = "fails_to_close"

    def close(self):
        raise RuntimeError("close failed")


def test_a_service_that_fails_to_close_leaves_no_handler_nor_lock_behind(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    trainer = tftrain.Trainer(make_mlp(), "sgd", "mse", model_dir=str(tmp_path), services=[FailsToClose()])
    with pytest.raises(RuntimeError, match="close failed"):
        trainer.fit(regression(), epochs=1, verbose=0)
    assert signal.getsignal(signal.SIGTERM) is before  # the preemption service closed after it
    assert not os.path.exists(tmp_path / "writer.lock")  # and the writer lock


class MeanLoss(Service):
    """Keeps a running mean of the loss as NumPy computes it: a NumPy scalar and an array in its state."""

    name = "mean_loss"

    def __init__(self, state=None):
        self.total, self.count, self.seen = np.float32(0.0), np.int64(0), np.zeros(2, "float32")
        self.restored = None
        self.bad = state

    def end_epoch(self, run, logs):
        self.total += np.float32(logs["loss"])
        self.count += 1
        self.seen = self.seen + 1

    def state_dict(self):
        state = {"total": self.total, "count": self.count, "seen": self.seen, "pair": (self.count, "x")}
        if self.bad is not None:
            state["extra"] = self.bad
        return state

    def load_state_dict(self, state):
        self.restored = state


def test_a_state_with_numpy_scalars_and_arrays_is_saved_as_python_numbers_and_lists(tmp_path):
    service = MeanLoss()
    trainer = tftrain.Trainer(make_mlp(), "sgd", "mse", model_dir=str(tmp_path), services=[service])
    trainer.fit(regression(), epochs=1, verbose=0)  # saved at the epoch's end
    resumed = MeanLoss()
    tftrain.Trainer(make_mlp(), "sgd", "mse", model_dir=str(tmp_path), services=[resumed]).fit(
        regression(), epochs=1, verbose=0
    )
    assert resumed.restored == {"total": float(service.total), "count": 1, "seen": [1.0, 1.0], "pair": [1, "x"]}
    assert type(resumed.restored["total"]) is float and type(resumed.restored["count"]) is int


@pytest.mark.parametrize(
    "bad, where",
    [
        ({"a": {1, 2}}, r"state\['extra'\]\['a'\] is of type set"),
        ([1, tf.constant(2.0)], r"state\['extra'\]\[1\] is of type EagerTensor"),
        ({3: "x"}, r"state\['extra'\] has the key 3, of type int"),
    ],
)
def test_a_state_json_cannot_hold_is_refused_when_the_service_is_registered(tmp_path, bad, where):
    with pytest.raises(TypeError, match=rf"Invalid state of the service 'mean_loss'.*Received: {where}\. Expected"):
        tftrain.Trainer(make_mlp(), "sgd", "mse", model_dir=str(tmp_path), services=[MeanLoss(bad)])


class LateBadState(MeanLoss):
    """A state JSON cannot hold only once training ran."""

    def state_dict(self):
        state = super().state_dict()
        if self.count:
            state["since"] = object()
        return state


def test_a_state_that_turns_bad_during_the_run_is_named_at_the_save(tmp_path):
    trainer = tftrain.Trainer(make_mlp(), "sgd", "mse", model_dir=str(tmp_path), services=[LateBadState()])
    with pytest.raises(TypeError, match=r"service 'mean_loss'.*Received: state\['since'\] is of type object"):
        trainer.fit(regression(), epochs=1, verbose=0)


def test_json_ready_state_converts_numpy_and_tuples_and_keeps_the_rest():
    state = {"a": np.float32(0.5), "b": [np.int32(2), (np.bool_(True), None)], "c": np.arange(4).reshape(2, 2)}
    converted = json_ready_state("s", state)
    assert converted == {"a": 0.5, "b": [2, [True, None]], "c": [[0, 1], [2, 3]]}
    assert json.loads(json.dumps(converted)) == converted
    assert json_ready_state("s", None) is None
