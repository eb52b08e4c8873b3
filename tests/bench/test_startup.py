"""The startup benchmark (`python -m tftrain.bench --workload=startup`): timings, pairing, the table."""

import pytest

from tftrain.bench import startup


def test_one_process_times_every_call_on_both_sides(monkeypatch):
    monkeypatch.setattr(startup, "_TRAINING_ROWS", {"mlp": 512, "convnet": 128})
    monkeypatch.setattr(startup, "_EVALUATION_ROWS", 256)
    for workload in startup.STARTUP_WORKLOADS:
        for side in startup.SIDES:
            timings = startup.measure_once(workload, side)
            assert set(timings) == set(startup.METRICS)
            assert 0 < timings["first_batch_s"] <= timings["fit_s"]
            assert timings["evaluate_s"] > 0 and timings["predict_s"] > 0


def test_rounds_alternate_the_sides_and_pair_the_ratios(monkeypatch):
    calls = []
    fake = {"trainer": 1.0, "keras": 2.0}

    def run_child(workload, side, timeout):
        calls.append((workload, side))
        return {metric: fake[side] * (index + 1) for index, metric in enumerate(startup.METRICS)}

    monkeypatch.setattr(startup, "_run_child", run_child)
    results = startup.run_startup(("mlp",), rounds=3)
    assert calls == [("mlp", "trainer"), ("mlp", "keras"), ("mlp", "keras"), ("mlp", "trainer")] + [
        ("mlp", "trainer"),
        ("mlp", "keras"),
    ]
    summary = results["workloads"]["mlp"]["summary"]
    assert summary["fit_s"]["ratio"]["estimate"] == pytest.approx(0.5)
    assert summary["fit_s"]["trainer_median_s"] == 2.0 and summary["fit_s"]["keras_median_s"] == 4.0
    table = startup.format_startup(results)
    assert "mlp      fit" in table and "0.50 [0.50-0.50]" in table


def test_a_failed_child_names_its_side_and_stderr(monkeypatch):
    with pytest.raises(RuntimeError, match="keras process for nothing failed"):
        startup._run_child("nothing", "keras", timeout=120)


@pytest.mark.parametrize(
    "kwargs, message",
    [(dict(workloads=("resnet",)), "Received: \\['resnet'\\]"), (dict(rounds=1), "rounds=1")],
)
def test_bad_arguments_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        startup.run_startup(**kwargs)


def test_main_runs_the_startup_workload_alone_and_rejects_one_round(tmp_path):
    import subprocess
    import sys

    command = [sys.executable, "-m", "tftrain.bench", "--workload=startup", "--rounds=1"]
    process = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert process.returncode != 0 and "rounds=1" in process.stderr


def test_main_rejects_steady_state_flags_with_the_startup_workload():
    import subprocess
    import sys

    command = [sys.executable, "-m", "tftrain.bench", "--workload=startup", "--quick", "--variants=graph"]
    process = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert process.returncode != 0
    assert "received --quick, --variants" in process.stderr
