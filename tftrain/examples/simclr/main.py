"""SimCLR pretraining, finetuning and evaluation: `python -m tftrain.examples.simclr`.

Every flag of google-research/simclr's TF2 `run.py` exists here with its
name, meaning and default; tftrain's own flags follow, and `tftrain.flags`
defines a flag for each `tftrain.Trainer` option the reference's flags do not
set (`--steps_per_loop`, `--jit_compile`, `--async_checkpoint`, ...; listed
apart by `--helpfull`). A recipe
(`--recipe`, see `config.py`) replaces some defaults: without `--dataset` the
`cpu_demo` recipe runs offline on 2 CPU cores in minutes; with `--dataset`
the `reference` recipe keeps the reference's defaults, so its README commands
run as written, e.g. CIFAR-10:

    python -m tftrain.examples.simclr --train_mode=pretrain --train_batch_size=512 \\
        --train_epochs=1000 --learning_rate=1.0 --weight_decay=1e-4 --temperature=0.5 \\
        --dataset=cifar10 --image_size=32 --eval_split=test --resnet_depth=18 \\
        --use_blur=False --color_jitter_strength=0.5 --model_dir=/tmp/simclr_test --use_tpu=False

Only `main` reads flags; it resolves and validates them all before any data is
read, prints every value and its source, and passes plain values to `run`.
"""

from __future__ import annotations

import dataclasses

from absl import app, flags

import tftrain
from tftrain import flags as trainer_flags
from tftrain.examples.simclr import config as config_lib
from tftrain.examples.simclr import experiment

FLAGS = flags.FLAGS
_D = config_lib.Config()  # one source of defaults: the reference's, and tftrain's for its own flags
_DEFINE = {
    "bool": flags.DEFINE_bool,
    "bool | None": flags.DEFINE_bool,
    "int": flags.DEFINE_integer,
    "int | None": flags.DEFINE_integer,
    "float": flags.DEFINE_float,
    "str": flags.DEFINE_string,
    "str | None": flags.DEFINE_string,
}
_FIELD_TYPES = {field.name: field.type for field in dataclasses.fields(config_lib.Config)}


def _define(name: str, help_text: str, choices: list[str] | None = None) -> None:
    """Defines the flag of setting `name`, of its field's type and `Config`'s default (an enum with `choices`)."""
    if choices is not None:
        flags.DEFINE_enum(name, getattr(_D, name), choices, help_text)
    else:
        _DEFINE[_FIELD_TYPES[name]](name, getattr(_D, name), help_text)


# ---------------------------------------------------------------- the reference's flags (tf2/run.py)
_define("learning_rate", "Base learning rate (per 256 examples with linear scaling).")
_define("learning_rate_scaling", "How the rate scales with the batch.", ["linear", "sqrt"])
_define("warmup_epochs", "Epochs of linear learning-rate warmup.")
_define("weight_decay", "Weight decay.")
_define("batch_norm_decay", "Batch norm moving-average momentum.")
_define("train_batch_size", "Global training batch size.")
_define("train_split", "Split to train on: any tensorflow-datasets split string (train, train[:10%], ...).")
_define("train_epochs", "Training epochs (when --train_steps is 0).")
_define("train_steps", "Training steps; 0: N * train_epochs // batch + 1.")
_define("eval_steps", "Evaluation batches; 0: the whole eval split.")
_define("eval_batch_size", "Global evaluation batch size.")
_define("checkpoint_epochs", "Epochs between checkpoints and summaries.")
_define("checkpoint_steps", "Steps between checkpoints and summaries; wins over epochs unless 0.")
_define(
    "eval_split", "Split to evaluate on: any tensorflow-datasets split string (validation, test[50%:], ...)."
)
_define(
    "dataset",
    "Dataset: any tensorflow-datasets image classification name, optionally with a config and version "
    f"(imagenet2012_subset/1pct, cifar10:3.0.2), e.g. {', '.join(experiment.KNOWN_DATASETS)} "
    "(shapes and synthetic are generated offline).",
)
_define("cache_dataset", "Keep the decoded dataset in memory (small datasets).")
_define("mode", "What to do.", ["train", "eval", "train_then_eval"])
_define("train_mode", "Contrastive pretraining or supervised finetuning.", ["pretrain", "finetune"])
_define("lineareval_while_pretraining", "Train a linear probe on stop-gradient features while pretraining.")
_define(
    "checkpoint",
    "With --train_mode=finetune: a pretraining run's checkpoint (or its checkpoints directory) to "
    "initialise the encoder and the projection layers below --ft_proj_selector from.",
)
_define("zero_init_logits_layer", "Finetune mode: the supervised head starts at zero.")
_define(
    "fine_tune_after_block",
    "Finetune mode: freeze the encoder up to this block group (0: the stem, 4: all of it: only the "
    "heads train); -1 fine-tunes every layer.",
)
_define("master", "TPU address used when --tpu_name is not given.")
_define("model_dir", "Checkpoints, TensorBoard files and result.json (reruns resume).")
_define("data_dir", "tensorflow-datasets data directory.")
_define("use_tpu", "Train on a TPU (the reference's default; --use_tpu=False otherwise).")
_define("tpu_name", "TPU name or grpc:// address.")
_define("tpu_zone", "Not supported by tftrain: give the TPU's address as --tpu_name.")
_define("gcp_project", "Not supported by tftrain: give the TPU's address as --tpu_name.")
_define("optimizer", "Optimizer.", ["momentum", "adam", "lars"])
_define("momentum", "Momentum of LARS and SGD.")
_define("eval_name", "A name for the evaluation, recorded in result.json.")
_define("keep_checkpoint_max", "Checkpoints kept in --model_dir.")
_define(
    "keep_hub_module_max",
    "Encoder SavedModels kept in --model_dir/saved_model (one per evaluation); 0: export none.",
)
_define("temperature", "NT-Xent temperature.")
_define("hidden_norm", "L2-normalize projections in the contrastive loss.")
_define("proj_head_mode", "Projection head.", ["none", "linear", "nonlinear"])
_define("proj_out_dim", "Projection output size.")
_define("num_proj_layers", "Layers of a nonlinear projection head.")
_define(
    "ft_proj_selector",
    "Projection layer whose output feeds the probe and finetuning: 0 none (the encoder's output), "
    "-1 the last layer.",
)
_define("global_bn", "Batch norm statistics over all replicas.")
_define("width_multiplier", "ResNet width multiplier (fractional: tftrain's).")
_define("resnet_depth", "ResNet depth: 18, 34, 50, 101, 152 or 200.")
_define("sk_ratio", "> 0: selective kernels (SimCLRv2; e.g. 0.0625).")
_define("se_ratio", "> 0: squeeze-and-excitation in each block.")
_define("image_size", "Input image size (after cropping).")
_define("color_jitter_strength", "Colour distortion strength.")
_define("use_blur", "Random Gaussian blur in pretraining.")

# ---------------------------------------------------------------- tftrain's flags
flags.DEFINE_string(
    "recipe",
    None,
    f"Defaults for a purpose: one of {', '.join(config_lib.RECIPES)}. Default: cpu_demo without "
    "--dataset, reference with it. Flags given on the command line win.",
)
_define("loop", "tftrain.Trainer.fit or keras Model.fit (same train_step).", ["trainer", "fit"])
_define("num_train_examples", "Use only this many training examples.")
_define("num_eval_examples", "Use only this many evaluation examples.")
_define("min_crop_area", "Smallest random crop, as a fraction of the image area.")
_define("cifar_stem", "Small-image stem (default: image_size <= 32, as the reference).")
_define("linear_eval", "After training, score linear probes on the frozen trained and random encoders.")
_define(
    "train_summary_steps",
    "Also write training summaries every this many steps; 0: with each checkpoint (as the TF2 reference).",
)
_define("eval_timeout_s", "--mode=eval: seconds to wait for the next checkpoint of --model_dir.")
_define("use_gpu", "Train on the visible GPUs (default: when any is visible and not --use_tpu).")
_define("num_cpu_devices", "Split the CPU into this many replicas.")
_define("seed", "Random seed.")
_define("verbose", "0 silent, 1 progress bars, 2 one line per epoch.")


# ---------------------------------------------------------------- the Trainer's other options (tftrain.flags)
trainer_flags.define_trainer_flags(
    exclude=[*config_lib.TRAINER_OPTIONS_SET_BY, *config_lib.RUN_ARGUMENTS_SET_BY],
    # The program's `model_dir` for the Trainer flags' parse-time check (many options need one);
    # --keep_checkpoint_max and --train_summary_steps are checked with the rest of the configuration.
    program_values=lambda: config_lib.checkable({"model_dir": FLAGS["model_dir"].value}),
)
for _name, _default in config_lib.PROGRAM_TRAINER_DEFAULTS.items():
    FLAGS.set_default(_name, str(_default))


def resolve_flags() -> config_lib.Resolved:
    """The parsed flags resolved: the command line over the recipe over the defaults."""
    given = {name: FLAGS[name].value for name in config_lib.Config.field_names() if FLAGS[name].present}
    trainer_options = {  # the Trainer flags given (`trainer_kwargs` also reads the program's --model_dir)
        name: value
        for name, value in trainer_flags.trainer_kwargs().items()
        if name in config_lib.TRAINER_FLAGS and FLAGS[name].present
    }
    return config_lib.resolve(given, FLAGS.recipe, trainer_options=trainer_options)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    try:
        resolved = resolve_flags()  # validated before any data is read
    except ValueError as error:
        raise app.UsageError(str(error)) from None
    print(resolved.describe(), flush=True)
    config = resolved.config
    try:
        result = experiment.run(config, hparams=trainer_flags.program_hparams())
    except experiment.FlagValueError as error:
        raise app.UsageError(str(error)) from None
    except tftrain.evaluation.EvaluationTimeoutError as error:
        raise SystemExit(
            f"SimCLR --mode=eval stopped waiting: {error} Expected --model_dir of a running or finished "
            "training run with the same step flags (--train_steps, --train_epochs, --train_batch_size, "
            "--num_train_examples); a longer --eval_timeout_s waits longer."
        ) from None
    print(experiment.summary_line(result))


def run_main() -> None:
    app.run(main)


if __name__ == "__main__":
    run_main()
