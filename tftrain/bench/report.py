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


@dataclasses.dataclass(frozen=True)
class RatioColumn:
    """A table column: each variant's median step time over a baseline's.

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


# The performance goals, per workload.
GRAPH_LOOP_VS_KERAS_FIT_SPE = Target(
    "graph_loop_vs_keras_fit_spe",
    "Trainer steps_per_loop=k no slower than keras fit at steps_per_execution=k",
    "graph_loop",
    "keras_fit_spe",
    1.00,
)
"""The reference for every k-step goal (MLP and CNN): keras fit at the same k."""
MLP_TARGETS = (
    Target(
        "graph_vs_handwritten",
        "Trainer graph (steps_per_loop=1) within 5% of the hand-written tf.function loop",
        "graph",
        "handwritten",
        1.05,
    ),
    Target(
        "xla_vs_handwritten_xla",
        "Trainer XLA within 5% of the hand-written XLA loop",
        "xla",
        "handwritten_xla",
        1.05,
    ),
    Target(
        "graph_loop_vs_handwritten_loop",
        "Trainer steps_per_loop=k within 5% of the hand-written k-steps-per-call loop",
        "graph_loop",
        "handwritten_loop",
        1.05,
    ),
    Target(
        "eager_vs_handwritten_eager",
        "Trainer eager within 5% of the hand-written eager loop",
        "eager",
        "handwritten_eager",
        1.05,
    ),
    Target(
        "graph_loop_vs_keras_fit",
        "Trainer steps_per_loop=k at most 0.6x keras_fit",
        "graph_loop",
        "keras_fit",
        0.60,
    ),
    GRAPH_LOOP_VS_KERAS_FIT_SPE,
    Target(
        "graph_loop_vs_data_only",
        "Trainer steps_per_loop=k at most 1.3x the bare input pipeline",
        "graph_loop",
        "data_only",
        1.30,
    ),
    Target(
        "default_vs_keras_fit",
        'the default Trainer (steps_per_loop="auto") at most 0.5x default keras fit',
        "default",
        "keras_fit",
        0.50,
    ),
    Target(
        "default_vs_graph_loop",
        'steps_per_loop="auto" within 5% of the fixed k (graph_loop)',
        "default",
        "graph_loop",
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
TARGETS = {
    "mlp": MLP_TARGETS,
    "cnn": (
        Target("graph_vs_keras_fit", "Trainer (graph) no slower than keras fit", "graph", "keras_fit", 1.00),
        GRAPH_LOOP_VS_KERAS_FIT_SPE,
        Target(
            "default_vs_keras_fit",
            'the default Trainer (steps_per_loop="auto") no slower than default keras fit',
            "default",
            "keras_fit",
            1.00,
        ),
    ),
    "linear": (),
    "simclr": (),
}


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


def evaluate_targets(variants: dict[str, Any], targets: tuple[Target, ...]) -> list[dict[str, Any]]:
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
        workload_result: One workload's results: its `name` and
            `variants[name]["runs"]`.

    Returns:
        The same dict, updated in place.
    """
    name = workload_result["name"]
    variants = workload_result["variants"]
    for variant in variants.values():
        variant["summary"] = summarize_runs(variant["runs"])
    for variant in variants.values():
        step = variant["summary"]["steady_step_s"]["median"]
        for column in COLUMNS.get(name, ()):
            variant["summary"][column.key] = ratio(step, _median_step(variants, column.baseline))
    workload_result["targets"] = evaluate_targets(variants, TARGETS.get(name, ()))
    if name in TIMING_HOOK_WORKLOADS and workload_result.get("timing_hook_s") is not None:
        workload_result["targets"].append(
            timing_hook_target(workload_result["timing_hook_s"], _median_step(variants, "graph"))
        )
    workload_result["floor"] = loop_floor(variants)
    return workload_result


# Workloads whose goals include the directly measured timing-hook cost.
TIMING_HOOK_WORKLOADS = ("mlp",)
TIMING_HOOK_TARGET = Target(
    "timing_hooks_direct",
    "timing hooks under 2%, measured directly (their work per host call over the graph step without it)",
    "graph",
    "graph - timing hooks",
    1.02,
    strict=True,
)


def timing_hook_target(hook_s: float, graph_step_s: float | None) -> dict[str, Any]:
    """The timing goal from the hooks' directly measured cost: `graph / (graph - hooks)`.

    Args:
        hook_s: Seconds the timing adds per host call (`runners.timing_hook_seconds`).
        graph_step_s: Median seconds per step of `graph` (one step per call), or None.

    Returns:
        A target entry like `evaluate_targets`'s, with `hook_s` added.
    """
    entry: dict[str, Any] = dataclasses.asdict(TIMING_HOOK_TARGET)
    value = None if graph_step_s is None else ratio(graph_step_s, graph_step_s - hook_s)
    entry.update(
        ratio=value,
        met=None if value is None else TIMING_HOOK_TARGET.met_by(value),
        ratio_per_repeat=[],
        conclusive=None,
        cpu_ratio=None,
        hook_s=hook_s,
    )
    return entry


def loop_floor(variants: dict[str, Any]) -> dict[str, Any] | None:
    """A reference for a k-step loop: reading a batch plus computing a step, apart.

    Not a strict floor: with prefetching, reading the next batch overlaps
    with the current step, so a loop can come in under the sum. `step_only`
    is the step without the loss and accuracy metric updates.

    Returns:
        A dict with `data_plus_step_s` (seconds per step) and `over_floor`
        (each k-step loop that ran, mapped to its step time over the floor),
        or None unless both `data_only` and `step_only` ran.
    """
    data, step = _median_step(variants, "data_only"), _median_step(variants, "step_only")
    if data is None or step is None:
        return None
    floor = data + step
    over = {
        name: ratio(_median_step(variants, name), floor)
        for name in ("handwritten_loop", "graph_loop", "keras_fit_spe")
        if _median_step(variants, name) is not None
    }
    return {"data_plus_step_s": floor, "over_floor": over}


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
    columns = COLUMNS.get(result["name"], ())
    validated = any(variant.get("validation") for variant in result["variants"].values())
    check = f"; {result['num_val']:,} validation examples for an untimed check" if validated else ""
    looped = [
        name
        for name in result["variants"]
        if name.endswith("_loop") or name in ("keras_fit_spe", "step_only")
    ]
    k_text = f", k = {result['steps_per_loop']} steps per call for {', '.join(looped)}" if looped else ""
    lines = [
        f"== {result['name']}: {result['description']}",
        f"   {result['num_train']:,} train examples ({result.get('data', 'synthetic, in memory')}{check}), "
        f"batch {result['batch_size']}, {result['steps_per_epoch']} steps/epoch{k_text}, "
        f"{result['num_params']:,} weights",
        f"   {epochs} epochs per run, training only; 'first ep' includes tracing; 'steady' = median of "
        f"epochs 2..{epochs}; {repeats} alternating repeat(s): median [min-max]; ratios are of median "
        "wall ms/step; 'cpu ms/step' is process CPU time (all threads) per step",
    ]
    header = (
        f"{'variant':<19}{'steps/ep':>9}{'first ep s':>11}{'steady ep s':>12}  {'ms/step median [min-max]':<27}"
        + "".join(f"{column.label:>9}" for column in columns)
        + f"{'cpu ms/step':>12}{'val_loss':>9}"
    )
    lines += [header, "-" * len(header)]
    any_eager = False
    notes = []
    for name, variant in result["variants"].items():
        label = name + ("*" if variant["eager"] else "")
        if variant.get("skipped"):
            lines.append(f"{label:<19}  skipped: {variant['skipped']}")
            continue
        summary = variant["summary"]
        step = summary["steady_step_s"]
        step_text = f"{_fmt(step['median'], '.3f', 1e3)} [{_fmt(step['min'], '.3f', 1e3)}-{_fmt(step['max'], '.3f', 1e3)}]"
        any_eager = any_eager or variant["eager"]
        validation = variant.get("validation") or {}
        ratios = "".join(
            f"{_fmt(None if column.eager_only and not variant['eager'] else summary.get(column.key), '.2f'):>9}"
            for column in columns
        )
        lines.append(
            f"{label:<19}{variant['steps_per_epoch']:>9}{_fmt(summary['first_epoch_s']['median'], '.2f'):>11}"
            f"{_fmt(summary['steady_epoch_s']['median'], '.3f'):>12}  {step_text:<27}{ratios}"
            f"{_fmt(summary['steady_cpu_step_s']['median'], '.3f', 1e3):>12}"
            f"{_fmt(validation.get('val_loss'), '.4f'):>9}"
        )
        notes += _checkpoint_notes(name, variant)
    if any_eager:
        lines.append(
            "* eager: may run fewer steps per epoch (steps/ep, --eager_steps); compare per step (ms/step)."
        )
    lines += notes
    floor = result.get("floor")
    if floor:
        over = ", ".join(f"{name} {value:.2f}x" for name, value in floor["over_floor"].items())
        lines.append(
            f"reference for a k-step loop: data_only + step_only = {floor['data_plus_step_s'] * 1e3:.3f} ms/step"
            + (f"; {over} of it" if over else "")
        )
    if result["targets"]:
        lines.append("Targets:")
        for target in result["targets"]:
            lines.append("  " + format_target(target))
    return "\n".join(lines)


def _checkpoint_notes(name: str, variant: dict[str, Any]) -> list[str]:
    """A line on the checkpoint saves of a run that saved (`graph_checkpoint`)."""
    saves = [run for run in variant["runs"] if (run.get("timing") or {}).get("checkpoint_saves")]
    if not saves:
        return []
    medians = [run["timing"]["checkpoint_save_median_s"] for run in saves]
    every = saves[0].get("notes", {}).get("checkpoint_every_steps")
    return [
        f"{name}: saved every {every} steps, {saves[0]['timing']['checkpoint_saves']} saves per run; "
        f"median seconds per save {_fmt(statistics.median(medians), '.4f')} "
        f"[{_fmt(min(medians), '.4f')}-{_fmt(max(medians), '.4f')}] over repeats"
    ]


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
    if target.get("hook_s") is not None:
        cpu += f"; {target['hook_s'] * 1e6:.1f} us per host call"
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
    lines += format_overview(results)
    return "\n".join(lines).rstrip() + "\n"


def format_overview(results: dict[str, Any]) -> list[str]:
    """The final table: every performance goal of the run, one line each."""
    rows = [
        (name, target)
        for name, workload_result in results["workloads"].items()
        for target in workload_result.get("targets", [])
    ]
    if not rows:
        return []
    lines = ["== goals", f"{'workload':<9}{'ratio':<33}{'target':>9}{'measured':>10}  result"]
    for name, target in rows:
        comparison = "<" if target["strict"] else "<="
        if target["met"] is None:
            measured, status = "-", "NOT RUN"
        else:
            measured = f"{target['ratio']:.3f}"
            status = "MET" if target["met"] else "MISSED"
            if target.get("conclusive") is False:
                status += " (inconclusive: noise exceeds the margin)"
        lines.append(
            f"{name:<9}{target['variant'] + '/' + target['baseline']:<33}"
            f"{comparison + ' ' + format(target['max_ratio'], '.2f'):>9}{measured:>10}  {status}"
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
