"""SimCLR pretraining, finetuning and evaluation: `python -m tftrain.examples.simclr`.

Flags follow google-research/simclr's TF2 `run.py`. The defaults run offline on
2 CPU cores in minutes: the generated `shapes` dataset, a narrow ResNet-18 and
a short schedule. For CIFAR-10 as in the paper:

    python -m tftrain.examples.simclr --dataset=cifar10 --use_gpu \\
        --train_batch_size=512 --train_epochs=1000 --learning_rate=1.0 \\
        --weight_decay=1e-4 --temperature=0.5 --width_multiplier=1 \\
        --model_dir=/tmp/simclr_cifar10

Only `main` reads flags; it validates them all before any data is read and
passes plain values to `run` (see `experiment.py`).
"""

from __future__ import annotations

from absl import app, flags

import tftrain
from tftrain.examples.simclr import experiment

FLAGS = flags.FLAGS
_DEFAULTS = experiment.Config()  # one source of defaults: the plain Config

flags.DEFINE_enum("mode", _DEFAULTS.mode, ["train", "eval", "train_then_eval"], "What to do.")
flags.DEFINE_enum(
    "train_mode",
    _DEFAULTS.train_mode,
    ["pretrain", "finetune"],
    "Contrastive pretraining or supervised finetuning.",
)
flags.DEFINE_enum(
    "loop", _DEFAULTS.loop, ["trainer", "fit"], "tftrain.Trainer.fit or keras Model.fit (same train_step)."
)
flags.DEFINE_string("dataset", _DEFAULTS.dataset, f"Dataset: one of {', '.join(experiment.KNOWN_DATASETS)}.")
flags.DEFINE_string("data_dir", _DEFAULTS.data_dir, "tensorflow-datasets data directory.")
flags.DEFINE_string("train_split", _DEFAULTS.train_split, "Split to train on.")
flags.DEFINE_string("eval_split", _DEFAULTS.eval_split, "Split to evaluate on.")
flags.DEFINE_integer(
    "num_train_examples",
    _DEFAULTS.num_train_examples,
    "Use only this many training examples (default: the split).",
)
flags.DEFINE_integer(
    "num_eval_examples",
    _DEFAULTS.num_eval_examples,
    "Use only this many evaluation examples (default: the split).",
)
flags.DEFINE_integer("image_size", _DEFAULTS.image_size, "Input image size (after cropping).")
flags.DEFINE_integer("train_batch_size", _DEFAULTS.train_batch_size, "Global training batch size.")
flags.DEFINE_integer("eval_batch_size", _DEFAULTS.eval_batch_size, "Global evaluation batch size.")
flags.DEFINE_integer(
    "train_epochs", _DEFAULTS.train_epochs, "Training epochs (ignored when --train_steps is not 0)."
)
flags.DEFINE_integer(
    "train_steps", _DEFAULTS.train_steps, "Training steps; wins over --train_epochs unless 0 (the default)."
)
flags.DEFINE_float("warmup_epochs", _DEFAULTS.warmup_epochs, "Epochs of linear learning-rate warmup.")
flags.DEFINE_float(
    "learning_rate", _DEFAULTS.learning_rate, "Base learning rate (per 256 examples with linear scaling)."
)
flags.DEFINE_enum(
    "learning_rate_scaling",
    _DEFAULTS.learning_rate_scaling,
    ["linear", "sqrt"],
    "How the rate scales with the batch size.",
)
flags.DEFINE_enum("optimizer", _DEFAULTS.optimizer, ["lars", "momentum", "adam"], "Optimizer.")
flags.DEFINE_float("momentum", _DEFAULTS.momentum, "Momentum of LARS and SGD.")
flags.DEFINE_float("weight_decay", _DEFAULTS.weight_decay, "Weight decay.")
flags.DEFINE_float("temperature", _DEFAULTS.temperature, "NT-Xent temperature.")
flags.DEFINE_bool("hidden_norm", _DEFAULTS.hidden_norm, "L2-normalize projections in the contrastive loss.")
flags.DEFINE_float("color_jitter_strength", _DEFAULTS.color_jitter_strength, "Colour distortion strength.")
flags.DEFINE_float(
    "min_crop_area", _DEFAULTS.min_crop_area, "Smallest random crop, as a fraction of the image area."
)
flags.DEFINE_bool(
    "use_blur", _DEFAULTS.use_blur, "Random Gaussian blur in pretraining (the paper uses it on ImageNet)."
)
flags.DEFINE_integer("resnet_depth", _DEFAULTS.resnet_depth, "ResNet depth: 18, 34 or 50.")
flags.DEFINE_float(
    "width_multiplier", _DEFAULTS.width_multiplier, "ResNet width multiplier (fractional for CPU runs)."
)
flags.DEFINE_bool("cifar_stem", _DEFAULTS.cifar_stem, "Small-image stem (default: image_size <= 64).")
flags.DEFINE_enum(
    "proj_head_mode", _DEFAULTS.proj_head_mode, ["none", "linear", "nonlinear"], "Projection head."
)
flags.DEFINE_integer("proj_out_dim", _DEFAULTS.proj_out_dim, "Projection output size.")
flags.DEFINE_integer("num_proj_layers", _DEFAULTS.num_proj_layers, "Layers of a nonlinear projection head.")
flags.DEFINE_integer(
    "ft_proj_selector",
    _DEFAULTS.ft_proj_selector,
    "Projection layer whose output feeds the probe and finetuning: 0 none (the encoder's output), "
    "-1 the last layer.",
)
flags.DEFINE_bool(
    "lineareval_while_pretraining",
    _DEFAULTS.lineareval_while_pretraining,
    "Train a linear probe on stop-gradient features.",
)
flags.DEFINE_bool(
    "linear_eval",
    _DEFAULTS.linear_eval,
    "After training, score linear probes on the frozen trained and random encoders.",
)
flags.DEFINE_bool(
    "zero_init_residual",
    _DEFAULTS.zero_init_residual,
    "Start residual blocks as identities (the reference does; slower in short runs).",
)
flags.DEFINE_bool("global_bn", _DEFAULTS.global_bn, "Batch norm statistics over all replicas.")
flags.DEFINE_string(
    "model_dir",
    _DEFAULTS.model_dir,
    "Checkpoints, TensorBoard files and result.json (resumes if it holds a run).",
)
flags.DEFINE_string(
    "checkpoint",
    _DEFAULTS.checkpoint,
    "With --train_mode=finetune: a pretraining run's checkpoint (or its checkpoints directory) to "
    "initialise the encoder and the projection layers below --ft_proj_selector from.",
)
flags.DEFINE_integer(
    "checkpoint_every_steps",
    _DEFAULTS.checkpoint_every_steps,
    "Also checkpoint every this many steps (default: epoch ends).",
)
flags.DEFINE_float(
    "eval_timeout_s",
    _DEFAULTS.eval_timeout_s,
    "--mode=eval: seconds to wait for the next checkpoint of --model_dir before giving up (tftrain's).",
)
flags.DEFINE_bool("use_gpu", _DEFAULTS.use_gpu, "Train on the visible GPUs (MirroredStrategy).")
flags.DEFINE_bool("use_tpu", _DEFAULTS.use_tpu, "Train on a TPU.")
flags.DEFINE_string("tpu_name", _DEFAULTS.tpu_name, "TPU name or grpc:// address.")
flags.DEFINE_integer(
    "num_cpu_devices",
    _DEFAULTS.num_cpu_devices,
    "Split the CPU into this many replicas (to try data parallelism).",
)
flags.DEFINE_enum(
    "mixed_precision",
    _DEFAULTS.mixed_precision,
    ["mixed_float16", "mixed_bfloat16"],
    "Mixed precision policy.",
)
flags.DEFINE_bool(
    "use_tf_function", _DEFAULTS.use_tf_function, "Run steps in tf.function (False: eagerly, for debugging)."
)
flags.DEFINE_integer("steps_per_loop", _DEFAULTS.steps_per_loop, "Training steps per host call.")
flags.DEFINE_integer("seed", _DEFAULTS.seed, "Random seed.")
flags.DEFINE_integer("verbose", _DEFAULTS.verbose, "0 silent, 1 progress bars, 2 one line per epoch.")


def config_from_flags() -> experiment.Config:
    """The experiment's plain configuration, from the parsed flags."""
    return experiment.Config(**{field: getattr(FLAGS, field) for field in experiment.Config.field_names()})


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    try:
        config = config_from_flags()  # validated before any data is read
    except ValueError as error:
        raise app.UsageError(str(error)) from None
    try:
        result = experiment.run(config)
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
