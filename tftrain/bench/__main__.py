"""Benchmarks the ways to train with tftrain against model.fit, a hand-written loop and PyTorch.

Usage: python -m tftrain.bench [--quick] [--workload=mlp,cnn,linear,simclr] [--rounds=N]
       [--variants=...] [--segment_steps=N] [--steps_per_loop=K] [--agreement]
       [--output=results.json] [--plot=results.png]
       python -m tftrain.bench --workload=startup [--rounds=N] [--output=startup.json]
         (a first run in fresh processes, Trainer against Keras: `tftrain.bench.startup`)
"""

import dataclasses
import os
import sys

from absl import app, flags, logging

from tftrain.bench import config as config_lib
from tftrain.bench import optional, outputs

_FIELDS = {field.name: field for field in dataclasses.fields(config_lib.BenchmarkConfig)}
_DEFINE = {
    "bool": flags.DEFINE_bool,
    "int": flags.DEFINE_integer,
    "int | None": flags.DEFINE_integer,
    "float": flags.DEFINE_float,
}


def _define(name: str, help_text: str) -> flags.FlagHolder:
    """The flag of `BenchmarkConfig` field `name`: of its type, with its default."""
    field = _FIELDS[name]
    return _DEFINE[field.type](name, field.default, help_text)  # a field of another type: a KeyError here


_define("quick", "A short run: fewer examples, shorter segments, 5 rounds by default.")
_OUTPUT = flags.DEFINE_string(
    "output", None, "Write all results (every run, summaries, targets) as JSON here (after the whole run)."
)
_PLOT = flags.DEFINE_string(
    "plot",
    None,
    "Draw a bar chart per workload into this .png/.svg/.pdf (needs matplotlib: the `plot` extra).",
)
_WORKLOAD = flags.DEFINE_string(
    "workload",
    ",".join(config_lib.WORKLOAD_NAMES),
    f"Comma-separated workloads: {', '.join(config_lib.WORKLOAD_NAMES)}; or `startup` alone: a first "
    "fit/evaluate/predict in fresh processes, Trainer against Keras (MNIST MLP and convnet).",
)
flags.DEFINE_string(
    "variants",
    None,
    "Comma-separated variants (default: every variant of each workload): "
    f"{', '.join(config_lib.VARIANT_NAMES)}.",
)
_ROUNDS = _define(
    "rounds",
    "Measured rounds: in each, every variant runs one segment, in a rotated order. Default 20, or 5 with --quick.",
)
_define("warmup_segments", "Segments per variant before the rounds (tracing, first calls); not compared.")
_define(
    "segment_steps",
    "Steps per segment of the non-eager variants. Default: each workload's own (300 mlp, 100 cnn and linear, "
    "2 simclr; fewer with --quick).",
)
_CONFIDENCE = _define("confidence", "Confidence level of every interval.")
_define("agreement", "Run the suite twice, back to back, and report whether the two runs' ratios agree.")
_define(
    "steps_per_loop",
    "k of the *_loop variants, step_only and keras_fit_spe (steps_per_execution). Default: each workload's own "
    "(20 for mlp/cnn, 10 for linear).",
)
_define("batch_size", "Batch size for every chosen workload (default: 128 mlp/cnn, 1024 linear, 64 simclr).")
_define(
    "checkpoint_every_steps",
    "How often graph_checkpoint saves (default: every steps_per_epoch // 4 steps; the Trainer also saves at "
    "each epoch end).",
)
_define("simclr_width", "Width multiplier of the SimCLR ResNet-18 (1.0 = the standard network).")
_define(
    "eager_steps", "Steps per segment of the eager variants (they are slow). Default 20, or 5 with --quick."
)
_define(
    "num_train",
    "Training examples for every chosen workload (default: each workload's own, e.g. 60,000 for mlp; "
    "fewer with --quick).",
)
_define(
    "num_val",
    "Validation examples for every chosen workload (default: each workload's own; fewer with --quick).",
)
_define("seed", "Seed for the synthetic data and the initial weights.")
_define(
    "shuffle_buffer",
    "Train on examples reshuffled each pass through a buffer of this many (e.g. 10000), no cache, "
    "instead of the cached batches.",
)
_define("autotune", "Prefetch with tf.data AUTOTUNE (autotuning on) instead of a fixed 2-batch buffer.")


# The flags `--workload=startup` reads; it rejects every other flag of this module (the steady-state ones).
_STARTUP_FLAGS = frozenset(holder.name for holder in (_WORKLOAD, _ROUNDS, _CONFIDENCE, _OUTPUT))


def _module_flags() -> list[flags.Flag]:
    """The flags this module defines."""
    return flags.FLAGS.get_flags_for_module(__name__)


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str]) -> None:
    """Checks the flags, runs the benchmark, prints the table, writes the JSON."""
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    if _WORKLOAD.value.strip() == "startup":
        _run_startup()
        return
    try:
        config = config_lib.BenchmarkConfig(  # each flag of a field's name sets that field
            workloads=_WORKLOAD.value,
            **{flag.name: flag.value for flag in _module_flags() if flag.name in _FIELDS},
        )
        _check_requested_optional_variants(config)
        outputs.check_outputs(_OUTPUT.value, _PLOT.value)
    except (ValueError, ImportError) as error:
        raise app.UsageError(str(error)) from None
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads
    if not flags.FLAGS["verbosity"].present:
        # TensorFlow logs each checkpoint save at INFO, which would bury the progress lines.
        logging.set_verbosity(logging.WARNING)
    if any("torch_eager" in config.variants_for(name) for name in config.workloads):
        optional.preload_torch()  # PyTorch must load before TensorFlow (see tftrain.bench.optional)
    from tftrain.bench import report, suite  # loads TensorFlow, so only after the checks

    results = suite.run_benchmark(config, progress=_progress)
    print(report.format_report(results), end="")
    for path in outputs.write_outputs(results, _OUTPUT.value, _PLOT.value):
        print(f"Wrote {path}")


def _run_startup() -> None:
    """`--workload=startup`: fresh processes per side and round (`tftrain.bench.startup`)."""
    from tftrain.bench import startup  # no TensorFlow in this process: each child loads its own

    ignored = [
        f"--{flag.name}" for flag in _module_flags() if flag.name not in _STARTUP_FLAGS and flag.present
    ]
    if ignored:
        raise app.UsageError(
            f"--workload=startup takes --rounds, --confidence and --output only; received {', '.join(ignored)}. "
            "Drop them, or run the steady-state workloads (e.g. --workload=mlp,cnn) in a separate command."
        )
    try:
        outputs.check_outputs(_OUTPUT.value, None)
        rounds = _ROUNDS.value if _ROUNDS.value is not None else 5
        results = startup.run_startup(rounds=rounds, confidence=_CONFIDENCE.value, progress=_progress)
    except ValueError as error:
        raise app.UsageError(str(error)) from None
    print(startup.format_startup(results), end="")
    if _OUTPUT.value:
        print(f"Wrote {outputs.write_startup_json(results, _OUTPUT.value)}")


def _check_requested_optional_variants(config: config_lib.BenchmarkConfig) -> None:
    """A variant named on the command line whose optional package is missing is an error (not a skip)."""
    for name in config.variants or ():
        if name in config_lib.OPTIONAL_VARIANTS:
            module, install = config_lib.OPTIONAL_VARIANTS[name]
            if not optional.is_installed(module):
                raise ValueError(
                    f"--variants={name} needs {module}, which is not installed. Install it ({install}) or "
                    f"leave {name} out (without --variants it is skipped when {module} is missing)."
                )


if __name__ == "__main__":
    app.run(main)
