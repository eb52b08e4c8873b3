"""The benchmark: every chosen variant on every chosen workload, repetitions alternating."""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tftrain.bench import report, runners, workloads
from tftrain.bench.config import BenchmarkConfig


def run_options(config: BenchmarkConfig, workload: workloads.Workload) -> runners.RunOptions:
    """The per-run options of a config for one workload (its own `k` unless the config sets one)."""
    return runners.RunOptions(
        epochs=config.epochs,
        steps_per_loop=config.steps_per_loop or workload.steps_per_loop,
        eager_steps=config.eager_steps or None,
        checkpoint_every_steps=config.checkpoint_every_steps,
    )


def model_options(config: BenchmarkConfig, workload: workloads.Workload) -> dict[str, Any]:
    """Keywords for a workload's `build_model` under a config."""
    return {"width_multiplier": config.simclr_width} if workload.name == "simclr" else {}


def sizes(config: BenchmarkConfig, workload: workloads.Workload) -> tuple[int, int]:
    """`(num_train, num_val)` of a workload under a config."""
    num_train, num_val = workload.sizes(config.quick)
    return config.num_train or num_train, config.num_val or num_val


def environment() -> dict[str, Any]:
    """The machine and library versions, for the report."""
    return {
        "load_average_1min": _load_average(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "devices": [device.device_type for device in tf.config.list_physical_devices()],
    }


def rotated(names: tuple[str, ...] | list[str], repeat: int) -> list[str]:
    """The run order of one repetition: `names` rotated left by `repeat`.

    Args:
        names: The variants in their canonical order.
        repeat: The repetition's index.

    Returns:
        The names in the order to run them.
    """
    names = list(names)
    if not names:
        return names
    shift = repeat % len(names)
    return names[shift:] + names[:shift]


def _steal_seconds() -> float | None:
    """CPU time the hypervisor gave to others (all CPUs, `steal` in /proc/stat), if known."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = stat.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def _run_record(repeat: int, result: runners.RunResult) -> dict[str, Any]:
    steady_epochs = result.epoch_s[1:]
    steady_epoch_s = statistics.median(steady_epochs) if steady_epochs else None
    steady_cpu = result.epoch_cpu_s[1:]
    steady_epoch_cpu_s = statistics.median(steady_cpu) if steady_cpu else None
    return {
        "repeat": repeat,
        "total_s": result.total_s,
        "epoch_s": list(result.epoch_s),
        "first_epoch_s": result.epoch_s[0] if result.epoch_s else None,
        "steady_epoch_s": steady_epoch_s,
        "steady_step_s": None if steady_epoch_s is None else steady_epoch_s / result.steps_per_epoch,
        "epoch_cpu_s": list(result.epoch_cpu_s),
        "steady_cpu_step_s": None
        if steady_epoch_cpu_s is None
        else steady_epoch_cpu_s / result.steps_per_epoch,
        "steps_per_epoch": result.steps_per_epoch,
        "final_loss": result.final_loss,
        "timing": result.timing,
        "notes": result.notes,
    }


def run_benchmark(config: BenchmarkConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Runs the benchmark.

    For each workload the data and initial weights are built once; then
    `for repeat in range(repeats): for variant in variants: run`, so slow
    drifts of the machine spread over all variants; each repetition starts
    one variant further down the list (`rotated`), so no variant always runs
    first (the cyclic order, and so each variant's neighbours, stay the same).

    Args:
        config: What to run.
        progress: Called with one line per run (and per workload); None is silent.

    Returns:
        A JSON-serializable dict: `config`, `environment` and `workloads`
        (per workload: sizes, and per variant its runs, summary and ratios,
        plus the performance targets); see `report`.
    """
    say = progress or (lambda line: None)
    results: dict[str, Any] = {
        "config": {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in dataclasses.asdict(config).items()
        },
        "environment": environment(),
        "workloads": {},
    }
    for name in config.workloads:
        workload = workloads.WORKLOADS[name]
        options = run_options(config, workload)
        num_train, num_val = sizes(config, workload)
        say(f"[{name}] preparing {num_train:,} train / {num_val:,} validation synthetic examples")
        data = workloads.prepare(
            workload,
            num_train,
            num_val,
            batch_size=config.batch_size,
            seed=config.seed,
            autotune=config.autotune,
            shuffle_buffer=config.shuffle_buffer,
            model_options=model_options(config, workload),
        )
        variant_results: dict[str, dict[str, Any]] = {}
        runnable = []
        for variant_name in config.variants_for(name):
            variant = runners.VARIANTS[variant_name]
            steps = runners.eager_steps_per_epoch(data, options) if variant.eager else data.steps_per_epoch
            skipped = variant.unavailable()
            variant_results[variant_name] = {
                "description": variant.description,
                "eager": variant.eager,
                "steps_per_epoch": steps,
                "runs": [],
                "validation": None,
                "skipped": skipped,
            }
            if skipped:
                say(f"[{name}] skipping {variant_name}: {skipped}")
            else:
                runnable.append(variant_name)
        for repeat in range(config.repeats):
            for variant_name in rotated(runnable, repeat):
                variant = runners.VARIANTS[variant_name]
                steal_before = _steal_seconds()
                result = variant.run(data, options)
                record = _run_record(repeat, result)
                steal_after = _steal_seconds()
                if steal_before is not None and steal_after is not None:
                    record["steal_s"] = steal_after - steal_before
                variant_results[variant_name]["runs"].append(record)
                if config.validate and repeat == 0 and result.model is not None and workload.evaluate:
                    variant_results[variant_name]["validation"] = workload.evaluate(result.model, data.val)
                say(_progress_line(name, repeat, config.repeats, variant_name, record))
        workload_result = {
            "name": name,
            "description": workload.description,
            "num_train": num_train,
            "num_val": num_val,
            "data": workload.data_description
            + (
                f"; reshuffled each pass through a {config.shuffle_buffer:,}-example buffer, no cache"
                if config.shuffle_buffer
                else "; batched and cached"
            ),
            "batch_size": data.batch_size,
            "steps_per_loop": options.steps_per_loop,
            "steps_per_epoch": data.steps_per_epoch,
            "num_params": data.num_params(),
            "variants": variant_results,
        }
        if "graph" in runnable and name in report.TIMING_HOOK_WORKLOADS:
            workload_result["timing_hook_s"] = runners.timing_hook_seconds()
        workload_result["load_average_1min_after"] = _load_average()
        report.add_summaries(workload_result)
        results["workloads"][name] = workload_result
    return results


def _progress_line(workload: str, repeat: int, repeats: int, variant: str, record: dict[str, Any]) -> str:
    epochs = ", ".join(f"{seconds:.2f}" for seconds in record["epoch_s"])
    step = record["steady_step_s"]
    step_text = "n/a" if step is None else f"{step * 1e3:.3f} ms/step"
    return (
        f"[{workload}] repeat {repeat + 1}/{repeats} {variant:<18} {record['steps_per_epoch']} steps/epoch, "
        f"epochs [{epochs}] s, total {record['total_s']:.2f} s, steady {step_text}"
        + (f", steal {record['steal_s']:.2f} s" if "steal_s" in record else "")
    )
