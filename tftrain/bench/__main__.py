"""Benchmarks the ways to train with tftrain against model.fit and a hand-written loop.

Usage: python -m tftrain.bench [--quick] [--workload=mlp,cnn] [--repeats=N]
       [--epochs=N] [--steps_per_loop=K] [--output=results.json]
"""

import os
import sys

from absl import app, flags

from tftrain.bench import config as config_lib

_QUICK = flags.DEFINE_bool(
    "quick", False, "A short run: fewer examples and eager steps (see the report), 1 repeat by default."
)
_OUTPUT = flags.DEFINE_string(
    "output", None, "Write all results (every run, summaries, targets) as JSON here."
)
_WORKLOAD = flags.DEFINE_string(
    "workload", ",".join(config_lib.WORKLOAD_NAMES), "Comma-separated workloads: mlp, cnn."
)
_VARIANTS = flags.DEFINE_string(
    "variants", None, f"Comma-separated variants (default: all): {', '.join(config_lib.VARIANT_NAMES)}."
)
_REPEATS = flags.DEFINE_integer(
    "repeats",
    None,
    "Alternating repetitions of every variant; medians are reported. Default 3, or 1 with --quick.",
)
_EPOCHS = flags.DEFINE_integer(
    "epochs", 2, "Epochs per run (>= 2); the first includes tracing, the rest are steady state."
)
_STEPS_PER_LOOP = flags.DEFINE_integer(
    "steps_per_loop", 20, "k for graph_loop (Trainer steps_per_loop) and keras_fit_spe (steps_per_execution)."
)
_EAGER_STEPS = flags.DEFINE_integer(
    "eager_steps",
    None,
    "Steps per epoch for the eager variants (they are slow); 0 = full epochs. Default 100, or 10 with --quick.",
)
_NUM_TRAIN = flags.DEFINE_integer(
    "num_train", None, "Training examples for every chosen workload (default 60,000; fewer with --quick)."
)
_NUM_VAL = flags.DEFINE_integer(
    "num_val", None, "Validation examples for every chosen workload (default 10,000; fewer with --quick)."
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed for the synthetic data and the initial weights.")
_AUTOTUNE = flags.DEFINE_bool(
    "autotune", False, "Prefetch with tf.data AUTOTUNE (autotuning on) instead of a fixed 2-batch buffer."
)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str]) -> None:
    """Checks the flags, runs the benchmark, prints the table, writes the JSON."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    try:
        config = config_lib.BenchmarkConfig(
            workloads=_WORKLOAD.value,
            variants=_VARIANTS.value,
            quick=_QUICK.value,
            repeats=_REPEATS.value,
            epochs=_EPOCHS.value,
            steps_per_loop=_STEPS_PER_LOOP.value,
            eager_steps=_EAGER_STEPS.value,
            num_train=_NUM_TRAIN.value,
            num_val=_NUM_VAL.value,
            seed=_SEED.value,
            autotune=_AUTOTUNE.value,
        )
    except ValueError as error:
        raise app.UsageError(str(error)) from None
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads
    from tftrain.bench import report, suite  # loads TensorFlow, so only after the checks

    results = suite.run_benchmark(config, progress=_progress)
    print(report.format_report(results), end="")
    if _OUTPUT.value:
        report.write_json(results, _OUTPUT.value)
        print(f"Wrote {_OUTPUT.value}")


if __name__ == "__main__":
    app.run(main)
