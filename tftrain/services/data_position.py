"""The data position's mode, recorded with every checkpoint (a resume must read the position the same way)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tftrain.services.protocol import RunState, Service


class DataCheckpointService(Service):
    """Records, with every checkpoint, how it holds the data position (a resume must read it the same way).

    Args:
        mode: `"symbolic"`, `"position"` or `"full"`.
        examples_in_pass: For array inputs: batches read in the pass -> examples
            read (`EpochPlan.examples_in_pass`), saved too, so a resume with
            another batch size goes on at the next unread example. None: the
            position is a batch count alone.
    """

    name = "data"

    def __init__(self, mode: str, examples_in_pass: Callable[[int], int | None] | None = None):
        self.mode = mode
        self._examples_in_pass = examples_in_pass
        self._examples: int | None = None

    def after_call(self, run: RunState, result: Any) -> None:
        self._note_position(run)

    def end_epoch(self, run: RunState, logs: dict[str, Any]) -> None:
        self._note_position(run)  # before the checkpoint service saves (it runs after this one)

    def _note_position(self, run: RunState) -> None:
        if self._examples_in_pass is not None:
            _, batches = run.data_position()
            self._examples = self._examples_in_pass(batches)

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"checkpoint": self.mode}
        if self._examples is not None:
            state["examples_in_pass"] = self._examples
        return state
