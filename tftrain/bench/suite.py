"""The benchmark: every chosen variant of a workload in one process, in interleaved segments."""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tftrain.bench import goals, report, runners, segments, workloads
from tftrain.bench.config import BenchmarkConfig


def run_options(config: BenchmarkConfig, workload: workloads.Workload) -> runners.RunOptions:
    """The per-run options of a config for one workload (its own `k` unless the config sets one)."""
    return runners.RunOptions(
        steps_per_loop=config.steps_per_loop or workload.steps_per_loop,
        checkpoint_every_steps=config.checkpoint_every_steps,
    )


def segment_steps(config: BenchmarkConfig, workload: workloads.Workload) -> int:
    """Steps per segment of a workload's non-eager variants under a config."""
    return config.segment_steps or workload.segment(config.quick)


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


def _segment_records(lane: segments.Lane, warmup: int) -> list[dict[str, Any]]:
    return [
        {"wall_s": segment.wall_s, "cpu_s": segment.cpu_s, "gap_s": segment.gap_s, "warmup": index < warmup}
        for index, segment in enumerate(lane.measured)
    ]


def run_workload(config: BenchmarkConfig, name: str, say: Callable[[str], None]) -> dict[str, Any]:
    """One workload: its variants built once, then interleaved segments, then summaries and goals.

    Args:
        config: What to run.
        name: The workload.
        say: Progress lines.

    Returns:
        The workload's results (see `run_benchmark`).
    """
    workload = workloads.WORKLOADS[name]
    options = run_options(config, workload)
    num_train, num_val = sizes(config, workload)
    steps = segment_steps(config, workload)
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
    lane_runners, lane_steps = {}, {}
    for variant_name in config.variants_for(name):
        variant = runners.VARIANTS[variant_name]
        skipped = variant.unavailable()
        variant_results[variant_name] = {
            "description": variant.description,
            "eager": variant.eager,
            "steps_per_segment": config.eager_steps if variant.eager else steps,
            "segments": [],
            "validation": None,
            "skipped": skipped,
        }
        if skipped:
            say(f"[{name}] skipping {variant_name}: {skipped}")
            continue
        lane_runners[variant_name] = functools.partial(variant.run, data, options)
        lane_steps[variant_name] = variant_results[variant_name]["steps_per_segment"]
    total = config.warmup_segments + config.rounds
    steal_before = _steal_seconds()

    def on_round(index: int, order: list[str]) -> None:
        kind = "warmup" if index < config.warmup_segments else "round"
        say(f"[{name}] segment {index + 1}/{total} ({kind}) done: {' '.join(order)}")

    lanes = segments.interleave(lane_runners, lane_steps, total, on_round=on_round)
    steal_after = _steal_seconds()
    for variant_name, lane in lanes.items():
        outcome = lane.result
        record = variant_results[variant_name]
        record.update(
            segments=_segment_records(lane, config.warmup_segments),
            final_loss=outcome.final_loss,
            timing=outcome.timing,
            notes=outcome.notes,
        )
        if config.validate and outcome.model is not None and workload.evaluate:
            record["validation"] = workload.evaluate(outcome.model, data.val)
    result = {
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
        "segment_steps": steps,
        "steps_per_epoch": data.steps_per_epoch,
        "num_params": data.num_params(),
        "variants": variant_results,
        "steal_s": None if steal_before is None or steal_after is None else steal_after - steal_before,
    }
    if "graph" in lanes and name in goals.TIMING_HOOK_WORKLOADS:
        result["timing_hook_s"] = runners.timing_hook_seconds()
    result["load_average_1min_after"] = _load_average()
    report.add_summaries(result, config.confidence)
    return result


def run_benchmark(config: BenchmarkConfig, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Runs the benchmark; with `config.agreement`, twice, back to back.

    Per workload, every chosen variant is built once in this process (its
    model, traced functions and input iterator) and trains in short
    segments: `config.warmup_segments` segments first (not compared), then
    `config.rounds` rounds in which every variant runs one segment, in an
    order rotated each round (`segments.interleave`). Each goal's ratio is
    paired by round and gets a confidence interval (`goals`, `stats`).

    Args:
        config: What to run.
        progress: Called with one line per round (and per workload); None is silent.

    Returns:
        A JSON-serializable dict: `config`, `environment` and `workloads`
        (per workload: sizes, and per variant its segments, summary and
        ratios, plus its `targets`: goals with intervals and verdicts); with
        `agreement`, also `second_run` (the second run's workloads) and
        `agreement` (`goals.agreement`).
    """
    say = progress or (lambda line: None)
    results: dict[str, Any] = {
        "config": {
            key: list(value) if isinstance(value, tuple) else value
            for key, value in dataclasses.asdict(config).items()
        },
        "environment": environment(),
        "workloads": {name: run_workload(config, name, say) for name in config.workloads},
    }
    if config.agreement:
        say("second run, back to back, for the agreement check")
        second = {"workloads": {name: run_workload(config, name, say) for name in config.workloads}}
        results["second_run"] = second
        results["agreement"] = goals.agreement(results, second)
    return results
