"""The profiler window: TensorFlow's profiler over chosen training steps."""

from __future__ import annotations

from typing import Any

from tftrain import summaries
from tftrain.services.protocol import RunState, Service


class ProfilerService(Service):
    """Runs the TensorFlow profiler over a window of training steps (`summaries.ProfileWindow`)."""

    name = "profiler"

    def __init__(self, window: summaries.ProfileWindow):
        self.window = window

    def next_stop(self, step: int) -> int | None:
        edges = [edge for edge in self.window.boundaries if edge > step]
        return min(edges) if edges else None

    def before_call(self, run: RunState) -> None:
        self.window.before_steps(run.progress.global_step)

    def after_call(self, run: RunState, result: Any) -> None:
        self.window.after_steps(run.progress.global_step)

    def close(self) -> None:
        self.window.close()
