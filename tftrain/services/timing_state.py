"""The timing state: the step timer's measurements and the trace count, kept across a resume."""

from __future__ import annotations

from typing import Any

from tftrain import timing
from tftrain.services.protocol import Service


class TimingService(Service):
    """Keeps the step timer's measurements (if timing is on) and the trace count across a resume."""

    name = "timing"

    def __init__(self, timer: timing.StepTimer | None, trace_counter: timing.TraceCounter):
        self.timer = timer
        self.trace_counter = trace_counter
        self._traces_before = trace_counter.count

    def trace_count(self) -> int:
        """Traces of the training step in this run (a resumed run adds the checkpointed count)."""
        return self.trace_counter.count - self._traces_before

    def state_dict(self) -> dict[str, Any] | None:
        if self.timer is None:
            return None
        return {"timer": self.timer.state_dict(), "trace_count": self.trace_count()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.timer is None:
            return
        self.timer.load_state_dict(state["timer"])
        self._traces_before = self.trace_counter.count - int(state["trace_count"])
