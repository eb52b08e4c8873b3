"""docs/research_scripts.md, run: the example program from a flagfile, two runs in a real TensorBoard's HParams tab.

The screenshot of the tab in the docs is made here where Chromium is
installed (`apt-get install chromium`); with `TFTRAIN_DOCS_IMAGES=1` it is
written to docs/images/hparams_tab.png.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import pytest
from helpers import TensorBoardServer

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "research_script.py"
SCREENSHOT = ROOT / "docs" / "images" / "hparams_tab.png"


def _run(*argv):
    return subprocess.run(
        [sys.executable, str(SCRIPT), *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """The page's two runs: one flagfile, two learning rates, under one log root."""
    root = tmp_path_factory.mktemp("runs")
    flagfile = root / "base.flags"
    flagfile.write_text("--epochs=4\n--steps_per_loop=8\n--checkpoint_every_steps=16\n")
    runs = {}
    for learning_rate in ("0.003", "0.0003"):
        done = _run(f"--flagfile={flagfile}", f"--model_dir={root / ('lr' + learning_rate)}", f"--learning_rate={learning_rate}")
        assert done.returncode == 0, done.stderr[-3000:]
        runs[learning_rate] = done.stdout
    return root, runs


def test_each_run_is_checked_by_a_dry_run_then_trains_and_records_its_flags(two_runs):
    root, runs = two_runs
    for learning_rate, stdout in runs.items():
        assert "dry run (graph+loop8): ok" in stdout
        assert "val_accuracy" in stdout and "after 192 steps" in stdout
        with open(root / f"lr{learning_rate}" / "run_record.json") as file:
            record = json.load(file)["record"]
        assert record["optimizer.learning_rate"] == float(learning_rate)
        assert record["hparams.learning_rate"] == float(learning_rate)
        assert record["hparams.trainer.checkpoint_every_steps"] == 16
        assert "--flagfile=" in record["hparams.command_line"]
    final = {lr: float(stdout.split("val_accuracy ")[-1].split()[0]) for lr, stdout in runs.items()}
    assert final["0.003"] > final["0.0003"]  # the page's point: the higher rate learns faster here


def test_the_runs_are_two_rows_of_the_hparams_tab(two_runs, tmp_path):
    root, _ = two_runs
    body = {
        "experimentName": "",
        "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
        "colParams": [],
        "startIndex": 0,
        "sliceSize": 100,
    }
    with TensorBoardServer(str(root)) as server:
        deadline = time.monotonic() + 60
        while True:
            groups = server.post("/data/plugin/hparams/session_groups", body)["sessionGroups"]
            ended = [group for group in groups if group["sessions"][0]["status"] == "STATUS_SUCCESS"]
            if len(ended) == 2 or time.monotonic() > deadline:
                break
            time.sleep(1)
        experiment = server.post("/data/plugin/hparams/experiment", {"experimentName": ""})
        rates = sorted(group["hparams"]["learning_rate"] for group in groups)
        assert rates == pytest.approx([0.0003, 0.003])
        for group in groups:
            metrics = {(m["name"]["group"], m["name"]["tag"]) for m in group["metricValues"]}
            assert ("", "val_accuracy") in metrics
            # No value twice: no two columns of one name (the last part of it) with the same value; the
            # program's `batch_size` flag is the global batch size.
            seen = set()
            for name, value in group["hparams"].items():
                short = "batch_size" if name == "data.global_batch_size" else name.rsplit(".", 1)[-1]
                assert (short, json.dumps(value)) not in seen, name
                seen.add((short, json.dumps(value)))
        infos = experiment["hparamInfos"]
        # The varied flag is the one column that differs, first; the program's flags under their own names,
        # the Trainer's options under `trainer.`, each with its own type.
        assert [info["name"] for info in infos if info.get("differs")] == ["learning_rate"] == [infos[0]["name"]]
        types = {info["name"]: info["type"] for info in infos}
        assert {name: types[name] for name in ("learning_rate", "width", "batch_size", "num_examples", "dry_run")} == {
            "learning_rate": "DATA_TYPE_FLOAT64", "width": "DATA_TYPE_FLOAT64", "batch_size": "DATA_TYPE_FLOAT64",
            "num_examples": "DATA_TYPE_FLOAT64", "dry_run": "DATA_TYPE_BOOL",
        }  # fmt: skip
        assert types["trainer.steps_per_loop"] == types["trainer.checkpoint_every_steps"] == "DATA_TYPE_FLOAT64"
        assert types["trainer.jit_compile"] == types["trainer.use_tf_function"] == "DATA_TYPE_BOOL"
        assert types["trainer.epochs"] == "DATA_TYPE_FLOAT64" and types["optimizer.class"] == "DATA_TYPE_STRING"
        program = {"learning_rate", "width", "batch_size", "num_examples", "dry_run"}
        groups_of = {name.split(".")[0] for name in types if name not in program}
        assert groups_of == {"trainer", "optimizer", "model", "data", "strategy", "versions"}, sorted(types)
        assert "optimizer.learning_rate" not in types and "command_line" not in types and "trainer.model_dir" not in types
        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if chromium is None:
            pytest.skip("the screenshot needs Chromium (apt-get install chromium); the data above was checked")
        shot = tmp_path / "hparams_tab.png"
        subprocess.run(
            [
                chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                "--window-size=1920,560", "--virtual-time-budget=20000", f"--screenshot={shot}",
                f"{server.url}/#hparams",
            ],
            capture_output=True,
            timeout=180,
            check=True,
        )  # fmt: skip
    png = shot.read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000  # a page drawn, not a blank one
    if os.environ.get("TFTRAIN_DOCS_IMAGES") == "1":
        shutil.copyfile(shot, SCREENSHOT)


def test_a_bad_trainer_flag_stops_the_script_before_any_work():
    done = _run("--steps_per_loop=0", "--model_dir=unused")
    assert done.returncode != 0
    assert "Invalid value for argument `steps_per_loop`" in done.stderr
    assert "dry run" not in done.stdout
