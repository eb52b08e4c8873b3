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


def test_finetuning_starts_from_the_pretrained_encoder_and_projection(pretrained, monkeypatch, capsys):
    checkpoints, saved = pretrained
    at_start = {}
    fit = tftrain.Trainer.fit

    def recording_fit(self, *args, **kwargs):
        head = self.model.projection_head
        below = values(head.proj_dense_0) + values(head.batch_normalization_proj_0)
        at_start.update(encoder=values(self.model.encoder), below=below)
        at_start.update(above=values(head.proj_dense_1), probe=values(self.model.supervised_head))
        return fit(self, *args, **kwargs)

    monkeypatch.setattr(tftrain.Trainer, "fit", recording_fit)
    config = experiment.Config(
        **TINY,
        mode="train",
        train_mode="finetune",
        train_steps=1,
        ft_proj_selector=1,
        checkpoint=str(checkpoints),
    )
    results = experiment.run(config)
    assert results["global_step"] == 1
    for got, want in zip(at_start["encoder"], values(saved.encoder), strict=True):
        np.testing.assert_array_equal(got, want)  # every weight, batch norm statistics too
    below = values(saved.projection_head.proj_dense_0) + values(
        saved.projection_head.batch_normalization_proj_0
    )
    for got, want in zip(at_start["below"], below, strict=True):
        np.testing.assert_array_equal(got, want)
    # Above the probe's input, and the probe itself, start fresh.
    assert not np.array_equal(at_start["above"][0], values(saved.projection_head.proj_dense_1)[0])
    assert not np.array_equal(at_start["probe"][0], values(saved.supervised_head)[0])
    printed = capsys.readouterr().out
    assert f"Warm start from {checkpoints}/ckpt-2: loaded" in printed
    assert results["warm_start"]["loaded"] == len(saved.encoder.weights) + len(below)
    assert "model/encoder" in printed and "projection_head/proj_dense_0" in printed


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
        match=r"(?s)--checkpoint=.* cannot initialise this model: .*has shape \(3, 3, 3, 4\) in the checkpoint but \(3, 3, 3, 8\)",
    ):
        experiment.run(config)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            dict(train_mode="finetune", checkpoint="/nonexistent/ckpt-3"),
            "--checkpoint=/nonexistent/ckpt-3 does not exist",
        ),
        (dict(checkpoint="/nonexistent"), "does not fine-tune. Expected --train_mode=finetune"),
    ],
)
def test_bad_checkpoint_flags_are_refused_before_any_data(overrides, message):
    with pytest.raises(ValueError, match=message):
        experiment.Config(**{**TINY, **overrides})
