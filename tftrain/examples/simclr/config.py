"""The SimCLR experiment's settings: the reference's defaults, recipes, and where each value came from.

`Config()` is google-research/simclr's TF2 `run.py` configuration: every flag
of the reference keeps its name, meaning and default, and tftrain's extra
settings have their own defaults. A recipe (`RECIPES`) replaces some defaults
for a purpose (`cpu_demo`: the offline demo on 2 CPU cores); values given on
the command line win over both. `resolve` applies that rule and records each
value's source, which the program prints at start.

The `tftrain.Trainer` the program builds takes some options from the
reference's flags (`TRAINER_OPTIONS_SET_BY`) and every other one from a flag
of `tftrain.flags` (`TRAINER_FLAGS`, held in `Config.trainer_options`);
`trainer_kwargs` joins them.
"""

from __future__ import annotations

import dataclasses
import inspect
import tempfile
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from tftrain import data as data_lib
from tftrain import trainer as trainer_lib
from tftrain.examples.simclr import resnet

KNOWN_DATASETS = data_lib.KNOWN_DATASETS  # known without tensorflow-datasets; any tfds name works too
MIN_IMAGE_SIZE = 16  # the random crop and the ResNet's strides need room

# The flags of google-research/simclr's tf2/run.py (48), with its defaults in `Config`.
REFERENCE_FLAGS = (
    "learning_rate", "learning_rate_scaling", "warmup_epochs", "weight_decay", "batch_norm_decay",
    "train_batch_size", "train_split", "train_epochs", "train_steps", "eval_steps", "eval_batch_size",
    "checkpoint_epochs", "checkpoint_steps", "eval_split", "dataset", "cache_dataset", "mode",
    "train_mode", "lineareval_while_pretraining", "checkpoint", "zero_init_logits_layer",
    "fine_tune_after_block", "master", "model_dir", "data_dir", "use_tpu", "tpu_name", "tpu_zone",
    "gcp_project", "optimizer", "momentum", "eval_name", "keep_checkpoint_max", "keep_hub_module_max",
    "temperature", "hidden_norm", "proj_head_mode", "proj_out_dim", "num_proj_layers",
    "ft_proj_selector", "global_bn", "width_multiplier", "resnet_depth", "sk_ratio", "se_ratio",
    "image_size", "color_jitter_strength", "use_blur",
)  # fmt: skip


# The Trainer's options the program sets from its own flags: `tftrain.flags` defines no second flag for them.
TRAINER_OPTIONS_SET_BY = {
    "model_dir": "--model_dir",
    "max_to_keep": "--keep_checkpoint_max",
    "summary_every_steps": "--train_summary_steps (0: None, summaries with each checkpoint)",
    "checkpoint_every_steps": "--checkpoint_steps or --checkpoint_epochs (each ends one of the Trainer's "
    "epochs, which saves; None: no other save)",
}
# `fit`'s budget and the strategy's arguments, which `tftrain.flags` defines too: the program sets them.
RUN_ARGUMENTS_SET_BY = {
    "epochs": "--train_epochs or --train_steps, in epochs of --checkpoint_steps or --checkpoint_epochs",
    "total_steps": "--train_steps, or N * --train_epochs // --train_batch_size + 1",
    "validation_every_steps": "none: the program trains without validation data",
    "use_gpu": "--use_gpu (default: the visible GPUs unless --use_tpu)",
    "use_tpu": "--use_tpu",
    "tpu": "--tpu_name, or --master",
    "num_cpu_devices": "--num_cpu_devices",
}
TRAINER_FLAGS = tuple(name for name in trainer_lib.OPTION_NAMES if name not in TRAINER_OPTIONS_SET_BY)
"""The Trainer's options that are flags of `tftrain.flags` in the program (`Config.trainer_options`)."""

PROGRAM_TRAINER_DEFAULTS: Mapping[str, Any] = {"steps_per_loop": 1}
"""The program's defaults where they are not the Trainer's (its `steps_per_loop` is `"auto"`)."""

FIT_LOOP_OPTIONS = ("use_tf_function", "steps_per_loop", "mixed_precision", "profile_steps")
"""The Trainer flags `--loop=fit` takes: `use_tf_function` as `run_eagerly`, `steps_per_loop` as
`steps_per_execution`, `mixed_precision` (the Trainer sets the model's policy) and `profile_steps`
(`tftrain.callbacks.standard_callbacks`)."""


class FlagValueError(ValueError):
    """A setting that `run` finds wrong once it sees the devices or the checkpoint (before any data)."""


@dataclasses.dataclass(frozen=True)
class Config:
    """An experiment's settings; see `main.py`'s flags for each one's meaning.

    The defaults are the reference's (`REFERENCE_FLAGS`) and tftrain's own
    (the other fields); `resolve` applies a recipe and the command line.
    `trainer_options` holds the `tftrain.Trainer` options given
    (`TRAINER_FLAGS` names -> values); the rest take `PROGRAM_TRAINER_DEFAULTS`
    or the Trainer's defaults (`trainer_kwargs` gives them all).
    """

    # The reference's flags and defaults.
    learning_rate: float = 0.3
    learning_rate_scaling: str = "linear"
    warmup_epochs: float = 10
    weight_decay: float = 1e-6
    batch_norm_decay: float = 0.9
    train_batch_size: int = 512
    train_split: str = "train"
    train_epochs: int = 100
    train_steps: int = 0
    eval_steps: int = 0
    eval_batch_size: int = 256
    checkpoint_epochs: int = 1
    checkpoint_steps: int = 0
    eval_split: str = "validation"
    dataset: str = "imagenet2012"
    cache_dataset: bool = False
    mode: str = "train"
    train_mode: str = "pretrain"
    lineareval_while_pretraining: bool = True
    checkpoint: str | None = None
    zero_init_logits_layer: bool = False
    fine_tune_after_block: int = -1
    master: str | None = None
    model_dir: str | None = None
    data_dir: str | None = None
    use_tpu: bool = True
    tpu_name: str | None = None
    tpu_zone: str | None = None
    gcp_project: str | None = None
    optimizer: str = "lars"
    momentum: float = 0.9
    eval_name: str | None = None
    keep_checkpoint_max: int = 5
    keep_hub_module_max: int = 1
    temperature: float = 0.1
    hidden_norm: bool = True
    proj_head_mode: str = "nonlinear"
    proj_out_dim: int = 128
    num_proj_layers: int = 3
    ft_proj_selector: int = 0
    global_bn: bool = True
    width_multiplier: float = 1
    resnet_depth: int = 50
    sk_ratio: float = 0.0
    se_ratio: float = 0.0
    image_size: int = 224
    color_jitter_strength: float = 1.0
    use_blur: bool = True
    # tftrain's own settings.
    loop: str = "trainer"
    num_train_examples: int | None = None
    num_eval_examples: int | None = None
    min_crop_area: float = 0.08
    cifar_stem: bool | None = None
    linear_eval: bool = False
    train_summary_steps: int = 0
    eval_timeout_s: float = 3600.0
    use_gpu: bool | None = None
    num_cpu_devices: int | None = None
    seed: int = 0
    verbose: int = 1
    # The Trainer's other options (tftrain.flags): name -> value, those given.
    trainer_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def field_names(cls) -> list[str]:
        """The settings that are flags of their own name: every field but `trainer_options`."""
        return [field.name for field in dataclasses.fields(cls) if field.name != "trainer_options"]

    @property
    def uses_cifar_stem(self) -> bool:
        """The small-image stem: `cifar_stem`, or as the reference `image_size <= 32`."""
        return self.image_size <= 32 if self.cifar_stem is None else self.cifar_stem

    def __post_init__(self):
        _check_devices(self)
        _check_dataset(self)
        if self.image_size < MIN_IMAGE_SIZE:
            raise ValueError(
                f"--image_size={self.image_size} is too small for SimCLR's random crop and the ResNet. "
                f"Expected at least {MIN_IMAGE_SIZE}."
            )
        for name in (
            "train_batch_size",
            "eval_batch_size",
            "train_epochs",
            "proj_out_dim",
            "checkpoint_epochs",
            "keep_checkpoint_max",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name}={getattr(self, name)}: expected an integer >= 1.")
        for name in ("train_steps", "eval_steps", "checkpoint_steps", "train_summary_steps"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"--{name}={getattr(self, name)}: expected an integer >= 1, or 0 (the default: "
                    f"{_ZERO_MEANS[name]})."
                )
        if self.keep_hub_module_max < 0:
            raise ValueError(f"--keep_hub_module_max={self.keep_hub_module_max}: expected an integer >= 0.")
        _check_model(self)
        if not 0 < self.min_crop_area <= 1:
            raise ValueError(f"--min_crop_area={self.min_crop_area}: expected a fraction in (0, 1].")
        if not self.eval_timeout_s > 0:
            raise ValueError(f"--eval_timeout_s={self.eval_timeout_s}: expected a number of seconds > 0.")
        if self.temperature <= 0:
            raise ValueError(f"--temperature={self.temperature}: expected a number > 0.")
        if self.mode != "train" and self.train_mode == "pretrain" and not self.lineareval_while_pretraining:
            if not self.linear_eval:
                raise ValueError(
                    "--mode evaluates, but --train_mode=pretrain with --nolineareval_while_pretraining "
                    "and --nolinear_eval leaves nothing to evaluate. Turn one of them on."
                )
        if self.checkpoint is not None:
            _check_checkpoint_flag(self)
        if self.mode == "eval" and self.model_dir is None:
            raise ValueError("--mode=eval needs --model_dir holding a trained run's checkpoints.")
        object.__setattr__(self, "trainer_options", dict(self.trainer_options))
        _check_trainer_options(self)


_ZERO_MEANS = {
    "train_steps": "train for --train_epochs",
    "eval_steps": "the whole eval split",
    "checkpoint_steps": "every --checkpoint_epochs",
    "train_summary_steps": "summaries with each checkpoint",
}


def _check_dataset(config: Config) -> None:
    """Checks --dataset and its splits as far as is possible without reading data.

    The generated datasets and `KNOWN_DATASETS` are checked without importing
    tensorflow-datasets (startup stays fast); any other name is looked up in
    tensorflow-datasets' registry (or `--data_dir`). The splits of a
    tensorflow-datasets dataset are checked where its data is first read,
    before any training step.
    """
    name = config.dataset
    if name in data_lib.GENERATED_DATASETS:
        for flag in ("train_split", "eval_split"):
            split = getattr(config, flag)
            if split not in data_lib.SPLITS[name]:
                count = "num_train_examples" if flag == "train_split" else "num_eval_examples"
                raise ValueError(
                    f"--{flag}={split!r} is not a split of --dataset={name}. Expected one of "
                    f"{', '.join(data_lib.SPLITS[name])} (a generated dataset has no slices: "
                    f"--{count} reads fewer examples)."
                )
        return
    if name in KNOWN_DATASETS:
        return
    try:
        data_lib.check_name(name, data_dir=config.data_dir)
    except ValueError as error:
        raise ValueError(
            f"Unknown --dataset={name!r}. {error} Known datasets: {', '.join(KNOWN_DATASETS)} "
            "(shapes and synthetic are generated offline), and any tensorflow-datasets image "
            "classification dataset."
        ) from None


def _check_devices(config: Config) -> None:
    if config.use_gpu and config.use_tpu:
        raise ValueError(
            "--use_gpu and --use_tpu=True contradict each other: pass one of them (--use_gpu alone "
            "turns the reference's default --use_tpu=True off)."
        )
    if config.num_cpu_devices is not None and (config.use_gpu or config.use_tpu):
        raise ValueError(
            "--num_cpu_devices splits the CPU; it cannot be combined with --use_gpu or --use_tpu=True "
            "(--num_cpu_devices alone turns the reference's default --use_tpu=True off)."
        )
    for name in ("tpu_zone", "gcp_project"):
        if getattr(config, name) is not None:
            raise ValueError(
                f"--{name}={getattr(config, name)} is not supported: tftrain connects to a TPU by "
                "--tpu_name (a name in this VM's zone and project, or a grpc:// address) or --master. "
                f"Expected no --{name}; pass the TPU's grpc:// address as --tpu_name instead."
            )


def _check_model(config: Config) -> None:
    if config.width_multiplier <= 0:
        raise ValueError(f"--width_multiplier={config.width_multiplier}: expected a number > 0.")
    if config.resnet_depth not in resnet.DEPTHS:
        raise ValueError(
            f"--resnet_depth={config.resnet_depth}: expected one of {', '.join(map(str, resnet.DEPTHS))}."
        )
    if not 0 <= config.batch_norm_decay < 1:
        raise ValueError(f"--batch_norm_decay={config.batch_norm_decay}: expected a number in [0, 1).")
    for name in ("sk_ratio", "se_ratio"):
        if getattr(config, name) < 0:
            raise ValueError(f"--{name}={getattr(config, name)}: expected a number >= 0 (0: off).")
    if not -1 <= config.fine_tune_after_block <= 4:
        raise ValueError(
            f"--fine_tune_after_block={config.fine_tune_after_block}: expected -1 (fine-tune every layer), "
            "0 (freeze the stem), 1..3 (freeze the stem and block groups up to that one) or 4 (train "
            "the heads only)."
        )
    if config.fine_tune_after_block != -1 and config.train_mode != "finetune":
        raise ValueError(
            f"--fine_tune_after_block={config.fine_tune_after_block} freezes layers for fine-tuning, but "
            f"--train_mode={config.train_mode}. Expected --train_mode=finetune, or "
            "--fine_tune_after_block=-1 (as the reference, pretraining freezes no layer)."
        )


def trainer_kwargs(config: Config) -> dict[str, Any]:
    """The options of the `tftrain.Trainer` the program builds (all but the strategy).

    The options given (`config.trainer_options`) over the program's defaults
    (`PROGRAM_TRAINER_DEFAULTS`), and those it sets from its own flags
    (`TRAINER_OPTIONS_SET_BY`); any other takes the Trainer's default.
    """
    return {
        **PROGRAM_TRAINER_DEFAULTS,
        **config.trainer_options,
        "model_dir": config.model_dir,
        "max_to_keep": config.keep_checkpoint_max,
        "summary_every_steps": config.train_summary_steps or None,
    }


def trainer_option_value(config: Config, name: str) -> Any:
    """The value the Trainer gets for option `name`: `trainer_kwargs`' or the Trainer's default."""
    kwargs = trainer_kwargs(config)
    return kwargs[name] if name in kwargs else inspect.signature(trainer_lib.Trainer).parameters[name].default


def checkable(options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` for `tftrain.trainer.check_options` without reaching a remote filesystem.

    A remote `model_dir` (`gs://...`) stands in as a local directory for the
    check of the options' combination: its path is checked when the Trainer
    is made, where the run can reach it.
    """
    options = dict(options)
    if "://" in str(options.get("model_dir") or ""):
        options["model_dir"] = tempfile.gettempdir()
    return options


def _check_trainer_options(config: Config) -> None:
    """The Trainer's options as the Trainer checks them, and as the program takes them."""
    given = config.trainer_options
    unknown = sorted(set(given) - set(trainer_lib.OPTION_NAMES))
    if unknown:
        raise ValueError(
            f"Invalid value for argument `trainer_options`. Received: {unknown}, which are no options of "
            f"tftrain.Trainer. Expected some of {', '.join(TRAINER_FLAGS)}."
        )
    clash = sorted(set(given) & set(TRAINER_OPTIONS_SET_BY))
    if clash:
        name = clash[0]
        raise ValueError(
            f"Invalid value for argument `trainer_options`. Received: {name}={given[name]!r}, which the "
            f"program sets from {TRAINER_OPTIONS_SET_BY[name]}. Expected that flag instead."
        )
    if config.loop == "fit":
        not_taken = [name for name in given if name not in FIT_LOOP_OPTIONS]
        if not_taken:
            raise ValueError(
                f"--{', --'.join(not_taken)} set options of tftrain.Trainer.fit, but --loop=fit trains with "
                f"keras Model.fit, which takes only --{', --'.join(FIT_LOOP_OPTIONS)}. Expected --loop=trainer "
                "(the default), or none of them."
            )
        if not isinstance(trainer_option_value(config, "steps_per_loop"), int):
            raise ValueError(
                f"--steps_per_loop={given['steps_per_loop']} is the Trainer's choice, but --loop=fit trains "
                "with keras Model.fit, whose steps_per_execution is a number. Expected a number of steps."
            )
    if given.get("resume_from") is not None and config.checkpoint is not None:
        raise ValueError(
            f"--resume_from={given['resume_from']} and --checkpoint={config.checkpoint} both set where "
            "training starts: --checkpoint initialises the model only (as the reference), --resume_from "
            "restores a whole training state (optimizer and step too). Expected one of them."
        )
    trainer_lib.check_options(**checkable(trainer_kwargs(config)))


def _check_checkpoint_flag(config: Config) -> None:
    if config.mode == "eval":
        raise ValueError(
            f"--checkpoint={config.checkpoint} initialises training, but --mode=eval evaluates the "
            "checkpoints of --model_dir (as the reference, which reads --checkpoint only when training). "
            "Expected --mode=train or train_then_eval, or no --checkpoint."
        )
    path = config.checkpoint
    if not (tf.io.gfile.isdir(path) or tf.io.gfile.exists(path + ".index")):
        raise ValueError(
            f"--checkpoint={path} does not exist. Expected a checkpoint path of a pretraining run "
            "(`<model_dir>/checkpoints/ckpt-N`) or a directory of checkpoints (`<model_dir>/checkpoints`)."
        )


@dataclasses.dataclass(frozen=True)
class Recipe:
    """Defaults for a purpose, in place of the reference's.

    Attributes:
        name: The `--recipe` value.
        purpose: One line on what it is for.
        values: Setting name -> the recipe's value.
        fixed: Settings the recipe stands on: a command line value that differs is an error.
    """

    name: str
    purpose: str
    values: Mapping[str, Any]
    fixed: tuple[str, ...] = ()


RECIPES = {
    recipe.name: recipe
    for recipe in (
        Recipe("reference", "google-research/simclr's TF2 run.py defaults, unchanged", {}),
        Recipe(
            "cpu_demo",
            "the offline demo: generated shapes at 32 px, a narrow ResNet-18, minutes on 2 CPU cores",
            {
                "dataset": "shapes",
                "eval_split": "test",
                "image_size": 32,
                "resnet_depth": 18,
                "width_multiplier": 0.125,
                "train_batch_size": 256,
                "train_epochs": 15,
                "learning_rate": 1.0,
                "warmup_epochs": 1,
                "weight_decay": 1e-4,
                "temperature": 0.5,
                "use_blur": False,
                "color_jitter_strength": 0.5,
                "min_crop_area": 0.6,
                "global_bn": False,
                "mode": "train_then_eval",
                "linear_eval": True,
                "use_tpu": False,
                "use_gpu": False,
            },
            fixed=("dataset", "use_tpu"),
        ),
    )
}


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A resolved configuration: the `Config`, the recipe it used and each setting's source."""

    config: Config
    recipe: str
    sources: Mapping[str, str]
    trainer_sources: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def describe(self) -> str:
        """Every setting, its value and where it came from, one per line; then the Trainer's options."""
        recipe = RECIPES[self.recipe]
        lines = [f"SimCLR configuration (--recipe={recipe.name}: {recipe.purpose}):"]
        width = max(map(len, [*self.sources, *self.trainer_sources]))
        for name, source in self.sources.items():
            lines.append(f"  {name:<{width}} = {getattr(self.config, name)!r:<24} ({source})")
        if self.trainer_sources:
            lines.append("tftrain.Trainer's other options (tftrain.flags):")
        for name, source in self.trainer_sources.items():
            lines.append(f"  {name:<{width}} = {trainer_option_value(self.config, name)!r:<24} ({source})")
        return "\n".join(lines)


def default_recipe(command_line: Mapping[str, Any]) -> str:
    """The recipe when `--recipe` is not given: `cpu_demo` without `--dataset`, else `reference`."""
    return "reference" if "dataset" in command_line else "cpu_demo"


def resolve(
    command_line: Mapping[str, Any],
    recipe: str | None = None,
    *,
    trainer_options: Mapping[str, Any] | None = None,
) -> Resolved:
    """The configuration of a command: the command line over the recipe over the defaults.

    Args:
        command_line: The settings given on the command line (name -> value).
        recipe: A `RECIPES` name, or None for `default_recipe(command_line)`.
        trainer_options: The Trainer's options given on the command line
            (`TRAINER_FLAGS` names -> values; `Config.trainer_options`).

    Returns:
        The validated `Config`, the recipe's name and each setting's source
        ("command line", "recipe <name>", "reference default" or "tftrain
        default"; for each of `TRAINER_FLAGS`, "command line" or "tftrain default").

    Raises:
        ValueError: an unknown recipe or setting, a command line value that
            contradicts the recipe's fixed choices, or an invalid setting.
    """
    name = default_recipe(command_line) if recipe is None else recipe
    if name not in RECIPES:
        raise ValueError(
            f"Invalid value for argument `recipe`. Received: recipe={name!r}. Expected one of "
            f"{', '.join(RECIPES)} (default: cpu_demo without --dataset, reference with it)."
        )
    unknown = sorted(set(command_line) - set(Config.field_names()))
    if unknown:
        raise ValueError(f"Unknown settings {unknown}. Expected names of {Config.__name__} fields.")
    chosen = RECIPES[name]
    for field in chosen.fixed:
        if field in command_line and command_line[field] != chosen.values[field]:
            raise ValueError(
                f"--{field}={command_line[field]} contradicts --recipe={name}, which runs with "
                f"--{field}={chosen.values[field]}. Expected no --{field} (or that value), or "
                "--recipe=reference to set it freely."
            )
    sources = {}
    for field in Config.field_names():
        if field in command_line:
            sources[field] = "command line"
        elif field in chosen.values:
            sources[field] = f"recipe {name}"
        else:
            sources[field] = "reference default" if field in REFERENCE_FLAGS else "tftrain default"
    values = {**chosen.values, **command_line}
    device_flag = _device_flag_given(command_line)
    if device_flag is not None and "use_tpu" not in command_line:
        # A device the user asked for wins over the reference's --use_tpu=True they did not give.
        values["use_tpu"] = False
        sources["use_tpu"] = f"off: {device_flag} given"
    trainer_options = dict(trainer_options or {})
    trainer_sources = {
        option: "command line" if option in trainer_options else "tftrain default" for option in TRAINER_FLAGS
    }
    return Resolved(Config(**values, trainer_options=trainer_options), name, sources, trainer_sources)


def _device_flag_given(command_line: Mapping[str, Any]) -> str | None:
    """The command line's own device choice (`--use_gpu`, `--num_cpu_devices`), if any."""
    if command_line.get("use_gpu"):
        return "--use_gpu"
    if command_line.get("num_cpu_devices") is not None:
        return "--num_cpu_devices"
    return None
