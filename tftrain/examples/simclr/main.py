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

from absl import app, flags

import tftrain
from tftrain import flags as trainer_flags
from tftrain.examples.simclr import config as config_lib
from tftrain.examples.simclr import experiment

FLAGS = flags.FLAGS
_D = config_lib.Config()  # one source of defaults: the reference's, and tftrain's for its own flags

# ---------------------------------------------------------------- the reference's flags (tf2/run.py)
flags.DEFINE_float(
    "learning_rate", _D.learning_rate, "Base learning rate (per 256 examples with linear scaling)."
)
flags.DEFINE_enum(
    "learning_rate_scaling",
    _D.learning_rate_scaling,
    ["linear", "sqrt"],
    "How the rate scales with the batch.",
)
flags.DEFINE_float("warmup_epochs", _D.warmup_epochs, "Epochs of linear learning-rate warmup.")
flags.DEFINE_float("weight_decay", _D.weight_decay, "Weight decay.")
flags.DEFINE_float("batch_norm_decay", _D.batch_norm_decay, "Batch norm moving-average momentum.")
flags.DEFINE_integer("train_batch_size", _D.train_batch_size, "Global training batch size.")
flags.DEFINE_string(
    "train_split",
    _D.train_split,
    "Split to train on: any tensorflow-datasets split string (train, train[:10%], ...).",
)
flags.DEFINE_integer("train_epochs", _D.train_epochs, "Training epochs (when --train_steps is 0).")
flags.DEFINE_integer("train_steps", _D.train_steps, "Training steps; 0: N * train_epochs // batch + 1.")
flags.DEFINE_integer("eval_steps", _D.eval_steps, "Evaluation batches; 0: the whole eval split.")
flags.DEFINE_integer("eval_batch_size", _D.eval_batch_size, "Global evaluation batch size.")
flags.DEFINE_integer("checkpoint_epochs", _D.checkpoint_epochs, "Epochs between checkpoints and summaries.")
flags.DEFINE_integer(
    "checkpoint_steps",
    _D.checkpoint_steps,
    "Steps between checkpoints and summaries; wins over epochs unless 0.",
)
flags.DEFINE_string(
    "eval_split",
    _D.eval_split,
    "Split to evaluate on: any tensorflow-datasets split string (validation, test[50%:], ...).",
)
flags.DEFINE_string(
    "dataset",
    _D.dataset,
    "Dataset: any tensorflow-datasets image classification name, optionally with a config and version "
    f"(imagenet2012_subset/1pct, cifar10:3.0.2), e.g. {', '.join(experiment.KNOWN_DATASETS)} "
    "(shapes and synthetic are generated offline).",
)
flags.DEFINE_bool("cache_dataset", _D.cache_dataset, "Keep the decoded dataset in memory (small datasets).")
flags.DEFINE_enum("mode", _D.mode, ["train", "eval", "train_then_eval"], "What to do.")
flags.DEFINE_enum(
    "train_mode", _D.train_mode, ["pretrain", "finetune"], "Contrastive pretraining or supervised finetuning."
)
flags.DEFINE_bool(
    "lineareval_while_pretraining",
    _D.lineareval_while_pretraining,
    "Train a linear probe on stop-gradient features while pretraining.",
)
flags.DEFINE_string(
    "checkpoint",
    _D.checkpoint,
    "With --train_mode=finetune: a pretraining run's checkpoint (or its checkpoints directory) to "
    "initialise the encoder and the projection layers below --ft_proj_selector from.",
)
flags.DEFINE_bool(
    "zero_init_logits_layer", _D.zero_init_logits_layer, "Finetune mode: the supervised head starts at zero."
)
flags.DEFINE_integer(
    "fine_tune_after_block",
    _D.fine_tune_after_block,
    "Finetune mode: freeze the encoder up to this block group (0: the stem, 4: all of it: only the "
    "heads train); -1 fine-tunes every layer.",
)
flags.DEFINE_string("master", _D.master, "TPU address used when --tpu_name is not given.")
flags.DEFINE_string(
    "model_dir", _D.model_dir, "Checkpoints, TensorBoard files and result.json (reruns resume)."
)
flags.DEFINE_string("data_dir", _D.data_dir, "tensorflow-datasets data directory.")
flags.DEFINE_bool(
    "use_tpu", _D.use_tpu, "Train on a TPU (the reference's default; --use_tpu=False otherwise)."
)
flags.DEFINE_string("tpu_name", _D.tpu_name, "TPU name or grpc:// address.")
flags.DEFINE_string(
    "tpu_zone", _D.tpu_zone, "Not supported by tftrain: give the TPU's address as --tpu_name."
)
flags.DEFINE_string(
    "gcp_project", _D.gcp_project, "Not supported by tftrain: give the TPU's address as --tpu_name."
)
flags.DEFINE_enum("optimizer", _D.optimizer, ["momentum", "adam", "lars"], "Optimizer.")
flags.DEFINE_float("momentum", _D.momentum, "Momentum of LARS and SGD.")
flags.DEFINE_string("eval_name", _D.eval_name, "A name for the evaluation, recorded in result.json.")
flags.DEFINE_integer("keep_checkpoint_max", _D.keep_checkpoint_max, "Checkpoints kept in --model_dir.")
flags.DEFINE_integer(
    "keep_hub_module_max",
    _D.keep_hub_module_max,
    "Encoder SavedModels kept in --model_dir/saved_model (one per evaluation); 0: export none.",
)
flags.DEFINE_float("temperature", _D.temperature, "NT-Xent temperature.")
flags.DEFINE_bool("hidden_norm", _D.hidden_norm, "L2-normalize projections in the contrastive loss.")
flags.DEFINE_enum("proj_head_mode", _D.proj_head_mode, ["none", "linear", "nonlinear"], "Projection head.")
flags.DEFINE_integer("proj_out_dim", _D.proj_out_dim, "Projection output size.")
flags.DEFINE_integer("num_proj_layers", _D.num_proj_layers, "Layers of a nonlinear projection head.")
flags.DEFINE_integer(
    "ft_proj_selector",
    _D.ft_proj_selector,
    "Projection layer whose output feeds the probe and finetuning: 0 none (the encoder's output), "
    "-1 the last layer.",
)
flags.DEFINE_bool("global_bn", _D.global_bn, "Batch norm statistics over all replicas.")
flags.DEFINE_float(
    "width_multiplier", _D.width_multiplier, "ResNet width multiplier (fractional: tftrain's)."
)
flags.DEFINE_integer("resnet_depth", _D.resnet_depth, "ResNet depth: 18, 34, 50, 101, 152 or 200.")
flags.DEFINE_float("sk_ratio", _D.sk_ratio, "> 0: selective kernels (SimCLRv2; e.g. 0.0625).")
flags.DEFINE_float("se_ratio", _D.se_ratio, "> 0: squeeze-and-excitation in each block.")
flags.DEFINE_integer("image_size", _D.image_size, "Input image size (after cropping).")
flags.DEFINE_float("color_jitter_strength", _D.color_jitter_strength, "Colour distortion strength.")
flags.DEFINE_bool("use_blur", _D.use_blur, "Random Gaussian blur in pretraining.")

# ---------------------------------------------------------------- tftrain's flags
flags.DEFINE_string(
    "recipe",
    None,
    f"Defaults for a purpose: one of {', '.join(config_lib.RECIPES)}. Default: cpu_demo without "
    "--dataset, reference with it. Flags given on the command line win.",
)
flags.DEFINE_enum(
    "loop", _D.loop, ["trainer", "fit"], "tftrain.Trainer.fit or keras Model.fit (same train_step)."
)
flags.DEFINE_integer("num_train_examples", _D.num_train_examples, "Use only this many training examples.")
flags.DEFINE_integer("num_eval_examples", _D.num_eval_examples, "Use only this many evaluation examples.")
flags.DEFINE_float(
    "min_crop_area", _D.min_crop_area, "Smallest random crop, as a fraction of the image area."
)
flags.DEFINE_bool(
    "cifar_stem", _D.cifar_stem, "Small-image stem (default: image_size <= 32, as the reference)."
)
flags.DEFINE_bool(
    "linear_eval",
    _D.linear_eval,
    "After training, score linear probes on the frozen trained and random encoders.",
)
flags.DEFINE_integer(
    "train_summary_steps",
    _D.train_summary_steps,
    "Also write training summaries every this many steps; 0: with each checkpoint (as the TF2 reference).",
)
flags.DEFINE_float(
    "eval_timeout_s",
    _D.eval_timeout_s,
    "--mode=eval: seconds to wait for the next checkpoint of --model_dir.",
)
flags.DEFINE_bool(
    "use_gpu", _D.use_gpu, "Train on the visible GPUs (default: when any is visible and not --use_tpu)."
)
flags.DEFINE_integer("num_cpu_devices", _D.num_cpu_devices, "Split the CPU into this many replicas.")
flags.DEFINE_integer("seed", _D.seed, "Random seed.")
flags.DEFINE_integer("verbose", _D.verbose, "0 silent, 1 progress bars, 2 one line per epoch.")


# ---------------------------------------------------------------- the Trainer's other options (tftrain.flags)
def _trainer_options_set_by_the_program() -> dict[str, object]:
    """The program's `model_dir` for the Trainer flags' parse-time check: many options need one.

    `--keep_checkpoint_max` and `--train_summary_steps` are checked with the
    rest of the configuration (`config_lib.resolve`), under their own names.
    """
    return config_lib.checkable({"model_dir": FLAGS["model_dir"].value})


trainer_flags.define_trainer_flags(
    exclude=[*config_lib.TRAINER_OPTIONS_SET_BY, *config_lib.RUN_ARGUMENTS_SET_BY],
    program_values=_trainer_options_set_by_the_program,
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
