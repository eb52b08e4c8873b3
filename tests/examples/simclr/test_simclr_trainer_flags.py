"""The SimCLR program's Trainer flags: `tftrain.flags` for every Trainer option the reference's flags do not set."""

import inspect
import json
import os
import re
import signal

import pytest
import test_simclr_program  # the tiny sizes, on the path as a sibling test module
from absl import flags as absl_flags
from helpers import make_mlp

import tftrain
from tftrain import flags as trainer_flags
from tftrain.examples.simclr import config as config_lib
from tftrain.examples.simclr import experiment, main
from tftrain.trainer import OPTION_NAMES

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "simclr.md")


def parse(*argv):
    """The program's flags parsed from `argv` (in-process), then reset."""

    class Parsed:
        pass

    try:
        main.FLAGS(["simclr", *argv])
        parsed = Parsed()
        parsed.resolved = main.resolve_flags()
        parsed.kwargs = config_lib.trainer_kwargs(parsed.resolved.config)
        return parsed
    finally:
        main.FLAGS.unparse_flags()


def helpfull_sections(text):
    """`--helpfull`'s text as {module heading: the flag names listed under it}."""
    sections, heading = {}, None
    for line in text.splitlines():
        if re.fullmatch(r"\S+:", line):
            heading = line[:-1]
            sections[heading] = []
        elif heading and (flag := re.match(r"  --(?:\[no\])?(\w+):", line)):
            sections[heading].append(flag.group(1))
    return sections


def test_every_trainer_option_is_a_trainer_flag_or_set_by_the_programs_own_flags():
    defined = [flag.name for flag in main.FLAGS.flags_by_module_dict()["tftrain.flags"]]
    assert sorted(defined) == sorted(config_lib.TRAINER_FLAGS)
    assert sorted([*config_lib.TRAINER_FLAGS, *config_lib.TRAINER_OPTIONS_SET_BY]) == sorted(OPTION_NAMES)
    assert sorted(config_lib.RUN_ARGUMENTS_SET_BY) == sorted(
        trainer_flags.BUDGET_NAMES + trainer_flags.STRATEGY_NAMES
    )
    # An option set from the program's flags has no second flag: those names are the program's own flags or none.
    own = [flag.name for flag in main.FLAGS.flags_by_module_dict()["tftrain.examples.simclr.main"]]
    assert not set(own) & set(config_lib.TRAINER_FLAGS)
    assert {"model_dir", "keep_checkpoint_max", "train_summary_steps", "checkpoint_steps"} <= set(own)
    assert "max_to_keep" not in main.FLAGS and "checkpoint_every_steps" not in main.FLAGS
    assert "total_steps" not in main.FLAGS and "tpu" not in main.FLAGS


def test_helpfull_lists_the_trainer_flags_apart_from_the_references():
    completed = test_simclr_program.run_program("--helpfull")  # absl prints the help and exits with 1
    assert "\ntftrain.flags:\n" in completed.stdout, completed.stderr[-3000:]
    sections = helpfull_sections(completed.stdout)
    assert sorted(sections["tftrain.flags"]) == sorted(config_lib.TRAINER_FLAGS)
    program = sections["tftrain.examples.simclr.main"]
    assert set(config_lib.REFERENCE_FLAGS) <= set(program)
    assert not set(program) & set(config_lib.TRAINER_FLAGS)
    trainer_section = completed.stdout.split("\ntftrain.flags:\n")[1]
    assert re.search(
        r"--steps_per_loop: Training steps per host call.*?\(default: '1'\)", trainer_section, re.S
    )


def test_the_trainer_flags_default_to_the_programs_run():
    parsed = parse()
    assert parsed.resolved.config.trainer_options == {}
    defaults = {name: p.default for name, p in inspect.signature(tftrain.Trainer).parameters.items()}
    for name in config_lib.TRAINER_FLAGS:
        expected = config_lib.PROGRAM_TRAINER_DEFAULTS.get(name, defaults[name])
        assert parsed.kwargs.get(name, defaults[name]) == expected, name
    assert (
        parsed.kwargs["steps_per_loop"] == 1
    )  # the program's default, as before the flag came from tftrain.flags
    assert set(parsed.resolved.trainer_sources.values()) == {"tftrain default"}


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--jit_compile=true"], dict(jit_compile=True)),
        (["--jit_compile=auto", "--steps_per_loop=auto"], dict(jit_compile="auto", steps_per_loop="auto")),
        (
            ["--nouse_tf_function", "--mixed_precision=mixed_bfloat16"],
            dict(use_tf_function=False, mixed_precision="mixed_bfloat16"),
        ),
        (
            ["--async_checkpoint", "--profile_steps=2,3"],
            dict(async_checkpoint=True, profile_steps=(2, 3)),
        ),
        (
            ["--on_nonfinite=rollback", "--max_rollbacks=2"],
            dict(on_nonfinite="rollback", max_rollbacks=2),
        ),
        (
            ["--preemption_signals=SIGTERM,SIGINT"],
            dict(preemption_signals=("SIGTERM", "SIGINT")),
        ),
        (["--ema_decay=0.99", "--nomeasure_timing"], dict(ema_decay=0.99, measure_timing=False)),
    ],
    ids=["jit", "auto", "eager_bf16", "async_profile", "rollback", "signals", "ema"],
)
def test_trainer_flags_become_the_trainers_options_with_those_the_reference_flags_set(argv, expected):
    parsed = parse(*argv, "--model_dir=runs/a", "--keep_checkpoint_max=3", "--train_summary_steps=7")
    assert {name: parsed.kwargs[name] for name in expected} == expected
    assert parsed.resolved.config.trainer_options == expected  # only the flags given
    set_by_reference_flags = ("model_dir", "max_to_keep", "summary_every_steps")
    assert [parsed.kwargs[name] for name in set_by_reference_flags] == ["runs/a", 3, 7]
    assert {parsed.resolved.trainer_sources[name] for name in expected} == {"command line"}
    text = parsed.resolved.describe()
    assert "tftrain.Trainer's other options (tftrain.flags):" in text
    first = next(iter(expected))
    assert re.search(rf"\n  {first} +=.*\(command line\)", text)


def test_a_trainer_flag_reaches_the_trainer_the_program_builds(tmp_path, monkeypatch, capsys):
    built = []

    class Recorded(tftrain.Trainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(tftrain, "Trainer", Recorded)
    flags = test_simclr_program.tiny_flags(train_steps=4, model_dir=tmp_path, keep_checkpoint_max=2)
    main.FLAGS(["simclr", *flags, "--mode=train", "--steps_per_loop=2", "--async_checkpoint"])
    try:
        main.main(["simclr"])
    finally:
        main.FLAGS.unparse_flags()
    (trainer,) = built
    assert trainer.options.steps_per_loop == 2 and trainer.run_options.async_checkpoint is True
    assert trainer.run_options.model_dir == str(tmp_path) and trainer.run_options.max_to_keep == 2
    assert trainer.timing.engine == "graph+loop2"
    with open(tmp_path / "result.json") as file:
        written = json.load(file)
    assert written["global_step"] == 4 and written["timing"]["engine"] == "graph+loop2"
    with open(tmp_path / "flags.json") as file:
        assert json.load(file)["trainer_options"] == {"steps_per_loop": 2, "async_checkpoint": True}
    assert re.search(r"\n  steps_per_loop +=.*\(command line\)", capsys.readouterr().out)
    # The program's flags and command line are in the run record (and TensorBoard's HParams tab).
    assert isinstance(trainer.run_options.hparams["temperature"], float)
    assert trainer.run_options.hparams["trainer.steps_per_loop"] == 2
    with open(tmp_path / "run_record.json") as file:
        record = json.load(file)["record"]
    assert record["hparams.train_steps"] == 4 and "hparams.command_line" in record


@pytest.mark.parametrize(
    "argv, kwargs",
    [
        (["--steps_per_loop=0"], dict(steps_per_loop=0)),
        (["--jit_compile=maybe"], dict(jit_compile="maybe")),
        (["--ema_decay=1.5"], dict(ema_decay=1.5)),
        (["--mixed_precision=half"], dict(mixed_precision="half")),
        (["--on_nonfinite=rollback"], dict(on_nonfinite="rollback")),
        (["--async_checkpoint"], dict(async_checkpoint=True)),
        (
            ["--rollback_lr_factor=0.5"],
            dict(model_dir="runs/a", rollback_lr_factor=0.5),
        ),
    ],
    ids=[
        "steps",
        "jit",
        "ema",
        "policy",
        "rollback_without_model_dir",
        "async_without_model_dir",
        "lr_factor",
    ],
)
def test_a_bad_trainer_flag_fails_when_parsed_with_the_trainers_message(argv, kwargs):
    with pytest.raises((TypeError, ValueError)) as from_trainer:
        tftrain.Trainer(make_mlp(), "sgd", "mse", **kwargs)
    try:
        with pytest.raises(absl_flags.IllegalFlagValueError) as from_flags:
            main.FLAGS(["simclr", *argv])
    finally:
        main.FLAGS.unparse_flags()
    assert str(from_trainer.value) in str(from_flags.value)


def test_the_program_stops_at_a_bad_trainer_flag_before_anything_runs():
    completed = test_simclr_program.run_program("--steps_per_loop=0")
    assert completed.returncode != 0
    assert "Invalid value for argument `steps_per_loop`. Received: steps_per_loop=0" in completed.stderr
    assert "SimCLR configuration" not in completed.stdout and "Traceback" not in completed.stderr


def test_a_flagfile_sets_reference_and_trainer_flags(tmp_path):
    flagfile = tmp_path / "run.flags"
    flagfile.write_text(
        f"--model_dir={tmp_path / 'run'}\n--train_epochs=3\n--steps_per_loop=4\n--jit_compile=true\n"
        "--preemption_signals=SIGUSR1\n"
    )
    parsed = parse(f"--flagfile={flagfile}", "--steps_per_loop=2")  # the command line after it wins
    assert parsed.resolved.config.train_epochs == 3 and parsed.kwargs["model_dir"] == str(tmp_path / "run")
    assert parsed.resolved.config.trainer_options == dict(
        steps_per_loop=2, jit_compile=True, preemption_signals=("SIGUSR1",)
    )
    trainer = tftrain.Trainer(make_mlp(), "sgd", "mse", **parsed.kwargs)
    assert trainer.options.jit_compile is True and trainer.run_options.preemption_signals == (signal.SIGUSR1,)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(loop="fit", trainer_options={"async_checkpoint": True}), "--async_checkpoint set options of"),
        (
            dict(loop="fit", trainer_options={"jit_compile": True}),
            "takes only --use_tf_function, --steps_per_loop",
        ),
        (dict(loop="fit", trainer_options={"steps_per_loop": "auto"}), "steps_per_execution is a number"),
        (
            dict(trainer_options={"model_dir": "runs/b"}),
            "model_dir='runs/b', which the program sets from --model_dir",
        ),
        (dict(trainer_options={"max_to_keep": 2}), "sets from --keep_checkpoint_max"),
        (
            dict(trainer_options={"stepz_per_loop": 2}),
            r"Received: \['stepz_per_loop'\], which are no options",
        ),
        (dict(trainer_options={"steps_per_loop": 0}), "Invalid value for argument `steps_per_loop`"),
        (dict(trainer_options={"summary_every_steps": 5}), "sets from --train_summary_steps"),
    ],
    ids=["fit_async", "fit_jit", "fit_auto", "model_dir", "max_to_keep", "unknown", "bad_value", "summaries"],
)
def test_a_trainer_option_the_program_cannot_take_is_refused_before_any_data(overrides, message):
    with pytest.raises(ValueError, match=message):
        experiment.Config(**{**test_simclr_program.TINY, **overrides})


def test_loop_fit_takes_the_trainer_flags_model_fit_has():
    options = dict(use_tf_function=False, steps_per_loop=3, mixed_precision="float32", profile_steps=(1, 2))
    config = experiment.Config(
        **test_simclr_program.TINY, loop="fit", model_dir="runs/c", trainer_options=options
    )
    assert {name: config_lib.trainer_kwargs(config)[name] for name in options} == options


def test_resume_from_with_checkpoint_is_refused(tmp_path):
    experiment.Config(**test_simclr_program.TINY, model_dir="runs/d", trainer_options={"resume_from": "x"})
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    with pytest.raises(ValueError, match="--checkpoint initialises the model only"):
        experiment.Config(
            **test_simclr_program.TINY,
            model_dir="runs/d",
            checkpoint=str(checkpoints),
            trainer_options={"resume_from": "x"},
        )


def test_a_remote_model_dir_is_not_reached_when_the_flags_are_checked():
    parsed = parse("--dataset=cifar10", "--model_dir=gs://bucket/simclr", "--async_checkpoint")
    assert parsed.kwargs["model_dir"] == "gs://bucket/simclr" and parsed.kwargs["async_checkpoint"] is True


def test_the_docs_list_every_trainer_flag_and_the_options_the_reference_flags_set():
    with open(DOCS) as file:
        text = file.read()
    section = text.split("### Flags: the Trainer's other options")[1].split("\n## ")[0]
    for name in config_lib.TRAINER_FLAGS:
        assert f"`--{name}`" in section, name
    for name in [*config_lib.TRAINER_OPTIONS_SET_BY, *config_lib.RUN_ARGUMENTS_SET_BY]:
        assert f"`{name}`" in section, name


def test_loop_fit_keeps_keep_checkpoint_max_checkpoints(tmp_path):
    config = experiment.Config(
        **test_simclr_program.TINY,
        loop="fit",
        train_steps=6,
        checkpoint_steps=2,
        keep_checkpoint_max=2,
        model_dir=str(tmp_path),
        trainer_options={"steps_per_loop": 2},
    )
    assert experiment.run(config)["global_step"] == 6
    kept = sorted(name for name in os.listdir(tmp_path / "checkpoints") if name.endswith(".index"))
    assert kept == ["ckpt-4.index", "ckpt-6.index"]
