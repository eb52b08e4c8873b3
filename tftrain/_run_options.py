"""`RunOptions`: what a `Trainer.fit` writes and guards around its steps, checked when made.

A frozen dataclass, validated in `__post_init__` without touching the
filesystem; `tftrain._run_setup.start_run` creates `model_dir` when a run
starts.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from typing import Any

from tftrain import _keras_compat, summaries
from tftrain import checkpoint as checkpoint_lib
from tftrain._validation import check_int

__all__ = ["RunOptions"]


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What a `Trainer.fit` writes and guards around its steps (see `Trainer` for each field).

    Validated on construction, without touching the filesystem: `model_dir`
    must not be a file and must be creatable; it is created when a run starts.

    Raises:
        TypeError, ValueError: a bad value, or an option that needs `model_dir` without it.
    """

    model_dir: str | None = None
    checkpoint_every_steps: int | None = None
    max_to_keep: int = 5
    summary_every_steps: int | None = None
    profile_steps: tuple[int, int] | None = None
    terminate_on_nan: bool = True
    preemption_signals: tuple[int, ...] = (signal.SIGTERM,)
    best_checkpoint_monitor: str | None = None
    best_checkpoint_mode: str = "auto"
    resume_from: str | None = None
    async_checkpoint: bool = False

    def __post_init__(self):
        summaries.check_every_steps(self.checkpoint_every_steps, "checkpoint_every_steps")
        summaries.check_every_steps(self.summary_every_steps, "summary_every_steps")
        check_int("max_to_keep", self.max_to_keep)
        if not isinstance(self.terminate_on_nan, bool):
            raise TypeError(
                "Invalid value for argument `terminate_on_nan`. Received: "
                f"terminate_on_nan={self.terminate_on_nan!r}. Expected True or False."
            )
        object.__setattr__(self, "profile_steps", summaries.check_profile_steps(self.profile_steps))
        object.__setattr__(self, "preemption_signals", _check_signals(self.preemption_signals))
        monitor = self.best_checkpoint_monitor
        if monitor is not None and (not isinstance(monitor, str) or not monitor):
            raise ValueError(
                f"Invalid value for argument `best_checkpoint_monitor`. Received: best_checkpoint_monitor="
                f"{monitor!r}. Expected the name of a log, e.g. 'val_loss', or None."
            )
        if self.best_checkpoint_mode not in ("auto", "min", "max"):
            raise ValueError(
                "Invalid value for argument `best_checkpoint_mode`. Received: best_checkpoint_mode="
                f"{self.best_checkpoint_mode!r}. Expected 'auto', 'min' or 'max'."
            )
        if not isinstance(self.async_checkpoint, bool):
            raise TypeError(
                "Invalid value for argument `async_checkpoint`. Received: "
                f"async_checkpoint={self.async_checkpoint!r}. Expected True or False."
            )
        if self.async_checkpoint and self.model_dir is None:
            raise ValueError(
                "Invalid combination of arguments. Received: async_checkpoint=True with model_dir=None. "
                "Expected a `model_dir` to write checkpoints to (or async_checkpoint=False)."
            )
        if self.async_checkpoint:
            _keras_compat.check_async_checkpoint_support()
        if self.model_dir is None:
            for name in (
                "checkpoint_every_steps",
                "summary_every_steps",
                "profile_steps",
                "best_checkpoint_monitor",
                "resume_from",
            ):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"Invalid combination of arguments. Received: {name}={getattr(self, name)!r} with "
                        "model_dir=None. Expected a `model_dir` to write checkpoints, summaries and "
                        "profiles to."
                    )
        else:
            directory = checkpoint_lib.check_directory_path(self.model_dir, "model_dir")
            object.__setattr__(self, "model_dir", directory)
        if self.resume_from is not None:
            if not isinstance(self.resume_from, (str, os.PathLike)) or not str(self.resume_from):
                raise ValueError(
                    f"Invalid value for argument `resume_from`. Received: resume_from={self.resume_from!r}. "
                    "Expected a checkpoint path (e.g. 'run1/checkpoints/ckpt-3000') or a directory of "
                    "checkpoints."
                )
            object.__setattr__(self, "resume_from", os.fspath(self.resume_from))


def _check_signals(value: Any) -> tuple[int, ...]:
    """`preemption_signals` as a tuple of signal numbers (names like "SIGUSR1" accepted)."""
    if value is None:
        return ()
    items = (value,) if isinstance(value, (str, int)) else tuple(value)
    numbers = []
    for item in items:
        try:
            numbers.append(int(signal.Signals[item] if isinstance(item, str) else signal.Signals(item)))
        except (KeyError, ValueError, TypeError):
            valid = ", ".join(
                sorted(s.name for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2))
            )
            raise ValueError(
                f"Invalid value for argument `preemption_signals`. Received: preemption_signals={value!r}. "
                f"Expected signals (numbers or names such as {valid}), or () to keep the default handlers."
            ) from None
    return tuple(numbers)
