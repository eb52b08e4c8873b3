"""The SimCLR program's flags as google-research/simclr's TF2 run.py: defaults, README commands, recipes, model."""

import os
import shlex

import keras
import numpy as np
import pytest
import tensorflow as tf
import test_simclr_program  # the tiny sizes, on the path as a sibling test module
from absl import app

from tftrain.examples.simclr import config as config_lib
from tftrain.examples.simclr import experiment, main

TINY = test_simclr_program.TINY

# google-research/simclr tf2/run.py's 48 flags and their defaults, as written there.
REFERENCE_DEFAULTS = {
    "learning_rate": 0.3,
    "learning_rate_scaling": "linear",
    "warmup_epochs": 10,
    "weight_decay": 1e-6,
    "batch_norm_decay": 0.9,
    "train_batch_size": 512,
    "train_split": "train",
    "train_epochs": 100,
    "train_steps": 0,
    "eval_steps": 0,
    "eval_batch_size": 256,
    "checkpoint_epochs": 1,
    "checkpoint_steps": 0,
    "eval_split": "validation",
    "dataset": "imagenet2012",
    "cache_dataset": False,
    "mode": "train",
    "train_mode": "pretrain",
    "lineareval_while_pretraining": True,
    "checkpoint": None,
    "zero_init_logits_layer": False,
    "fine_tune_after_block": -1,
    "master": None,
    "model_dir": None,
    "data_dir": None,
    "use_tpu": True,
    "tpu_name": None,
    "tpu_zone": None,
    "gcp_project": None,
    "optimizer": "lars",
    "momentum": 0.9,
    "eval_name": None,
    "keep_checkpoint_max": 5,
    "keep_hub_module_max": 1,
    "temperature": 0.1,
    "hidden_norm": True,
    "proj_head_mode": "nonlinear",
    "proj_out_dim": 128,
    "num_proj_layers": 3,
    "ft_proj_selector": 0,
    "global_bn": True,
    "width_multiplier": 1,
    "resnet_depth": 50,
    "sk_ratio": 0.0,
    "se_ratio": 0.0,
    "image_size": 224,
    "color_jitter_strength": 1.0,
    "use_blur": True,
}

# The reference README's (tf2/README.md) pretraining commands, with tftrain's module name.
CIFAR10_COMMAND = (
    "--train_mode=pretrain --train_batch_size=512 --train_epochs=1000 --learning_rate=1.0 "
    "--weight_decay=1e-4 --temperature=0.5 --dataset=cifar10 --image_size=32 --eval_split=test "
    "--resnet_depth=18 --use_blur=False --color_jitter_strength=0.5 --model_dir=/tmp/simclr_test --use_tpu=False"
)
CIFAR10_VALUES = dict(
    train_mode="pretrain",
    train_batch_size=512,
    train_epochs=1000,
    learning_rate=1.0,
    weight_decay=1e-4,
    temperature=0.5,
    dataset="cifar10",
    image_size=32,
    eval_split="test",
    resnet_depth=18,
    use_blur=False,
    color_jitter_strength=0.5,
    model_dir="/tmp/simclr_test",
    use_tpu=False,
)
IMAGENET_COMMAND = (
    "--train_mode=pretrain --train_batch_size=4096 --train_epochs=100 --temperature=0.1 "
    "--learning_rate=0.075 --learning_rate_scaling=sqrt --weight_decay=1e-4 --dataset=imagenet2012 "
    "--image_size=224 --eval_split=validation --data_dir=gs://bucket/tensorflow_datasets "
    "--model_dir=gs://bucket/simclr --use_tpu=True --tpu_name=my-tpu --train_summary_steps=0"
)
IMAGENET_VALUES = dict(
    train_mode="pretrain",
    train_batch_size=4096,
    train_epochs=100,
    temperature=0.1,
    learning_rate=0.075,
    learning_rate_scaling="sqrt",
    weight_decay=1e-4,
    dataset="imagenet2012",
    image_size=224,
    eval_split="validation",
    data_dir="gs://bucket/tensorflow_datasets",
    model_dir="gs://bucket/simclr",
    use_tpu=True,
    tpu_name="my-tpu",
)


def tiny(**overrides):
    return experiment.Config(**{**TINY, **overrides})


resolved = test_simclr_program.parsed


def test_every_reference_flag_exists_with_its_default():
    assert sorted(config_lib.REFERENCE_FLAGS) == sorted(REFERENCE_DEFAULTS)
    for name, default in REFERENCE_DEFAULTS.items():
        assert main.FLAGS[name].default == default, name


@pytest.mark.parametrize(
    "command, given",
    [(CIFAR10_COMMAND, CIFAR10_VALUES), (IMAGENET_COMMAND, IMAGENET_VALUES)],
    ids=["cifar10", "imagenet"],
)
def test_the_readme_commands_resolve_to_the_reference_configuration(command, given):
    result = resolved(*shlex.split(command))
    assert result.recipe == "reference"
    expected = {**REFERENCE_DEFAULTS, **given}
    assert {name: getattr(result.config, name) for name in expected} == expected
    for name in REFERENCE_DEFAULTS:
        assert result.sources[name] == ("command line" if name in given else "reference default"), name
    assert result.config.uses_cifar_stem == (result.config.image_size <= 32)


def test_no_dataset_means_the_cpu_demo_recipe_and_the_command_line_wins():
    result = resolved("--train_epochs=3")
    assert result.recipe == "cpu_demo"
    assert result.config.dataset == "shapes" and result.sources["dataset"] == "recipe cpu_demo"
    assert result.config.train_epochs == 3 and result.sources["train_epochs"] == "command line"
    assert result.sources["temperature"] == "recipe cpu_demo"
    assert result.sources["num_proj_layers"] == "reference default"
    assert result.sources["loop"] == "tftrain default"
    text = result.describe()
    assert text.startswith("SimCLR configuration (--recipe=cpu_demo:")
    assert "train_epochs" in text and "(command line)" in text and "(recipe cpu_demo)" in text


def test_bad_recipes_are_clear_errors_from_main_before_any_data():
    for argv, message in [
        (["--recipe=nope"], "recipe='nope'. Expected one of reference, cpu_demo"),
        (["--recipe=cpu_demo", "--dataset=cifar10"], "--dataset=cifar10 contradicts --recipe=cpu_demo"),
        (["--recipe=cpu_demo", "--use_tpu"], "--use_tpu=True contradicts --recipe=cpu_demo"),
    ]:
        main.FLAGS(["simclr", *argv])
        try:
            with pytest.raises(app.UsageError, match=message):
                main.main(["simclr"])
        finally:
            main.FLAGS.unparse_flags()
    assert resolved("--recipe=cpu_demo", "--dataset=shapes").config.dataset == "shapes"


def test_use_gpu_or_num_cpu_devices_given_turns_the_reference_default_use_tpu_off():
    assert resolved("--dataset=cifar10").config.use_tpu  # the reference's default
    for flag in ("--use_gpu", "--num_cpu_devices=2"):
        result = resolved("--dataset=cifar10", flag)
        assert result.recipe == "reference" and not result.config.use_tpu
        assert result.sources["use_tpu"] == f"off: {flag.split('=')[0]} given"
    assert not resolved("--dataset=cifar10", "--use_gpu", "--use_tpu=False").config.use_tpu
    assert resolved("--dataset=cifar10", "--nouse_gpu").config.use_tpu  # only a device asked for wins
    for argv, message in [
        (["--use_gpu", "--use_tpu=True"], "--use_gpu and --use_tpu=True contradict"),
        (["--num_cpu_devices=2", "--use_tpu"], "--num_cpu_devices splits the CPU"),
    ]:
        with pytest.raises(ValueError, match=message):
            resolved("--dataset=cifar10", *argv)


def test_the_use_gpu_command_starts_on_a_cpu_machine_with_a_no_gpu_warning(tmp_path):
    values = {k: v for k, v in TINY.items() if k not in ("use_gpu", "use_tpu")}
    flags = [f"--{key}={value}" for key, value in values.items()]
    completed = test_simclr_program.run_program(
        "--use_gpu", *flags, "--train_steps=1", f"--model_dir={tmp_path}"
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "use_gpu=True but TensorFlow sees no GPU, so training runs on the CPU" in completed.stderr
    assert (tmp_path / "result.json").exists()


def test_the_resolved_configuration_is_printed_at_start():
    flags = test_simclr_program.tiny_flags(num_cpu_devices=2, train_batch_size=15, train_steps=1)
    completed = test_simclr_program.run_program("--recipe=cpu_demo", *flags)
    assert completed.returncode != 0  # the uneven batch stops the run after the configuration is printed
    assert "SimCLR configuration (--recipe=cpu_demo:" in completed.stdout
    assert "train_batch_size" in completed.stdout and "15" in completed.stdout


def finetune_model(**overrides):
    keras.utils.set_random_seed(0)
    return experiment.build_model(tiny(train_mode="finetune", **overrides), 8)


def test_fine_tune_after_block_freezes_the_encoder_up_to_that_block():
    def trainable(model):
        return {v.path.split("/")[-2].split("_")[0] for v in model.encoder.trainable_variables}

    assert trainable(finetune_model()) == {"stem", "group1", "group2", "group3", "group4"}
    assert trainable(finetune_model(fine_tune_after_block=0)) == {"group1", "group2", "group3", "group4"}
    model = finetune_model(fine_tune_after_block=2)
    assert trainable(model) == {"group3", "group4"}
    heads = model.supervised_head.trainable_variables + model.projection_head.trainable_variables
    assert heads and all(v.trainable for v in heads)
    # As the reference under tf.keras 2 (whose frozen blocks hold batch norm layers that stay
    # trainable): frozen batch norms update their averages in training mode too, but their gamma and
    # beta are not trained.
    frozen = model.encoder.get_layer("group2_block1_batch_normalization_1")
    trained = model.encoder.get_layer("group3_block1_batch_normalization_1")
    before = frozen.moving_mean.numpy().copy(), trained.moving_mean.numpy().copy()
    model(np.random.RandomState(0).rand(4, 16, 16, 3).astype("float32"), training=True)
    assert not np.array_equal(frozen.moving_mean.numpy(), before[0])
    assert not np.array_equal(trained.moving_mean.numpy(), before[1])
    assert frozen.trainable and not frozen.trainable_weights and len(trained.trainable_weights) == 2
    # ... and normalize with the batch's statistics (tf.keras 2's frozen-block batch norm, checked with
    # the tf-keras package on the reference's BatchNormRelu inside a trainable=False block).
    x = np.random.RandomState(1).rand(4, 3, 3, frozen.gamma.shape[0]).astype("float32") * 3 + 1
    mean, variance = x.mean(axis=(0, 1, 2)), x.var(axis=(0, 1, 2))
    np.testing.assert_allclose(
        frozen(x, training=True),
        frozen.gamma.numpy() * (x - mean) / np.sqrt(variance + frozen.epsilon) + frozen.beta.numpy(),
        rtol=1e-4,
        atol=1e-4,
    )
    assert finetune_model(fine_tune_after_block=4).encoder.trainable_variables == []


def test_bad_fine_tune_after_block_is_refused():
    for value in (-2, 5):
        with pytest.raises(ValueError, match=f"--fine_tune_after_block={value}: expected -1"):
            tiny(train_mode="finetune", fine_tune_after_block=value)
    with pytest.raises(ValueError, match="Expected --train_mode=finetune"):
        tiny(fine_tune_after_block=2)


def test_head_initializers_and_batch_norm_as_the_reference():
    model = finetune_model(width_multiplier=0.125, proj_out_dim=64, batch_norm_decay=0.99)
    assert np.std(model.supervised_head.kernel.numpy()) == pytest.approx(0.01, rel=0.15)
    dense = model.projection_head.dense_layers[0].kernel.numpy()  # 64 x 64
    assert np.std(dense) == pytest.approx(0.01, rel=0.1) and abs(np.mean(dense)) < 0.002
    for norm in model.projection_head.norm_layers:
        assert norm.epsilon == 1e-5 and norm.momentum == 0.99 and not norm.synchronized
    synced = experiment.build_model(tiny(global_bn=True), 8)
    assert all(norm.synchronized for norm in synced.projection_head.norm_layers)
    zero = finetune_model(zero_init_logits_layer=True)
    assert not np.any(zero.supervised_head.kernel.numpy())


def test_lars_leaves_the_supervised_head_out_of_the_trust_ratio_and_decay():
    config = tiny(weight_decay=0.5)
    model = experiment.build_model(config, 8)
    optimizer = experiment._optimizer(config, 0.1)
    variables = model.trainable_variables
    optimizer.build(variables)
    before = {v.path: v.numpy().copy() for v in variables}
    optimizer.apply([keras.ops.ones_like(v) for v in variables], variables)
    steps = {v.path: before[v.path] - v.numpy() for v in variables}
    head = next(path for path in steps if "head_supervised" in path and path.endswith("kernel"))
    np.testing.assert_allclose(steps[head], 0.1, rtol=1e-6)  # the plain step: no trust ratio, no decay
    projection = next(path for path in steps if "proj_dense_0" in path)
    assert not np.allclose(steps[projection], 0.1)  # LARS's trust ratio and weight decay apply


def test_total_steps_are_the_reference_count_in_checkpoint_sized_epochs():
    config = experiment.Config(**{**TINY, "train_batch_size": 512, "train_epochs": 100})
    assert experiment._steps_plan(config, 1000) == (2, 98, 1000 * 100 // 512 + 1)
    every_7 = experiment.Config(
        **{**TINY, "train_batch_size": 512, "train_epochs": 100, "checkpoint_steps": 7}
    )
    assert experiment._steps_plan(every_7, 1000) == (7, 28, 196)


def test_checkpoint_steps_and_keep_checkpoint_max(tmp_path):
    config = experiment.Config(
        **TINY, train_steps=6, checkpoint_steps=2, keep_checkpoint_max=2, model_dir=str(tmp_path)
    )
    assert experiment.run(config)["global_step"] == 6
    kept = sorted(name for name in os.listdir(tmp_path / "checkpoints") if name.endswith(".index"))
    assert kept == ["ckpt-4.index", "ckpt-6.index"]


def test_se_and_sk_ratios_build_the_reference_blocks():
    se = experiment.build_model(tiny(width_multiplier=0.125, se_ratio=0.25), 8)
    assert se.encoder.get_layer("group1_block1_se_reduce").kernel.shape == (1, 1, 8, 2)
    assert se.encoder.get_layer("group4_block2_se_expand").kernel.shape == (1, 1, 16, 64)
    sk = experiment.build_model(tiny(resnet_depth=50, cifar_stem=False, sk_ratio=0.0625), 8)
    names = {layer.name for layer in sk.encoder.layers}
    assert {"group1_block1_conv2_sk_mix", "stem_conv_a", "group2_block1_projection_pool"} <= names
    features = sk.encoder(np.zeros([2, 32, 32, 3], np.float32), training=True)
    assert features.shape == (2, 4 * 32)


@pytest.mark.parametrize("cifar_stem", [True, False])
def test_the_saved_model_is_the_reference_s_and_keeps_the_newest(tmp_path, cifar_stem):
    model = experiment.build_model(tiny(cifar_stem=cifar_stem), 8)
    steps = (2, 4, 6) if cifar_stem else (6,)  # keeping the newest does not depend on the stem: tested once
    for step in steps:
        path = experiment.export_saved_model(model, str(tmp_path), step, keep=2)
    assert path == str(tmp_path / "saved_model" / "6")
    assert sorted(os.listdir(tmp_path / "saved_model")) == (["4", "6"] if cifar_stem else ["6"])
    loaded = tf.saved_model.load(path)
    images = np.random.RandomState(0).rand(2, 16, 16, 3).astype("float32")
    tensors = loaded(tf.constant(images), trainable=False)
    assert set(tensors) == {
        "initial_conv", "initial_max_pool", "block_group1", "block_group2", "block_group3",
        "block_group4", "final_avg_pool", "proj_head_input", "proj_head_output", "logits_sup",
    }  # fmt: skip
    projection, logits = model(images, training=False)
    np.testing.assert_allclose(tensors["logits_sup"], logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tensors["proj_head_output"], projection, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(tensors["final_avg_pool"], model.encoder(images), rtol=1e-5, atol=1e-5)
    assert tensors["block_group4"].shape[-1] == tensors["final_avg_pool"].shape[-1]
    assert (tensors["initial_max_pool"].shape == tensors["initial_conv"].shape) == cifar_stem
    assert len(loaded.trainable_variables_list) == len(model.trainable_variables)
    loaded(tf.constant(images), trainable=True)  # the reference's second signature


def test_tpu_zone_is_refused_clearly():
    with pytest.raises(ValueError, match="--tpu_zone=us-central1-b is not supported"):
        experiment.Config(**{**TINY, "use_tpu": True, "tpu_zone": "us-central1-b"})


# ------------------------------------------------ datasets and splits: any tfds name and split string


def test_any_tfds_name_and_split_string_resolve_as_the_reference_takes_them():
    config = resolved(
        "--dataset=imagenet2012_subset/1pct", "--train_split=train[:10%]", "--eval_split=validation[50%:]"
    ).config
    assert (config.dataset, config.train_split, config.eval_split) == (
        "imagenet2012_subset/1pct",
        "train[:10%]",
        "validation[50%:]",
    )
    # experiment.run's example count of a sliced split, as the reference's builder.info.splits[split].
    from tftrain import data as data_lib

    assert data_lib.info("cifar10").splits["train[:10%]"] == 5_000


def test_an_unknown_dataset_suggests_close_names_and_lists_the_known_ones():
    with pytest.raises(ValueError) as error:
        tiny(dataset="imagenet")
    message = str(error.value)
    assert message.startswith("Unknown --dataset='imagenet'.") and "Did you mean 'imagenet2012'" in message
    assert "Known datasets: cifar10" in message and "any tensorflow-datasets image classification" in message


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(eval_split="validation"), "--eval_split='validation' is not a split of --dataset=shapes"),
        (dict(train_split="train[:10%]"), "no slices: --num_train_examples reads fewer"),
    ],
)
def test_generated_datasets_keep_their_fixed_splits(overrides, message):
    with pytest.raises(ValueError, match=message.replace("[", "\\[")):
        tiny(**overrides)


def test_resolving_generated_dataset_flags_does_not_import_tensorflow_datasets():
    code = (
        "import sys\n"
        "from tftrain.examples.simclr import main\n"
        "main.FLAGS(['simclr', '--train_split=train', '--eval_split=test'])\n"
        "assert main.resolve_flags().config.dataset == 'shapes'\n"
        "assert 'tensorflow_datasets' not in sys.modules, 'imported at flag resolution'\n"
    )
    import subprocess
    import sys

    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})


def test_an_eval_split_the_dataset_lacks_fails_before_any_training_step(tmp_path):
    from tftrain import data as data_lib

    config = tiny(dataset="cifar10", eval_split="validation", mode="train_then_eval", model_dir=str(tmp_path))
    with pytest.raises(data_lib.UnknownSplitError, match="validation"):
        experiment.run(config)
    assert not (tmp_path / "checkpoints").exists() and not list(tmp_path.glob("*.json"))
