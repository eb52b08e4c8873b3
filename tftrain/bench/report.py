"""Summaries, ratio columns, the printed tables and the JSON file (no TensorFlow).

Everything here works on the plain dicts that `suite.run_benchmark` returns,
so it can be tested on hand-made numbers. Step times are per step of the
measured rounds (warmup segments left out); ratios are paired by round (the
geometric mean of the per-round ratios, see `stats`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from typing import Any

from tftrain.bench import goals, stats


@dataclasses.dataclass(frozen=True)
class RatioColumn:
    """A table column: each variant's step time over a baseline's, paired by round.

    Attributes:
        key: The summary key (`summary[key]` in the results).
        label: The column header.
        baseline: The variant divided by.
        eager_only: Shown only for eager variants (the others would compare
            a graph step with an eager one).
    """

    key: str
    label: str
    baseline: str
    eager_only: bool = False


_CLASSIFIER_COLUMNS = (
    RatioColumn("x_handwritten", "x handwr", "handwritten"),
    RatioColumn("x_keras_fit", "x fit", "keras_fit"),
    RatioColumn("x_handwritten_eager", "x hw_eag", "handwritten_eager", eager_only=True),
    RatioColumn("x_data_only", "x data", "data_only"),
)
# The ratio columns of each workload's table.
COLUMNS = {
    "mlp": _CLASSIFIER_COLUMNS,
    "cnn": _CLASSIFIER_COLUMNS,
    "linear": (RatioColumn("x_eager", "x eager", "eager"), RatioColumn("x_torch", "x torch", "torch_eager")),
    "simclr": (RatioColumn("x_keras_fit", "x fit", "keras_fit"),),
}


def spread(values: list[float]) -> dict[str, float | None]:
    """`{"median", "min", "max"}` of the values (all None without values)."""
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def summarize(variant: dict[str, Any]) -> dict[str, Any]:
    """A variant's per-step wall and CPU times over its rounds, and its warmup time."""
    warmup = [segment["wall_s"] for segment in variant.get("segments", []) if segment["warmup"]]
    return {
        "step_s": spread(goals.per_step(variant, "wall_s")),
        "cpu_step_s": spread(goals.per_step(variant, "cpu_s")),
        "warmup_s": sum(warmup) if warmup else None,
        "rounds": len(goals.per_step(variant)),
    }


def add_summaries(workload_result: dict[str, Any], confidence: float = 0.95) -> dict[str, Any]:
    """Adds each variant's `summary` (spreads and paired ratio columns), the `targets` and the `floor`.

    Args:
        workload_result: One workload's results: its `name` and
            `variants[name]` with `segments` and `steps_per_segment`.
        confidence: The confidence level of every interval.

    Returns:
        The same dict, updated in place.
    """
    name = workload_result["name"]
    variants = workload_result["variants"]
    for variant_name, variant in variants.items():
        variant["summary"] = summary = summarize(variant)
        for column in COLUMNS.get(name, ()):
            interval = goals.paired_interval(variants, variant_name, column.baseline, confidence=confidence)
            summary[column.key] = None if interval is None else interval.estimate
    workload_result["targets"] = goals.evaluate_workload(workload_result, confidence)
    workload_result["floor"] = loop_floor(variants)
    return workload_result


def loop_floor(variants: dict[str, Any]) -> dict[str, Any] | None:
    """A reference for a k-step loop: reading a batch plus computing a step, apart.

    Not a strict floor: with prefetching, reading the next batch overlaps
    with the current step, so a loop can come in under the sum. `step_only`
    is the step without the loss and accuracy metric updates.

    Returns:
        A dict with `data_plus_step_s` (seconds per step) and `over_floor`
        (each k-step loop that ran, mapped to its median step time over the
        floor), or None unless both `data_only` and `step_only` ran.
    """
    data, step = goals.median_step(variants, "data_only"), goals.median_step(variants, "step_only")
    if data is None or step is None:
        return None
    floor = data + step
    over = {
        name: goals.median_step(variants, name) / floor
        for name in ("handwritten_loop", "graph_loop", "keras_fit_spe")
        if goals.median_step(variants, name) is not None
    }
    return {"data_plus_step_s": floor, "over_floor": over}


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value * scale, spec)


def format_interval(interval: dict[str, Any] | None, spec: str = ".3f", scale: float = 1.0) -> str:
    """`estimate [low-high]`, or the estimate alone without an interval, or `-`."""
    if not interval:
        return "-"
    text = _fmt(interval["estimate"], spec, scale)
    if interval["low"] is not None:
        text += f" [{_fmt(interval['low'], spec, scale)}-{_fmt(interval['high'], spec, scale)}]"
    return text


def format_table(workload_result: dict[str, Any], rounds: int, warmup: int) -> str:
    """Renders one workload's results as a text table with ratios and goal lines."""
    result = workload_result
    columns = COLUMNS.get(result["name"], ())
    validated = any(variant.get("validation") for variant in result["variants"].values())
    check = f"; {result['num_val']:,} validation examples for an untimed check" if validated else ""
    lines = [
        f"== {result['name']}: {result['description']}",
        f"   {result['num_train']:,} train examples ({result.get('data', 'synthetic, in memory')}{check}), "
        f"batch {result['batch_size']}, {result['segment_steps']} steps per segment, k = {result['steps_per_loop']}, "
        f"{result['num_params']:,} weights",
        f"   {warmup} warmup segment(s) (not compared), then {rounds} interleaved rounds, each in a rotated order; "
        "ms/step: median [min-max] over rounds; ratios: geometric mean of per-round ratios of wall time",
    ]
    header = (
        f"{'variant':<19}{'steps/seg':>10}{'warmup s':>9}  {'ms/step median [min-max]':<27}"
        + "".join(f"{column.label:>9}" for column in columns)
        + f"{'cpu ms/step':>12}{'val_loss':>9}"
    )
    lines += [header, "-" * len(header)]
    for name, variant in result["variants"].items():
        label = name + ("*" if variant["eager"] else "")
        if variant.get("skipped"):
            lines.append(f"{label:<19}  skipped: {variant['skipped']}")
            continue
        summary = variant["summary"]
        step = summary["step_s"]
        step_text = f"{_fmt(step['median'], '.3f', 1e3)} [{_fmt(step['min'], '.3f', 1e3)}-{_fmt(step['max'], '.3f', 1e3)}]"
        ratios = "".join(
            f"{_fmt(None if column.eager_only and not variant['eager'] else summary.get(column.key), '.2f'):>9}"
            for column in columns
        )
        chosen = (variant.get("notes") or {}).get("steps_per_loop_chosen")
        lines.append(
            f"{label:<19}{variant['steps_per_segment']:>10}{_fmt(summary['warmup_s'], '.2f'):>9}  {step_text:<27}{ratios}"
            f"{_fmt(summary['cpu_step_s']['median'], '.3f', 1e3):>12}"
            f"{_fmt((variant.get('validation') or {}).get('val_loss'), '.4f'):>9}"
            + (f"  (auto chose k = {chosen})" if chosen else "")
        )
    if any(variant["eager"] for variant in result["variants"].values()):
        lines.append("* eager: shorter segments (--eager_steps); compare per step.")
    floor = result.get("floor")
    if floor:
        over = ", ".join(f"{name} {value:.2f}x" for name, value in floor["over_floor"].items())
        lines.append(
            f"reference for a k-step loop: data_only + step_only = {floor['data_plus_step_s'] * 1e3:.3f} ms/step"
            + (f"; {over} of it" if over else "")
        )
    if result["targets"]:
        lines.append("Goals:")
        lines += ["  " + format_target(target) for target in result["targets"]]
    return "\n".join(lines)


def format_target(target: dict[str, Any]) -> str:
    """One line: the verdict, the goal, the measured wall (and CPU) ratio with its interval."""
    verdict = target["verdict"]
    if verdict == stats.NOT_RUN:
        needs = ", ".join(target["best_of"]) if target.get("best_of") else target["baseline"]
        return f"[NOT RUN] {target['description']}: needs {target['variant']} and {needs}"
    wall = target["wall"]
    confidence = f"{wall['confidence']:.0%}"
    comparison = "<" if target["strict"] else "<="
    goal = "" if target["max_ratio"] is None else f"; goal {comparison} {target['max_ratio']:g}"
    if target["name"] == "checkpoint_save":
        return (
            f"[{verdict.upper()}] {target['description']}: {format_interval(wall, '.1f', 1e3)} ms "
            f"({confidence} interval of the median, {wall['samples']} saves; goal <= {target['max_ratio'] * 1e3:g} ms; "
            f"graph's gap between segments {_fmt(target.get('baseline_gap_median_s'), '.1f', 1e3)} ms; "
            f"the Trainer's own median {_fmt(target.get('trainer_save_median_s'), '.1f', 1e3)} ms over "
            f"{target.get('trainer_saves')} saves)"
        )
    line = (
        f"[{verdict.upper()}] {target['description']}: {target['variant']}/{target['baseline']} = "
        f"{format_interval(wall)} ({confidence}, {wall['samples']} rounds{goal}"
        + (f"; CPU time {format_interval(target['cpu'])}" if target.get("cpu") else "")
        + (f"; {target['hook_s'] * 1e6:.1f} us per host call" if target.get("hook_s") is not None else "")
        + ")"
    )
    if verdict == stats.UNDECIDED:
        line += ": the interval contains the goal; more rounds or a quieter machine can decide it"
    return line


def format_report(results: dict[str, Any]) -> str:
    """Renders all workloads' tables, the goals and, with a second run, the agreement table."""
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
        lines += [format_table(workload_result, config["rounds"], config["warmup_segments"]), ""]
    lines += format_overview(results)
    if results.get("agreement") is not None:
        lines += [""] + format_agreement(results["agreement"])
    return "\n".join(lines).rstrip() + "\n"


def format_overview(results: dict[str, Any]) -> list[str]:
    """The final table: every goal of the run, one line each, with its intervals and verdict."""
    rows = [
        (name, target)
        for name, workload_result in results["workloads"].items()
        for target in workload_result.get("targets", [])
    ]
    if not rows:
        return []
    lines = [
        "== goals (wall-time interval decides; CPU time for reference)",
        f"{'workload':<9}{'ratio':<38}{'goal':>8}  {'wall [interval]':<26}{'cpu [interval]':<26}verdict",
    ]
    for name, target in rows:
        save = target["name"] == "checkpoint_save"
        comparison = "<" if target["strict"] else "<="
        goal = "-" if target["max_ratio"] is None else f"{comparison} {target['max_ratio']:g}"
        if save and target["max_ratio"] is not None:
            goal = f"<= {target['max_ratio'] * 1e3:g}"
        scale = 1e3 if save else 1.0
        label = "save ms (median)" if save else f"{target['variant']}/{target['baseline']}"
        lines.append(
            f"{name:<9}{label:<38}{goal:>8}  {format_interval(target.get('wall'), '.3f', scale):<26}"
            f"{format_interval(target.get('cpu')):<26}{target['verdict'].upper()}"
        )
    return lines


def format_agreement(rows: list[dict[str, Any]]) -> list[str]:
    """The back-to-back table: each goal's wall ratio in both runs and whether they agree."""
    if not rows:
        return ["== back-to-back agreement: no goal had an interval in both runs"]
    agreed = sum(row["agree"] for row in rows)
    lines = [
        f"== back-to-back agreement: {agreed} of {len(rows)} goals agree "
        "(each run's estimate inside the other run's interval)",
        f"{'workload':<9}{'goal':<34}{'first run':<26}{'second run':<26}agree",
    ]
    for row in rows:
        lines.append(
            f"{row['workload']:<9}{row['goal']:<34}{format_interval(row['first']):<26}"
            f"{format_interval(row['second']):<26}{'yes' if row['agree'] else 'NO'}"
        )
    return lines


def write_json(results: dict[str, Any], path: str) -> None:
    """Writes the results as indented JSON.

    Args:
        results: What `run_benchmark` returned.
        path: The file to write.
    """
    with open(path, "w", encoding="utf-8") as file:
        json.dump(results, file, indent=2, sort_keys=False)
        file.write("\n")
