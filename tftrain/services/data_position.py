"""The data position's mode, recorded with every checkpoint (a resume must read the position the same way)."""

from __future__ import annotations

from typing import Any

from tftrain.fit_inputs.epoch_order import ArrayPosition
from tftrain.services.protocol import Service


class DataCheckpointService(Service):
    """Records, with every checkpoint, how it holds the data position (a resume must read it the same way).

    Args:
        mode: `"symbolic"`, `"position"` or `"full"`.
        position: For array inputs, their position: where the current pass's
            iterator started (`ArrayPosition.offset`, not (0, 0) after a
            resume in another batch size) is saved too, so a resume finds
            the examples read from the batches read. None: the position is
            a batch count alone.
    """

    name = "data"

    def __init__(self, mode: str, position: ArrayPosition | None = None):
        self.mode = mode
        self.position = position

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"checkpoint": self.mode}
        if self.position is not None:
            state["pass_offset"] = list(self.position.offset)
        return state
