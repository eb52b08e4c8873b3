"""The writer lock as a service: held while a run lasts, its heartbeat refreshed after host calls."""

from __future__ import annotations

from typing import Any

from tftrain.checkpoint.writer_lock import WriterLock
from tftrain.services.protocol import RunState, Service


class WriterLockService(Service):
    """Keeps a run's `WriterLock` live (a heartbeat after host calls) and releases it at `close`.

    Args:
        lock: The lock, already held (`WriterLock(model_dir)`).
    """

    name = "writer_lock"

    def __init__(self, lock: WriterLock):
        self.lock = lock

    def after_call(self, run: RunState, result: Any) -> None:
        self.lock.refresh()

    def close(self) -> None:
        self.lock.close()
