"""tftrain.checkpoint.warm_start: initialise an encoder from another run's checkpoint."""

import logging
import types

import keras
import numpy as np
import pytest

import tftrain
from tftrain import checkpoint as checkpoint_lib

# Dense kernel, bias; BatchNormalization gamma, beta, mean, variance; Dense kernel, bias.
ENCODER_VARIABLES = 8


class Net(keras.Model):
    """An `encoder` and a head kept as attributes: the checkpoint names them so."""

    def __init__(self, width=8, out=4, classes=3, head="head", **kwargs):
        super().__init__(**kwargs)
        self.encoder = keras.Sequential(
            [
                keras.layers.Dense(width, activation="relu"),
                keras.layers.BatchNormalization(),
                keras.layers.Dense(out),
            ],
            name="encoder",
        )
        self.head_name = head
        setattr(self, head, keras.layers.Dense(classes))

    def call(self, x, training=False):
        return getattr(self, self.head_name)(self.encoder(x, training=training))


def built(model, seed=5):
    keras.utils.set_random_seed(seed)
    model(np.zeros((1, 6), "float32"))
    return model


def values(variables):
    return [np.array(variable.numpy()) for variable in variables]


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def data(classes, seed=0):
    rng = np.random.RandomState(seed)
    return rng.rand(16, 6).astype("float32"), rng.randint(0, classes, 16).astype("int32")


def compiled(model):
    model.compile(
        optimizer=keras.optimizers.Adam(0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A run of two epochs of two steps: checkpoints ckpt-2 and ckpt-4 in model_dir/checkpoints."""
    model_dir = tmp_path_factory.mktemp("pretrain")
    model = compiled(built(Net(), seed=1))
    after_first_epoch = {}

    class Snapshot(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            after_first_epoch.setdefault("encoder", values(model.encoder.weights))

    x, y = data(3)
    tftrain.Trainer(model, model_dir=str(model_dir)).fit(
        x, y, epochs=2, batch_size=8, verbose=0, callbacks=[Snapshot()]
    )
    return types.SimpleNamespace(
        checkpoints=str(model_dir / "checkpoints"),
        model_dir=str(model_dir),
        model=model,
        encoder=values(model.encoder.weights),
        encoder_after_first_epoch=after_first_epoch["encoder"],
    )


def test_the_encoder_is_loaded_bit_for_bit_and_the_new_head_is_untouched(pretrained, caplog):
    model = built(Net(classes=5, head="classifier"))
    head = values(model.classifier.weights)
    with caplog.at_level(logging.INFO, logger="tftrain"):
        report = checkpoint_lib.warm_start(model.encoder, pretrained.checkpoints, source="model/encoder")

    assert_same(values(model.encoder.weights), pretrained.encoder)
    assert_same(values(model.classifier.weights), head)
    assert report.checkpoint.endswith("ckpt-4")  # a directory: its latest checkpoint
    assert list(report.loaded) == [variable.path for variable in model.encoder.weights]
    assert len(report.loaded) == ENCODER_VARIABLES
    assert all(path.startswith("model/encoder/") for path in report.loaded.values())
    assert report.not_loaded == report.skipped == report.unused == ()
    assert "loaded 8 variables" in caplog.text
    with pytest.raises(TypeError):
        report.loaded["x"] = "y"  # the report is frozen


def test_a_whole_model_reports_what_was_and_was_not_loaded_and_never_the_optimizer(pretrained):
    model = compiled(built(Net(classes=5, head="classifier")))
    model.optimizer.build(model.trainable_variables)
    optimizer_state = values(model.optimizer.variables)

    report = checkpoint_lib.warm_start(model, pretrained.checkpoints)  # source="model"

    assert list(report.loaded) == [variable.path for variable in model.encoder.weights]
    assert report.not_loaded == tuple(variable.path for variable in model.classifier.weights)
    assert report.unused == ("model/head/_kernel", "model/head/bias")
    assert_same(values(model.optimizer.variables), optimizer_state)  # no slots, no iteration count
    assert "not loaded  " + model.classifier.bias.path in report.summary()


def test_a_head_of_another_width_is_refused_by_name_unless_skipped(pretrained):
    model = built(Net(classes=5))  # the same attribute name `head`, 5 classes instead of 3
    before = values(model.weights)
    with pytest.raises(checkpoint_lib.IncompatibleCheckpointError) as error:
        checkpoint_lib.warm_start(model, pretrained.checkpoints)
    message = str(error.value)
    assert f"`{model.head.kernel.path}` (checkpoint `model/head/_kernel`)" in message
    assert "(4, 3) in the checkpoint but (4, 5) in the model" in message
    assert "nothing was loaded" in message
    assert_same(values(model.weights), before)

    report = checkpoint_lib.warm_start(model, pretrained.checkpoints, skip="head")
    assert report.skipped == tuple(variable.path for variable in model.head.weights)
    assert len(report.loaded) == ENCODER_VARIABLES and report.not_loaded == ()
    assert_same(values(model.encoder.weights), pretrained.encoder)
    assert_same(values(model.head.weights), before[-2:])


def test_an_encoder_of_another_width_changes_nothing(pretrained):
    model = built(Net(out=5))  # the first Dense and the BatchNormalization would fit; the last does not
    before = values(model.weights)
    with pytest.raises(checkpoint_lib.IncompatibleCheckpointError) as error:
        checkpoint_lib.warm_start(model.encoder, pretrained.checkpoints, source="model/encoder")
    message = str(error.value)
    last = model.encoder.layers[-1]
    assert (
        f"`{last.kernel.path}`" in message and "(8, 4) in the checkpoint but (8, 5) in the model" in message
    )
    assert f"`{last.bias.path}`" in message and "(4,) in the checkpoint but (5,) in the model" in message
    assert model.encoder.layers[0].kernel.path not in message
    assert_same(values(model.weights), before)


def test_a_dict_maps_several_targets_from_a_chosen_checkpoint(pretrained):
    model = built(Net())
    head_kernel = values([model.head.kernel])
    path = f"{pretrained.checkpoints}/ckpt-2"
    report = checkpoint_lib.warm_start(
        {"model/encoder": model.encoder, "model/head/bias": model.head.bias}, path
    )

    assert report.checkpoint == path
    assert_same(values(model.encoder.weights), pretrained.encoder_after_first_epoch)
    assert not np.array_equal(model.encoder.weights[0].numpy(), pretrained.encoder[0])
    assert report.loaded[model.head.bias.path] == "model/head/bias"
    assert len(report.loaded) == ENCODER_VARIABLES + 1
    assert_same(values([model.head.kernel]), head_kernel)


def test_checkpoints_that_do_not_exist(pretrained, tmp_path):
    model = built(Net())
    with pytest.raises(checkpoint_lib.CheckpointError, match="which does not exist"):
        checkpoint_lib.warm_start(model, str(tmp_path / "nope" / "ckpt-3"))
    with pytest.raises(checkpoint_lib.CheckpointError, match="No checkpoint in"):
        checkpoint_lib.warm_start(model, str(tmp_path))
    with pytest.raises(checkpoint_lib.CheckpointError, match="a tftrain `model_dir`"):
        checkpoint_lib.warm_start(model, pretrained.model_dir)
    with pytest.raises(TypeError, match="Invalid value for argument `checkpoint`"):
        checkpoint_lib.warm_start(model, 3)


@pytest.mark.parametrize(
    "arguments, error, message",
    [
        # The encoder against the whole saved model: nothing shares a name.
        (
            dict(target="encoder"),
            ValueError,
            r"no variable of `encoder`.*there: encoder, head.*'model/encoder'",
        ),
        (
            dict(target="encoder", source="model/encodr"),
            ValueError,
            r"no object `encodr` under `model`.*encoder",
        ),
        (dict(target="encoder", source="modle"), ValueError, r"at its top level; there it has: .*model"),
        (dict(target={"model/encoder": "encoder", "model/hed": "head"}), ValueError, r"the key 'model/hed'"),
        (dict(target={"model": "model"}, source="model"), ValueError, "Expected source=None"),
        (dict(target="model", source="optimizer"), ValueError, "never warm-started"),
        (dict(target="model", skip=["encoder", "haed"]), ValueError, r"\['haed'\] match no target variable"),
        (dict(target="model", skip="*"), ValueError, "excludes every matched variable"),
        (dict(target="model", skip=[3]), TypeError, "Invalid value for argument `skip`"),
        (dict(target="unbuilt"), ValueError, "not built"),
    ],
)
def test_bad_maps_are_clear_errors_and_change_nothing(pretrained, arguments, error, message):
    model = built(Net())
    objects = {"model": model, "encoder": model.encoder, "head": model.head, "unbuilt": Net()}
    target = arguments.pop("target")
    target = {k: objects[v] for k, v in target.items()} if isinstance(target, dict) else objects[target]
    before = values(model.weights)
    with pytest.raises(error, match=message):
        checkpoint_lib.warm_start(target, pretrained.checkpoints, **arguments)
    assert_same(values(model.weights), before)


def test_fit_trains_from_the_warm_start_and_a_rerun_resumes_its_own_checkpoint(pretrained, tmp_path):
    """The documented order: warm-start, then fit; rerun the same script and the run's checkpoint wins."""
    x, y = data(5, seed=1)
    model_dir = str(tmp_path / "finetune")

    def run():
        model = compiled(built(Net(classes=5, head="classifier"), seed=3))
        checkpoint_lib.warm_start(model.encoder, pretrained.checkpoints, source="model/encoder")
        first_batch = []

        class FirstBatch(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                if not first_batch:
                    first_batch.append(values(model.encoder.weights))

        history = tftrain.Trainer(model, model_dir=model_dir).fit(
            x, y, epochs=2, batch_size=8, verbose=0, callbacks=[FirstBatch()]
        )
        return model, first_batch, history

    model, first_batch, _ = run()
    assert_same(first_batch[0], pretrained.encoder)  # training started from the pretrained encoder
    trained = values(model.weights)
    assert not np.array_equal(trained[0], pretrained.encoder[0])

    rerun, first_batch, history = run()  # the same script again: fit restores model_dir's checkpoint
    assert first_batch == [] and history.history.get("loss", []) == []  # nothing left to train
    assert_same(values(rerun.weights), trained)
