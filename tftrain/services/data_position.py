"""The data position's mode, recorded with every checkpoint (a resume must read the position the same way)."""

from __future__ import annotations

from typing import Any

from tftrain.services.protocol import Service


class DataCheckpointService(Service):
    """Records, with every checkpoint, how it holds the data position (a resume must read it the same way).

    Args:
        mode: `"symbolic"`, `"position"` or `"full"`.
    """

    name = "data"

    def __init__(self, mode: str):
        self.mode = mode

    def state_dict(self) -> dict[str, Any]:
        return {"checkpoint": self.mode}
