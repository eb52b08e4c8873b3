"""`--mode=eval` as the reference runs it: every checkpoint of a run until its last step, reference keys."""

import json

import pytest
import test_simclr_program  # the tiny sizes, on the path as a sibling test module

import tftrain
from tftrain.examples.simclr import experiment, main

TINY = {**test_simclr_program.TINY, "num_train_examples": 32, "num_eval_examples": 16, "linear_eval": False}
REFERENCE_KEYS = ("eval/label_top_1_accuracy", "eval/label_top_5_accuracy", "eval/regularization_loss")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 4-step pretraining (then its evaluation) that checkpoints every step."""
    model_dir = tmp_path_factory.mktemp("pretrain")
    config = experiment.Config(
        **TINY, mode="train_then_eval", train_steps=4, checkpoint_steps=1, model_dir=str(model_dir)
    )
    return model_dir, experiment.run(config)


def test_train_then_eval_results_carry_the_reference_keys(trained):
    model_dir, results = trained
    with open(model_dir / "result.json") as file:
        written = json.load(file)
    assert written["global_step"] == results["global_step"] == 4
    assert written["eval/label_top_1_accuracy"] == written["label_top_1_accuracy"]
    assert written["eval/label_top_5_accuracy"] == written["label_top_5_accuracy"]
    assert written["eval/regularization_loss"] > 0  # the probe's kernel decay under LARS


def test_eval_mode_evaluates_every_checkpoint_until_the_last_step(trained):
    model_dir, after_training = trained
    config = experiment.Config(
        **TINY, mode="eval", train_steps=4, model_dir=str(model_dir), eval_timeout_s=30
    )
    results = experiment.run(config)
    with open(model_dir / "result.json") as file:
        written = json.load(file)
    assert list(written["eval_results"]) == ["1", "2", "3", "4"]  # every checkpoint, the run's last included
    assert tftrain.evaluation.read_results(str(model_dir)).keys() == {1, 2, 3, 4}
    last = written["eval_results"]["4"]
    assert written["global_step"] == results["global_step"] == 4
    assert written["restored"].endswith("ckpt-4")
    for key in ("label_top_1_accuracy", "label_top_5_accuracy"):
        assert written[f"eval/{key}"] == written[key] == last[key]
        # The last checkpoint holds the trained weights: the same score as right after training.
        assert written[key] == pytest.approx(after_training[key])
    assert written["eval/regularization_loss"] == pytest.approx(after_training["eval/regularization_loss"])
    # Steps 1..3 had other weights: the probe's loss differs from the last step's.
    assert {logs["supervised_loss"] for logs in written["eval_results"].values()} != {last["supervised_loss"]}


def test_eval_mode_without_checkpoints_times_out_clearly(tmp_path):
    argv = [f"--{key}={value}" for key, value in TINY.items()]
    argv += ["--mode=eval", "--train_steps=2", f"--model_dir={tmp_path}", "--eval_timeout_s=0.5"]
    try:
        main.FLAGS(["simclr", *argv])
        with pytest.raises(SystemExit) as stopped:
            main.main(["simclr"])
    finally:
        main.FLAGS.unparse_flags()
    message = str(stopped.value)
    assert f"No new checkpoint in {tmp_path}" in message and "(waiting for step 2)" in message
    assert "holds no checkpoint" in message and "a longer --eval_timeout_s waits longer" in message
    assert not (tmp_path / "result.json").exists()


def test_a_bad_eval_timeout_is_refused_before_any_data():
    with pytest.raises(ValueError, match=r"--eval_timeout_s=0: expected a number of seconds > 0"):
        experiment.Config(**TINY, eval_timeout_s=0)
