"""Summaries, ratios, performance targets, the printed table and the JSON file.

Everything here works on the plain dicts that `suite.run_benchmark` returns,
so it can be tested on hand-made numbers. Comparisons use the steady-state
time per training step (the median over repetitions of each run's median
post-warm-up epoch time, divided by its steps per epoch), which keeps
variants that run fewer steps per epoch (the eager ones) comparable.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from typing import Any

# Baselines of the ratio columns: (summary key, variant).
BASELINES = (
    ("x_handwritten", "handwritten"),
    ("x_keras_fit", "keras_fit"),
    ("x_handwritten_eager", "handwritten_eager"),
)
_MEASURES = ("steady_step_s", "steady_cpu_step_s", "steady_epoch_s", "first_epoch_s", "total_s", "steal_s")


@dataclasses.dataclass(frozen=True)
class Target:
    """A performance target: `variant`'s step time relative to `baseline`'s.

    Attributes:
        name: Short identifier.
        description: The target in words.
        variant: The variant measured.
        baseline: The variant it is compared with.
        max_ratio: The largest allowed ratio of steady step times.
        strict: Whether the ratio must be strictly below `max_ratio`.
    """

    name: str
    description: str
    variant: str
    baseline: str
    max_ratio: float
    strict: bool = False

    def met_by(self, ratio: float) -> bool:
        """Whether a ratio meets the target."""
        return ratio < self.max_ratio if self.strict else ratio <= self.max_ratio


# The issue's targets; they are stated for the MLP workload.
TARGETS = (
    Target(
        "graph_vs_handwritten",
        "Trainer steps_per_loop=1 (graph) within 5% of the hand-written tf.function loop",
        "graph",
        "handwritten",
        1.05,
    ),
    Target(
        "graph_loop_vs_keras_fit",
        "Trainer steps_per_loop=k (graph_loop) at most 0.6x keras_fit",
        "graph_loop",
        "keras_fit",
        0.60,
    ),
    Target(
        "eager_vs_handwritten_eager",
        "Trainer eager within 5% of the hand-written eager loop",
        "eager",
        "handwritten_eager",
        1.05,
    ),
    Target(
        "timing_overhead",
        "timing on vs off (graph vs trainer_no_timing) under 2%",
        "graph",
        "trainer_no_timing",
        1.02,
        strict=True,
    ),
)
TARGET_WORKLOAD = "mlp"


def spread(values: list[float | None]) -> dict[str, float | None]:
    """`{"median", "min", "max"}` of the values that are not None (all None if none are)."""
    present = [value for value in values if value is not None]
    if not present:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(present), "min": min(present), "max": max(present)}


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """`numerator / denominator`, or None if either is missing or the denominator is not positive."""
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def summarize_runs(runs: list[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Median and range over repetitions of each measure (`steady_step_s`, ...)."""
    return {measure: spread([run.get(measure) for run in runs]) for measure in _MEASURES}


def _median_step(variants: dict[str, Any], name: str, measure: str = "steady_step_s") -> float | None:
    variant = variants.get(name)
    if variant is None or "summary" not in variant:
        return None
    return variant["summary"].get(measure, {}).get("median")


def _paired_ratios(variants: dict[str, Any], name: str, baseline: str) -> list[float]:
    """Ratios of steady step times within each repetition (neighbouring runs)."""
    by_repeat = {run["repeat"]: run.get("steady_step_s") for run in variants[baseline]["runs"]}
    ratios = []
    for run in variants[name]["runs"]:
        value = ratio(run.get("steady_step_s"), by_repeat.get(run["repeat"]))
        if value is not None:
            ratios.append(value)
    return ratios


def evaluate_targets(variants: dict[str, Any], targets: tuple[Target, ...] = TARGETS) -> list[dict[str, Any]]:
    """Checks each target against measured summaries.

    Args:
        variants: `{name: {"runs": [...], "summary": ...}}` as built by
            `add_summaries` (only `summary.steady_step_s.median` and the runs'
            `repeat`/`steady_step_s` are read).
        targets: The targets.

    Returns:
        One dict per target: its fields, the measured `ratio` (of median wall
        times per step), `ratio_per_repeat` (paired within repetitions),
        `cpu_ratio` (the same ratio of process CPU times, for reference),
        `met` (decided on `ratio`; None when a variant was not run), and
        `conclusive`: whether every per-repeat ratio falls on the same side of
        the target (None with fewer than 2 repetitions). An inconclusive
        result means run-to-run noise is larger than the target's margin.
    """
    evaluated = []
    for target in targets:
        entry: dict[str, Any] = dataclasses.asdict(target)
        value = ratio(_median_step(variants, target.variant), _median_step(variants, target.baseline))
        entry["ratio"] = value
        entry["met"] = None if value is None else target.met_by(value)
        per_repeat = [] if value is None else _paired_ratios(variants, target.variant, target.baseline)
        entry["ratio_per_repeat"] = per_repeat
        # With fewer than 2 repetitions there is no telling noise from a difference.
        entry["conclusive"] = (
            None if len(per_repeat) < 2 else len({target.met_by(paired) for paired in per_repeat}) == 1
        )
        entry["cpu_ratio"] = ratio(
            _median_step(variants, target.variant, "steady_cpu_step_s"),
            _median_step(variants, target.baseline, "steady_cpu_step_s"),
        )
        evaluated.append(entry)
    return evaluated


def add_summaries(workload_result: dict[str, Any]) -> dict[str, Any]:
    """Adds each variant's `summary` (spreads and ratios) and the workload's `targets`.

    Args:
        workload_result: One workload's results with `variants[name]["runs"]`.

    Returns:
        The same dict, updated in place.
    """
    variants = workload_result["variants"]
    for variant in variants.values():
        variant["summary"] = summarize_runs(variant["runs"])
    for variant in variants.values():
        step = variant["summary"]["steady_step_s"]["median"]
        for key, baseline in BASELINES:
            variant["summary"][key] = ratio(step, _median_step(variants, baseline))
    workload_result["targets"] = evaluate_targets(variants)
    return workload_result


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value * scale, spec)


def format_table(workload_result: dict[str, Any], repeats: int, epochs: int) -> str:
    """Renders one workload's results as a text table with ratios and target lines.

    Args:
        workload_result: One workload's results (after `add_summaries`).
        repeats: Repetitions run (for the header).
        epochs: Epochs per run (for the header).

    Returns:
        The table, target lines included.
    """
    result = workload_result
    lines = [
        f"== {result['name']}: {result['description']}",
        f"   {result['num_train']:,} train examples (synthetic, in memory; {result['num_val']:,} validation "
        f"examples for an untimed check), batch {result['batch_size']}, {result['steps_per_epoch']} "
        f"steps/epoch, {result['num_params']:,} parameters",
        f"   {epochs} epochs per run, training only; 'first ep' includes tracing; 'steady' = median of "
        f"epochs 2..{epochs}; {repeats} alternating repeat(s): median [min-max]; ratios are of median "
        "wall ms/step; 'cpu ms/step' is process CPU time (all threads) per step",
    ]
    header = (
        f"{'variant':<19}{'steps/ep':>9}{'first ep s':>11}{'steady ep s':>12}  {'ms/step median [min-max]':<27}"
        f"{'x handwr':>9}{'x fit':>7}{'x hw_eag':>9}{'cpu ms/step':>12}{'val_loss':>9}"
    )
    lines += [header, "-" * len(header)]
    any_eager = False
    for name, variant in result["variants"].items():
        summary = variant["summary"]
        step = summary["steady_step_s"]
        step_text = f"{_fmt(step['median'], '.3f', 1e3)} [{_fmt(step['min'], '.3f', 1e3)}-{_fmt(step['max'], '.3f', 1e3)}]"
        label = name + ("*" if variant["eager"] else "")
        any_eager = any_eager or variant["eager"]
        validation = variant.get("validation") or {}
        lines.append(
            f"{label:<19}{variant['steps_per_epoch']:>9}{_fmt(summary['first_epoch_s']['median'], '.2f'):>11}"
            f"{_fmt(summary['steady_epoch_s']['median'], '.3f'):>12}  {step_text:<27}"
            f"{_fmt(summary['x_handwritten'], '.2f'):>9}{_fmt(summary['x_keras_fit'], '.2f'):>7}"
            f"{_fmt(summary['x_handwritten_eager'] if variant['eager'] else None, '.2f'):>9}"
            f"{_fmt(summary['steady_cpu_step_s']['median'], '.3f', 1e3):>12}"
            f"{_fmt(validation.get('val_loss'), '.4f'):>9}"
        )
    if any_eager:
        lines.append(
            "* eager variants run fewer steps per epoch (steps/ep); compare them per step (ms/step, x hw_eag)."
        )
    note = (
        "" if result["name"] == TARGET_WORKLOAD else f" (stated for {TARGET_WORKLOAD}; shown for reference)"
    )
    lines.append(f"Targets{note}:")
    for target in result["targets"]:
        lines.append("  " + format_target(target))
    return "\n".join(lines)


def format_target(target: dict[str, Any]) -> str:
    """One line: MET/MISSED/NOT RUN, the target, and the measured ratio."""
    if target["met"] is None:
        return (
            f"[NOT RUN] {target['description']}: needs variants {target['variant']} and {target['baseline']}"
        )
    per_repeat = target["ratio_per_repeat"]
    paired = f"; per repeat {min(per_repeat):.3f}-{max(per_repeat):.3f}" if len(per_repeat) > 1 else ""
    comparison = "<" if target["strict"] else "<="
    status = "MET" if target["met"] else "MISSED"
    if target.get("conclusive") is False:
        status += ", INCONCLUSIVE"
    cpu = "" if target.get("cpu_ratio") is None else f"; CPU-time ratio {target['cpu_ratio']:.3f}"
    line = (
        f"[{status}] {target['description']}: {target['variant']}/{target['baseline']} = "
        f"{target['ratio']:.3f} (target {comparison} {target['max_ratio']:.2f}{paired}{cpu})"
    )
    if target.get("conclusive") is False:
        line += "; the per-repeat ratios fall on both sides of the target: noise exceeds the margin"
    return line


def format_report(results: dict[str, Any]) -> str:
    """Renders all workloads' tables, with the environment on top."""
    env = results["environment"]
    config = results["config"]
    lines = [
        f"tftrain benchmark: TensorFlow {env['tensorflow']}, Keras {env['keras']}, Python {env['python']}, "
        f"{env['cpu_count']} CPU cores, devices {','.join(env['devices'])}"
        + (", quick mode" if config["quick"] else ""),
        f"load average (1 min) at start: {_fmt(env.get('load_average_1min'), '.2f')}",
        "",
    ]
    for workload_result in results["workloads"].values():
        lines.append(format_table(workload_result, config["repeats"], config["epochs"]))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write_json(results: dict[str, Any], path: str) -> None:
    """Writes the results as indented JSON.

    Args:
        results: What `run_benchmark` returned.
        path: The file to write.
    """
    with open(path, "w", encoding="utf-8") as file:
        json.dump(results, file, indent=2, sort_keys=False)
        file.write("\n")
