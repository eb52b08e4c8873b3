"""Preemption in multi-worker runs: every worker saves at one agreed step, then stops.

A signal reaches one worker, but a checkpoint needs all of them (each holds
replicas of the variables), at the same step. TensorFlow's
`tf.distribute.experimental.PreemptionCheckpointHandler` agrees on that step
through the cluster's coordination service: the signalled worker announces
"save after the next host call", every worker acknowledges, and each saves
when it reaches that call. `MultiWorkerPreemption` feeds the handler from
tftrain's own signal handlers (so any configured signal counts, not SIGTERM
alone), saves through the run's checkpoint service (the chief to
`model_dir/checkpoints`, the others to their scratch directories) and, instead
of exiting the process as TensorFlow does by default, raises
`tftrain.PreemptedError` on every worker.
"""

from __future__ import annotations

import itertools
import os
import signal
import warnings
from typing import Any

import tensorflow as tf

from tftrain.compat import tf_internals
from tftrain.services.checkpointing import CheckpointService
from tftrain.services.preemption import SignalRecorder, preempted_error
from tftrain.services.protocol import RunState, Service

_SIGNAL_KEY = "tftrain_preemption_signal"  # "<worker name> <signal number>" of the first signalled worker
_BARRIER_TIMEOUT_MS = 300_000
_SIGNAL_KEY_TIMEOUT_MS = 10_000
_handlers_created = itertools.count()  # the same on every worker: one per multi-worker fit with model_dir


def multiworker_preemption(
    signals: tuple[int, ...],
    checkpoints: CheckpointService,
    cluster_resolver: Any,
    worker: tuple[bool, str],
) -> MultiWorkerPreemption | None:
    """The preemption service of a multi-worker run, or None (warned) where TensorFlow's handler cannot apply.

    It applies to a cluster of `chief`/`worker` tasks whose processes share a
    coordination service (as `tf.distribute.MultiWorkerMirroredStrategy`
    starts one), except where TensorFlow makes its handler inert (GCP CPU and
    TPU VMs). Elsewhere no signal handler is installed: a signal acts as it
    would without tftrain (SIGTERM ends the process) and a rerun resumes from
    the last periodic or epoch checkpoint.

    Args:
        signals: The signals that mean "preempted".
        checkpoints: The run's checkpoint service.
        cluster_resolver: The strategy's cluster resolver, or None.
        worker: `(is_chief, name)` of this worker (`tftrain.distribute.worker_role`).
    """
    reason = _unsupported(cluster_resolver)
    service = None
    if reason is None:
        service = MultiWorkerPreemption(signals, checkpoints, cluster_resolver, worker)
        if not tf_internals.preemption_handler_coordinates(service.handler):
            service.close()
            service = None
            reason = "TensorFlow's PreemptionCheckpointHandler does not coordinate workers on this platform"
    if reason is not None:
        names = ", ".join(signal.Signals(number).name for number in signals)
        warnings.warn(
            f"Preemption signals ({names}) are not handled in this multi-worker run: {reason}. They act as "
            "without tftrain (SIGTERM ends the process); a rerun resumes from the last checkpoint. Use "
            "MultiWorkerMirroredStrategy on a chief/worker cluster (tftrain.distribute.setup_strategy) "
            "for every worker to checkpoint at one step on preemption.",
            stacklevel=4,
        )
    return service


def _unsupported(cluster_resolver: Any) -> str | None:
    """Why TensorFlow's preemption handler cannot serve this run, or None if it can."""
    if cluster_resolver is None or not cluster_resolver.cluster_spec().jobs:
        return "the strategy has no cluster resolver with a cluster"
    jobs = cluster_resolver.cluster_spec().as_dict()
    if set(jobs) - {"chief", "worker"}:
        return f"the cluster has tasks other than chief and workers ({sorted(jobs)})"
    if not tf_internals.coordination_context().coordination_service:
        return "the workers share no coordination service (MultiWorkerMirroredStrategy starts one)"
    return None


class MultiWorkerPreemption(Service):
    """Stops a multi-worker run on a preemption signal at one step, with a checkpoint from every worker.

    When any worker receives one of `signals`, all workers finish the host
    call in flight and one more (TensorFlow's handler agrees on the step
    through the coordination service), save at that step (the chief's
    checkpoint is the run's), and raise `tftrain.PreemptedError` with the same
    step, the chief's checkpoint and the signal. A notice that arrives during
    an epoch's last host call takes effect after the epoch's end (its
    checkpoint is the one kept). The previous signal handlers are restored and
    the handler's threads stopped at `close`.

    Args:
        signals: The signals that mean "preempted".
        checkpoints: The run's checkpoint service (it writes the last checkpoint).
        cluster_resolver: The strategy's cluster resolver.
        worker: `(is_chief, name)` of this worker, e.g. `(False, "worker-1")`.
    """

    name = "preemption"

    def __init__(
        self,
        signals: tuple[int, ...],
        checkpoints: CheckpointService,
        cluster_resolver: Any,
        worker: tuple[bool, str],
    ):
        self.checkpoints = checkpoints
        self._is_chief, self.worker_name = worker
        self._context = tf_internals.coordination_context()
        self._num_workers = sum(len(tasks) for tasks in cluster_resolver.cluster_spec().as_dict().values())
        self._clear_keys(next(_handlers_created))
        self._saved: str | None = None
        self._stopping = False
        self.signals = SignalRecorder(signals, stacklevel=6)
        # The handler only counts calls to `save_checkpoint_if_preempted`, so it is given a
        # checkpoint of its own that nothing writes (saves go through `save_fn`).
        unused = tf.train.CheckpointManager(
            tf.train.Checkpoint(), os.path.join(checkpoints.directory, "unused"), max_to_keep=1
        )
        config = tf.distribute.experimental.TerminationConfig(
            termination_watcher_fn=self._notice, exit_fn=self._exit, grace_period=0, save_fn=self._save
        )
        try:
            self.handler = tf.distribute.experimental.PreemptionCheckpointHandler(
                cluster_resolver, unused, termination_config=config
            )
        except BaseException:
            self.signals.restore()
            raise

    def _clear_keys(self, number: int) -> None:
        """Deletes an earlier handler's keys once every worker has closed it (all wait for the chief)."""
        self._context.wait_at_barrier(f"tftrain_preemption_{number}_closed", _BARRIER_TIMEOUT_MS)
        if self._is_chief:
            for key in [*tf_internals.preemption_handler_keys(self._num_workers), _SIGNAL_KEY]:
                self._context.delete_config_key_value(key)
        self._context.wait_at_barrier(f"tftrain_preemption_{number}_cleared", _BARRIER_TIMEOUT_MS)

    def _notice(self) -> bool:
        """The handler's watcher (polled from its thread): whether a signal arrived; shares which."""
        if self.signals.received is None:
            return False
        try:
            self._context.set_config_key_value(_SIGNAL_KEY, f"{self.worker_name} {self.signals.received}")
        except tf.errors.AlreadyExistsError:
            pass  # another worker was signalled first; its notice decides
        return True

    def _save(self, run: RunState) -> None:
        # The workers exit next: the save must be on disk. At an epoch end the checkpoint
        # service has just saved this step.
        if run.progress.step_in_epoch == 0:
            path = self.checkpoints.latest
        else:
            path = self.checkpoints.save(run, wait=True)
        # Report the chief's copy (numbered by step as this worker's own).
        self._saved = self.checkpoints.shared_path(path) if path is not None else None

    def _exit(self) -> None:
        self._stopping = True

    @property
    def stopped(self) -> bool:
        """Whether the run stopped on a preemption notice, every worker's checkpoint saved."""
        return self._stopping

    def after_call(self, run: RunState, result: Any) -> None:
        # At an epoch's last step the epoch ends first; its checkpoint is the one kept.
        if not run.epoch_ending:
            self._check(run)

    def end_epoch(self, run: RunState, logs: dict[str, Any]) -> None:
        self._check(run)

    def _check(self, run: RunState) -> None:
        # Every worker calls this at the same points (the handler counts them to agree on a step).
        self.handler.save_checkpoint_if_preempted(run)
        if not self._stopping:
            return
        try:
            who, number = self._context.get_config_key_value(_SIGNAL_KEY, _SIGNAL_KEY_TIMEOUT_MS).split()
            signal_number = int(number)
            cause = f"{signal.Signals(signal_number).name} (sent to {who})"
        except (tf.errors.OpError, ValueError):
            signal_number, cause = self.signals.received, "a preemption notice"
        raise preempted_error(run, signal_number, self._saved, cause)

    def close(self) -> None:
        tf_internals.stop_preemption_handler(self.handler)
        self.signals.restore()
