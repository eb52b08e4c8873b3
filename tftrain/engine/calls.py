"""What one host call returns: its `LoopResult`, read once from a `PendingCall`.

A call is dispatched without waiting for the device (`StepRunner.dispatch`);
its `PendingCall` reads the results once, when asked, so the loop can read
call n after it has dispatched call n+1.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import tensorflow as tf

__all__ = ["LoopResult", "PendingCall", "block_until_ready"]


class LoopResult(NamedTuple):
    """What one call of a `StepRunner` did.

    Attributes:
        steps: Steps that ran (fewer than asked if the data ended or a loss
            was not finite).
        examples: Examples those steps consumed, or None where the batch size
            is not known on the host.
        logs: The last step's outputs (None if no step ran). For a loop
            built with `collect=True`: every step's outputs, as a list of
            chunks (each a structure of tensors whose rows are examples).
        nonfinite: Whether the last step's loss (a `loss` or `*_loss` log) was
            NaN or infinite; the loop stops right after such a step. Only set
            where the runner's `NonFinitePolicy` `stops`; where it `flags`
            (`StepRunner.past_nonfinite`), whether any step of the call had one.
    """

    steps: int
    examples: int | None
    logs: Any
    nonfinite: bool = False


class PendingCall:
    """A dispatched host call, whose device results the host reads once, in `result()`.

    Attributes:
        steps: The steps the call runs if the host knows them without reading
            (a known number of batches was there), else None.
        halted: In-graph flag for the next call's `after` (the call stopped at
            a non-finite loss), or None where the call cannot pass one on.
    """

    def __init__(self, read: Callable[[], LoopResult], steps: int | None, logs: Any, halted: Any = None):
        self._read = read
        self._result: LoopResult | None = None
        self.steps = steps
        self.logs = logs
        self.halted = halted

    @property
    def done(self) -> bool:
        """Whether `result()` has read the call's results."""
        return self._result is not None

    def result(self) -> LoopResult:
        """The call's `LoopResult`: waits for the device the first time (one host read)."""
        if self._result is None:
            self._result = self._read()
        return self._result

    def expected(self) -> LoopResult:
        """What the call does if its loss stays finite, read from nothing (needs `steps`)."""
        return LoopResult(self.steps, None, self.logs)


def block_until_ready(logs: Any) -> None:
    """Waits for a step's outputs, so the clock reads device time too."""
    for value in tf.nest.flatten(logs):
        if hasattr(value, "numpy"):
            value.numpy()
            return
