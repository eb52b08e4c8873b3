"""Fine-tuning from a pretraining run's checkpoint (`--checkpoint`), as the reference's run.py."""

import numpy as np
import pytest
import tensorflow as tf
import test_simclr_program  # the tiny sizes, on the path as a sibling test module

import tftrain
from tftrain.examples.simclr import experiment

TINY = {**test_simclr_program.TINY, "num_train_examples": 32, "num_eval_examples": 16, "linear_eval": False}


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A pretraining run of 2 steps, and its model as saved (restored from its checkpoint)."""
    model_dir = tmp_path_factory.mktemp("pretrain")
    experiment.run(experiment.Config(**TINY, mode="train", train_steps=2, model_dir=str(model_dir)))
    model = experiment.build_model(experiment.Config(**TINY), 8)
    latest = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
    tf.train.Checkpoint(model=model).read(latest).expect_partial().assert_existing_objects_matched()
    return model_dir / "checkpoints", model


def values(layer):
    return [w.numpy() for w in layer.weights]


@pytest.mark.parametrize(
    "train_mode, zero_init_logits_layer", [("finetune", False), ("finetune", True), ("pretrain", False)]
)
def test_a_checkpoint_initialises_the_whole_model_as_the_reference(
    pretrained, monkeypatch, capsys, train_mode, zero_init_logits_layer
):
    checkpoints, saved = pretrained
    at_start = {}
    fit = tftrain.Trainer.fit

    def recording_fit(self, *args, **kwargs):
        at_start.update(encoder=values(self.model.encoder), head=values(self.model.projection_head))
        at_start.update(probe=values(self.model.supervised_head))
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(tftrain.Trainer, "fit", recording_fit)
    config = experiment.Config(
        **TINY,
        mode="train",
        train_mode=train_mode,
        train_steps=1,
        ft_proj_selector=1,
        zero_init_logits_layer=zero_init_logits_layer,
        checkpoint=str(checkpoints),
    )
    results = experiment.run(config)
    assert results["global_step"] == 1  # the step (and the optimizer) start fresh
    # As the reference's tf.train.Checkpoint(model=model).restore: the encoder (batch norm statistics
    # too), the whole projection head, above ft_proj_selector as well, and head_supervised.
    for part in ("encoder", "projection_head"):
        got = at_start["encoder" if part == "encoder" else "head"]
        for value, want in zip(got, values(getattr(saved, part)), strict=True):
            np.testing.assert_array_equal(value, want)
    for value, want in zip(at_start["probe"], values(saved.supervised_head), strict=True):
        if zero_init_logits_layer:
            assert not np.any(value)  # zeroed after the restore, as the reference
        else:
            np.testing.assert_array_equal(value, want)
    printed = capsys.readouterr().out
    assert f"Warm start from {checkpoints}/ckpt-2: loaded" in printed
    model_weights = len(saved.encoder.weights) + len(saved.projection_head.weights)
    assert results["warm_start"]["loaded"] >= model_weights + len(saved.supervised_head.weights)


def test_a_checkpoint_of_another_architecture_is_refused_before_training(pretrained, monkeypatch):
    checkpoints, _ = pretrained
    monkeypatch.setattr(tftrain.Trainer, "fit", lambda *a, **k: pytest.fail("trained"))
    config = experiment.Config(
        **{**TINY, "width_multiplier": 0.125},
        mode="train",
        train_mode="finetune",
        checkpoint=str(checkpoints),
    )
    with pytest.raises(
        experiment.FlagValueError,
        match=r"(?s)--checkpoint=.* cannot initialise this model: .*head_supervised/kernel.*has shape \(32, 8\) "
        r"in the checkpoint but \(64, 8\).*\(and \d+ more\)",
    ):
        experiment.run(config)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            dict(train_mode="finetune", checkpoint="/nonexistent/ckpt-3"),
            "--checkpoint=/nonexistent/ckpt-3 does not exist",
        ),
        (
            dict(checkpoint="/nonexistent", mode="eval"),
            "--mode=eval evaluates the checkpoints of --model_dir",
        ),
    ],
)
def test_bad_checkpoint_flags_are_refused_before_any_data(overrides, message):
    with pytest.raises(ValueError, match=message):
        experiment.Config(**{**TINY, **overrides})
