"""Validation every N training steps, mid-epoch included (beyond `fit`'s per-epoch validation)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tftrain.services.protocol import EveryNSteps, RunState, Service


class PeriodicValidation(Service):
    """Validates every N training steps; other services hear of it through `Service.validated`.

    Args:
        every_steps: Validate at each multiple of this many global steps.
        validate: Runs one validation (its callback hooks included) and
            returns its logs (without the `val_` prefix).
        history: Where each validation is recorded: `"step"` -> the global
            steps, `"val_<name>"` -> the values (`History.step_history`).
    """

    name = "periodic_validation"

    def __init__(
        self, every_steps: int, validate: Callable[[], dict[str, Any]], history: dict[str, list[Any]]
    ):
        self.when = EveryNSteps(every_steps)
        self.validate = validate
        self.history = history

    def next_stop(self, step: int) -> int | None:
        return self.when.next_stop(step)

    def after_call(self, run: RunState, result: Any) -> None:
        step = run.progress.global_step
        if not self.when.reached(step - result.steps, step):
            return
        logs = self.validate()
        self.history.setdefault("step", []).append(step)
        for key, value in logs.items():
            self.history.setdefault(f"val_{key}", []).append(value)
        run.report_validation(logs)
