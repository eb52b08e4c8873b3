"""The NaN guard and the checkpoint services once a step's loss was not finite (a fit with `TerminateOnNaN`).

The runs themselves, against `model.fit`, are in tests/test_trainer_terminate_on_nan.py.
"""

import types
import warnings

import numpy as np
import pytest
import tensorflow as tf

from tftrain import checkpoint as checkpoint_lib
from tftrain.engine.calls import LoopResult
from tftrain.errors import NonFiniteLossError
from tftrain.options import NonFinitePolicy
from tftrain.services.best_checkpoint import BestCheckpointService
from tftrain.services.checkpointing import CheckpointService
from tftrain.services.nan_guard import NonFiniteGuard


def fake_run(nonfinite_step=None, step=4, latest=None):
    """A `RunState` at `step` (epoch 0), whose first non-finite call ended at `nonfinite_step`."""
    progress = checkpoint_lib.Progress()
    progress.global_step = progress.step_in_epoch = step
    return types.SimpleNamespace(
        progress=progress,
        nonfinite_step=nonfinite_step,
        epoch_ending=False,
        settle=lambda: None,
        latest_checkpoint=lambda: latest,
        service_states=dict,
        data_position=lambda: (None, step),
    )


NAN_RESULT = LoopResult(1, 4, {"loss": np.float32("nan")}, nonfinite=True)
DECIDING = NonFinitePolicy(callbacks_decide=True)  # a fit whose callbacks hold TerminateOnNaN


def test_the_guard_raises_unless_the_callbacks_decide():
    with pytest.raises(NonFiniteLossError, match=r"step 4\b.*terminate_on_nan=False"):
        NonFiniteGuard(NonFinitePolicy()).results_read(fake_run(), NAN_RESULT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no model_dir: nothing to say, Keras's callback speaks
        NonFiniteGuard(DECIDING).results_read(fake_run(), NAN_RESULT)


def test_stepping_aside_with_checkpoints_it_warns_once():
    guard = NonFiniteGuard(DECIDING, checkpoints=True)
    run = fake_run(latest="dir/ckpt-2")
    with pytest.warns(UserWarning, match=r"step 4\): no checkpoint is written.*ckpt-2.*TerminateOnNaN"):
        guard.results_read(run, NAN_RESULT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        guard.results_read(run, NAN_RESULT)
    three_steps = LoopResult(3, 12, {"loss": np.float32("nan")}, nonfinite=True)
    with pytest.warns(UserWarning, match=r"steps 2 to 4\)"):
        NonFiniteGuard(DECIDING, checkpoints=True).results_read(run, three_steps)


def test_no_checkpoint_is_written_after_a_nonfinite_step(tmp_path):
    model = tf.Module()
    model.v = tf.Variable(1.0)
    state = {"model": model}
    checkpoints = CheckpointService(checkpoint_lib.Checkpointer(str(tmp_path / "c"), state), 2, None)
    best = BestCheckpointService(checkpoint_lib.Checkpointer(str(tmp_path / "b"), state), "loss")

    first = checkpoints.save(fake_run(step=2))
    best.end_epoch(fake_run(step=2), {"loss": 1.0})
    assert first.endswith("ckpt-2") and best.best == 1.0

    bad = fake_run(nonfinite_step=3, step=4)
    assert checkpoints.save(bad, wait=True) == first  # the last good one; nothing written
    checkpoints.after_call(bad, LoopResult(2, None, None))  # a periodic save at step 4
    checkpoints.end_epoch(bad, {"loss": 0.5})
    best.end_epoch(bad, {"loss": 0.5})  # better, but not saved, nor counted as the best
    assert best.best == 1.0
    assert tf.train.get_checkpoint_state(str(tmp_path / "c")).all_model_checkpoint_paths == [first]
    assert tf.train.latest_checkpoint(str(tmp_path / "b")).endswith("ckpt-2")
    checkpoints.close()
    best.close()
