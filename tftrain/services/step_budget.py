"""The step budget: a host call never runs past `fit(total_steps=...)`."""

from __future__ import annotations

from tftrain.services.protocol import Service


class StepBudget(Service):
    """Ends host calls at a total number of training steps (the fit loop stops there)."""

    name = "step_budget"

    def __init__(self, total_steps: int):
        self.total_steps = total_steps

    def next_stop(self, step: int) -> int | None:
        return self.total_steps if step < self.total_steps else None
