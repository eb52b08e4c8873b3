"""The best checkpoint: the state of the best epoch (or validation) by a monitored log."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from tftrain.checkpoint import Checkpointer
from tftrain.services.protocol import RunState, Service


class BestCheckpointService(Service):
    """Keeps the checkpoint of the best epoch (or validation) by a monitored log, apart from the rotating ones.

    At each epoch end, and each validation every N steps, whose logs improve
    on the best `monitor` value so far, the run's state is saved to its own
    directory (one checkpoint, replaced
    only by a better one; never rotated away by the regular checkpoints). The
    best value is saved with the regular checkpoints, so a resumed run goes
    on comparing with it. Nothing is saved (nor counted as best) once a step
    of the run had a non-finite loss (`RunState.nonfinite_step`).

    Args:
        checkpointer: Writes to the best checkpoint's directory (`max_to_keep=1`).
        monitor: The log to watch, e.g. `"val_loss"`.
        mode: `"min"`, `"max"`, or `"auto"` (max for accuracy-like names, else min).
        weights: A block in which the model holds the weights that were
            validated (the EMA averages, `Trainer(ema_decay=...)`): the best
            checkpoint's model weights are those. None: the weights as they are.

    Raises:
        ValueError: (at the first epoch end or validation) `monitor` is not among the logs.
    """

    name = "best_checkpoint"

    def __init__(
        self,
        checkpointer: Checkpointer,
        monitor: str,
        mode: str = "auto",
        *,
        weights: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
    ):
        self.checkpointer = checkpointer
        self.weights = weights or contextlib.nullcontext
        self.monitor = monitor
        if mode == "auto":
            mode = "max" if any(part in monitor for part in ("acc", "auc", "precision", "recall")) else "min"
        self.mode = mode
        self.best: float | None = None

    def end_epoch(self, run: RunState, logs: dict[str, Any]) -> None:
        if self.monitor not in logs:
            if self.monitor.startswith("val_") and not any(key.startswith("val_") for key in logs):
                return  # no validation in this epoch (validation_freq)
            raise self._unknown(sorted(logs), "the epoch's logs")
        self._consider(run, float(logs[self.monitor]))

    def validated(self, run: RunState, logs: dict[str, Any]) -> None:
        names = sorted(f"val_{key}" for key in logs)
        if self.monitor in names:
            self._consider(run, float(logs[self.monitor[len("val_") :]]))
        elif self.monitor.startswith("val_"):
            raise self._unknown(names, "the validation's logs")

    def _unknown(self, names: list[str], where: str) -> ValueError:
        return ValueError(
            f"Invalid value for argument `best_checkpoint_monitor`. Received: "
            f"best_checkpoint_monitor={self.monitor!r}, but {where} are {names}. "
            "Expected one of those names (validation logs need `validation_data`)."
        )

    def _consider(self, run: RunState, value: float) -> None:
        if self.best is not None and not (value < self.best if self.mode == "min" else value > self.best):
            return
        run.settle()  # the checkpoint holds only steps whose loss was checked
        if run.nonfinite_step is not None:  # no checkpoint holds a non-finite step's state
            return
        self.best = value
        progress = run.progress
        with self.weights():
            self.checkpointer.save(progress, None, run.service_states(), number=progress.global_step)

    def state_dict(self) -> dict[str, Any]:
        return {"monitor": self.monitor, "best": self.best}

    def close(self) -> None:
        self.checkpointer.close()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("monitor") == self.monitor:
            self.best = state.get("best")
