"""One SimCLR experiment from a plain configuration: strategy, data, model, training, evaluation.

`run(Config(...))` is what `python -m tftrain.examples.simclr` does after
parsing its flags; it returns (and writes to `model_dir/result.json`) the
results: the global step, the probe's top-1/top-5 accuracy on the eval split,
linear-evaluation accuracies of the trained and of a random encoder, timings,
and the configuration.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import keras
import tensorflow as tf

import tftrain
from tftrain import data as data_lib
from tftrain import distribute
from tftrain.examples.simclr import evaluation, lars, pipeline, schedule
from tftrain.examples.simclr import model as model_lib

KNOWN_DATASETS = data_lib.KNOWN_DATASETS
MIN_IMAGE_SIZE = 16  # the random crop and the ResNet's strides need room


class FlagValueError(ValueError):
    """A setting that `run` finds wrong once it sees the devices or the checkpoint (before any data)."""


@dataclasses.dataclass(frozen=True)
class Config:
    """An experiment's settings; see `main.py`'s flags for each one's meaning."""

    mode: str = "train_then_eval"
    train_mode: str = "pretrain"
    loop: str = "trainer"
    dataset: str = "shapes"
    data_dir: str | None = None
    train_split: str = "train"
    eval_split: str = "test"
    num_train_examples: int | None = None
    num_eval_examples: int | None = None
    image_size: int = 32
    train_batch_size: int = 256
    eval_batch_size: int = 256
    train_epochs: int = 10
    train_steps: int = 0
    warmup_epochs: float = 1
    learning_rate: float = 1.0
    learning_rate_scaling: str = "linear"
    optimizer: str = "lars"
    momentum: float = 0.9
    weight_decay: float = 1e-4
    temperature: float = 0.5
    hidden_norm: bool = True
    color_jitter_strength: float = 1.0
    use_blur: bool = False
    min_crop_area: float = 0.35
    resnet_depth: int = 18
    width_multiplier: float = 0.125
    cifar_stem: bool | None = None
    proj_head_mode: str = "nonlinear"
    proj_out_dim: int = 128
    num_proj_layers: int = 2
    ft_proj_selector: int = 0
    lineareval_while_pretraining: bool = True
    linear_eval: bool = True
    global_bn: bool = False
    zero_init_residual: bool = False
    model_dir: str | None = None
    checkpoint: str | None = None
    checkpoint_every_steps: int | None = None
    eval_timeout_s: float = 3600.0
    use_gpu: bool = False
    use_tpu: bool = False
    tpu_name: str | None = None
    num_cpu_devices: int | None = None
    mixed_precision: str | None = None
    use_tf_function: bool = True
    steps_per_loop: int = 1
    seed: int = 0
    verbose: int = 1

    @classmethod
    def field_names(cls) -> list[str]:
        return [field.name for field in dataclasses.fields(cls)]

    def __post_init__(self):
        if self.use_gpu and self.use_tpu:
            raise ValueError("--use_gpu and --use_tpu contradict each other: pass one of them.")
        if self.num_cpu_devices is not None and (self.use_gpu or self.use_tpu):
            raise ValueError(
                "--num_cpu_devices splits the CPU; it cannot be combined with --use_gpu or --use_tpu."
            )
        if self.dataset not in KNOWN_DATASETS:
            raise ValueError(
                f"Unknown --dataset={self.dataset!r}. Known datasets: {', '.join(KNOWN_DATASETS)} "
                "(shapes and synthetic are generated offline)."
            )
        if self.image_size < MIN_IMAGE_SIZE:
            raise ValueError(
                f"--image_size={self.image_size} is too small for SimCLR's random crop and the ResNet. "
                f"Expected at least {MIN_IMAGE_SIZE}."
            )
        for name in ("train_batch_size", "eval_batch_size", "train_epochs", "steps_per_loop", "proj_out_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name}={getattr(self, name)}: expected an integer >= 1.")
        if self.train_steps is not None and self.train_steps < 0:
            raise ValueError(
                f"--train_steps={self.train_steps}: expected an integer >= 1, or 0 (the default) to "
                "train for --train_epochs."
            )
        if self.width_multiplier <= 0:
            raise ValueError(f"--width_multiplier={self.width_multiplier}: expected a number > 0.")
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


def _check_checkpoint_flag(config: Config) -> None:
    if config.train_mode != "finetune" or config.mode == "eval":
        raise ValueError(
            f"--checkpoint={config.checkpoint} initialises fine-tuning from a pretraining run, but "
            f"--train_mode={config.train_mode} --mode={config.mode} does not fine-tune. Expected "
            "--train_mode=finetune with --mode=train or train_then_eval, or no --checkpoint."
        )
    path = config.checkpoint
    if not (tf.io.gfile.isdir(path) or tf.io.gfile.exists(path + ".index")):
        raise ValueError(
            f"--checkpoint={path} does not exist. Expected a checkpoint path of a pretraining run "
            "(`<model_dir>/checkpoints/ckpt-N`) or a directory of checkpoints (`<model_dir>/checkpoints`)."
        )


def warm_start(model: model_lib.SimCLRModel, checkpoint: str) -> tftrain.checkpoint.WarmStartReport:
    """Initialises the encoder, and the projection layers below the probe, from a pretraining run.

    As the reference's `--checkpoint`: fine-tuning starts from the pretrained
    network up to the probe's input (`ft_proj_selector`); the probe and the
    optimizer start fresh.

    Args:
        model: A built `SimCLRModel` of the pretraining run's architecture.
        checkpoint: A checkpoint path or a directory of checkpoints (its latest
            is used) written by a SimCLR run under tftrain.

    Returns:
        What was loaded, as `tftrain.checkpoint.warm_start` reports it.

    Raises:
        FlagValueError: the checkpoint does not exist, cannot be read, or holds
            another architecture (each mismatched variable is named).
    """
    targets = {"model/encoder": model.encoder}
    for name, layer in model.projection_head.layers_below_probe().items():
        targets[f"model/projection_head/{name}"] = layer
    try:
        return tftrain.checkpoint.warm_start(targets, checkpoint)
    except (tftrain.checkpoint.CheckpointError, ValueError) as error:
        raise FlagValueError(
            f"--checkpoint={checkpoint} cannot initialise this model: {error} Expected a checkpoint of "
            "a pretraining run with the same --resnet_depth, --width_multiplier, --cifar_stem and "
            "projection head."
        ) from error


def _steps_plan(config: Config, num_train_examples: int) -> tuple[int, int, int]:
    """(steps_per_epoch, epochs, total_steps) for the run.

    `train_steps` 0 (or None) means: train for `train_epochs`. With
    `train_steps`, epochs are made of the largest number of steps that
    divides `train_steps` and fits in one pass, so training stops exactly there.
    """
    steps_per_pass = num_train_examples // config.train_batch_size
    if steps_per_pass < 1:
        raise ValueError(
            f"--train_batch_size={config.train_batch_size} is larger than the {num_train_examples} training "
            "examples. Expected a smaller batch or more examples."
        )
    if not config.train_steps:
        return steps_per_pass, config.train_epochs, steps_per_pass * config.train_epochs
    steps_per_epoch = max(
        d for d in range(1, min(steps_per_pass, config.train_steps) + 1) if config.train_steps % d == 0
    )
    return steps_per_epoch, config.train_steps // steps_per_epoch, config.train_steps


def _optimizer(config: Config, learning_rate: Any) -> keras.optimizers.Optimizer:
    if config.optimizer == "lars":
        return lars.LARS(
            learning_rate,
            momentum=config.momentum,
            weight_decay=config.weight_decay,
            exclude_from_weight_decay=model_lib.LARS_EXCLUDE_FROM_WEIGHT_DECAY,
            exclude_from_layer_adaptation=model_lib.LARS_EXCLUDE_FROM_LAYER_ADAPTATION,
        )
    if config.optimizer == "momentum":
        return keras.optimizers.SGD(learning_rate, momentum=config.momentum, nesterov=True)
    return keras.optimizers.Adam(learning_rate)


def build_model(config: Config, num_classes: int) -> model_lib.SimCLRModel:
    """The SimCLR model, built (all variables created) for `config.image_size`."""
    cifar_stem = config.image_size <= 64 if config.cifar_stem is None else config.cifar_stem
    model = model_lib.SimCLRModel(
        num_classes,
        resnet_depth=config.resnet_depth,
        width_multiplier=config.width_multiplier,
        cifar_stem=cifar_stem,
        proj_head_mode=config.proj_head_mode,
        proj_out_dim=config.proj_out_dim,
        num_proj_layers=config.num_proj_layers,
        ft_proj_selector=config.ft_proj_selector,
        train_mode=config.train_mode,
        lineareval_while_pretraining=config.lineareval_while_pretraining,
        temperature=config.temperature,
        hidden_norm=config.hidden_norm,
        weight_decay=config.weight_decay,
        lars_handles_decay=config.optimizer == "lars",
        sync_batch_norm=config.global_bn,
        zero_init_residual=config.zero_init_residual,
    )
    model.build_for(config.image_size)
    return model


def run(config: Config) -> dict[str, Any]:
    """Runs the experiment; returns its results (also written to `model_dir/result.json`)."""
    strategy = distribute.setup_strategy(
        use_gpu=config.use_gpu,
        use_tpu=config.use_tpu,
        tpu=config.tpu_name,
        num_cpu_devices=config.num_cpu_devices,
    )
    replicas = strategy.num_replicas_in_sync
    for name in ("train_batch_size", "eval_batch_size"):
        if getattr(config, name) % replicas:
            raise FlagValueError(
                f"--{name}={getattr(config, name)} does not split over {replicas} replicas. Expected a "
                f"multiple of {replicas}."
            )
    keras.utils.set_random_seed(config.seed)
    info = data_lib.info(config.dataset, data_dir=config.data_dir, image_size=config.image_size)
    num_train = info.splits[config.train_split]
    if config.num_train_examples is not None:
        num_train = min(num_train, config.num_train_examples)
    steps_per_epoch, epochs, total_steps = _steps_plan(config, num_train)
    learning_rate = schedule.WarmUpAndCosineDecay(
        config.learning_rate,
        num_train,
        config.train_batch_size,
        train_steps=total_steps,
        warmup_epochs=config.warmup_epochs,
        learning_rate_scaling=config.learning_rate_scaling,
    )
    with strategy.scope():
        model = build_model(config, info.num_classes)
        model.compile(optimizer=_optimizer(config, learning_rate), steps_per_execution=config.steps_per_loop)
        model.optimizer.build(model.trainable_variables)
    results: dict[str, Any] = {}
    if config.checkpoint is not None:
        report = warm_start(model, config.checkpoint)
        print(report.summary())
        results["warm_start"] = {"checkpoint": report.checkpoint, "loaded": len(report.loaded)}

    def dataset(split, *, training, num_examples, batch_size):
        return pipeline.build_dataset(
            config.dataset,
            split,
            batch_size=batch_size,
            image_size=config.image_size,
            is_training=training,
            train_mode=config.train_mode,
            color_jitter_strength=config.color_jitter_strength,
            use_blur=config.use_blur,
            min_crop_area=config.min_crop_area,
            data_dir=config.data_dir,
            num_examples=num_examples,
            repeat=training,
            seed=config.seed,
        )

    trainer = tftrain.Trainer(
        model,
        strategy=strategy,
        use_tf_function=config.use_tf_function,
        steps_per_loop=config.steps_per_loop,
        model_dir=config.model_dir,
        checkpoint_every_steps=config.checkpoint_every_steps,
        mixed_precision=config.mixed_precision,
    )
    train_seconds = 0.0
    if config.mode in ("train", "train_then_eval"):
        train_data = dataset(
            config.train_split, training=True, num_examples=num_train, batch_size=config.train_batch_size
        )
        start = time.perf_counter()
        if config.loop == "trainer":
            history = trainer.fit(
                train_data, epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=config.verbose
            )
            results["timing"] = trainer.timing.to_dict() if trainer.timing else None
        else:
            model.run_eagerly = not config.use_tf_function
            callbacks = tftrain.callbacks.standard_callbacks(config.model_dir) if config.model_dir else []
            history = model.fit(
                train_data,
                epochs=epochs,
                steps_per_epoch=steps_per_epoch,
                callbacks=callbacks,
                verbose=config.verbose,
            )
        train_seconds = time.perf_counter() - start
        results["train_logs"] = {key: float(values[-1]) for key, values in history.history.items() if values}
        results["global_step"] = int(model.optimizer.iterations.numpy())
    results["train_seconds"] = round(train_seconds, 1)
    if config.mode in ("eval", "train_then_eval"):
        eval_data = dataset(
            config.eval_split,
            training=False,
            num_examples=config.num_eval_examples,
            batch_size=config.eval_batch_size,
        )
        if config.mode == "eval" and model.uses_probe:
            results.update(
                evaluation.evaluate_checkpoints(
                    trainer,
                    eval_data,
                    model_dir=config.model_dir,
                    last_step=total_steps,
                    timeout_s=config.eval_timeout_s,
                    verbose=config.verbose,
                )
            )
        elif config.mode == "eval":  # no probe to score: the linear evaluation of the newest checkpoint
            results["restored"] = evaluation.restore_latest(model, config.model_dir)
            results["global_step"] = int(model.optimizer.iterations.numpy())
        elif model.uses_probe:
            logs = trainer.evaluate(eval_data, verbose=config.verbose)
            results.update(evaluation.reference_results(model, logs, results["global_step"]))
        if config.linear_eval:
            train_eval = dataset(
                config.train_split, training=False, num_examples=num_train, batch_size=config.eval_batch_size
            )

            def random_encoder():
                keras.utils.set_random_seed(config.seed)
                return build_model(config, info.num_classes).encoder

            results.update(
                evaluation.linear_eval(model.encoder, random_encoder, train_eval, eval_data, info.num_classes)
            )
    results["config"] = dataclasses.asdict(config)
    if config.model_dir and distribute.worker_role(strategy)[0]:
        tf.io.gfile.makedirs(config.model_dir)
        with tf.io.gfile.GFile(os.path.join(config.model_dir, "result.json"), "w") as file:
            json.dump(results, file, indent=2, sort_keys=True)
    return results


def summary_line(results: dict[str, Any]) -> str:
    """One line a person reads at the end of a run."""
    parts = [f"global_step={results['global_step']}", f"train_seconds={results['train_seconds']}"]
    for key in ("label_top_1_accuracy", "linear_eval_top_1", "random_encoder_linear_eval_top_1"):
        if key in results:
            parts.append(f"{key}={results[key]:.4f}")
    return "SimCLR: " + ", ".join(parts)
