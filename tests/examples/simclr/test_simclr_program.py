"""The SimCLR program end to end, with tiny settings: both loops, result.json, bad flags, kill-and-resume."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tftrain.examples.simclr import config as config_lib
from tftrain.examples.simclr import experiment

# The defaults are the reference's (ImageNet, ResNet-50): start from the demo recipe's model and data
# (what to run, --mode and --linear_eval, each test says).
TINY = {
    k: v for k, v in config_lib.RECIPES["cpu_demo"].values.items() if k not in ("mode", "linear_eval")
} | dict(
    image_size=16,
    num_train_examples=64,
    num_eval_examples=32,
    train_batch_size=16,
    eval_batch_size=16,
    width_multiplier=0.0625,
    proj_out_dim=16,
    verbose=0,
)


@pytest.mark.parametrize("loop", ["trainer", "fit"])
def test_a_tiny_run_writes_result_json(loop, tmp_path):
    config = experiment.Config(
        **TINY, loop=loop, train_steps=4, model_dir=str(tmp_path), mode="train_then_eval", linear_eval=True
    )
    results = experiment.run(config)
    with open(tmp_path / "result.json") as file:
        written = json.load(file)
    assert written["global_step"] == results["global_step"] == 4
    for key in (
        "label_top_1_accuracy",
        "label_top_5_accuracy",
        "linear_eval_top_1",
        "random_encoder_linear_eval_top_1",
    ):
        assert 0.0 <= written[key] <= 1.0, key
    assert written["config"]["loop"] == loop and written["config"]["train_steps"] == 4
    assert written["train_logs"]["contrast_loss"] > 0
    # The reference's training metrics: contrast_entropy, supervised_loss and supervised_acc.
    assert 0 < written["train_logs"]["contrast_entropy"] <= np.log(2 * TINY["train_batch_size"])
    assert written["train_logs"]["supervised_loss"] > 0 and 0 <= written["train_logs"]["supervised_acc"] <= 1
    # As the reference, result_<step>.json beside result.json, and the flags' values in flags.json.
    with open(tmp_path / "result_4.json") as file:
        assert json.load(file) == written
    with open(tmp_path / "flags.json") as file:
        assert json.load(file) == written["config"]
    assert os.listdir(tmp_path / "checkpoints") and os.listdir(tmp_path / "train")


def test_eval_mode_restores_the_trained_encoder(tmp_path):
    trained = experiment.run(
        experiment.Config(**TINY, mode="train_then_eval", train_steps=2, model_dir=str(tmp_path))
    )
    evaluated = experiment.run(
        # The training run's step flags: --mode=eval evaluates until its last step.
        experiment.Config(**TINY, mode="eval", train_steps=2, model_dir=str(tmp_path), linear_eval=False)
    )
    assert evaluated["restored"].startswith(str(tmp_path / "checkpoints" / "ckpt-"))
    assert evaluated["global_step"] == trained["global_step"] == 2
    assert evaluated["label_top_1_accuracy"] == pytest.approx(trained["label_top_1_accuracy"])


def test_finetune_mode_trains_the_probe_end_to_end():
    results = experiment.run(
        experiment.Config(**TINY, train_mode="finetune", train_steps=3, linear_eval=False)
    )
    assert results["global_step"] == 3
    # The reference's finetuning metrics only: no contrastive metric it does not compute.
    assert set(results["train_logs"]) == {"loss", "supervised_loss", "supervised_acc", "weight_decay"}
    assert results["train_logs"]["supervised_loss"] > 0


def test_train_steps_win_over_epochs():
    config = experiment.Config(**{**TINY, "train_steps": 6, "train_epochs": 50})
    assert experiment._steps_plan(config, 64) == (4, 2, 6)  # epochs of 4 steps, the last cut short
    # Without train_steps, as the reference: N * E // B + 1 steps.
    assert experiment._steps_plan(experiment.Config(**{**TINY, "train_epochs": 2}), 64) == (4, 3, 9)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(dataset="imagenet"), "Known datasets: cifar10, .*shapes, synthetic"),
        (dict(use_gpu=True, use_tpu=True), "--use_gpu and --use_tpu=True contradict"),
        (dict(image_size=8), "--image_size=8 is too small"),
        (dict(mode="eval"), "--mode=eval needs --model_dir"),
        (dict(train_batch_size=0), "--train_batch_size=0"),
    ],
)
def test_bad_settings_are_refused_before_any_data(overrides, message):
    with pytest.raises(ValueError, match=message):
        experiment.Config(**{**TINY, **overrides})


def run_program(*flags, timeout=240):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run(
        [sys.executable, "-m", "tftrain.examples.simclr", *flags],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def tiny_flags(**extra):
    values = {**TINY, **extra}
    return [f"--{key}={value}" for key, value in values.items()]


def test_main_reports_bad_flags_clearly():
    completed = run_program("--dataset=nope")
    assert completed.returncode != 0
    assert "Known datasets: cifar10" in completed.stderr
    assert "Traceback" not in completed.stderr
    uneven = run_program(*tiny_flags(num_cpu_devices=2, train_batch_size=15, train_steps=1))
    assert uneven.returncode != 0
    assert "--train_batch_size=15 does not split over 2 replicas" in uneven.stderr


def test_a_killed_run_resumes_from_its_checkpoint(tmp_path):
    flags = tiny_flags(train_steps=60, checkpoint_steps=5, model_dir=tmp_path, linear_eval=False)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    process = subprocess.Popen([sys.executable, "-m", "tftrain.examples.simclr", *flags], env=env)
    try:
        deadline = time.monotonic() + 180
        while not (tmp_path / "checkpoints" / "ckpt-10.index").exists():  # the second, at step 10
            assert process.poll() is None, "the run ended before its second checkpoint"
            assert time.monotonic() < deadline, "no second checkpoint in time"
            time.sleep(0.2)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert not (tmp_path / "result.json").exists()
    completed = run_program(*flags)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "tftrain: resumed from" in completed.stdout + completed.stderr  # logged at verbose=0
    with open(tmp_path / "result.json") as file:
        assert json.load(file)["global_step"] == 60


def parsed(*argv):
    """The command line's resolved configuration (recipe and sources too), parsed in-process."""
    from tftrain.examples.simclr import main

    try:
        main.FLAGS(["simclr", *argv])
        return main.resolve_flags()
    finally:
        main.FLAGS.unparse_flags()


def parsed_config(*argv):
    return parsed(*argv).config


def test_train_steps_0_means_train_for_the_epochs_as_the_reference():
    config = parsed_config("--train_steps=0", "--train_epochs=3", "--train_batch_size=16")
    assert config.train_steps == 0
    assert experiment._steps_plan(config, 64) == (4, 4, 13)
    with pytest.raises(ValueError, match="--train_steps=-1: expected an integer >= 1, or 0"):
        experiment.Config(**TINY, train_steps=-1)


def test_ft_proj_selector_minus_1_feeds_the_probe_from_the_last_projection_layer():
    config = parsed_config("--ft_proj_selector=-1", "--num_proj_layers=2", "--proj_out_dim=16")
    assert config.ft_proj_selector == -1
    model = experiment.build_model(experiment.Config(**{**TINY, **dict(ft_proj_selector=-1)}), 8)
    projection, logits = model(np.zeros([2, 16, 16, 3], np.float32))
    head = model.projection_head
    assert head.ft_proj_selector == head.num_layers == 3  # the reference's default num_proj_layers
    assert model.supervised_head.kernel.shape == (16, 8)  # the projection's output size
    with pytest.raises(ValueError, match="Received: -2. Expected 0..3 .*or -1 for the last layer"):
        experiment.build_model(experiment.Config(**TINY, ft_proj_selector=-2), 8)


def test_the_demo_recipe_learns_at_tiny_size():
    # The cpu_demo recipe as it is (augmentation, optimizer, temperature), on fewer, smaller images and a
    # narrower network: 300 steps must find the positive view far more often than the first epoch does
    # (about 0.26 against 0.11 here; chance is 1/63). Unrelated views (a pairing or augmentation bug) would
    # stay at chance, and a step that does not learn would stay at the first epoch's accuracy.
    examples, batch = 512, 32

    def run(steps):
        config = experiment.Config(
            **{**TINY, "num_train_examples": examples, "train_batch_size": batch, "warmup_epochs": 1},
            train_steps=steps,
            mode="train",
        )
        return experiment.run(config)["train_logs"]

    first_epoch, trained = run(examples // batch), run(300)
    chance = 1 / (2 * batch - 1)  # each view's partner among the batch's other 2B - 1 views
    runs = (first_epoch, trained)
    assert trained["contrast_acc"] > max(1.6 * first_epoch["contrast_acc"], 10 * chance), runs
    assert trained["contrast_loss"] < first_epoch["contrast_loss"] - 1.0, runs


def test_two_cpu_replicas_train_with_the_blur_drawn_per_replica(tmp_path):
    # The pipeline slices each global batch as tf.distribute does (test_simclr_pipeline checks the draws).
    flags = tiny_flags(num_cpu_devices=2, use_blur=True, train_steps=2, model_dir=tmp_path)
    completed = run_program(*flags)
    assert completed.returncode == 0, completed.stderr[-3000:]
    with open(tmp_path / "result.json") as file:
        written = json.load(file)
    assert written["global_step"] == 2 and written["config"]["num_cpu_devices"] == 2
