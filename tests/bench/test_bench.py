"""Tests for `python -m tftrain.bench` (tiny sizes: a few steps per run)."""

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
from helpers import TIMING_REPORT_KEYS

from tftrain.bench import config, goals, optional, outputs, plot, report, runners, stats, suite, workloads
from tftrain.compat import tf_internals

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
    "graph_loop_k1",
    "default",
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
    """Every variant of a tiny MLP workload: a warmup segment and 2 rounds of 4-step segments."""
    lines = []
    tiny = config.BenchmarkConfig(
        workloads="mlp",
        rounds=2,
        segment_steps=4,
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
    assert (mlp["num_train"], mlp["num_val"], mlp["steps_per_epoch"], mlp["segment_steps"]) == (300, 64, 3, 4)
    assert len(lines) == 1 + 3  # "preparing" + one line per segment index
    assert lines[1].startswith("[mlp] segment 1/3 (warmup) done: handwritten graph")
    assert lines[2].startswith("[mlp] segment 2/3 (round) done: graph default")  # rotated
    for name, variant in mlp["variants"].items():
        expected_steps = 2 if variant["eager"] else 4
        assert variant["steps_per_segment"] == expected_steps, name
        assert [segment["warmup"] for segment in variant["segments"]] == [True, False, False]
        assert all(segment["wall_s"] > 0 and segment["cpu_s"] >= 0 for segment in variant["segments"])
        assert variant["summary"]["rounds"] == 2 and variant["summary"]["step_s"]["median"] > 0
        assert set(variant["summary"]) >= {"step_s", "cpu_step_s", "warmup_s", "x_handwritten", "x_data_only"}
        if name == "data_only":
            assert variant["final_loss"] is None and variant["validation"] is None
        elif name == "step_only":  # trained on one batch: nothing to validate
            assert math.isfinite(variant["final_loss"]) and variant["validation"] is None
        else:
            assert math.isfinite(variant["final_loss"]), name
            assert set(variant["validation"]) == {"val_loss", "val_accuracy"}
        if name in TRAINER_VARIANTS or name == "keras_fit_timing":
            assert set(variant["timing"]) == TIMING_KEYS, name
    assert mlp["variants"]["eager"]["summary"]["x_handwritten_eager"] is not None
    assert mlp["variants"]["handwritten"]["summary"]["x_handwritten"] == pytest.approx(1.0)
    expected = [target.name for target in goals.TARGETS["mlp"]] + ["checkpoint_save", "timing_hooks_direct"]
    assert [target["name"] for target in mlp["targets"]] == expected
    for target in mlp["targets"]:  # every goal ran and has an interval (2 rounds) and a verdict
        assert target["verdict"] in (stats.MET, stats.MISSED, stats.UNDECIDED, stats.REPORTED), target["name"]
        if target["name"] != "checkpoint_save":
            assert target["wall"]["samples"] == 2
            assert target["wall"]["low"] <= target["wall"]["estimate"] <= target["wall"]["high"]
    assert 0 < mlp["timing_hook_s"] < 1e-3  # microseconds, not milliseconds
    auto = next(target for target in mlp["targets"] if target["name"] == "auto_vs_best_fixed_k")
    assert auto["baseline"] in goals.AUTO_REFERENCES


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
    # k=5 over 4-step segments runs calls of 5, as Keras's steps_per_execution: it trains more.
    assert variants["graph_loop_k5"]["timing"]["steps"] == 15
    assert val_loss("graph_loop_k5") != pytest.approx(val_loss("handwritten"), rel=1e-5)
    # Eager variants ran fewer steps, so they trained less: the check can tell runs apart.
    assert val_loss("eager") != pytest.approx(val_loss("handwritten"), rel=1e-5)


def test_trainer_timing_is_recorded(tiny_results):
    variants = tiny_results[0]["workloads"]["mlp"]["variants"]
    graph_timing = variants["graph"]["timing"]
    assert graph_timing["steps"] == 12 and graph_timing["trace_count"] >= 1  # 3 segments of 4 steps, one fit
    assert variants["trainer_no_timing"]["timing"]["steps"] == 0  # nothing measured
    assert variants["graph_no_sync"]["timing"]["steps"] == 0
    assert variants["graph_loop"]["notes"]["engine"] == "graph+loop2"
    assert variants["graph_loop_k5"]["notes"]["engine"] == "graph+loop5"
    assert variants["keras_fit_spe"]["notes"]["steps_per_execution"] == 2
    # The step count goes in as a tensor: one trace for every segment.
    assert variants["handwritten_loop"]["notes"] == {"trace_count": 1, "steps_per_call": 2}
    assert variants["handwritten_xla"]["notes"]["jit_compile"] is True
    # 3 steps per pass -> a save every step (a quarter pass, at least 1): steps 1..12.
    checkpointed = variants["graph_checkpoint"]
    assert checkpointed["notes"]["checkpoint_every_steps"] == 1
    assert checkpointed["timing"]["checkpoint_saves"] == 12
    # The saves at the ends of the segments fall between them: measured as gaps.
    assert all(segment["gap_s"] > 0 for segment in checkpointed["segments"][1:])
    assert graph_timing["checkpoint_saves"] == 0
    assert variants["step_only"]["notes"]["trace_count"] == 1


def test_report_and_json_render(tiny_results, tmp_path):
    results = tiny_results[0]
    text = report.format_report(results)
    for name in config.WORKLOAD_VARIANTS["mlp"]:
        assert name in text
    assert "Goals:" in text and "x handwr" in text and "x data" in text and "(95%, 2 rounds" in text
    assert "== goals" in text and "graph_loop/data_only" in text and "default/graph_loop_k" in text
    assert "back-to-back" not in text  # one run only
    floor = results["workloads"]["mlp"]["floor"]
    variants = results["workloads"]["mlp"]["variants"]
    assert floor["data_plus_step_s"] == pytest.approx(
        variants["data_only"]["summary"]["step_s"]["median"]
        + variants["step_only"]["summary"]["step_s"]["median"]
    )
    assert set(floor["over_floor"]) == {"handwritten_loop", "graph_loop", "keras_fit_spe"}
    path = tmp_path / "results.json"
    report.write_json(results, str(path))
    loaded = json.loads(path.read_text())
    assert loaded["workloads"]["mlp"]["variants"]["graph"]["steps_per_segment"] == 4
    assert loaded["config"]["workloads"] == ["mlp"] and loaded["config"]["rounds"] == 2


def test_back_to_back_runs_report_their_agreement():
    tiny = config.BenchmarkConfig(
        workloads="mlp",
        variants="handwritten,graph",
        rounds=3,
        segment_steps=3,
        num_train=256,
        num_val=64,
        agreement=True,
        validate=False,
    )
    results = suite.run_benchmark(tiny)
    rows = {row["goal"]: row for row in results["agreement"]}
    assert set(rows) == {"graph_vs_handwritten", "timing_hooks_direct"}
    row = rows["graph_vs_handwritten"]
    assert row["agree"] in (True, False)
    second = results["second_run"]["workloads"]["mlp"]["targets"]
    assert row["second"] == next(t["wall"] for t in second if t["name"] == "graph_vs_handwritten")
    assert "== back-to-back agreement: " in report.format_report(results)


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
        "--rounds=2",
        "--segment_steps=2",
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
    assert results["config"]["rounds"] == 2
    assert len(results["workloads"]["mlp"]["variants"]["graph"]["segments"]) == 3  # warmup + 2 rounds
    assert "Goals:" in process.stdout and "[NOT RUN]" in process.stdout
    # The second segment starts one variant further down the list.
    assert "[mlp] segment 2/3 (round) done: graph graph_checkpoint handwritten" in process.stderr


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


def test_registries_match_the_light_name_lists():
    assert tuple(workloads.WORKLOADS) == config.WORKLOAD_NAMES
    assert tuple(runners.VARIANTS) == config.VARIANT_NAMES
    assert set(config.WORKLOAD_VARIANTS) == set(config.WORKLOAD_NAMES)
    for own in config.WORKLOAD_VARIANTS.values():
        assert set(own) <= set(config.VARIANT_NAMES) and len(set(own)) == len(own)
    assert set(report.COLUMNS) == set(goals.TARGETS) == set(config.WORKLOAD_NAMES)
    for name in config.OPTIONAL_VARIANTS:
        assert runners.VARIANTS[name].unavailable_reason is not None


def test_config_defaults_and_validation():
    quick = config.BenchmarkConfig(quick=True)
    assert (quick.rounds, quick.eager_steps, quick.workloads) == (5, 5, config.WORKLOAD_NAMES)
    assert quick.variants is None and quick.variants_for("linear") == config.WORKLOAD_VARIANTS["linear"]
    assert suite.sizes(quick, workloads.WORKLOADS["mlp"]) == (6_000, 1_000)
    assert suite.run_options(quick, workloads.WORKLOADS["linear"]).steps_per_loop == 10
    assert suite.run_options(quick, workloads.WORKLOADS["mlp"]).steps_per_loop == 20
    assert suite.segment_steps(quick, workloads.WORKLOADS["mlp"]) == 100
    chosen = config.BenchmarkConfig(workloads="mlp,linear", variants="eager,graph", steps_per_loop=5)
    assert chosen.variants_for("mlp") == ("graph", "eager")
    assert chosen.variants_for("linear") == ("eager",)
    assert suite.run_options(chosen, workloads.WORKLOADS["linear"]).steps_per_loop == 5
    full = config.BenchmarkConfig(num_train=1_000)
    assert (full.rounds, full.eager_steps, full.warmup_segments, full.confidence) == (20, 20, 1, 0.95)
    assert suite.sizes(full, workloads.WORKLOADS["cnn"]) == (1_000, 2_560)
    # Every full-size segment is a multiple of each k the auto goal compares.
    for name in ("mlp", "cnn", "linear"):
        steps = suite.segment_steps(full, workloads.WORKLOADS[name])
        assert all(steps % k == 0 for k in runners.AUTO_REFERENCE_K), name
    for name in ("default", "graph_loop_k1", "graph_loop_k100"):
        assert name in config.WORKLOAD_VARIANTS["linear"] and name in config.WORKLOAD_VARIANTS["cnn"]
    with pytest.raises(ValueError, match="rounds=0"):
        config.BenchmarkConfig(rounds=0)
    with pytest.raises(ValueError, match="segment_steps=0"):
        config.BenchmarkConfig(segment_steps=0)
    with pytest.raises(ValueError, match=r"confidence=1.0.*Expected a number in \[0.5, 1\)"):
        config.BenchmarkConfig(confidence=1.0)


def test_goals_per_workload():
    cnn = {(t.variant, t.baseline, t.max_ratio) for t in goals.TARGETS["cnn"]}
    assert {
        ("graph", "keras_fit", 1.0),
        ("default", "keras_fit", 1.0),
        ("graph_loop", "keras_fit_spe", 1.0),
        ("graph_loop", "handwritten_loop", 1.05),
        ("xla", "handwritten_xla", 1.05),
    } <= cnn
    assert goals.AUTO_GOAL in goals.TARGETS["linear"] and goals.AUTO_GOAL in goals.TARGETS["mlp"]
    default = next(t for t in goals.TARGETS["mlp"] if t.name == "default_vs_keras_fit")
    assert (default.variant, default.baseline, default.max_ratio) == ("default", "keras_fit", 0.5)
    (simclr,) = goals.TARGETS["simclr"]
    assert (simclr.variant, simclr.baseline, simclr.max_ratio) == ("graph", "keras_fit", 1.0)
    missing = goals.evaluate_workload({"name": "mlp", "variants": {}})
    assert all(t["verdict"] == stats.NOT_RUN for t in missing)
    assert report.format_target(missing[0]).startswith("[NOT RUN]")


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
    ops = {node.op for node in tf_internals.dataset_graph_nodes(shuffled)}
    assert any("Shuffle" in op for op in ops) and not any("Cache" in op for op in ops)
    cached = workloads.make_dataset(x, y, 8)
    assert any("Cache" in node.op for node in tf_internals.dataset_graph_nodes(cached))
    with pytest.raises(ValueError, match="shuffle_buffer=0"):
        config.BenchmarkConfig(shuffle_buffer=0)


@pytest.fixture(scope="module")
def linear_and_simclr_results():
    """The linear and SimCLR workloads, tiny: 2-step segments, a narrow ResNet-18."""
    tiny = config.BenchmarkConfig(
        workloads="linear,simclr",
        variants="default,graph_loop,xla_loop,eager,torch_eager,graph,keras_fit",
        rounds=2,
        segment_steps=2,
        eager_steps=2,
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
    assert list(variants) == ["default", "graph_loop", "xla_loop", "eager", "torch_eager"]
    reference = variants["graph_loop"]["validation"]["val_loss"]
    assert variants["eager"]["validation"]["val_loss"] == pytest.approx(reference, rel=1e-5)
    assert variants["default"]["validation"]["val_loss"] == pytest.approx(reference, rel=1e-5)
    assert variants["xla_loop"]["validation"]["val_loss"] == pytest.approx(reference, rel=1e-4)
    assert variants["xla_loop"]["notes"]["engine"] == "xla+loop2"
    assert variants["graph_loop"]["summary"]["x_eager"] is not None
    (auto,) = linear["targets"]  # no fixed-k variant ran
    assert auto["name"] == "auto_vs_best_fixed_k" and auto["verdict"] == stats.NOT_RUN
    # In this process TensorFlow loaded first: PyTorch is skipped (not installed, or loaded too late).
    reason = variants["torch_eager"]["skipped"]
    assert reason == optional.torch_unavailable_reason() and reason.startswith("torch ")
    assert variants["torch_eager"]["segments"] == []
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
        assert variants["torch_eager"]["notes"]["torch"]
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
    graph, fit = (simclr["variants"][name] for name in ("graph", "keras_fit"))
    assert graph["steps_per_segment"] == fit["steps_per_segment"] == 2
    # Same start, same batches, same LARS step: the same training loss.
    assert graph["final_loss"] == pytest.approx(fit["final_loss"], rel=1e-4)
    assert graph["timing"]["steps"] == 6
    (goal,) = simclr["targets"]
    assert goal["name"] == "graph_vs_keras_fit" and goal["wall"]["samples"] == 2


def test_call_counts_split_an_epoch_into_k_step_calls():
    assert runners.call_counts(7, 3) == [3, 3, 1]
    assert runners.call_counts(6, 3) == [3, 3]
    assert runners.call_counts(2, 5) == [2]


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
    for flag in (
        "workload",
        "variants",
        "rounds",
        "agreement",
        "quick",
        "output",
        "plot",
        "seed",
        "simclr_width",
    ):
        assert f"--{flag}:" in listed and f"`--{flag}`" in table, flag
