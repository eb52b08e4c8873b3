"""`tftrain.options.NonFinitePolicy`: what a loss blow-up does, from the Trainer's options and a fit call's callbacks."""

import keras
import numpy as np
import pytest
from helpers import make_mlp

import tftrain
from tftrain.loops import preparation
from tftrain.options import UNTESTED, NonFinitePolicy


@pytest.mark.parametrize(
    "policy, stops, flags, loss_limit",
    [
        (NonFinitePolicy(), True, False, None),
        (NonFinitePolicy(on_nonfinite="rollback", loss_spike_threshold=10), True, False, 10),
        (NonFinitePolicy(callbacks_decide=True), False, True, None),
        (UNTESTED, False, False, None),
    ],
    ids=["stop", "rollback", "callbacks decide", "untested"],
)
def test_what_a_training_call_does_at_a_blow_up(policy, stops, flags, loss_limit):
    assert (policy.stops, policy.flags, policy.loss_limit) == (stops, flags, loss_limit)


def test_a_terminate_on_nan_callback_decides_where_losses_are_tested():
    assert NonFinitePolicy().with_callbacks(True) == NonFinitePolicy(callbacks_decide=True)
    assert NonFinitePolicy().with_callbacks(False) == NonFinitePolicy()
    assert UNTESTED.with_callbacks(True) == UNTESTED  # terminate_on_nan=False: the callback acts alone


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(on_nonfinite="retry"), "Expected 'stop'"),
        (dict(loss_spike_threshold=float("nan")), "loss_spike_threshold=nan"),
        (dict(loss_spike_threshold="10"), "Expected a finite number"),
        (dict(max_rollbacks=-1), "max_rollbacks=-1"),
        (dict(rollback_lr_factor=0.0), r"rollback_lr_factor=0.0\. Expected a number in \(0, 1\]"),
        (dict(rollback_lr_factor=2), "rollback_lr_factor=2"),
        (dict(max_rollbacks=5), "max_rollbacks=5 with on_nonfinite='stop'"),
        (
            dict(terminate_on_nan=False, loss_spike_threshold=5.0),
            "terminate_on_nan=False with on_nonfinite='stop', loss_spike_threshold=5.0",
        ),
        (
            dict(on_nonfinite="rollback", callbacks_decide=True),
            "TerminateOnNaN in `callbacks` with on_nonfinite='rollback', loss_spike_threshold=None",
        ),
    ],
)
def test_bad_policies_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        NonFinitePolicy(**kwargs)


def test_rollback_needs_a_model_dir():
    NonFinitePolicy(on_nonfinite="rollback").check(model_dir="runs/a")
    with pytest.raises(ValueError, match="on_nonfinite='rollback' with model_dir=None"):
        NonFinitePolicy(on_nonfinite="rollback").check(model_dir=None)


def test_a_fit_call_resolves_the_policy_and_verbose_once():
    trainer = tftrain.Trainer(make_mlp(), "sgd", "mse", steps_per_loop=2, loss_spike_threshold=100.0)
    assert trainer.nonfinite_policy == NonFinitePolicy(loss_spike_threshold=100.0, keep_every_steps=2)
    x, y = np.zeros((4, 6), np.float32), np.zeros((4, 3), np.float32)
    call = preparation.fit_call(trainer, preparation.FitArguments(x, y, batch_size=2))
    assert call.nonfinite_policy == trainer.nonfinite_policy
    assert (call.verbose, call.verbosity) == ("auto", 1)
    with pytest.raises(ValueError, match="TerminateOnNaN in `callbacks` with on_nonfinite='stop', loss_spike_threshold=100"):
        preparation.fit_call(trainer, preparation.FitArguments(x, y, callbacks=[keras.callbacks.TerminateOnNaN()]))
    trainer = tftrain.Trainer(make_mlp(), "sgd", "mse")
    arguments = preparation.FitArguments(x, y, batch_size=2, verbose=0, callbacks=[keras.callbacks.TerminateOnNaN()])
    call = preparation.fit_call(trainer, arguments)
    assert call.nonfinite_policy.flags and not trainer.nonfinite_policy.flags
    assert (call.verbose, call.verbosity) == (0, 0)
