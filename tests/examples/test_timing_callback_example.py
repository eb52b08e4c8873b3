"""The timing-callback template records per-epoch timing and flags retraces and slowdowns."""

import importlib.util
import math
import pathlib
import warnings

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


def test_partial_batch_retrace_is_flagged_under_the_trainer(example):
    with pytest.warns(UserWarning, match="Epoch 2: the training step traced again in 1 host call"):
        monitor = example.train(
            "trainer", epochs=3, num_examples=250, batch_size=32, drop_remainder=False, verbose=False
        )
    assert [r["retraced_calls"] for r in monitor.epoch_records] == [0, 1, 0]
    assert monitor.report.trace_count == 2
    assert len([alert for alert in monitor.alerts if "traced again" in alert]) == 1


def test_keras_fit_does_not_retrace_on_a_partial_batch(example):
    # Keras traces its step on the iterator's element spec, whose batch size is unknown.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        monitor = example.train(
            "fit", epochs=3, num_examples=250, batch_size=32, drop_remainder=False, verbose=False
        )
    assert [r["retraced_calls"] for r in monitor.epoch_records] == [0, 0, 0]
    assert not [alert for alert in monitor.alerts if "traced again" in alert]


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
