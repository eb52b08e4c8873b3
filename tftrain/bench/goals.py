"""The performance goals and how each is decided from interleaved segments (no TensorFlow).

Everything works on the plain dicts that `suite.run_benchmark` builds, so it
can be tested on hand-made numbers. A variant's measured rounds are its
segments after the warmup ones; round `i` of two variants ran seconds apart,
so their per-step times are paired (see `stats`).
"""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

from tftrain.bench import stats


@dataclasses.dataclass(frozen=True)
class Target:
    """A goal on the ratio of `variant`'s step time to `baseline`'s.

    Attributes:
        name: Short identifier.
        description: The goal in words.
        variant: The variant measured.
        baseline: The variant it is compared with (for `best_of`, a label).
        max_ratio: The largest allowed ratio; None for a ratio that is only
            reported.
        strict: The ratio must be strictly below `max_ratio`.
        best_of: Compare with the fastest of these variants (by median step
            time; the one chosen is recorded) instead of `baseline`.
    """

    name: str
    description: str
    variant: str
    baseline: str
    max_ratio: float | None
    strict: bool = False
    best_of: tuple[str, ...] = ()


AUTO_REFERENCES = ("graph_loop_k1", "graph_loop_k5", "graph_loop_k20", "graph_loop_k100")
_K_STEP_GOALS = (
    Target(
        "graph_loop_vs_keras_fit_spe",
        "Trainer steps_per_loop=k no slower than keras fit at steps_per_execution=k",
        "graph_loop",
        "keras_fit_spe",
        1.00,
    ),
    Target(
        "graph_loop_vs_handwritten_loop",
        "Trainer steps_per_loop=k within 5% of the hand-written k-steps-per-call loop",
        "graph_loop",
        "handwritten_loop",
        1.05,
    ),
    Target(
        "graph_vs_handwritten",
        "Trainer graph (one step per call, NaN guard and timing on) within 5% of the hand-written loop",
        "graph",
        "handwritten",
        1.05,
    ),
    Target(
        "xla_vs_handwritten_xla",
        "Trainer XLA (one step per call, NaN guard and timing on) within 5% of the hand-written XLA loop",
        "xla",
        "handwritten_xla",
        1.05,
    ),
)
AUTO_GOAL = Target(
    "auto_vs_best_fixed_k",
    'steps_per_loop="auto" (the default Trainer) within 5% of the best fixed k in {1, 5, 20, 100}',
    "default",
    "best graph_loop_k*",
    1.05,
    best_of=AUTO_REFERENCES,
)
CHECKPOINT_RATIO = Target(
    "graph_checkpoint_vs_graph",
    "what the saves inside segments cost (reported)",
    "graph_checkpoint",
    "graph",
    None,
)
CHECKPOINT_SAVE_LIMIT_S = 0.050
"""The goal for one checkpoint save of the MLP: at most 50 ms (median)."""

TARGETS: dict[str, tuple[Target, ...]] = {
    "mlp": (
        *_K_STEP_GOALS,
        AUTO_GOAL,
        Target(
            "default_vs_keras_fit",
            'the default Trainer (steps_per_loop="auto") at most 0.5x default keras fit',
            "default",
            "keras_fit",
            0.50,
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
        Target(
            "graph_loop_vs_data_only",
            "Trainer steps_per_loop=k at most 1.3x the bare input pipeline",
            "graph_loop",
            "data_only",
            1.30,
        ),
        Target(
            "timing_overhead",
            "timing on vs off (graph vs trainer_no_timing) under 2%",
            "graph",
            "trainer_no_timing",
            1.02,
            strict=True,
        ),
        CHECKPOINT_RATIO,
    ),
    "cnn": (
        *_K_STEP_GOALS,
        AUTO_GOAL,
        Target(
            "default_vs_keras_fit",
            'the default Trainer (steps_per_loop="auto") no slower than default keras fit',
            "default",
            "keras_fit",
            1.00,
        ),
        Target("graph_vs_keras_fit", "Trainer (graph) no slower than keras fit", "graph", "keras_fit", 1.00),
        CHECKPOINT_RATIO,
    ),
    "linear": (AUTO_GOAL,),
    "simclr": (
        Target(
            "graph_vs_keras_fit",
            "SimCLR step: Trainer no slower than keras fit at k = 1",
            "graph",
            "keras_fit",
            1.00,
        ),
    ),
}
# Workloads whose goals include the checkpoint save time and the directly measured timing-hook cost.
CHECKPOINT_GOAL_WORKLOADS = ("mlp",)
TIMING_HOOK_WORKLOADS = ("mlp",)


def per_step(variant: dict[str, Any], measure: str = "wall_s") -> list[float]:
    """A variant's per-step times of its measured rounds (warmup segments left out)."""
    steps = variant["steps_per_segment"]
    return [segment[measure] / steps for segment in variant.get("segments", []) if not segment["warmup"]]


def median_step(variants: dict[str, Any], name: str, measure: str = "wall_s") -> float | None:
    """The median per-step time of a variant over its rounds, or None when it did not run."""
    variant = variants.get(name)
    times = per_step(variant, measure) if variant else []
    return statistics.median(times) if times else None


def paired_interval(
    variants: dict[str, Any], name: str, baseline: str, measure: str = "wall_s", confidence: float = 0.95
) -> stats.Interval | None:
    """The ratio of `name`'s to `baseline`'s per-step times over their shared rounds, with its interval."""
    if name not in variants or baseline not in variants:
        return None
    a, b = per_step(variants[name], measure), per_step(variants[baseline], measure)
    count = min(len(a), len(b))
    return stats.ratio_interval(a[:count], b[:count], confidence) if count else None


def _entry(target: Target, verdict: str, wall: stats.Interval | None, **extra: Any) -> dict[str, Any]:
    entry = dataclasses.asdict(target)
    entry.update(verdict=verdict, wall=None if wall is None else wall.to_dict(), **extra)
    return entry


def evaluate_target(variants: dict[str, Any], target: Target, confidence: float = 0.95) -> dict[str, Any]:
    """Decides one ratio goal from the measured rounds.

    Returns:
        The target's fields plus `verdict` (`stats.verdict` of the wall-time
        interval), `wall` and `cpu` (intervals as dicts, or None), and
        `baseline` resolved for a `best_of` target.
    """
    baseline = target.baseline
    if target.best_of:
        measured = [(median_step(variants, name), name) for name in target.best_of]
        measured = [pair for pair in measured if pair[0] is not None]
        baseline = min(measured)[1] if measured else baseline
    wall = paired_interval(variants, target.variant, baseline, "wall_s", confidence)
    cpu = paired_interval(variants, target.variant, baseline, "cpu_s", confidence)
    entry = _entry(target, stats.verdict(wall, target.max_ratio, target.strict), wall)
    entry.update(baseline=baseline, cpu=None if cpu is None else cpu.to_dict())
    return entry


def checkpoint_save_target(variants: dict[str, Any], confidence: float = 0.95) -> dict[str, Any]:
    """The save-time goal from `graph_checkpoint`'s saves between segments.

    The Trainer saves at each epoch's end, which falls between two segments;
    the lane measures that gap (`gap_s`). Each gap is one save plus the
    epoch-end bookkeeping, so it bounds the save from above; `graph`'s gaps
    (the same bookkeeping, no save) are reported beside it.
    """
    target = Target(
        "checkpoint_save",
        f"a checkpoint save at most {CHECKPOINT_SAVE_LIMIT_S * 1e3:.0f} ms (median of the saves between segments)",
        "graph_checkpoint",
        "-",
        CHECKPOINT_SAVE_LIMIT_S,
    )
    variant = variants.get("graph_checkpoint")
    gaps = [
        segment["gap_s"]
        for segment in (variant or {}).get("segments", [])
        if segment.get("gap_s") is not None
    ]
    interval = stats.median_interval(gaps, confidence) if gaps else None
    graph_gaps = [
        segment["gap_s"] for segment in variants.get("graph", {}).get("segments", []) if segment.get("gap_s")
    ]
    timing = (variant or {}).get("timing") or {}
    return _entry(
        target,
        stats.verdict(interval, CHECKPOINT_SAVE_LIMIT_S),
        interval,
        cpu=None,
        baseline_gap_median_s=statistics.median(graph_gaps) if graph_gaps else None,
        trainer_save_median_s=timing.get("checkpoint_save_median_s"),
        trainer_saves=timing.get("checkpoint_saves"),
    )


TIMING_HOOK_TARGET = Target(
    "timing_hooks_direct",
    "timing hooks under 2%, measured directly (their work per host call over the graph step without it)",
    "graph",
    "graph - timing hooks",
    1.02,
    strict=True,
)


def timing_hook_target(hook_s: float, graph_steps_s: list[float], confidence: float = 0.95) -> dict[str, Any]:
    """The timing goal from the hooks' directly measured cost: `graph / (graph - hooks)` per round.

    Args:
        hook_s: Seconds the timing adds per host call (`runners.timing_hook_seconds`).
        graph_steps_s: `graph`'s per-step times of its rounds (one step per call).
        confidence: The interval's confidence level.

    Returns:
        A target entry like `evaluate_target`'s, with `hook_s` added.
    """
    usable = [step for step in graph_steps_s if step > hook_s]
    wall = stats.ratio_interval(usable, [step - hook_s for step in usable], confidence) if usable else None
    return _entry(
        TIMING_HOOK_TARGET,
        stats.verdict(wall, TIMING_HOOK_TARGET.max_ratio, strict=True),
        wall,
        cpu=None,
        hook_s=hook_s,
    )


def evaluate_workload(workload_result: dict[str, Any], confidence: float = 0.95) -> list[dict[str, Any]]:
    """Every goal of one workload (`TARGETS`, plus the checkpoint and timing-hook goals where they apply)."""
    name, variants = workload_result["name"], workload_result["variants"]
    entries = [evaluate_target(variants, target, confidence) for target in TARGETS.get(name, ())]
    if name in CHECKPOINT_GOAL_WORKLOADS:
        entries.append(checkpoint_save_target(variants, confidence))
    hook_s = workload_result.get("timing_hook_s")
    if name in TIMING_HOOK_WORKLOADS and hook_s is not None and "graph" in variants:
        entries.append(timing_hook_target(hook_s, per_step(variants["graph"]), confidence))
    return entries


def agreement(first: dict[str, Any], second: dict[str, Any]) -> list[dict[str, Any]]:
    """Whether two back-to-back runs agree: each run's estimate inside the other's interval.

    Args:
        first: One run's results (`suite.run_benchmark`).
        second: The next run's results.

    Returns:
        One row per goal measured with an interval in both runs: workload,
        goal, both wall intervals and `agree`.
    """
    rows = []
    for workload, result in first["workloads"].items():
        others = {
            target["name"]: target for target in second["workloads"].get(workload, {}).get("targets", [])
        }
        for target in result.get("targets", []):
            a, b = target.get("wall"), (others.get(target["name"]) or {}).get("wall")
            if not a or not b or a["low"] is None or b["low"] is None:
                continue
            first_interval, second_interval = stats.Interval(**a), stats.Interval(**b)
            rows.append(
                {
                    "workload": workload,
                    "goal": target["name"],
                    "first": a,
                    "second": b,
                    "agree": first_interval.contains(b["estimate"])
                    and second_interval.contains(a["estimate"]),
                }
            )
    return rows
