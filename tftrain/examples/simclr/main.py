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

from tftrain.examples.simclr import experiment

FLAGS = flags.FLAGS

flags.DEFINE_enum("mode", "train_then_eval", ["train", "eval", "train_then_eval"], "What to do.")
flags.DEFINE_enum(
    "train_mode", "pretrain", ["pretrain", "finetune"], "Contrastive pretraining or supervised finetuning."
)
flags.DEFINE_enum(
    "loop", "trainer", ["trainer", "fit"], "tftrain.Trainer.fit or keras Model.fit (same train_step)."
)
flags.DEFINE_string("dataset", "shapes", f"Dataset: one of {', '.join(experiment.KNOWN_DATASETS)}.")
flags.DEFINE_string("data_dir", None, "tensorflow-datasets data directory.")
flags.DEFINE_string("train_split", "train", "Split to train on.")
flags.DEFINE_string("eval_split", "test", "Split to evaluate on.")
flags.DEFINE_integer("num_train_examples", None, "Use only this many training examples (default: the split).")
flags.DEFINE_integer(
    "num_eval_examples", None, "Use only this many evaluation examples (default: the split)."
)
flags.DEFINE_integer("image_size", 32, "Input image size (after cropping).")
flags.DEFINE_integer("train_batch_size", 256, "Global training batch size.")
flags.DEFINE_integer("eval_batch_size", 256, "Global evaluation batch size.")
flags.DEFINE_integer("train_epochs", 12, "Training epochs (ignored when --train_steps is given).")
flags.DEFINE_integer("train_steps", None, "Training steps; wins over --train_epochs.")
flags.DEFINE_float("warmup_epochs", 1, "Epochs of linear learning-rate warmup.")
flags.DEFINE_float("learning_rate", 1.0, "Base learning rate (per 256 examples with linear scaling).")
flags.DEFINE_enum(
    "learning_rate_scaling", "linear", ["linear", "sqrt"], "How the rate scales with the batch size."
)
flags.DEFINE_enum("optimizer", "lars", ["lars", "momentum", "adam"], "Optimizer.")
flags.DEFINE_float("momentum", 0.9, "Momentum of LARS and SGD.")
flags.DEFINE_float("weight_decay", 1e-4, "Weight decay.")
flags.DEFINE_float("temperature", 0.5, "NT-Xent temperature.")
flags.DEFINE_bool("hidden_norm", True, "L2-normalize projections in the contrastive loss.")
flags.DEFINE_float("color_jitter_strength", 0.5, "Colour distortion strength.")
flags.DEFINE_bool("use_blur", False, "Random Gaussian blur in pretraining (the paper uses it on ImageNet).")
flags.DEFINE_integer("resnet_depth", 18, "ResNet depth: 18, 34 or 50.")
flags.DEFINE_float("width_multiplier", 0.25, "ResNet width multiplier (fractional for CPU runs).")
flags.DEFINE_bool("cifar_stem", None, "Small-image stem (default: image_size <= 64).")
flags.DEFINE_enum("proj_head_mode", "nonlinear", ["none", "linear", "nonlinear"], "Projection head.")
flags.DEFINE_integer("proj_out_dim", 128, "Projection output size.")
flags.DEFINE_integer("num_proj_layers", 2, "Layers of a nonlinear projection head.")
flags.DEFINE_integer("ft_proj_selector", 0, "Projection layer whose input feeds the probe.")
flags.DEFINE_bool("lineareval_while_pretraining", True, "Train a linear probe on stop-gradient features.")
flags.DEFINE_bool(
    "linear_eval", True, "After training, score linear probes on the frozen trained and random encoders."
)
flags.DEFINE_bool("global_bn", False, "Batch norm statistics over all replicas.")
flags.DEFINE_string(
    "model_dir", None, "Checkpoints, TensorBoard files and result.json (resumes if it holds a run)."
)
flags.DEFINE_integer(
    "checkpoint_every_steps", None, "Also checkpoint every this many steps (default: epoch ends)."
)
flags.DEFINE_bool("use_gpu", False, "Train on the visible GPUs (MirroredStrategy).")
flags.DEFINE_bool("use_tpu", False, "Train on a TPU.")
flags.DEFINE_string("tpu_name", None, "TPU name or grpc:// address.")
flags.DEFINE_integer(
    "num_cpu_devices", None, "Split the CPU into this many replicas (to try data parallelism)."
)
flags.DEFINE_enum("mixed_precision", None, ["mixed_float16", "mixed_bfloat16"], "Mixed precision policy.")
flags.DEFINE_bool("use_tf_function", True, "Run steps in tf.function (False: eagerly, for debugging).")
flags.DEFINE_integer("steps_per_loop", 1, "Training steps per host call.")
flags.DEFINE_integer("seed", 0, "Random seed.")
flags.DEFINE_integer("verbose", 1, "0 silent, 1 progress bars, 2 one line per epoch.")


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
    result = experiment.run(config)
    print(experiment.summary_line(result))


def run_main() -> None:
    app.run(main)


if __name__ == "__main__":
    run_main()
