"""Requeueing a SLURM job after a preemption's checkpoint (`Trainer(slurm_requeue=True)`)."""

from __future__ import annotations

from typing import Any

from tftrain import slurm
from tftrain.services.protocol import Service


class SlurmRequeue(Service):
    """Puts the SLURM job back in the queue once a preempted run has saved and closed (the chief only).

    It is the run's last service, so it acts in `close` after every other
    service has closed (the writer lock released, the files written): SLURM
    stops the job's tasks as soon as it requeues it. `scontrol` is bounded by
    a timeout and its failure said in one line (`tftrain.slurm.requeue`); the
    run's `PreemptedError` goes on either way.

    Args:
        preemption: The run's preemption service (single- or multi-worker); it
            says whether the run stopped on a signal with its checkpoint saved.
    """

    name = "slurm_requeue"

    def __init__(self, preemption: Any):
        self.preemption = preemption
        self.requeued: bool | None = None  # None: not asked (the run did not stop on a signal)

    def close(self) -> None:
        if self.preemption.stopped and self.requeued is None:
            self.requeued = slurm.requeue()
