"""The Trainer against `model.fit`/`evaluate`/`predict`: same weights, History, predictions, hooks.

Every test runs Keras itself on a twin model and compares; the full callback
hook sequence (name, index, log keys, value types) must be identical.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from parity import (
    ENGINE_TRAINER,
    Recorder,
    compile_for,
    fit_both,
    history_close,
    same_events,
    same_hooks,
    weights_close,
)

import tftrain
from tftrain.compat import keras_internals

ENGINE_NAMES = ["eager", "graph", "xla", "loop3", "xla_loop3"]


def data(n=48, features=6, seed=0):
    rng = np.random.RandomState(seed)
    x = rng.rand(n, features).astype("float32")
    y = (x[:, 0] * 3).astype("int32").clip(0, 2)
    return x, y


def mlp(seed=1):
    def make():
        keras.utils.set_random_seed(seed)
        return keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)]
        )

    return make


def classifier_compile():
    return dict(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )


def check_all(result, atol=1e-5):
    keras_model, keras_history, keras_recorder, model, history, recorder = result
    weights_close(keras_model, model, atol=atol)
    history_close(keras_history.history, history.history)
    same_events(keras_recorder, recorder)


# ------------------------------------------------------------------ engines


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_every_engine_fit_matches_keras(engine):
    x, y = data()
    check_all(
        fit_both(
            mlp(),
            classifier_compile,
            engine,
            data_args=(x, y),
            fit_kwargs=dict(batch_size=8, epochs=2, shuffle=False, validation_data=(x[:24], y[:24])),
        )
    )


@pytest.mark.parametrize("engine", ENGINE_NAMES)
def test_every_engine_evaluate_and_predict_match_keras(engine):
    x, y = data()
    reference = mlp()()
    compile_for(reference, engine, classifier_compile())
    model = mlp()()
    model.compile(**classifier_compile())
    trainer = tftrain.Trainer(model, **ENGINE_TRAINER[engine])
    keras_recorder, recorder = Recorder(), Recorder()
    expected = reference.evaluate(x, y, batch_size=8, verbose=0, callbacks=[keras_recorder])
    got = trainer.evaluate(x, y, batch_size=8, verbose=0, callbacks=[recorder])
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert trainer.evaluate(x, y, batch_size=8, verbose=0, return_dict=True) == reference.evaluate(
        x, y, batch_size=8, verbose=0, return_dict=True
    )
    same_events(keras_recorder, recorder)
    keras_recorder, recorder = Recorder(), Recorder()
    np.testing.assert_allclose(
        trainer.predict(x, batch_size=8, verbose=0, callbacks=[recorder]),
        reference.predict(x, batch_size=8, verbose=0, callbacks=[keras_recorder]),
        rtol=1e-6,
    )
    same_hooks(keras_recorder, recorder)


# ------------------------------------------------------------------ inputs


def two_input_model():
    keras.utils.set_random_seed(2)
    a, b = keras.Input((6,), name="a"), keras.Input((2,), name="b")
    hidden = keras.layers.Dense(4, activation="relu")(keras.layers.Concatenate()([a, b]))
    return keras.Model(
        [a, b], [keras.layers.Dense(3, name="first")(hidden), keras.layers.Dense(1, name="second")(hidden)]
    )


def two_output_compile():
    return dict(
        optimizer=keras.optimizers.SGD(0.1),
        loss=[keras.losses.SparseCategoricalCrossentropy(from_logits=True), "mse"],
        metrics=[["accuracy"], ["mae"]],
    )


def test_dict_inputs_and_nested_lists_match_keras():
    x, y = data()
    extra = x[:, :2] * 2
    for inputs_ in ({"a": x, "b": extra}, [x, extra]):
        check_all(
            fit_both(
                two_input_model,
                two_output_compile,
                data_args=(inputs_, [y, x[:, :1]]),
                fit_kwargs=dict(batch_size=8, epochs=2, shuffle=False),
            )
        )


class RaggedSum(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(3)

    def call(self, x):
        if isinstance(x, tf.SparseTensor):
            x = tf.sparse.to_dense(x)
        elif isinstance(x, tf.RaggedTensor):
            x = x.to_tensor(shape=[None, 4])
        return self.dense(x)


def ragged_model():
    keras.utils.set_random_seed(3)
    model = RaggedSum()
    model(tf.zeros((1, 4)))
    return model


@pytest.mark.parametrize("kind", ["ragged", "sparse"])
def test_ragged_and_sparse_inputs_match_keras(kind):
    _, y = data(n=24)
    rows = [[float(i % 5)] * (1 + i % 4) for i in range(24)]
    ragged = tf.ragged.constant(rows)
    x = ragged if kind == "ragged" else tf.sparse.from_dense(ragged.to_tensor(shape=[None, 4]))
    check_all(
        fit_both(
            ragged_model,
            classifier_compile,
            data_args=(x, y),
            fit_kwargs=dict(batch_size=8, epochs=2, shuffle=False),
        )
    )


def test_tf_data_dataset_matches_keras():
    x, y = data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    check_all(
        fit_both(
            mlp(),
            classifier_compile,
            data_args=(dataset,),
            fit_kwargs=dict(epochs=2, validation_data=dataset),
        )
    )


def test_a_dataset_that_reshuffles_each_epoch_gets_keras_orders():
    x, y = data()

    def reshuffled():
        return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(48, seed=3).batch(8)

    check_all(
        fit_both(
            mlp(),
            classifier_compile,
            data_args=lambda: (reshuffled(),),
            fit_kwargs=dict(epochs=3, validation_data=reshuffled),  # fresh for each side
        )
    )


class Batches(keras.utils.PyDataset):
    """A PyDataset of the tiny data, 8 examples a batch (shape-stable, no shuffling)."""

    def __init__(self, x, y, **kwargs):
        super().__init__(**kwargs)
        self.x, self.y = x, y
        self.epoch_ends = 0

    def __len__(self):
        return len(self.x) // 8

    def __getitem__(self, index):
        part = slice(index * 8, (index + 1) * 8)
        return self.x[part], self.y[part]

    def on_epoch_end(self):
        self.epoch_ends += 1


@pytest.mark.parametrize(
    "options",
    [dict(), dict(workers=2), dict(workers=2, use_multiprocessing=True)],
    ids=["plain", "threads", "processes"],
)
def test_py_dataset_matches_keras(options):
    x, y = data()
    made = []

    def make_data():
        made.append((Batches(x, y, **options), Batches(x[:16], y[:16], **options)))
        return (made[-1][0],)

    check_all(
        fit_both(
            mlp(),
            classifier_compile,
            data_args=make_data,
            fit_kwargs=dict(epochs=2, shuffle=False, validation_data=lambda: made[-1][1]),
        )
    )
    (keras_train, keras_val), (train, val) = made
    # Keras resets its epoch iterators (on_epoch_end) before training and each validation too.
    assert (train.epoch_ends, val.epoch_ends) == (keras_train.epoch_ends, keras_val.epoch_ends)
    assert keras_train.epoch_ends == 3 and keras_val.epoch_ends == 4


def test_known_length_pass_that_steps_per_epoch_does_not_divide_matches_keras():
    x, y = data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)  # 6 batches, known
    with pytest.warns(UserWarning, match="ran out of data"):
        check_all(
            fit_both(
                mlp(), classifier_compile, data_args=(dataset,), fit_kwargs=dict(epochs=3, steps_per_epoch=4)
            )
        )


class StopAtBatch(keras.callbacks.Callback):
    def __init__(self, batch):
        super().__init__()
        self.batch = batch

    def on_train_batch_end(self, batch, logs=None):
        if batch >= self.batch:
            self.model.stop_training = True


@pytest.mark.parametrize("engine", ["eager", "graph", "loop3"])
def test_endless_data_without_steps_per_epoch_trains_until_a_callback_stops_it_as_keras(engine):
    x, y = data()
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat()  # never ends
    with pytest.warns(UserWarning, match="never ends"):
        result = fit_both(
            mlp(),
            classifier_compile,
            engine,
            data_args=(dataset,),
            fit_kwargs=dict(epochs=3),
            callbacks=lambda: [StopAtBatch(7)],
        )
    check_all(result)
    assert len(result[4].history["loss"]) == 1


def test_predict_with_dense_then_ragged_outputs_on_one_trainer():
    class Identity(keras.Model):
        def call(self, x):
            return x

    trainer = tftrain.Trainer(Identity(), steps_per_loop=2)
    dense = np.arange(10, dtype="float32").reshape(5, 2)
    np.testing.assert_array_equal(trainer.predict(dense, batch_size=2, verbose=0), dense)
    ragged = tf.ragged.constant([[1.0], [2.0, 3.0], [4.0]])
    predicted = trainer.predict(ragged, batch_size=2, verbose=0)
    assert isinstance(predicted, tf.RaggedTensor) and predicted.to_list() == ragged.to_list()


def test_python_generator_with_steps_matches_keras():
    x, y = data()

    def batches():
        while True:
            for start in range(0, 48, 8):
                yield x[start : start + 8], y[start : start + 8]

    check_all(
        fit_both(
            mlp(),
            classifier_compile,
            data_args=lambda: (batches(),),
            fit_kwargs=dict(epochs=2, steps_per_epoch=4),
        )
    )


def test_finite_generator_one_epoch_calls_the_hooks_fit_calls():
    x, y = data()

    def batches():
        for start in range(0, 48, 8):
            yield x[start : start + 8], y[start : start + 8]

    def run(fit):
        model, recorder = mlp()(), Recorder()
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", steps_per_execution=4)
        fit(model)(batches(), callbacks=[recorder], verbose=0)
        return model, [event[:2] for event in recorder.events]

    keras_model, under_fit = run(lambda model: model.fit)
    model, under_trainer = run(lambda model: tftrain.Trainer(model, steps_per_loop=4).fit)
    # Calls of 4 and 2 steps, then Keras's begin hook of a call that finds no batch.
    assert under_trainer == under_fit
    assert int(model.optimizer.iterations) == 6
    weights_close(keras_model, model)


@pytest.mark.parametrize("steps_per_loop", [1, 3])
def test_data_running_out_mid_epoch_calls_the_hooks_fit_calls(steps_per_loop):
    x, y = data()

    def run(fit):
        dataset = (
            tf.data.Dataset.from_tensor_slices((x, y)).batch(8).filter(lambda a, b: True)
        )  # unknown length
        model, recorder = mlp()(), Recorder()
        # SGD: its steps do not depend on `optimizer.iterations`, which Keras's one-step
        # call that finds no batch still increments (the Trainer counts the steps it ran).
        model.compile(
            optimizer="sgd", loss="sparse_categorical_crossentropy", steps_per_execution=steps_per_loop
        )
        with pytest.warns(UserWarning, match="ran out of data"):
            fit(model)(dataset, epochs=2, steps_per_epoch=10, callbacks=[recorder], verbose=0)
        return model, [event[:2] for event in recorder.events]

    keras_model, under_fit = run(lambda model: model.fit)
    model, under_trainer = run(lambda model: tftrain.Trainer(model, steps_per_loop=steps_per_loop).fit)
    assert under_trainer == under_fit  # hooks and indices, the begin of the call that finds no data too
    assert int(model.optimizer.iterations) == 12
    weights_close(keras_model, model)


# ------------------------------------------------------------------ fit arguments


@pytest.mark.parametrize(
    "fit_kwargs",
    [
        dict(sample_weight=np.linspace(0.1, 2.0, 48).astype("float32")),
        dict(class_weight={0: 0.5, 1: 2.0, 2: 1.0}),
        dict(validation_split=0.25),
        dict(validation_split=0.25, validation_freq=2, epochs=4),
        dict(validation_data="half", validation_freq=[1, 3], epochs=3),
        dict(initial_epoch=1, epochs=3),
        dict(validation_data="half", validation_batch_size=5),
        dict(steps_per_epoch=3, epochs=3),
        dict(validation_data="half", validation_steps=2),
        dict(shuffle=True, epochs=2),
    ],
    ids=[
        "sample_weight",
        "class_weight",
        "validation_split",
        "validation_freq",
        "validation_freq_list",
        "initial_epoch",
        "validation_batch_size",
        "steps_per_epoch",
        "validation_steps",
        "shuffle",
    ],
)
def test_fit_arguments_match_keras(fit_kwargs):
    x, y = data()
    fit_kwargs = dict(fit_kwargs)
    if fit_kwargs.get("validation_data") == "half":
        fit_kwargs["validation_data"] = (x[:24], y[:24])
    fit_kwargs.setdefault("shuffle", False)
    fit_kwargs.setdefault("epochs", 2)
    check_all(
        fit_both(mlp(), classifier_compile, data_args=(x, y), fit_kwargs=dict(batch_size=8, **fit_kwargs))
    )


def test_keyword_x_y_and_evaluate_sample_weight_match_keras():
    x, y = data()
    weights = np.linspace(0.1, 2.0, 48).astype("float32")
    result = fit_both(mlp(), classifier_compile, fit_kwargs=dict(x=x, y=y, batch_size=8, shuffle=False))
    check_all(result)
    keras_model, model = result[0], result[3]
    expected = keras_model.evaluate(
        x=x, y=y, sample_weight=weights, batch_size=8, verbose=0, return_dict=True
    )
    assert tftrain.Trainer(model).evaluate(
        x=x, y=y, sample_weight=weights, batch_size=8, verbose=0, return_dict=True
    ) == pytest.approx(expected, rel=1e-6)


def test_keras_config_limits_are_honoured():
    if not hasattr(keras.config, "set_max_epochs"):
        pytest.skip("keras.config.set_max_epochs needs Keras >= 3.10")
    x, y = data()
    keras.config.set_max_epochs(2)
    keras.config.set_max_steps_per_epoch(3)
    try:
        result = fit_both(
            mlp(), classifier_compile, data_args=(x, y), fit_kwargs=dict(batch_size=8, epochs=5)
        )
    finally:
        keras.config.set_max_epochs(None)
        keras.config.set_max_steps_per_epoch(None)
    check_all(result)
    assert len(result[4].history["loss"]) == 2 and int(result[3].optimizer.iterations) == 6


def test_a_keras_config_step_limit_above_the_data_is_only_a_cap():
    if not hasattr(keras.config, "set_max_steps_per_epoch"):
        pytest.skip("keras.config.set_max_steps_per_epoch needs Keras >= 3.10")
    x, y = data()
    keras.config.set_max_steps_per_epoch(100)
    try:
        result = fit_both(
            mlp(), classifier_compile, data_args=(x, y), fit_kwargs=dict(batch_size=8, epochs=2)
        )
        model = result[3]
        logs = tftrain.Trainer(model).evaluate(x, y, batch_size=8, verbose=0, return_dict=True)
        predictions = tftrain.Trainer(model).predict(x, batch_size=8, verbose=0)
    finally:
        keras.config.set_max_steps_per_epoch(None)
    weights_close(result[0], model)
    assert int(model.optimizer.iterations) == 12 and predictions.shape == (48, 3) and "loss" in logs


# ------------------------------------------------------------------ guide-style models


class GuideModel(keras.Model):
    """The Keras guide's style: own trackers, a `metrics` property, own train and test steps."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")

    def train_step(self, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = keras.losses.mean_squared_error(y, y_pred)
            if sample_weight is not None:
                loss = loss * sample_weight
            loss = tf.reduce_mean(loss)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        self.loss_tracker.update_state(loss)
        self.mae_metric.update_state(y, y_pred)
        return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        self.loss_tracker.update_state(tf.reduce_mean(keras.losses.mean_squared_error(y, y_pred)))
        self.mae_metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}

    @property
    def metrics(self):
        return [self.loss_tracker, self.mae_metric]


def guide_model():
    keras.utils.set_random_seed(4)
    inputs = keras.Input((6,))
    return GuideModel(inputs, keras.layers.Dense(1)(keras.layers.Dense(4, activation="relu")(inputs)))


def test_guide_style_model_with_own_steps_and_sample_weights_matches_keras():
    x, _ = data()
    y = x[:, :1] * 2
    weights = np.linspace(0.5, 1.5, 48).astype("float32")
    result = fit_both(
        guide_model,
        lambda: dict(optimizer=keras.optimizers.Adam(0.01)),
        data_args=(x, y),
        fit_kwargs=dict(batch_size=8, epochs=2, shuffle=False, sample_weight=weights, validation_data=(x, y)),
    )
    check_all(result)


class GuideTestStep(keras.Model):
    """The guide's "Providing your own evaluation step" model: compiled metrics, its own test_step."""

    def test_step(self, data):
        x, y = data
        y_pred = self(x, training=False)
        loss = self.compute_loss(y=y, y_pred=y_pred)
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


def test_own_test_step_with_compiled_metrics_evaluates_like_keras():
    x, _ = data()
    y = x[:, :1]
    results = []
    for side in ("keras", "trainer"):
        keras.utils.set_random_seed(5)
        inputs = keras.Input((6,))
        model = GuideTestStep(inputs, keras.layers.Dense(1)(inputs))
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
        if side == "keras":
            results.append(
                (model.evaluate(x, y, verbose=0, return_dict=True), model.evaluate(x, y, verbose=0))
            )
        else:
            trainer = tftrain.Trainer(model)
            results.append(
                (trainer.evaluate(x, y, verbose=0, return_dict=True), trainer.evaluate(x, y, verbose=0))
            )
    (keras_dict, keras_list), (trainer_dict, trainer_list) = results
    assert sorted(trainer_dict) == ["loss", "mae"] and all(
        isinstance(v, float) for v in trainer_dict.values()
    )
    # Keras 3.7 returned the nested `compile_metrics` dict unflattened; flatten it as Keras now does.
    keras_flat = keras_internals.pythonify_logs(keras_dict)
    assert trainer_dict == pytest.approx(keras_flat)
    assert trainer_list == pytest.approx([keras_flat["loss"], keras_flat["mae"]])
    if isinstance(keras_list, list) and all(isinstance(value, float) for value in keras_list):
        assert trainer_list == pytest.approx(keras_list)


def test_custom_model_matches_keras():
    x, y = data()

    def make():
        keras.utils.set_random_seed(6)
        inputs = keras.Input((6,))
        return tftrain.CustomModel(
            inputs, keras.layers.Dense(3)(keras.layers.Dense(8, activation="relu")(inputs))
        )

    check_all(
        fit_both(
            make, classifier_compile, "loop3", data_args=(x, y), fit_kwargs=dict(batch_size=8, shuffle=False)
        )
    )


def test_one_element_metric_results_arrive_as_keras_gives_them():
    class OneElementMetric(keras.metrics.SparseCategoricalAccuracy):
        def result(self):
            return tf.reshape(super().result(), [1])

    x, y = data()

    def compile_kwargs():
        return dict(
            optimizer="sgd",
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=[OneElementMetric(name="mean_one")],
        )

    result = fit_both(mlp(), compile_kwargs, data_args=(x, y), fit_kwargs=dict(batch_size=8, shuffle=False))
    check_all(result)  # the same value types in every hook
    assert type(result[4].history["mean_one"][0]) is type(result[1].history["mean_one"][0])


# ------------------------------------------------------------------ Keras callbacks


def regression_data(n=48, nan_at=None):
    x, _ = data(n)
    y = (x[:, :1] * 2 - x[:, 1:2]).astype("float32")
    if nan_at is not None:
        y[nan_at] = np.nan
    return x, y


def regression_model():
    keras.utils.set_random_seed(7)
    return keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)]
    )


def regression_compile(**optimizer_kwargs):
    return lambda: dict(optimizer=keras.optimizers.SGD(0.05, **optimizer_kwargs), loss="mse", metrics=["mae"])


def compare_files(make_callbacks, tmp_path, compare):
    """Fits twins with callbacks writing under `tmp_path/keras` and `tmp_path/trainer`; compares what they wrote."""
    x, y = regression_data()
    directories = iter([tmp_path / "keras", tmp_path / "trainer"])
    result = fit_both(
        regression_model,
        regression_compile(),
        data_args=(x, y),
        fit_kwargs=dict(batch_size=8, epochs=4, shuffle=False, validation_data=(x[:16], y[:16])),
        callbacks=lambda: make_callbacks(next(directories)),
    )
    check_all(result)
    compare(tmp_path / "keras", tmp_path / "trainer")
    return result


@pytest.mark.parametrize(
    "make_callbacks",
    [
        lambda: [
            keras.callbacks.EarlyStopping(
                monitor="val_loss", patience=0, min_delta=10.0, restore_best_weights=True
            )
        ],
        lambda: [keras.callbacks.EarlyStopping(monitor="loss", patience=1, start_from_epoch=1)],
        lambda: [keras.callbacks.LearningRateScheduler(lambda epoch, lr: lr * 0.5)],
        lambda: [
            keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=0.2, patience=0, min_delta=10.0)
        ],
        lambda: [keras.callbacks.TerminateOnNaN()],
    ],
    ids=[
        "early_stopping_restore_best",
        "early_stopping_start_from",
        "lr_scheduler",
        "reduce_lr",
        "terminate_on_nan",
    ],
)
def test_keras_callbacks_act_as_under_fit(make_callbacks):
    x, y = regression_data()
    result = fit_both(
        regression_model,
        regression_compile(),
        data_args=(x, y),
        fit_kwargs=dict(batch_size=8, epochs=4, shuffle=False, validation_data=(x[:16], y[:16])),
        callbacks=make_callbacks,
    )
    check_all(result)
    np.testing.assert_allclose(
        float(result[3].optimizer.learning_rate.numpy()), float(result[0].optimizer.learning_rate.numpy())
    )


def test_terminate_on_nan_stops_where_keras_stops_with_the_guard_off():
    x, y = regression_data(nan_at=20)
    result = fit_both(
        regression_model,
        regression_compile(),
        data_args=(x, y),
        fit_kwargs=dict(batch_size=8, epochs=3, shuffle=False),
        callbacks=lambda: [keras.callbacks.TerminateOnNaN()],
        trainer_kwargs=dict(terminate_on_nan=False),
    )
    keras_model, keras_history, keras_recorder, model, history, recorder = result
    same_events(keras_recorder, recorder)
    assert int(model.optimizer.iterations) == int(keras_model.optimizer.iterations) == 3


def same_csv(keras_dir, trainer_dir, rows):
    keras_rows = (keras_dir / "log.csv").read_text().splitlines()
    trainer_rows = (trainer_dir / "log.csv").read_text().splitlines()
    assert keras_rows[0] == trainer_rows[0] and len(keras_rows) == len(trainer_rows) == rows + 1
    for keras_row, trainer_row in zip(keras_rows[1:], trainer_rows[1:], strict=True):
        assert "NA" not in trainer_row
        np.testing.assert_allclose(
            [float(v) for v in trainer_row.split(",")], [float(v) for v in keras_row.split(",")], rtol=1e-5
        )


def test_csv_logger_writes_the_same_rows(tmp_path):
    def make(directory):
        directory.mkdir()
        return [keras.callbacks.CSVLogger(str(directory / "log.csv"))]

    compare_files(make, tmp_path, lambda keras_dir, trainer_dir: same_csv(keras_dir, trainer_dir, rows=4))


def test_the_epoch_that_stops_training_is_validated(tmp_path):
    class StopAfterFirst(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.model.stop_training = True

    def make(directory):
        directory.mkdir()
        return [StopAfterFirst(), keras.callbacks.CSVLogger(str(directory / "log.csv"))]

    def compare(keras_dir, trainer_dir):
        same_csv(keras_dir, trainer_dir, rows=1)
        assert "val_loss" in (trainer_dir / "log.csv").read_text().splitlines()[0]

    compare_files(make, tmp_path, compare)


def test_model_checkpoint_saves_at_the_same_steps(tmp_path):
    def make(directory):
        directory.mkdir()
        return [
            keras.callbacks.ModelCheckpoint(
                str(directory / "step-{epoch}-{batch}.weights.h5"), save_freq=4, save_weights_only=True
            ),
            keras.callbacks.ModelCheckpoint(
                str(directory / "best.keras"), monitor="val_loss", save_best_only=True
            ),
        ]

    def compare(keras_dir, trainer_dir):
        names = sorted(path.name for path in keras_dir.iterdir())
        assert sorted(path.name for path in trainer_dir.iterdir()) == names and len(names) > 3
        keras_best = keras.models.load_model(keras_dir / "best.keras")
        trainer_best = keras.models.load_model(trainer_dir / "best.keras")
        weights_close(keras_best, trainer_best)

    compare_files(make, tmp_path, compare)


def test_tensorboard_callback_writes_the_same_scalars(tmp_path):
    from tensorboard.backend.event_processing import event_accumulator

    def scalars(directory):
        found = {}
        for run in ("train", "validation"):
            accumulator = event_accumulator.EventAccumulator(
                str(directory / run), size_guidance={"tensors": 0}
            )
            accumulator.Reload()
            for tag in accumulator.Tags()["tensors"]:
                values = [
                    (event.step, tf.make_ndarray(event.tensor_proto)) for event in accumulator.Tensors(tag)
                ]
                if values and values[0][1].dtype.kind == "f":  # scalars, not the model's config text
                    found[(run, tag)] = [(step, float(value)) for step, value in values]
        return found

    def compare(keras_dir, trainer_dir):
        expected, got = scalars(keras_dir), scalars(trainer_dir)
        assert sorted(got) == sorted(expected) and any(tag == "epoch_loss" for _, tag in got)
        for key in expected:
            assert [step for step, _ in got[key]] == [step for step, _ in expected[key]], key
            np.testing.assert_allclose([v for _, v in got[key]], [v for _, v in expected[key]], rtol=1e-5)

    compare_files(
        lambda directory: [keras.callbacks.TensorBoard(str(directory), update_freq=3)], tmp_path, compare
    )


def test_swap_ema_weights_and_finalize_as_under_fit():
    x, y = regression_data()
    result = fit_both(
        regression_model,
        lambda: dict(optimizer=keras.optimizers.SGD(0.05, use_ema=True, ema_momentum=0.5), loss="mse"),
        data_args=(x, y),
        fit_kwargs=dict(batch_size=8, epochs=2, shuffle=False, validation_data=(x[:16], y[:16])),
        callbacks=lambda: [keras.callbacks.SwapEMAWeights()],
    )
    check_all(result)
    model = result[3]
    # finalize_variable_values ran: the model holds the moving averages, not the last raw weights.
    ema = [v.numpy() for v in model.optimizer._model_variables_moving_average]
    for weight, average in zip(model.trainable_weights, ema, strict=True):
        np.testing.assert_allclose(weight.numpy(), average)


class CrashAt(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError("killed")


def test_backup_and_restore_resumes_at_the_recorded_epoch(tmp_path):
    x, y = regression_data()
    steps = {}
    for side in ("keras", "trainer"):
        backup = str(tmp_path / side)
        model = regression_model()
        model.compile(**regression_compile()())
        fitter = model if side == "keras" else tftrain.Trainer(model)
        with pytest.raises(RuntimeError, match="killed"):
            fitter.fit(
                x,
                y,
                batch_size=8,
                epochs=4,
                shuffle=False,
                verbose=0,
                callbacks=[keras.callbacks.BackupAndRestore(backup), CrashAt(2)],
            )
        rerun = regression_model()
        rerun.compile(**regression_compile()())
        recorder = Recorder()
        fitter = rerun if side == "keras" else tftrain.Trainer(rerun)
        history = fitter.fit(
            x,
            y,
            batch_size=8,
            epochs=4,
            shuffle=False,
            verbose=0,
            callbacks=[keras.callbacks.BackupAndRestore(backup), recorder],
        )
        steps[side] = (int(rerun.optimizer.iterations), history.epoch, recorder.events, rerun.get_weights())
    assert steps["trainer"][0] == steps["keras"][0] == 24  # 2 epochs restored + 2 trained, of 6 steps each
    assert steps["trainer"][1] == steps["keras"][1] == [2, 3]
    assert steps["trainer"][2] == steps["keras"][2]
    for left, right in zip(steps["trainer"][3], steps["keras"][3], strict=True):
        np.testing.assert_allclose(left, right, atol=1e-6)


def test_backup_and_restore_with_model_dir_is_refused_before_any_step(tmp_path):
    model = regression_model()
    trainer = tftrain.Trainer(model, **regression_compile()(), model_dir=str(tmp_path / "run"))
    x, y = regression_data()
    with pytest.raises(ValueError, match="BackupAndRestore callback with model_dir"):
        trainer.fit(x, y, callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))], verbose=0)
    assert int(model.optimizer.iterations) == 0


# ------------------------------------------------------------------ evaluate's return


def _evaluate_model(setup):
    keras.utils.set_random_seed(3)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    if setup == "multi_output":
        outputs = {"a": keras.layers.Dense(3, name="a")(hidden), "b": keras.layers.Dense(1, name="b")(hidden)}
        model = keras.Model(inputs, outputs)
        model.compile(
            "sgd",
            loss={"a": keras.losses.SparseCategoricalCrossentropy(from_logits=True), "b": "mse"},
            metrics={"a": ["accuracy"], "b": ["mae", "mse"]},
        )
        return model
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    metrics = {"loss_only": [], "one_metric": ["mae"], "several_metrics": ["mse", "mae"]}[setup]
    model.compile("sgd", "mse", metrics=metrics)
    return model


@pytest.mark.parametrize("setup", ["loss_only", "one_metric", "several_metrics", "multi_output"])
def test_evaluate_returns_what_keras_returns(setup):
    x, labels = data()
    y = {"a": labels, "b": x[:, :1]} if setup == "multi_output" else x[:, :1]
    reference, model = _evaluate_model(setup), _evaluate_model(setup)
    trainer = tftrain.Trainer(model)
    for kwargs in ({}, {"return_dict": False}, {"return_dict": True}):
        expected = reference.evaluate(x, y, batch_size=16, verbose=0, **kwargs)
        got = trainer.evaluate(x, y, batch_size=16, verbose=0, **kwargs)
        assert type(got) is type(expected), (kwargs, got, expected)
        if isinstance(expected, dict):
            assert list(got) == list(expected)  # the same keys, in Keras's order
            assert got == pytest.approx(expected, rel=1e-6)
        elif isinstance(expected, list):
            assert len(got) == len(expected) and all(type(value) is float for value in got)
            np.testing.assert_allclose(got, expected, rtol=1e-6)  # Keras's metrics order
        else:
            assert type(got) is float and got == pytest.approx(expected, rel=1e-6)
    if setup == "loss_only":
        assert type(trainer.evaluate(x, y, verbose=0)) is float  # a scalar by default, as Keras
    if setup == "several_metrics":  # the order of the list is the compiled metrics' order, not sorted
        listed = trainer.evaluate(x, y, verbose=0)
        logs = trainer.evaluate(x, y, verbose=0, return_dict=True)
        assert listed == pytest.approx([logs["loss"], logs["mse"], logs["mae"]], rel=1e-6)


def test_evaluate_takes_keras_keyword_arguments_as_keras_does():
    x, _ = data()
    reference, model = _evaluate_model("one_metric"), _evaluate_model("one_metric")
    trainer = tftrain.Trainer(model)
    expected = reference.evaluate(x, x[:, :1], verbose=0, _use_cached_eval_dataset=False)
    assert trainer.evaluate(x, x[:, :1], verbose=0, _use_cached_eval_dataset=False) == pytest.approx(
        expected, rel=1e-6
    )
    with pytest.raises(ValueError, match="Arguments not recognized") as keras_error:
        reference.evaluate(x, x[:, :1], verbose=0, unknown=1)
    with pytest.raises(ValueError, match="Arguments not recognized") as error:
        trainer.evaluate(x, x[:, :1], verbose=0, unknown=1)
    assert str(error.value) == str(keras_error.value)
