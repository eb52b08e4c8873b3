"""Preemption signals in multi-worker runs: handlers restored, and the fallback where TF's handler cannot apply.

The two-worker run itself (a SIGTERM to one worker, every worker saving at one
step) is in test_trainer_multiworker.py.
"""

import os
import signal

import pytest
import tensorflow as tf

from tftrain import checkpoint as checkpoint_lib
from tftrain.services.checkpointing import CheckpointService
from tftrain.services.multiworker_preemption import multiworker_preemption
from tftrain.services.preemption import SignalRecorder


def test_signal_recorder_records_and_restores_the_previous_handlers():
    seen = []

    def previous(number, frame):
        seen.append(number)

    before = signal.signal(signal.SIGUSR1, previous), signal.getsignal(signal.SIGUSR2)
    try:
        recorder = SignalRecorder((signal.SIGUSR1, signal.SIGUSR2))
        assert signal.getsignal(signal.SIGUSR1) != previous
        os.kill(os.getpid(), signal.SIGUSR2)
        assert recorder.received == signal.SIGUSR2 and not seen  # recorded, the old handler not called
        recorder.restore()
        assert signal.getsignal(signal.SIGUSR1) is previous
        assert signal.getsignal(signal.SIGUSR2) == before[1]
        os.kill(os.getpid(), signal.SIGUSR1)
        assert seen == [signal.SIGUSR1] and recorder.received == signal.SIGUSR2
    finally:
        signal.signal(signal.SIGUSR1, before[0])


def _checkpoints(tmp_path):
    checkpointer = checkpoint_lib.Checkpointer(str(tmp_path), {"v": tf.Variable(1.0)})
    return CheckpointService(checkpointer, None, None)


@pytest.mark.parametrize(
    "cluster, reason",
    [
        (None, "the strategy has no cluster resolver"),
        ({"worker": ["localhost:1", "localhost:2"]}, "share no coordination service"),
        ({"worker": ["localhost:1"], "ps": ["localhost:2"]}, "tasks other than chief and workers"),
    ],
)
def test_where_tf_handler_cannot_apply_it_warns_and_leaves_the_signals_alone(tmp_path, cluster, reason):
    resolver = None
    if cluster is not None:
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(cluster), task_type="worker", task_id=0
        )
    before = signal.getsignal(signal.SIGTERM)
    with pytest.warns(UserWarning, match=f"Preemption signals \\(SIGTERM\\) are not handled.*{reason}"):
        service = multiworker_preemption(
            (signal.SIGTERM,), _checkpoints(tmp_path), resolver, (True, "worker-0")
        )
    assert service is None
    assert signal.getsignal(signal.SIGTERM) == before
