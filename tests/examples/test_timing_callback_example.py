"""The timing-callback template records per-epoch timing and flags retraces and slowdowns."""

import importlib.util
import math
import pathlib
import warnings

import keras
import pytest
from absl import flags

TEMPLATE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "timing_callback.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("timing_callback_template", TEMPLATE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines no flags: those are defined under __main__
    return module


@pytest.mark.parametrize("loop", ["trainer", "fit"])
def test_records_every_epoch(example, loop):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a clean run issues no alert about retracing
        warnings.filterwarnings("ignore", message=".*shuffle.*")  # keras fit on a Dataset
        warnings.filterwarnings("ignore", message=".*step time.*")  # timing noise is not under test
        monitor = example.train(loop, epochs=3, num_examples=256, batch_size=32, verbose=False)
    assert [r["epoch"] for r in monitor.epoch_records] == [0, 1, 2]
    for record in monitor.epoch_records:
        assert record["steps"] == 8
        assert record["retraced_calls"] == 0
        assert record["step_time_median_s"] > 0
        assert record["examples_per_sec"] > 0
    assert monitor.report.steps == 24
    history = monitor.model.history.history
    assert len(history["examples_per_sec"]) == len(history["step_time_ms"]) == 3
    assert all(math.isfinite(value) and value > 0 for value in history["examples_per_sec"])


@pytest.mark.parametrize("loop", ["trainer", "fit"])
def test_no_loop_retraces_on_a_partial_batch(example, loop):
    # Both trace the step on the iterator's element spec, whose batch size is unknown.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monitor = example.train(
            loop, epochs=3, num_examples=250, batch_size=32, drop_remainder=False, verbose=False
        )
    assert [r["retraced_calls"] for r in monitor.epoch_records] == [0, 0, 0]
    assert [r["steps"] for r in monitor.epoch_records] == [7, 7, 7]  # the partial batch is one of them
    assert not [alert for alert in monitor.alerts if "traced again" in alert]


def test_a_rebuilt_train_function_retraces_and_is_flagged(example):
    """A step traced again mid-run (Keras's train function rebuilt at epoch 2): warned, that epoch only."""

    class Rebuild(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1:
                self.model.make_train_function(force=True)

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    dataset, steps = example.make_data(256, 32, True)
    monitor = example.ThroughputMonitor(verbose=False)
    with pytest.warns(UserWarning, match="Epoch 2: the training step traced again in 1 host call"):
        model.fit(dataset, epochs=3, steps_per_epoch=steps, callbacks=[Rebuild(), monitor], verbose=0)
    assert [r["retraced_calls"] for r in monitor.epoch_records] == [0, 1, 0]
    assert len([alert for alert in monitor.alerts if "traced again" in alert]) == 1


@pytest.mark.parametrize("loop", ["trainer", "fit"])
def test_slow_epoch_is_flagged(example, loop):
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        monitor = example.train(
            loop, epochs=3, num_examples=256, batch_size=32, stall_epoch=3, stall_ms=30.0, verbose=False
        )
    slow = [alert for alert in monitor.alerts if alert.startswith("Epoch 3: steady-state step time")]
    assert slow, monitor.alerts
    assert monitor.epoch_records[2]["step_time_median_s"] > 0.025


def test_main_runs_both_loops(example, monkeypatch, capsys):
    flag_values = flags.FlagValues()
    example.define_flags(flag_values)
    flag_values(["timing_callback.py", "--epochs=2", "--num_examples=128", "--batch_size=32"])
    monkeypatch.setattr(example, "FLAGS", flag_values)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        example.main(["timing_callback.py"])
    out = capsys.readouterr().out
    assert "--- tftrain.Trainer.fit" in out and "--- keras Model.fit" in out
    assert out.count("epoch 2: 4 steps") == 2
    assert out.count("examples/sec") == 2  # the timing summary after each run
    assert out.count("alerts:") == 2
