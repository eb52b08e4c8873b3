"""Runs Keras's own `fit` tests with `fit`/`evaluate`/`predict` routed through `tftrain.Trainer`.

1. Fetches Keras's tests (fetch.py) unless `--tests` names a folder that has them.
2. Runs them all with every model's `fit`, `evaluate` and `predict` routed
   through a Trainer (routing.py).
3. Runs the tests that failed again under Keras itself: a test that fails
   there too does not test the Trainer (it needs JAX, a newer Keras, ...).
4. Fails if any test that passes under Keras fails through the Trainer,
   except those in `KNOWN_DIFFERENCES` (each one also in docs/trainer.md's
   table of differences).

`--full-baseline` also runs every test under Keras, for the count of tests
that pass there. Usage: `python tests/keras_conformance/run.py [--tests DIR]`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import fetch

# Tests that may pass under Keras and not through the Trainer, by node id, with the reason
# (docs/trainer.md's "Deliberate differences from model.fit" has the same rows). At most three.
KNOWN_DIFFERENCES: dict[str, str] = {
    "callbacks/tensorboard_test.py::TestTensorBoardV2::test_TensorBoard_weight_images": (
        "the NaN guard (docs/trainer.md's first row): with about one initialisation in four "
        "(5 of seeds 0-19, Keras 3.7.0 and 3.15.1 alike) its Conv2D on all-ones images diverges "
        "to a NaN loss, which fit trains on and the Trainer stops at"
    ),
}
# The error each listed difference shows as: a listed test failing any other way is unexplained.
KNOWN_DIFFERENCE_ERRORS: dict[str, str] = {
    "callbacks/tensorboard_test.py::TestTensorBoardV2::test_TensorBoard_weight_images": "NonFiniteLossError",
}

_HERE = Path(__file__).resolve().parent


def run_tests(tests: Path, mode: str, node_ids: list[str] | None = None) -> dict[str, dict]:
    """Runs the fetched tests (or `node_ids` of them) in `mode`; returns each test's outcome."""
    with tempfile.TemporaryDirectory() as scratch:
        results = Path(scratch) / "results.json"
        arguments = node_ids if node_ids is not None else [str(tests)]
        if node_ids is not None:
            arguments_file = Path(scratch) / "node_ids.txt"
            arguments_file.write_text("\n".join(str(tests / node) for node in node_ids))
            arguments = [f"@{arguments_file}"]
        env = dict(
            os.environ,
            TFTRAIN_CONFORMANCE=mode,
            TFTRAIN_CONFORMANCE_RESULTS=str(results),
            PYTHONPATH=os.pathsep.join(filter(None, [str(_HERE), os.environ.get("PYTHONPATH")])),
            TF_CPP_MIN_LOG_LEVEL="2",
        )
        # --tb=native: pytest's own traceback rendering re-parses sources with `ast` deep in the stack, which
        # on Python 3.11 can end the session with "SystemError: AST constructor recursion depth mismatch"
        # (an INTERNALERROR after ~200 of the 329 tests, seen with TF 2.16.2 / Keras 3.7.0).
        command = [sys.executable, "-m", "pytest", "-q", "--tb=native", "-p", "routing", "-c", str(tests / "pytest.ini"),
                   "--rootdir", str(tests), *arguments]  # fmt: skip
        completed = subprocess.run(command, env=env, cwd=tests, capture_output=True, text=True)
        if completed.returncode not in (0, 1):  # 0: all passed, 1: some failed; else the run broke off
            sys.stdout.write(completed.stdout[-5000:] + completed.stderr[-5000:])
            raise SystemExit(
                f"pytest did not finish its run (exit {completed.returncode}): results are partial."
            )
        if not results.exists():
            sys.stdout.write(completed.stdout[-5000:] + completed.stderr[-5000:])
            raise SystemExit(f"pytest wrote no results (exit {completed.returncode}).")
        return json.loads(results.read_text())


def summarize(through_trainer: dict, under_keras: dict, full_baseline: bool) -> tuple[list[str], str]:
    """Returns the unexplained failures and a report of the counts."""
    failed = sorted(node for node, entry in through_trainer.items() if entry["outcome"] == "failed")
    regressions = [node for node in failed if under_keras.get(node, {}).get("outcome") == "passed"]
    listed = [node for node in regressions if _is_listed(node, through_trainer[node])]
    unexplained = [node for node in regressions if node not in listed]
    passed = [node for node, entry in through_trainer.items() if entry["outcome"] == "passed"]
    routed = [node for node, entry in through_trainer.items() if entry["routed"]]
    lines = [
        f"Keras {fetch.KERAS_VERSION}'s tests, installed Keras {_installed_keras()}:",
        f"  tests: {len(through_trainer)}; calling fit/evaluate/predict: {len(routed)}",
        f"  pass through the Trainer: {len(passed)} ({sum(through_trainer[n]['routed'] > 0 for n in passed)} routed)",
        f"  fail under Keras itself too: {len(failed) - len(regressions)}",
        f"  listed differences: {len(listed)}; unexplained failures: {len(unexplained)}",
    ]
    if full_baseline:
        keras_passed = {node for node, entry in under_keras.items() if entry["outcome"] == "passed"}
        both = keras_passed & set(passed)
        lines.append(f"  pass under Keras: {len(keras_passed)}; of those, through the Trainer: {len(both)}")
    for node in unexplained:
        lines.append(f"  FAILED {node}: {through_trainer[node].get('error', '')}")
    for node in listed:
        lines.append(f"  listed {node}: {KNOWN_DIFFERENCES[node]}")
    for node in sorted(set(KNOWN_DIFFERENCES) - set(listed)):
        lines.append(f"  (listed, but not a failure here: {node})")
    return unexplained, "\n".join(lines)


def _is_listed(node: str, outcome: dict) -> bool:
    """Whether a failure is a listed difference, failing as listed."""
    return node in KNOWN_DIFFERENCES and KNOWN_DIFFERENCE_ERRORS.get(node, "") in outcome.get("error", "")


def _installed_keras() -> str:
    import keras

    return keras.__version__


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=Path, default=Path("build/keras_conformance"),
                        help="folder of fetched tests (fetched into it if it has none)")  # fmt: skip
    parser.add_argument("--full-baseline", action="store_true", help="also run every test under Keras")
    parser.add_argument("--report-only", action="store_true", help="report unexplained failures, exit 0")
    args = parser.parse_args()
    start = time.monotonic()
    tests = args.tests.resolve()
    if not (tests / "SOURCE.md").exists():
        with tempfile.TemporaryDirectory() as downloads:
            fetch.extract(fetch.download_sdist(Path(downloads)), tests)
    through_trainer = run_tests(tests, "trainer")
    failed = [node for node, entry in through_trainer.items() if entry["outcome"] == "failed"]
    if args.full_baseline:
        under_keras = run_tests(tests, "keras")
    else:
        under_keras = run_tests(tests, "keras", failed) if failed else {}
    unexplained, report = summarize(through_trainer, under_keras, args.full_baseline)
    print(report)
    print(f"  time: {time.monotonic() - start:.0f} s")
    raise SystemExit(1 if unexplained and not args.report_only else 0)


if __name__ == "__main__":
    main()
