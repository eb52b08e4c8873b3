"""`tftrain.flags`: absl flags for every Trainer option, `fit`'s budget and the strategy, checked as the Trainer checks them."""

import inspect
import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf
from absl import flags as absl_flags
from helpers import make_mlp

import tftrain
from tftrain import flags
from tftrain.trainer import OPTION_NAMES

PROGRAM = os.path.join(os.path.dirname(__file__), "..", "examples", "flags_program.py")


def parsed(*argv, **define):
    """A fresh flag registry with the Trainer's flags defined (`define`: `define_trainer_flags` arguments), parsed from `argv`."""
    values = absl_flags.FlagValues()
    flags.define_trainer_flags(flag_values=values, **define)
    values(["program", *argv])
    return values


def test_every_option_budget_and_strategy_argument_gets_a_flag_with_its_default():
    values = parsed()
    expected = list(OPTION_NAMES) + list(flags.BUDGET_NAMES) + list(flags.STRATEGY_NAMES)
    assert [name for name in expected if name not in values] == []
    defaults = {name: p.default for name, p in inspect.signature(tftrain.Trainer.__init__).parameters.items()}
    kwargs = flags.trainer_kwargs(flag_values=values)
    assert sorted(kwargs) == sorted(OPTION_NAMES)
    for name, value in kwargs.items():
        expected_default = defaults[name]
        if name == "preemption_signals":
            expected_default = tuple(signal.name for signal in expected_default)
        assert value == expected_default, name
    assert flags.fit_kwargs(flag_values=values) == {"epochs": 1, "total_steps": None, "validation_every_steps": None}


def test_a_flags_help_is_its_arguments_docstring():
    values = parsed()
    assert values["steps_per_loop"].help.startswith("Training steps per host call, or `\"auto\"`")
    assert values["total_steps"].help.startswith("(tftrain) A step budget")
    assert values["use_gpu"].help.startswith("Train on the visible GPUs")
    assert "Each of" not in values["async_checkpoint"].help


def test_parsed_flags_make_a_trainer_with_those_options(tmp_path):
    values = parsed(
        "--steps_per_loop=4", "--jit_compile=false", f"--model_dir={tmp_path}", "--checkpoint_every_steps=3",
        "--profile_steps=2,3", "--preemption_signals=SIGTERM,SIGINT", "--on_nonfinite=rollback",
        "--rollback_lr_factor=0.5", "--ema_decay=0.9", "--epochs=2",
    )  # fmt: skip
    trainer = tftrain.Trainer(make_mlp(), "sgd", "mse", **flags.trainer_kwargs(flag_values=values))
    assert trainer.options.steps_per_loop == 4 and trainer.options.jit_compile is False
    assert trainer.run_options.model_dir == str(tmp_path) and trainer.run_options.profile_steps == (2, 3)
    assert set(trainer.run_options.preemption_signals) == {2, 15}
    assert trainer.nonfinite_policy.rollback_lr_factor == 0.5 and trainer.ema_decay == 0.9
    assert flags.fit_kwargs(flag_values=values)["epochs"] == 2
    assert flags.trainer_kwargs(flag_values=parsed("--jit_compile=auto"))["jit_compile"] == "auto"


@pytest.mark.parametrize(
    "argv, kwargs",
    [
        (["--steps_per_loop=0"], dict(steps_per_loop=0)),
        (["--jit_compile=maybe"], dict(jit_compile="maybe")),
        (["--model_dir="], dict(model_dir="")),
        (["--rollback_lr_factor=0.5"], dict(rollback_lr_factor=0.5)),
        (["--count_flops", "--nouse_tf_function"], dict(count_flops=True, use_tf_function=False)),
        (["--ema_decay=1.5"], dict(ema_decay=1.5)),
        (["--mixed_precision=half"], dict(mixed_precision="half")),
        (["--on_data_change=skip", "--model_dir=runs"], dict(on_data_change="skip", model_dir="runs")),
    ],
    ids=["steps", "jit", "empty_model_dir", "lr_factor_without_rollback", "flops_eagerly", "ema", "policy", "data"],
)
def test_a_bad_value_fails_when_parsed_with_the_trainers_message(argv, kwargs):
    with pytest.raises((TypeError, ValueError)) as from_trainer:
        tftrain.Trainer(make_mlp(), "sgd", "mse", **kwargs)
    with pytest.raises(absl_flags.IllegalFlagValueError) as from_flags:
        parsed(*argv)
    assert str(from_trainer.value) in str(from_flags.value)


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--steps_per_loop=0"], "--steps_per_loop=0"),
        (["--model_dir=runs", "--on_data_change=skip"], "--on_data_change=skip"),
        (["--rollback_lr_factor=0.5"], "--rollback_lr_factor=0.5"),
    ],
    ids=["value", "combination", "needs_another_option"],
)
def test_a_bad_values_message_starts_with_the_flag_and_the_reason(argv, flag):
    with pytest.raises(absl_flags.IllegalFlagValueError) as error:
        parsed(*argv)
    message = str(error.value)
    assert message.startswith(f"flag {flag}: Invalid "), message
    assert len(message) < 600 and message.count("\n") == 0, message  # no listing of every other flag


def test_a_clash_with_a_programs_flag_names_both_and_the_way_out():
    values = absl_flags.FlagValues()
    absl_flags.DEFINE_string("model_dir", None, "The program's own.", flag_values=values)
    with pytest.raises(absl_flags.DuplicateFlagError) as error:
        flags.define_trainer_flags(flag_values=values)
    message = str(error.value)
    assert "--model_dir (defined in" in message and "['model_dir']" in message
    assert "exclude=['model_dir']" in message and 'prefix="trainer_"' in message
    assert "steps_per_loop" not in values  # nothing defined
    assert "trainer_model_dir" in flags.define_trainer_flags(prefix="trainer_", flag_values=values)


def test_a_bad_budget_fails_when_parsed():
    with pytest.raises(absl_flags.IllegalFlagValueError, match="Invalid value for argument `epochs`"):
        parsed("--epochs=-1")
    with pytest.raises(absl_flags.IllegalFlagValueError, match="Invalid value for argument `total_steps`"):
        parsed("--total_steps=0")


def test_a_prefix_and_a_subset_keep_clear_of_a_programs_own_flags():
    values = absl_flags.FlagValues()
    absl_flags.DEFINE_integer("steps_per_loop", 7, "The program's own.", flag_values=values)
    defined = flags.define_trainer_flags(
        prefix="trainer_", only=["steps_per_loop", "model_dir", "epochs"], exclude=["model_dir"], flag_values=values
    )
    assert defined == ("trainer_steps_per_loop", "trainer_epochs")
    values(["program", "--trainer_steps_per_loop=3"])
    assert flags.trainer_kwargs(prefix="trainer_", flag_values=values) == {"steps_per_loop": 3}
    assert values.steps_per_loop == 7
    with pytest.raises(ValueError, match=r"Received: names \['steps_per_lop'\]"):
        flags.define_trainer_flags(only=["steps_per_lop"], flag_values=absl_flags.FlagValues())


def test_a_flagfile_sets_them(tmp_path):
    flagfile = tmp_path / "run.flags"
    flagfile.write_text(f"--model_dir={tmp_path / 'run'}\n--steps_per_loop=2\n--epochs=3\n")
    values = parsed(f"--flagfile={flagfile}")
    assert flags.trainer_kwargs(flag_values=values)["steps_per_loop"] == 2
    assert flags.fit_kwargs(flag_values=values)["epochs"] == 3


def test_the_strategy_from_no_flag_is_the_default_strategy():
    assert flags.strategy_from_flags(flag_values=parsed()) is tf.distribute.get_strategy()


def test_reading_them_before_parsing_is_absls_error():
    values = absl_flags.FlagValues()
    flags.define_trainer_flags(flag_values=values)
    with pytest.raises(absl_flags.UnparsedFlagAccessError):
        flags.trainer_kwargs(flag_values=values)


def test_with_a_model_dir_the_options_hold_the_programs_flags_and_command_line(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["train.py", "--temperature=0.5"])
    values = absl_flags.FlagValues()
    absl_flags.DEFINE_float("temperature", 0.1, "The loss's temperature.", flag_values=values)
    absl_flags.DEFINE_list("sizes", ["8", "4"], "Layer sizes.", flag_values=values)
    absl_flags.DEFINE_string("note", None, "A note.", flag_values=values)
    flags.define_trainer_flags(flag_values=values)
    values(["train.py", "--temperature=0.5", f"--model_dir={tmp_path}"])
    hparams = flags.trainer_kwargs(flag_values=values)["hparams"]
    assert hparams["command_line"] == "train.py --temperature=0.5"
    assert (hparams["temperature"], hparams["sizes"], hparams["note"]) == (0.5, "8,4", None)
    # tftrain's flags under `trainer.`, as the Trainer takes them.
    assert hparams["trainer.model_dir"] == str(tmp_path) and hparams["trainer.steps_per_loop"] == "auto"
    assert hparams["trainer.jit_compile"] is False and hparams["trainer.preemption_signals"] == "SIGTERM"
    assert "steps_per_loop" not in hparams
    assert "flagfile" not in hparams and "verbosity" not in hparams  # absl's own
    trainer = tftrain.Trainer(make_mlp(), "sgd", "mse", **flags.trainer_kwargs(flag_values=values))
    assert trainer.run_options.hparams["temperature"] == 0.5
    assert "hparams" not in flags.trainer_kwargs(flag_values=parsed())  # no model_dir: nothing to record in


def test_the_example_program_trains_from_a_flagfile_and_refuses_a_bad_flag(tmp_path):
    flagfile = tmp_path / "run.flags"
    flagfile.write_text(f"--model_dir={tmp_path / 'run'}\n--steps_per_loop=2\n--epochs=2\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, PROGRAM, f"--flagfile={flagfile}"], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained 2 epochs, 16 steps, engine graph+loop2" in done.stdout
    with open(tmp_path / "run" / "run_record.json") as file:
        record = json.load(file)["record"]
    assert record["hparams.command_line"].endswith(f"flags_program.py --flagfile={flagfile}")
    assert record["hparams.trainer.steps_per_loop"] == 2 and record["hparams.trainer.epochs"] == 2
    bad = subprocess.run(
        [sys.executable, PROGRAM, "--steps_per_loop=0"], capture_output=True, text=True, env=env, timeout=300
    )
    assert bad.returncode != 0 and "Invalid value for argument `steps_per_loop`" in bad.stderr
