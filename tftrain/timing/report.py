"""`TimingReport`: what one `fit` measured, and its table."""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["TimingReport"]


@dataclasses.dataclass(frozen=True)
class TimingReport:
    """What one `fit` measured.

    Attributes:
        first_step_s: Seconds of the first host call: tracing, compiling and
            running it. With `steps_per_loop=k` that call runs k steps.
        step_time_median_s: Median seconds per training step in steady state
            (host calls after the first one that did not trace).
        step_time_p90_s: 90th percentile of the same.
        examples_per_sec: Examples per second in steady state.
        steps: Training steps run (each step of a k-step loop counts).
        trace_count: How many times the training step function was traced.
        checkpoint_saves: Checkpoints written during the run (Trainer with a
            `model_dir`; 0 otherwise).
        checkpoint_save_median_s: Median seconds one checkpoint save took
            (outside the step times above), or None without saves.
        engine: The engine the training steps ran under, after every
            `"auto"` was resolved (`EngineOptions.ran_name`): e.g. `"graph"`,
            `"xla+loop4"`, `"graph+loop20 (auto)"` (the k that
            `steps_per_loop="auto"` chose), `"eager"`. Under `model.fit`
            (`tftrain.callbacks.Timing`): the engine Keras ran, from the
            model's `run_eagerly`, resolved `jit_compile` and
            `steps_per_execution`. None if unknown.
        flops_per_step: Floating-point operations of one training step (all
            replicas), counted from the traced step
            (`Trainer(count_flops=True)`, `tftrain.engine.flops`); None when
            not asked for or not countable (a warning says why).
        flops_per_sec: `flops_per_step / step_time_median_s`: FLOP/s in
            steady state, or None.
        peak_flops: Peak FLOP/s of all the devices the run used (the
            `Trainer`'s `peak_flops`, or `tftrain.engine.peak_flops`'s table
            for the model's compute dtype), or None if unknown.
        utilization: `flops_per_sec / peak_flops` (model FLOPs utilisation,
            0 to 1), or None.
    """

    first_step_s: float | None = None
    step_time_median_s: float | None = None
    step_time_p90_s: float | None = None
    examples_per_sec: float | None = None
    steps: int = 0
    trace_count: int = 0
    checkpoint_saves: int = 0
    checkpoint_save_median_s: float | None = None
    engine: str | None = None
    flops_per_step: float | None = None
    flops_per_sec: float | None = None
    peak_flops: float | None = None
    utilization: float | None = None

    def with_flops(self, flops_per_step: float | None, peak_flops: float | None) -> TimingReport:
        """This report with the FLOP fields filled from one step's FLOPs and the devices' peak.

        Args:
            flops_per_step: FLOPs of one training step, or None if unknown.
            peak_flops: Peak FLOP/s of the devices the run used, or None.

        Returns:
            A new report: `flops_per_sec` is `flops_per_step` over the median
            step time (None without either), `utilization` is `flops_per_sec`
            over `peak_flops` (None without either).
        """
        per_sec = None
        if flops_per_step is not None and self.step_time_median_s:
            per_sec = flops_per_step / self.step_time_median_s
        return dataclasses.replace(
            self,
            flops_per_step=flops_per_step,
            flops_per_sec=per_sec,
            peak_flops=peak_flops,
            utilization=None if per_sec is None or not peak_flops else per_sec / peak_flops,
        )

    def to_dict(self) -> dict[str, Any]:
        """Returns the report as a plain dict (JSON-serializable)."""
        return dataclasses.asdict(self)

    def summary(self) -> str:
        """Renders the report as a short two-column table.

        The engine first, where known; FLOPs per step, FLOP/s and the
        utilisation after examples/sec, where counted (`count_flops=True`).
        """
        rows = [] if self.engine is None else [("engine", self.engine)]
        rows += [
            ("steps", str(self.steps)),
            ("trace count", str(self.trace_count)),
            ("first step (trace+compile+run)", _format_seconds(self.first_step_s)),
            ("step time median", _format_seconds(self.step_time_median_s)),
            ("step time p90", _format_seconds(self.step_time_p90_s)),
            ("examples/sec", "n/a" if self.examples_per_sec is None else f"{self.examples_per_sec:,.1f}"),
        ]
        if self.flops_per_step is not None:  # asked for and counted (`count_flops=True`)
            rows.append(("FLOPs per step", _format_flops(self.flops_per_step, "FLOP")))
            rows.append(("FLOP/s", _format_flops(self.flops_per_sec, "FLOP/s")))
        if self.utilization is not None:
            rows.append(
                ("utilisation", f"{self.utilization:.1%} of {_format_flops(self.peak_flops, 'FLOP/s')}")
            )
        if self.checkpoint_saves:
            rows.append(
                (
                    f"checkpoint save median ({self.checkpoint_saves} saves)",
                    _format_seconds(self.checkpoint_save_median_s),
                )
            )
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _format_flops(value: float | None, unit: str) -> str:
    """E.g. `_format_flops(1.234e12, "FLOP/s")` -> "1.23 TFLOP/s"."""
    if value is None:
        return "n/a"
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {prefix}{unit}"
    return f"{value:.3g} {unit}"


def _format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "n/a"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"
