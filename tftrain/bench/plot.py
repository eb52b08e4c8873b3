"""The benchmark's bar chart: one panel per workload, median step time per variant.

matplotlib comes from the `plot` extra (`pip install "tftrain[plot]"`); it is
imported only here, and only when a plot is asked for. The figure is drawn
with matplotlib's object API and the Agg canvas, so no GUI backend or global
pyplot state is touched.
"""

from __future__ import annotations

import math
import textwrap
from typing import IO, Any

PLOT_EXTRA_HINT = 'pip install "tftrain[plot]"  (or: pip install matplotlib)'
PLOT_SUFFIXES = (".png", ".svg", ".pdf")


class PlottingUnavailableError(ImportError):
    """matplotlib, which `--plot` needs, is not installed."""


def check_available() -> None:
    """Fails early if matplotlib cannot be imported.

    Raises:
        PlottingUnavailableError: matplotlib is missing; the message names the
            extra to install.
    """
    try:
        import matplotlib  # noqa: F401
    except ImportError as error:
        raise PlottingUnavailableError(
            f"--plot needs matplotlib, which is not installed ({error}). Install the plot extra: "
            f"{PLOT_EXTRA_HINT}"
        ) from None


def _bars(workload_result: dict[str, Any]) -> list[tuple[str, float, float, float]]:
    """`(label, median, min, max)` in ms per step of every variant that ran."""
    bars = []
    for name, variant in workload_result["variants"].items():
        step = (variant.get("summary") or {}).get("step_s") or {}
        if step.get("median") is None:
            continue
        label = name + ("*" if variant.get("eager") else "")
        bars.append((label, step["median"] * 1e3, step["min"] * 1e3, step["max"] * 1e3))
    return bars


def plot_results(results: dict[str, Any], path: str | IO[bytes], image_format: str | None = None) -> None:
    """Draws a bar chart per workload (median ms per training step, min-max whiskers).

    Args:
        results: What `suite.run_benchmark` returned.
        path: The image file (`.png`, `.svg` or `.pdf`), or a binary file object.
        image_format: `"png"`, `"svg"` or `"pdf"`; None infers it from `path`.

    Raises:
        PlottingUnavailableError: matplotlib is missing.
        ValueError: no workload has a measured variant.
    """
    check_available()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = [(name, _bars(result)) for name, result in results["workloads"].items()]
    panels = [(name, [bar for bar in bars if all(map(math.isfinite, bar[1:]))]) for name, bars in panels]
    panels = [(name, bars) for name, bars in panels if bars]
    if not panels:
        raise ValueError("Nothing to plot: no variant of any workload has a measured step time.")
    heights = [max(2.0, 0.35 * len(bars) + 1.2) for _, bars in panels]
    figure = Figure(figsize=(8.5, sum(heights)), layout="constrained")
    FigureCanvasAgg(figure)
    axes_list = figure.subplots(len(panels), 1, squeeze=False, height_ratios=heights)[:, 0]
    for axes, (name, bars) in zip(axes_list, panels, strict=True):
        labels = [bar[0] for bar in bars]
        medians = [bar[1] for bar in bars]
        lower = [bar[1] - bar[2] for bar in bars]
        upper = [bar[3] - bar[1] for bar in bars]
        positions = list(range(len(bars)))
        axes.barh(positions, medians, xerr=[lower, upper], color="#4C72B0", ecolor="#333333", capsize=3)
        axes.set_yticks(positions, labels)
        axes.invert_yaxis()
        if max(medians) / max(min(medians), 1e-12) > 20:
            axes.set_xscale("log")
        for position, bar in zip(positions, bars, strict=True):
            # The label goes right of the whisker, so neither hides the other.
            text = f" {bar[1]:,.0f}" if bar[1] >= 100 else f" {bar[1]:.3g}"
            axes.annotate(text, (bar[3], position), va="center", fontsize=8, annotation_clip=False)
        description = results["workloads"][name]["description"]
        axes.set_title(
            textwrap.shorten(f"{name}: {description}", 95, placeholder=" ..."), fontsize=9, loc="left"
        )
        axes.set_xlabel("ms per training step (median, min-max over rounds; * = eager)")
        axes.margins(x=0.15)
    environment = results.get("environment", {})
    figure.suptitle(
        f"tftrain benchmark: TensorFlow {environment.get('tensorflow', '?')}, "
        f"{environment.get('cpu_count', '?')} CPU cores",
        fontsize=10,
    )
    figure.savefig(path, dpi=110, format=image_format)
