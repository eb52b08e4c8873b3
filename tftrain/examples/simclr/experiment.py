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
import math
import os
import time
from collections.abc import Mapping
from typing import Any

import keras
import tensorflow as tf

import tftrain
from tftrain import data as data_lib
from tftrain import distribute
from tftrain.examples.simclr import config as config_lib
from tftrain.examples.simclr import evaluation, pipeline, schedule
from tftrain.examples.simclr import model as model_lib

# The configuration lives in config.py; these names stay importable from here.
Config = config_lib.Config
FlagValueError = config_lib.FlagValueError
KNOWN_DATASETS = config_lib.KNOWN_DATASETS


def warm_start(
    model: model_lib.SimCLRModel, checkpoint: str, *, zero_init_logits_layer: bool = False
) -> tftrain.checkpoint.WarmStartReport:
    """Initialises the whole model from another run's checkpoint, as the reference's `--checkpoint`.

    The reference restores `tf.train.Checkpoint(model=model)` with
    `expect_partial()` in any `--train_mode`: the encoder, the whole
    projection head and `head_supervised` (where the checkpoint has them),
    then zeroes `head_supervised` with `--zero_init_logits_layer`. The
    optimizer and the step start fresh.

    Args:
        model: A built `SimCLRModel` of the checkpointed run's architecture.
        checkpoint: A checkpoint path or a directory of checkpoints (its latest
            is used) written by a SimCLR run under tftrain.
        zero_init_logits_layer: Zero `head_supervised` after loading.

    Returns:
        What was loaded, as `tftrain.checkpoint.warm_start` reports it.

    Raises:
        FlagValueError: the checkpoint does not exist, cannot be read, or holds
            another architecture (each mismatched variable is named).
    """
    try:
        report = tftrain.checkpoint.warm_start(model, checkpoint)
    except (tftrain.checkpoint.CheckpointError, ValueError) as error:
        raise FlagValueError(
            f"--checkpoint={checkpoint} cannot initialise this model: {error} Expected a checkpoint of "
            "a SimCLR run with the same --resnet_depth, --width_multiplier, --cifar_stem, projection head "
            "and number of classes."
        ) from error
    if zero_init_logits_layer:
        for variable in model.supervised_head.trainable_weights:
            variable.assign(tf.zeros_like(variable))
    return report


def _steps_plan(config: Config, num_train_examples: int) -> tuple[int, int, int]:
    """(steps_per_epoch, epochs, total_steps) for the run, as the reference counts them.

    Total steps: `train_steps`, or when 0 `N * train_epochs // batch + 1`. The
    reference trains in loops of `checkpoint_steps` (or `checkpoint_epochs`
    passes of `round(N / batch)` steps) and checkpoints after each: each loop
    is one of the Trainer's epochs, the last one cut short at the total.
    """
    epoch_steps = int(round(num_train_examples / config.train_batch_size))
    if num_train_examples < config.train_batch_size:
        raise ValueError(
            f"--train_batch_size={config.train_batch_size} is larger than the {num_train_examples} training "
            "examples. Expected a smaller batch or more examples."
        )
    total = schedule.train_steps_of(
        num_train_examples, config.train_steps, config.train_epochs, config.train_batch_size
    )
    steps_per_epoch = min(config.checkpoint_steps or config.checkpoint_epochs * epoch_steps, total)
    return steps_per_epoch, math.ceil(total / steps_per_epoch), total


class _StopAtStep(keras.callbacks.Callback):
    """Stops `model.fit` at the run's total step (`Trainer.fit` does it with `total_steps`)."""

    def __init__(self, total_steps: int):
        super().__init__()
        self.total_steps = total_steps

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) >= self.total_steps:
            self.model.stop_training = True


def _optimizer(config: Config, learning_rate: Any) -> keras.optimizers.Optimizer:
    if config.optimizer == "lars":
        return model_lib.lars_optimizer(learning_rate, config.momentum, config.weight_decay)
    if config.optimizer == "momentum":
        return keras.optimizers.SGD(learning_rate, momentum=config.momentum, nesterov=True)
    return keras.optimizers.Adam(learning_rate)


def build_model(config: Config, num_classes: int) -> model_lib.SimCLRModel:
    """The SimCLR model, built (all variables created) for `config.image_size`."""
    finetune = config.train_mode == "finetune"
    model = model_lib.SimCLRModel(
        num_classes,
        resnet_depth=config.resnet_depth,
        width_multiplier=config.width_multiplier,
        cifar_stem=config.uses_cifar_stem,
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
        batch_norm_decay=config.batch_norm_decay,
        se_ratio=config.se_ratio,
        sk_ratio=config.sk_ratio,
        fine_tune_after_block=config.fine_tune_after_block if finetune else -1,
        zero_init_logits_layer=config.zero_init_logits_layer and finetune,
    )
    model.build_for(config.image_size)
    return model


def run(config: Config, *, hparams: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Runs the experiment; returns its results (also written to `model_dir/result.json`).

    Args:
        config: The experiment's settings.
        hparams: Values to record with the run (`tftrain.Trainer(hparams=...)`:
            the run record and TensorBoard's HParams tab), e.g. the
            program's flags and command line; used with a `model_dir`.
    """
    use_gpu = config.use_gpu
    if use_gpu is None:  # as the reference: MirroredStrategy over the visible GPUs unless on a TPU
        use_gpu = not config.use_tpu and bool(tf.config.list_physical_devices("GPU"))
    strategy = distribute.setup_strategy(
        use_gpu=use_gpu,
        use_tpu=config.use_tpu,
        tpu=config.tpu_name or config.master,
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
    if config.mode != "train":
        info.splits[config.eval_split]  # an unknown split fails here, before any training step
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
    trainer_options = config_lib.trainer_kwargs(config)
    steps_per_loop = trainer_options["steps_per_loop"]  # an int with --loop=fit (Config checks it)
    with strategy.scope():
        model = build_model(config, info.num_classes)
        model.compile(
            optimizer=_optimizer(config, learning_rate),
            steps_per_execution=steps_per_loop if isinstance(steps_per_loop, int) else 1,
        )
        model.optimizer.build(model.trainable_variables)
    results: dict[str, Any] = {}
    if config.checkpoint is not None:
        report = warm_start(model, config.checkpoint, zero_init_logits_layer=config.zero_init_logits_layer)
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
            cache_dataset=config.cache_dataset,
            data_dir=config.data_dir,
            num_examples=num_examples,
            repeat=training,
            seed=config.seed,
            num_replicas=replicas,
        )

    if hparams is not None and config.model_dir is not None:
        trainer_options["hparams"] = hparams
    trainer = tftrain.Trainer(model, strategy=strategy, **trainer_options)
    train_seconds = 0.0
    if config.mode in ("train", "train_then_eval"):
        train_data = dataset(
            config.train_split, training=True, num_examples=num_train, batch_size=config.train_batch_size
        )
        # The pipeline shuffles, seeded: `shuffle` would only warn.
        fit_args = dict(epochs=epochs, steps_per_epoch=steps_per_epoch, shuffle=False, verbose=config.verbose)
        start = time.perf_counter()
        if config.loop == "trainer":
            history = trainer.fit(train_data, total_steps=total_steps, **fit_args)
            results["timing"] = trainer.timing.to_dict() if trainer.timing else None
        else:
            model.run_eagerly = not trainer.options.use_tf_function
            callbacks = []
            if config.model_dir:
                callbacks = tftrain.callbacks.standard_callbacks(
                    config.model_dir,
                    summary_every_steps=trainer.run_options.summary_every_steps,
                    profile_steps=trainer.run_options.profile_steps,
                    max_to_keep=trainer.run_options.max_to_keep,
                )
            callbacks.append(_StopAtStep(total_steps))
            history = model.fit(train_data, callbacks=callbacks, **fit_args)
        train_seconds = time.perf_counter() - start
        results["train_logs"] = {key: float(values[-1]) for key, values in history.history.items() if values}
        results["global_step"] = int(model.optimizer.iterations.numpy())
    results["train_seconds"] = round(train_seconds, 1)
    if config.mode in ("eval", "train_then_eval"):
        eval_steps = config.eval_steps or None  # 0: the whole eval split, as the reference
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
                    steps=eval_steps,
                    verbose=config.verbose,
                )
            )
        elif config.mode == "eval":  # no probe to score: the linear evaluation of the newest checkpoint
            results["restored"] = evaluation.restore_latest(model, config.model_dir)
            results["global_step"] = int(model.optimizer.iterations.numpy())
        elif model.uses_probe:
            logs = trainer.evaluate(eval_data, steps=eval_steps, verbose=config.verbose, return_dict=True)
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
    chief = distribute.worker_role(strategy)[0]
    if config.model_dir and chief and config.keep_hub_module_max and "global_step" in results:
        if config.mode != "train":
            results["saved_model"] = export_saved_model(
                model, config.model_dir, results["global_step"], config.keep_hub_module_max
            )
    if config.model_dir and chief:
        write_results(config.model_dir, results)
    return results


def write_results(model_dir: str, results: dict[str, Any]) -> None:
    """Writes `result.json`, `result_<global_step>.json` and `flags.json`, as the reference does.

    The reference writes its flags' values to `flags.json` beside the results;
    here they are the run's `Config` (`results["config"]`), the same names.
    """
    tf.io.gfile.makedirs(model_dir)
    names = ["result.json"]
    if "global_step" in results:
        names.append(f"result_{results['global_step']}.json")
    for name in names:
        with tf.io.gfile.GFile(os.path.join(model_dir, name), "w") as file:
            json.dump(results, file, indent=2, sort_keys=True)
    with tf.io.gfile.GFile(os.path.join(model_dir, "flags.json"), "w") as file:
        json.dump(results["config"], file, indent=2, sort_keys=True)


class SalientTensors(tf.Module):
    """The reference's SavedModel: `module(images, trainable)` -> its named tensors.

    As google-research/simclr's `build_saved_model`: called on float images
    `[batch, height, width, 3]` in [0, 1] with `trainable` True or False, it
    returns `block_group1`..`block_group4`, `initial_conv`,
    `initial_max_pool`, `final_avg_pool` (the encoder's features),
    `proj_head_input`, `proj_head_output` and `logits_sup`;
    `trainable_variables_list` holds the model's trainable variables.
    """

    def __init__(self, model: model_lib.SimCLRModel):
        super().__init__(name="simclr")
        encoder = model.encoder
        stem = "stem_pool" if "stem_pool" in {layer.name for layer in encoder.layers} else None
        groups = {}
        for layer in encoder.layers:  # in graph order: each group's last block's output wins
            if layer.name.startswith("group") and layer.name.endswith("_out"):
                groups[f"block_group{layer.name[5]}"] = layer.output
        outputs = {
            "initial_conv": encoder.get_layer("stem_batch_normalization_relu").output,
            "initial_max_pool": encoder.get_layer(stem or "stem_batch_normalization_relu").output,
            **groups,
            "final_avg_pool": encoder.output,
        }
        self.encoder = keras.Model(encoder.input, outputs, name="salient_encoder")
        self.projection_head = model.projection_head
        self.supervised_head = model.supervised_head
        # Named as the reference's: `trainable_variables` is tf.Module's own property.
        self.trainable_variables_list = model.trainable_variables

    @tf.function
    def __call__(self, inputs, trainable):
        tensors = dict(self.encoder(inputs, training=trainable))
        hidden = tensors["final_avg_pool"]
        projection, probe_input = self.projection_head(hidden, training=trainable)
        tensors.update(
            proj_head_input=hidden, proj_head_output=projection, logits_sup=self.supervised_head(probe_input)
        )
        return tensors


def export_saved_model(model: model_lib.SimCLRModel, model_dir: str, step: int, keep: int) -> str:
    """Exports the model as the reference does, to `model_dir/saved_model/<step>`, keeping the newest `keep`.

    The SavedModel is `SalientTensors(model)` with the reference's two
    signatures (`trainable` True and False, images of any size), written after
    each evaluation (`--keep_hub_module_max`). Returns the export's path.
    """
    module = SalientTensors(model)
    spec = tf.TensorSpec([None, None, None, 3], tf.float32)
    for trainable in (True, False):
        module.__call__.get_concrete_function(spec, trainable=trainable)
    export_dir = os.path.join(model_dir, "saved_model")
    path = os.path.join(export_dir, str(step))
    if tf.io.gfile.exists(path):
        tf.io.gfile.rmtree(path)
    tf.saved_model.save(module, path)
    steps = sorted(
        int(name.strip("/")) for name in tf.io.gfile.listdir(export_dir) if name.strip("/").isdigit()
    )
    for old in steps[:-keep]:
        tf.io.gfile.rmtree(os.path.join(export_dir, str(old)))
    return path


def summary_line(results: dict[str, Any]) -> str:
    """One line a person reads at the end of a run."""
    parts = [f"global_step={results['global_step']}", f"train_seconds={results['train_seconds']}"]
    for key in ("label_top_1_accuracy", "linear_eval_top_1", "random_encoder_linear_eval_top_1"):
        if key in results:
            parts.append(f"{key}={results[key]:.4f}")
    return "SimCLR: " + ", ".join(parts)
