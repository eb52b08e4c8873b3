"""Tests for `python -m tftrain.bench` (tiny sizes: a few steps per run)."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
from helpers import TIMING_REPORT_KEYS

from tftrain import _keras_compat
from tftrain.bench import config, optional, outputs, plot, report, runners, suite, workloads

TIMING_KEYS = TIMING_REPORT_KEYS
TRAINER_VARIANTS = {
    "eager",
    "graph",
    "xla",
    "graph_loop",
    "trainer_no_timing",
    "graph_checkpoint",
    "graph_no_sync",
}
# Same initial weights, same batches, same optimizer: these must end at the same loss.
GRAPH_VARIANTS = [
    "graph",
    "trainer_no_timing",
    "graph_no_sync",
    "graph_checkpoint",
    "handwritten_loop",
    "graph_loop",
    "keras_fit",
    "keras_fit_spe",
    "keras_fit_timing",
]
TORCH_INSTALLED = importlib.util.find_spec("torch") is not None
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def tiny_results():
    """Every variant once on a tiny MLP workload: 3 steps per epoch (the last one partial)."""
    lines = []
    tiny = config.BenchmarkConfig(
        workloads="mlp",
        repeats=1,
        epochs=2,
        steps_per_loop=2,
        eager_steps=2,
        num_train=300,
        num_val=64,
    )
    results = suite.run_benchmark(tiny, progress=lines.append)
    return results, lines


def test_every_variant_runs_and_reports(tiny_results):
    results, lines = tiny_results
    mlp = results["workloads"]["mlp"]
    assert list(mlp["variants"]) == list(config.WORKLOAD_VARIANTS["mlp"])
    assert (mlp["num_train"], mlp["num_val"], mlp["steps_per_epoch"]) == (300, 64, 3)
    assert len(lines) == 1 + len(mlp["variants"])  # "preparing" + one line per run
    for name, variant in mlp["variants"].items():
        expected_steps = 2 if variant["eager"] else 3
        assert variant["steps_per_epoch"] == expected_steps, name
        (run,) = variant["runs"]
        assert len(run["epoch_s"]) == 2
        assert run["steady_step_s"] == pytest.approx(run["epoch_s"][1] / expected_steps)
        assert run["total_s"] >= sum(run["epoch_s"]) > 0
        assert len(run["epoch_cpu_s"]) == 2 and run["steady_cpu_step_s"] > 0
        assert set(variant["summary"]) >= {
            "steady_step_s",
            "first_epoch_s",
            "x_handwritten",
            "x_keras_fit",
            "x_data_only",
        }
        if name == "data_only":
            assert run["final_loss"] is None and variant["validation"] is None
        elif name == "step_only":  # trained on one batch: nothing to validate
            assert math.isfinite(run["final_loss"]) and variant["validation"] is None
        else:
            assert math.isfinite(run["final_loss"]), name
            assert set(variant["validation"]) == {"val_loss", "val_accuracy"}
        if name in TRAINER_VARIANTS or name == "keras_fit_timing":
            assert set(run["timing"]) == TIMING_KEYS, name
    assert mlp["variants"]["eager"]["summary"]["x_handwritten_eager"] is not None
    assert mlp["variants"]["handwritten"]["summary"]["x_handwritten"] == pytest.approx(1.0)
    assert [t["name"] for t in mlp["targets"]] == [t.name for t in report.MLP_TARGETS] + [
        "timing_hooks_direct"
    ]
    assert 0 < mlp["timing_hook_s"] < 1e-3  # microseconds, not milliseconds
    assert mlp["targets"][-1]["hook_s"] == mlp["timing_hook_s"]
    assert all(t["met"] in (True, False) for t in mlp["targets"])


def test_variants_train_the_same_from_the_same_start(tiny_results):
    """Fair comparison: every graph-mode loop trains the same model on the same batches."""
    variants = tiny_results[0]["workloads"]["mlp"]["variants"]

    def val_loss(name):
        return variants[name]["validation"]["val_loss"]

    for name in GRAPH_VARIANTS:
        assert val_loss(name) == pytest.approx(val_loss("handwritten"), rel=1e-5), name
    assert val_loss("xla") == pytest.approx(val_loss("handwritten"), rel=1e-3)
    assert val_loss("handwritten_xla") == pytest.approx(val_loss("xla"), rel=1e-3)
    assert val_loss("eager") == pytest.approx(val_loss("handwritten_eager"), rel=1e-5)
    # Eager variants ran fewer steps, so they trained less: the check can tell runs apart.
    assert val_loss("eager") != pytest.approx(val_loss("handwritten"), rel=1e-5)


def test_trainer_timing_is_recorded(tiny_results):
    variants = tiny_results[0]["workloads"]["mlp"]["variants"]
    graph_timing = variants["graph"]["runs"][0]["timing"]
    assert graph_timing["steps"] == 6 and graph_timing["trace_count"] >= 1
    assert variants["trainer_no_timing"]["runs"][0]["timing"]["steps"] == 0  # nothing measured
    assert variants["graph_no_sync"]["runs"][0]["timing"]["steps"] == 0
    assert variants["graph_loop"]["runs"][0]["notes"]["engine"] == "graph+loop2"
    assert variants["keras_fit_spe"]["runs"][0]["notes"]["steps_per_execution"] == 2
    # The step count goes in as a tensor: one trace despite a 2-step and a 1-step call per epoch.
    assert variants["handwritten_loop"]["runs"][0]["notes"] == {"trace_count": 1, "steps_per_call": 2}
    assert variants["handwritten_xla"]["runs"][0]["notes"]["jit_compile"] is True
    # 3 steps per epoch -> a save every step (four per epoch at most): steps 1..6.
    checkpointed = variants["graph_checkpoint"]["runs"][0]
    assert checkpointed["notes"]["checkpoint_every_steps"] == 1
    assert checkpointed["timing"]["checkpoint_saves"] == 6
    assert checkpointed["timing"]["checkpoint_save_median_s"] > 0
    assert graph_timing["checkpoint_saves"] == 0
    assert variants["step_only"]["runs"][0]["notes"]["trace_count"] == 1


def test_report_and_json_render(tiny_results, tmp_path):
    results = tiny_results[0]
    text = report.format_report(results)
    for name in config.WORKLOAD_VARIANTS["mlp"]:
        assert name in text
    assert "Targets:" in text and "x handwr" in text and "x data" in text
    assert "graph_checkpoint: saved every 1 steps, 6 saves per run" in text
    assert "== goals" in text and "graph_loop/data_only" in text
    floor = results["workloads"]["mlp"]["floor"]
    variants = results["workloads"]["mlp"]["variants"]
    assert floor["data_plus_step_s"] == pytest.approx(
        variants["data_only"]["summary"]["steady_step_s"]["median"]
        + variants["step_only"]["summary"]["steady_step_s"]["median"]
    )
    assert set(floor["over_floor"]) == {"handwritten_loop", "graph_loop", "keras_fit_spe"}
    assert "reference for a k-step loop: data_only + step_only = " in text
    path = tmp_path / "results.json"
    report.write_json(results, str(path))
    loaded = json.loads(path.read_text())
    assert loaded["workloads"]["mlp"]["variants"]["graph"]["runs"][0]["steps_per_epoch"] == 3
    assert loaded["config"]["workloads"] == ["mlp"]


def test_main_writes_json_and_plot(tmp_path):
    output = tmp_path / "out.json"
    image = tmp_path / "out.png"
    command = [
        sys.executable,
        "-m",
        "tftrain.bench",
        "--workload=mlp",
        "--variants=handwritten,graph,graph_checkpoint",
        "--num_train=256",
        "--num_val=64",
        "--repeats=2",
        f"--output={output}",
        f"--plot={image}",
    ]
    process = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr[-3000:]
    assert image.read_bytes().startswith(b"\x89PNG")
    assert f"Wrote {image}" in process.stdout
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.json", "out.png"]  # no temporaries
    umask = os.umask(0)
    os.umask(umask)
    assert (image.stat().st_mode & 0o777) == 0o666 & ~umask  # not mkstemp's private 0o600
    results = json.loads(output.read_text())
    assert list(results["workloads"]["mlp"]["variants"]) == ["handwritten", "graph", "graph_checkpoint"]
    assert "Sharding callback" not in process.stderr  # TensorFlow's INFO lines per save stay quiet
    assert results["config"]["repeats"] == 2
    assert len(results["workloads"]["mlp"]["variants"]["graph"]["runs"]) == 2
    assert "Targets:" in process.stdout and "[NOT RUN]" in process.stdout
    assert "[mlp] repeat 2/2 graph" in process.stderr
    # The second repetition starts one variant further down the list.
    order = [line.split()[3] for line in process.stderr.splitlines() if line.startswith("[mlp] repeat 2/2")]
    assert order == ["graph", "graph_checkpoint", "handwritten"]


def test_main_rejects_unknown_workload_before_running():
    command = [sys.executable, "-m", "tftrain.bench", "--workload=mlp,resnet"]
    process = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert process.returncode != 0
    assert "workload=resnet (unknown)" in process.stderr and "mlp, cnn, linear, simclr" in process.stderr
    assert "preparing" not in process.stderr


def _run_main_without(module, *flags_):
    """`python -m tftrain.bench FLAGS` in a process where `module` cannot be imported."""
    code = (
        f"import runpy, sys; sys.modules[{module!r}] = None; sys.argv = ['tftrain.bench', *{list(flags_)!r}]; "
        "runpy.run_module('tftrain.bench', run_name='__main__')"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )


def test_main_without_matplotlib_names_the_plot_extra_and_writes_nothing(tmp_path):
    image, output = tmp_path / "chart.png", tmp_path / "out.json"
    process = _run_main_without("matplotlib", "--workload=mlp", f"--plot={image}", f"--output={output}")
    assert process.returncode != 0
    assert "--plot needs matplotlib" in process.stderr and 'pip install "tftrain[plot]"' in process.stderr
    assert "preparing" not in process.stderr  # refused before anything ran
    assert list(tmp_path.iterdir()) == []


def test_main_refuses_an_explicit_torch_variant_without_torch():
    process = _run_main_without("torch", "--workload=linear", "--variants=torch_eager")
    assert process.returncode != 0
    assert "--variants=torch_eager needs torch, which is not installed" in process.stderr
    assert "preparing" not in process.stderr


def test_output_destinations_are_checked_before_running(tmp_path):
    with pytest.raises(ValueError, match="does not exist. Create it first"):
        outputs.check_outputs(str(tmp_path / "missing" / "out.json"), None)
    with pytest.raises(ValueError, match="is a directory"):
        outputs.check_outputs(str(tmp_path), None)
    with pytest.raises(ValueError, match=r"ending in \.png, \.svg, \.pdf"):
        outputs.check_outputs(None, str(tmp_path / "chart.jpg"))
    with pytest.raises(ValueError, match="the same file"):
        outputs.check_outputs(str(tmp_path / "a.png"), str(tmp_path / "a.png"))
    outputs.check_outputs(str(tmp_path / "out.json"), str(tmp_path / "chart.svg"))


def test_missing_matplotlib_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(
        plot.PlottingUnavailableError, match=r'Install the plot extra: pip install "tftrain\[plot\]"'
    ):
        outputs.check_outputs(None, str(tmp_path / "chart.png"))


def test_nothing_is_written_half_way(tmp_path):
    """A plot that cannot be drawn leaves neither the JSON nor a temporary file; old files stay."""
    output = tmp_path / "out.json"
    output.write_text("previous results")
    nothing_measured = {"environment": {}, "workloads": {"mlp": {"description": "d", "variants": {}}}}
    with pytest.raises(ValueError, match="Nothing to plot"):
        outputs.write_outputs(nothing_measured, str(output), str(tmp_path / "chart.png"))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out.json"]
    assert output.read_text() == "previous results"


def test_unknown_names_raise_clear_errors():
    with pytest.raises(
        ValueError, match=r"workload=resnet \(unknown\).*Expected .*: mlp, cnn, linear, simclr"
    ):
        config.BenchmarkConfig(workloads="mlp,resnet")
    with pytest.raises(ValueError, match="variants=fast.*handwritten, graph"):
        config.BenchmarkConfig(workloads="mlp", variants="graph,fast")
    with pytest.raises(ValueError, match="variants=xla, which no chosen workload.*simclr: graph, keras_fit"):
        config.BenchmarkConfig(workloads="simclr", variants="graph,xla")
    with pytest.raises(ValueError, match="simclr_width=0"):
        config.BenchmarkConfig(simclr_width=0)
    with pytest.raises(ValueError, match="Expected a comma-separated list"):
        config.parse_names(" , ", ["mlp"], "workload")
    assert config.parse_names("cnn, mlp,cnn", ["mlp", "cnn"], "workload") == ["cnn", "mlp"]


def test_repetitions_rotate_the_run_order():
    names = ("a", "b", "c")
    assert [suite.rotated(names, repeat) for repeat in range(4)] == [
        ["a", "b", "c"],
        ["b", "c", "a"],
        ["c", "a", "b"],
        ["a", "b", "c"],
    ]


def test_registries_match_the_light_name_lists():
    assert tuple(workloads.WORKLOADS) == config.WORKLOAD_NAMES
    assert tuple(runners.VARIANTS) == config.VARIANT_NAMES
    assert set(config.WORKLOAD_VARIANTS) == set(config.WORKLOAD_NAMES)
    for own in config.WORKLOAD_VARIANTS.values():
        assert set(own) <= set(config.VARIANT_NAMES) and len(set(own)) == len(own)
    assert set(report.COLUMNS) == set(report.TARGETS) == set(config.WORKLOAD_NAMES)
    for name in config.OPTIONAL_VARIANTS:
        assert runners.VARIANTS[name].unavailable_reason is not None


def test_config_defaults_and_validation():
    quick = config.BenchmarkConfig(quick=True)
    assert (quick.repeats, quick.eager_steps, quick.workloads) == (1, 10, config.WORKLOAD_NAMES)
    assert quick.variants is None and quick.variants_for("linear") == config.WORKLOAD_VARIANTS["linear"]
    assert suite.sizes(quick, workloads.WORKLOADS["mlp"]) == (6_000, 1_000)
    assert suite.run_options(quick, workloads.WORKLOADS["linear"]).steps_per_loop == 10
    assert suite.run_options(quick, workloads.WORKLOADS["mlp"]).steps_per_loop == 20
    chosen = config.BenchmarkConfig(workloads="mlp,linear", variants="eager,graph", steps_per_loop=5)
    assert chosen.variants_for("mlp") == ("graph", "eager")
    assert chosen.variants_for("linear") == ("eager",)
    assert suite.run_options(chosen, workloads.WORKLOADS["linear"]).steps_per_loop == 5
    full = config.BenchmarkConfig(num_train=1_000)
    assert (full.repeats, full.eager_steps) == (3, 100)
    assert suite.sizes(full, workloads.WORKLOADS["cnn"]) == (1_000, 2_560)
    with pytest.raises(ValueError, match="epochs=1"):
        config.BenchmarkConfig(epochs=1)
    with pytest.raises(ValueError, match="repeats=0"):
        config.BenchmarkConfig(repeats=0)


def _runs(*steps_ms):
    return {"runs": [{"repeat": i, "steady_step_s": value / 1e3} for i, value in enumerate(steps_ms)]}


def test_ratios_and_targets_on_hand_made_numbers():
    result = {
        "name": "mlp",
        "variants": {
            "handwritten": _runs(1.0, 1.2, 1.1),  # median 1.1
            "graph": _runs(1.3, 1.1, 1.2),  # median 1.2: 1.0909x handwritten -> missed
            "trainer_no_timing": _runs(1.2, 1.19, 1.18),  # median 1.19: graph is 1.0084x -> met
            "keras_fit": _runs(2.0, 2.5, 1.5),  # median 2.0
            "graph_loop": _runs(1.3, 1.2, 1.1),  # median 1.2: 0.6x keras_fit -> met (<=)
            "handwritten_eager": _runs(10.0, 10.0, 10.0),
            "eager": _runs(10.6, 10.8, 10.7),  # median 10.7: 1.07x -> missed
            "data_only": _runs(1.0, 0.9, 0.95),  # median 0.95: graph_loop is 1.263x -> met
        },
    }
    report.add_summaries(result)
    graph = result["variants"]["graph"]["summary"]
    assert graph["steady_step_s"] == pytest.approx({"median": 1.2e-3, "min": 1.1e-3, "max": 1.3e-3})
    assert graph["x_handwritten"] == pytest.approx(1.2 / 1.1)
    assert graph["x_keras_fit"] == pytest.approx(0.6)
    assert result["variants"]["eager"]["summary"]["x_handwritten_eager"] == pytest.approx(1.07)
    targets = {t["name"]: t for t in result["targets"]}
    assert targets["graph_vs_handwritten"]["ratio"] == pytest.approx(1.2 / 1.1)
    assert targets["graph_vs_handwritten"]["met"] is False
    assert targets["graph_vs_handwritten"]["ratio_per_repeat"] == pytest.approx([1.3, 1.1 / 1.2, 1.2 / 1.1])
    assert targets["graph_loop_vs_keras_fit"]["met"] is True
    assert targets["eager_vs_handwritten_eager"]["met"] is False
    assert targets["timing_overhead"]["ratio"] == pytest.approx(1.2 / 1.19)
    assert targets["timing_overhead"]["met"] is True
    assert targets["timing_overhead"]["cpu_ratio"] is None  # no CPU times in these runs
    assert targets["graph_loop_vs_data_only"]["ratio"] == pytest.approx(1.2 / 0.95)
    assert targets["graph_loop_vs_data_only"]["met"] is True
    assert targets["xla_vs_handwritten_xla"]["met"] is None  # not run
    assert result["variants"]["graph_loop"]["summary"]["x_data_only"] == pytest.approx(1.2 / 0.95)
    # Per repeat graph/handwritten is 1.3, 0.917, 1.091: on both sides of 1.05.
    assert targets["graph_vs_handwritten"]["conclusive"] is False
    assert targets["graph_loop_vs_keras_fit"]["conclusive"] is False  # 0.65, 0.48, 0.733
    assert targets["eager_vs_handwritten_eager"]["conclusive"] is True  # 1.06, 1.08, 1.07: all miss
    line = report.format_target(targets["graph_vs_handwritten"])
    assert line.startswith("[MISSED, INCONCLUSIVE]") and "1.091" in line and "<= 1.05" in line
    assert report.format_target(targets["eager_vs_handwritten_eager"]).startswith("[MISSED]")


def test_targets_edges():
    timing = next(t for t in report.MLP_TARGETS if t.name == "timing_overhead")
    assert timing.met_by(1.019) and not timing.met_by(1.02)  # "under 2%" is strict
    graph = next(t for t in report.MLP_TARGETS if t.name == "graph_vs_handwritten")
    assert graph.met_by(1.05) and not graph.met_by(1.0501)
    cnn = {(t.variant, t.baseline, t.max_ratio) for t in report.TARGETS["cnn"]}
    assert cnn == {
        ("graph", "keras_fit", 1.0),
        ("default", "keras_fit", 1.0),
        ("graph_loop", "keras_fit_spe", 1.0),
    }
    default = next(t for t in report.MLP_TARGETS if t.name == "default_vs_keras_fit")
    assert (default.variant, default.baseline, default.max_ratio) == ("default", "keras_fit", 0.5)
    missing = report.evaluate_targets({"graph": _runs(1.0)}, report.MLP_TARGETS)
    assert all(t["met"] is None for t in missing)
    assert report.format_target(missing[0]).startswith("[NOT RUN]")
    overview = "\n".join(report.format_overview({"workloads": {"mlp": {"targets": missing}}}))
    assert "graph/handwritten" in overview and "NOT RUN" in overview


def test_workload_models_and_data():
    assert workloads.build_mlp().count_params() == 784 * 20 + 20 + 20 * 20 + 20 + 20 * 10 + 10
    cnn = workloads.build_cnn()
    assert cnn.output_shape == (None, 10)
    assert [type(layer).__name__ for layer in cnn.layers].count("Conv2D") == 3
    x, y = workloads.classifier_arrays((28, 28, 1), 50, seed=3)
    x2, y2 = workloads.classifier_arrays((28, 28, 1), 50, seed=3)
    assert x.shape == (50, 28, 28, 1) and x.dtype == "float32" and y.dtype == "int32"
    assert (x == x2).all() and (y == y2).all()
    assert 0 <= y.min() and y.max() < 10 and len(set(y.tolist())) > 3
    assert workloads.build_linear().count_params() == 1000 * 1000 * 2 + 1000 * 2 + 1000 + 1
    x, y = workloads.regression_arrays((1000,), 8, seed=1)
    assert x.shape == (8, 1000) and y.shape == (8, 1) and y.dtype == "float32"
    assert (workloads.regression_arrays((1000,), 8, seed=1)[1] == y).all()
    pairs, labels = workloads.image_pair_arrays((32, 32, 6), 4, seed=0)
    assert pairs.shape == (4, 32, 32, 6) and labels.shape == (4,)


def test_the_shuffled_pipeline_reshuffles_each_pass_and_caches_nothing():
    x, y = workloads.classifier_arrays((4,), 64, seed=0)
    shuffled = workloads.make_dataset(x, y, 8, shuffle_buffer=64, seed=1)
    first, second = ([int(v) for batch in shuffled for v in batch[1]] for _ in range(2))
    assert sorted(first) == sorted(y.tolist()) and first != second
    ops = {node.op for node in _keras_compat.dataset_graph_nodes(shuffled)}
    assert any("Shuffle" in op for op in ops) and not any("Cache" in op for op in ops)
    cached = workloads.make_dataset(x, y, 8)
    assert any("Cache" in node.op for node in _keras_compat.dataset_graph_nodes(cached))
    with pytest.raises(ValueError, match="shuffle_buffer=0"):
        config.BenchmarkConfig(shuffle_buffer=0)


@pytest.fixture(scope="module")
def linear_and_simclr_results():
    """The linear and SimCLR workloads, tiny: 2 steps per epoch, a narrow ResNet-18."""
    tiny = config.BenchmarkConfig(
        workloads="linear,simclr",
        repeats=1,
        steps_per_loop=2,
        num_train=128,
        num_val=32,
        batch_size=64,
        simclr_width=0.0625,
    )
    lines = []
    return suite.run_benchmark(tiny, progress=lines.append), lines


def test_linear_workload_runs_eager_graph_and_xla_to_the_same_loss(linear_and_simclr_results):
    results, lines = linear_and_simclr_results
    linear = results["workloads"]["linear"]
    assert linear["steps_per_loop"] == 2 and linear["steps_per_epoch"] == 2
    variants = linear["variants"]
    assert list(variants) == list(config.WORKLOAD_VARIANTS["linear"])
    reference = variants["graph_loop"]["validation"]["val_loss"]
    assert variants["eager"]["validation"]["val_loss"] == pytest.approx(reference, rel=1e-5)
    assert variants["xla_loop"]["validation"]["val_loss"] == pytest.approx(reference, rel=1e-4)
    assert variants["xla_loop"]["runs"][0]["notes"]["engine"] == "xla+loop2"
    assert variants["graph_loop"]["summary"]["x_eager"] is not None
    # In this process TensorFlow loaded first: PyTorch is skipped (not installed, or loaded too late).
    reason = variants["torch_eager"]["skipped"]
    assert reason == optional.torch_unavailable_reason() and reason.startswith("torch ")
    assert variants["torch_eager"]["runs"] == []
    assert any(line.startswith("[linear] skipping torch_eager: torch ") for line in lines)
    assert "torch_eager          skipped: torch " in report.format_report(results)


def test_main_runs_pytorch_side_by_side_when_installed(tmp_path):
    output = tmp_path / "linear.json"
    command = [
        sys.executable,
        "-m",
        "tftrain.bench",
        "--workload=linear",
        "--variants=graph_loop" + (",torch_eager" if TORCH_INSTALLED else ""),
        "--num_train=128",
        "--num_val=32",
        "--batch_size=64",
        "--steps_per_loop=2",
        f"--output={output}",
    ]
    process = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stderr[-3000:]
    variants = json.loads(output.read_text())["workloads"]["linear"]["variants"]
    if TORCH_INSTALLED:  # same start, batches and SGD step as TensorFlow: the same validation loss
        reference = variants["graph_loop"]["validation"]["val_loss"]
        assert variants["torch_eager"]["validation"]["val_loss"] == pytest.approx(reference, rel=1e-4)
        assert variants["torch_eager"]["runs"][0]["notes"]["torch"]
    else:
        assert list(variants) == ["graph_loop"]


def test_missing_optional_package_skips_its_variant(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    assert runners.VARIANTS["torch_eager"].unavailable() == (
        "torch is not installed (optional: pip install torch)"
    )
    assert runners.VARIANTS["graph"].unavailable() is None
    assert optional.preload_torch() is False


def test_simclr_step_runs_under_the_trainer_and_model_fit_alike(linear_and_simclr_results):
    simclr = linear_and_simclr_results[0]["workloads"]["simclr"]
    assert list(simclr["variants"]) == ["graph", "keras_fit"]
    graph, fit = (simclr["variants"][name]["runs"][0] for name in ("graph", "keras_fit"))
    assert graph["steps_per_epoch"] == fit["steps_per_epoch"] == 2
    # Same start, same batches, same LARS step: the same training loss.
    assert graph["final_loss"] == pytest.approx(fit["final_loss"], rel=1e-4)
    assert graph["timing"]["steps"] == 4
    assert simclr["variants"]["graph"]["summary"]["x_keras_fit"] is not None
    assert simclr["targets"] == []


def test_call_counts_split_an_epoch_into_k_step_calls():
    assert runners.call_counts(7, 3) == [3, 3, 1]
    assert runners.call_counts(6, 3) == [3, 3]
    assert runners.call_counts(2, 5) == [2]


def test_timing_hook_goal_from_the_direct_measurement():
    met = report.timing_hook_target(10e-6, 1e-3)  # 10 us of a 1 ms step
    assert met["ratio"] == pytest.approx(1e-3 / 0.99e-3) and met["met"] is True
    missed = report.timing_hook_target(30e-6, 1e-3)
    assert missed["ratio"] == pytest.approx(1 / 0.97) and missed["met"] is False
    assert "30.0 us per host call" in report.format_target(missed)
    assert report.timing_hook_target(10e-6, None)["met"] is None


def test_main_help_lists_every_flag_the_docs_table_names():
    process = subprocess.run(
        [sys.executable, "-m", "tftrain.bench", "--helpshort"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Try --helpfull" in process.stdout, process.stderr[-2000:]  # absl exits 1 after help
    listed = process.stdout.replace("--[no]", "--")
    table = open(os.path.join(REPO_ROOT, "docs", "benchmarks.md"), encoding="utf-8").read()
    documented = {name for name in table.split("`--")[1:] for name in [name.split("`")[0].split("=")[0]]}
    for flag in documented:
        assert f"--{flag}:" in listed, flag
    in_help = {line.split(":")[0].strip()[2:] for line in listed.splitlines() if line.startswith("  --")}
    assert in_help == documented  # the docs' flag table and --help name the same flags
    for flag in ("workload", "variants", "repeats", "quick", "output", "plot", "seed", "simclr_width"):
        assert f"--{flag}:" in listed and f"`--{flag}`" in table, flag
