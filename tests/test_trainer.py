"""Trainer: every engine trains like model.fit; callbacks, history, styles, bad input."""

import csv
import re
import signal
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import compile_args, make_mlp, max_weight_difference

import tftrain
from tftrain import Trainer


def fit_reference(dataset, epochs=2, steps_per_execution=1, **fit_kwargs):
    model = make_mlp()
    model.compile(**compile_args(), steps_per_execution=steps_per_execution)
    history = model.fit(dataset, epochs=epochs, verbose=0, **fit_kwargs)
    return model, history


def test_every_engine_matches_model_fit(engine, tiny_dataset):
    reference, ref_history = fit_reference(tiny_dataset)
    model = make_mlp()
    trainer = Trainer(model, **compile_args(), **engine)
    history = trainer.fit(tiny_dataset, epochs=2, verbose=0)
    assert max_weight_difference(model, reference) < 1e-5
    np.testing.assert_allclose(history.history["loss"], ref_history.history["loss"], rtol=1e-5)
    np.testing.assert_allclose(history.history["accuracy"], ref_history.history["accuracy"], rtol=1e-5)
    assert int(model.optimizer.iterations) == 14


def test_custom_model_same_under_fit_and_trainer(engine, tiny_dataset):
    class Clipped(tftrain.CustomModel):
        def compute_gradients(self, tape, loss):
            return [tf.clip_by_value(g, -0.05, 0.05) for g in super().compute_gradients(tape, loss)]

    def build():
        keras.utils.set_random_seed(3)
        inputs = keras.Input((6,))
        hidden = keras.layers.Dense(8, activation="relu")(inputs)
        return Clipped(inputs, keras.layers.Dense(3)(hidden))

    reference = build()
    reference.compile(**compile_args())
    reference.fit(tiny_dataset, epochs=2, verbose=0)
    model = build()
    model.compile(**compile_args())
    Trainer(model, **engine).fit(tiny_dataset, epochs=2, verbose=0)
    assert max_weight_difference(model, reference) < 1e-5


def test_history_has_validation_logs_and_evaluate_returns_floats(tiny_dataset):
    model = make_mlp()
    trainer = Trainer(model, **compile_args())
    history = trainer.fit(tiny_dataset, epochs=2, validation_data=tiny_dataset, verbose=0)
    assert isinstance(history, keras.callbacks.History)
    assert set(history.history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert len(history.history["val_loss"]) == 2
    logs = trainer.evaluate(tiny_dataset, return_dict=True)
    assert set(logs) == {"loss", "accuracy"}
    assert all(type(value) is float for value in logs.values())
    assert logs["loss"] == pytest.approx(history.history["val_loss"][-1], rel=1e-6)


def test_metrics_reset_each_epoch(tiny_dataset):
    seen = []
    model = make_mlp()
    trainer = Trainer(model, **compile_args())
    probe = keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: seen.append(float(model.metrics[0].count))
    )
    trainer.fit(tiny_dataset, epochs=3, verbose=0, callbacks=[probe])
    assert seen == [0.0, 0.0, 0.0]


def test_numpy_inputs_like_fit(tiny_data):
    x, y = tiny_data
    model = make_mlp()
    history = Trainer(model, **compile_args()).fit(x, y, epochs=1, batch_size=10, verbose=0)
    assert int(model.optimizer.iterations) == 5
    assert history.history["loss"][0] > 0


def test_steps_per_epoch_continues_iterator_like_fit(tiny_dataset):
    repeated = tiny_dataset.repeat()
    reference, _ = fit_reference(repeated, epochs=3, steps_per_epoch=4, steps_per_execution=3)
    model = make_mlp()
    Trainer(model, **compile_args(), steps_per_loop=3).fit(repeated, epochs=3, steps_per_epoch=4, verbose=0)
    # As Keras's steps_per_execution: calls of 3 steps from steps 0 and 3 of each epoch of 4.
    assert int(model.optimizer.iterations) == int(reference.optimizer.iterations) == 18
    assert max_weight_difference(model, reference) < 1e-5


def test_unknown_cardinality_dataset_trains_full_pass(tiny_dataset, engine):
    filtered = tiny_dataset.filter(lambda x, y: tf.shape(x)[0] > 0)
    assert int(filtered.cardinality()) == tf.data.UNKNOWN_CARDINALITY
    model = make_mlp()
    Trainer(model, **compile_args(), **engine).fit(filtered, epochs=2, verbose=0)
    assert int(model.optimizer.iterations) == 14


# ------------------------------------------------------------------ callbacks


def test_batch_hooks_fire_once_per_loop_with_kerass_indices(tiny_dataset):
    def record(run_fit):
        batches = []
        hook = keras.callbacks.LambdaCallback(
            on_train_batch_begin=lambda batch, logs: batches.append(("begin", batch)),
            on_train_batch_end=lambda batch, logs: batches.append(("end", batch)),
        )
        run_fit(hook)
        return batches

    keras_model = make_mlp()
    keras_model.compile(**compile_args(), steps_per_execution=3)
    under_fit = record(lambda hook: keras_model.fit(tiny_dataset, verbose=0, callbacks=[hook]))
    trainer = Trainer(make_mlp(), **compile_args(), steps_per_loop=3)
    under_trainer = record(lambda hook: trainer.fit(tiny_dataset, verbose=0, callbacks=[hook]))
    # 7 batches in calls of 3, 3, 1; Keras 3.11+ reports each call's begin + 2 at its end.
    assert under_trainer == under_fit
    assert [batch for kind, batch in under_trainer if kind == "begin"] == [0, 3, 6]


def test_early_stopping_and_stop_training(tiny_dataset):
    stopper = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=100.0)
    history = Trainer(make_mlp(), **compile_args()).fit(
        tiny_dataset, epochs=10, verbose=0, callbacks=[stopper]
    )
    assert len(history.history["loss"]) == 2

    class StopAtBatch(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:
                self.model.stop_training = True

    model = make_mlp()
    Trainer(model, **compile_args()).fit(tiny_dataset, epochs=5, verbose=0, callbacks=[StopAtBatch()])
    assert int(model.optimizer.iterations) == 3


def test_reduce_lr_on_plateau_changes_optimizer(tiny_dataset):
    model = make_mlp()
    reducer = keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=100.0)
    Trainer(model, **compile_args()).fit(tiny_dataset, epochs=3, verbose=0, callbacks=[reducer])
    # Epoch 0 sets the first best value; epochs 1 and 2 cannot improve by 100.
    assert float(model.optimizer.learning_rate) == pytest.approx(0.01 * 0.5**2)


def test_csv_logger_writes_epochs(tiny_dataset, tmp_path):
    path = tmp_path / "log.csv"
    Trainer(make_mlp(), **compile_args()).fit(
        tiny_dataset,
        epochs=2,
        validation_data=tiny_dataset,
        verbose=0,
        callbacks=[keras.callbacks.CSVLogger(str(path))],
    )
    rows = list(csv.DictReader(path.open()))
    assert [row["epoch"] for row in rows] == ["0", "1"]
    assert {"loss", "accuracy", "val_loss", "val_accuracy"} <= set(rows[0])


def test_keras_terminate_on_nan_works_with_the_guard_off(tiny_data):
    x, y = tiny_data
    targets = np.eye(3, dtype="float32")[y]
    targets[20] = np.nan
    model = make_mlp()
    trainer = Trainer(model, keras.optimizers.SGD(0.01), "mse", terminate_on_nan=False)
    trainer.fit(x, targets, epochs=3, batch_size=10, verbose=0, callbacks=[keras.callbacks.TerminateOnNaN()])
    assert int(model.optimizer.iterations) < 15


def test_test_hooks_run_during_validation(tiny_dataset):
    events = []
    hook = keras.callbacks.LambdaCallback(
        on_test_begin=lambda logs: events.append("begin"),
        on_test_end=lambda logs: events.append(("end", sorted(logs))),
    )
    Trainer(make_mlp(), **compile_args()).fit(
        tiny_dataset, epochs=1, validation_data=tiny_dataset, verbose=0, callbacks=[hook]
    )
    assert events == ["begin", ("end", ["accuracy", "loss"])]


# --------------------------------------------------------------- step styles


class MeanSquaredTrainer(Trainer):
    """The custom-loop style: own train/eval steps and own metric."""

    def __init__(self, model, **kwargs):
        super().__init__(model, optimizer=keras.optimizers.SGD(0.1), **kwargs)
        self.loss_metric = keras.metrics.Mean(name="mse")

    def train_step(self, batch):
        x, y = batch
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self.model(x, training=True)[:, 0] - y))
        grads = tape.gradient(loss, self.model.trainable_variables)
        self.optimizer.apply(grads, self.model.trainable_variables)
        self.loss_metric.update_state(loss)
        return {"mse": self.loss_metric.result()}

    def eval_step(self, batch):
        x, y = batch
        self.loss_metric.update_state(tf.reduce_mean(tf.square(self.model(x)[:, 0] - y)))
        return {"mse": self.loss_metric.result()}


def regression_dataset():
    rng = np.random.RandomState(1)
    x = rng.rand(40, 6).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, x.sum(1))).batch(8)


def test_trainer_subclass_custom_loop(engine):
    dataset = regression_dataset()
    results = []
    for kwargs in (dict(use_tf_function=False), engine):
        model = make_mlp()
        trainer = MeanSquaredTrainer(model, **kwargs)
        history = trainer.fit(dataset, epochs=3, validation_data=dataset, verbose=0)
        results.append((model, history.history))
    (eager_model, eager_logs), (model, logs) = results
    assert logs["mse"][-1] < logs["mse"][0]
    assert set(logs) == {"mse", "val_mse"}
    assert max_weight_difference(model, eager_model) < 1e-5


def test_eager_engine_runs_python_in_step(capsys):
    class Printing(MeanSquaredTrainer):
        def train_step(self, batch):
            print("step with numpy", batch[0].numpy().shape)
            return super().train_step(batch)

    Printing(make_mlp(), use_tf_function=False).fit(regression_dataset(), epochs=1, verbose=0)
    assert capsys.readouterr().out.count("step with numpy (8, 6)") == 5


class TwoOptimizerModel(tftrain.CustomModel):
    """A GAN-like model: its own compile with two optimizers, no Keras optimizer."""

    def __init__(self):
        super().__init__()
        self.first = keras.layers.Dense(1)
        self.second = keras.layers.Dense(1)
        self.gap = keras.metrics.Mean(name="gap")

    def call(self, x):
        return self.first(x) + self.second(x)

    def compile(self, first_optimizer, second_optimizer):
        super().compile()
        self.first_optimizer = first_optimizer
        self.second_optimizer = second_optimizer

    def train_step(self, data):
        x, y = data
        for layer, optimizer in ((self.first, self.first_optimizer), (self.second, self.second_optimizer)):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(self(x)[:, 0] - y))
            optimizer.apply(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables)
        self.gap.update_state(loss)
        return {"gap": self.gap.result()}


def test_model_with_own_optimizers_needs_no_trainer_optimizer():
    model = TwoOptimizerModel()
    model.compile(keras.optimizers.SGD(0.05), keras.optimizers.SGD(0.05))
    history = Trainer(model).fit(regression_dataset(), epochs=3, verbose=0)
    assert history.history["gap"][-1] < history.history["gap"][0]
    assert int(model.first_optimizer.iterations) == 15


def test_verbose_prints_progress_and_timing(tiny_dataset, capsys):
    Trainer(make_mlp(), **compile_args()).fit(tiny_dataset, epochs=1, verbose=1)
    out = capsys.readouterr().out
    assert "7/7" in out
    assert "tftrain timing:\nengine" in out and "step time median" in out
    assert re.search(r"^engine +graph\+auto$", out, re.MULTILINE)  # 7 steps: too few for "auto" to choose


def test_timing_report_after_fit(tiny_dataset):
    trainer = Trainer(make_mlp(), **compile_args(), steps_per_loop=3)
    trainer.fit(tiny_dataset, epochs=2, verbose=0)
    report = trainer.timing
    assert report.steps == 14
    assert report.trace_count == 1
    assert report.first_step_s > 0 and report.step_time_median_s > 0
    assert report.examples_per_sec > 0

    untimed = Trainer(make_mlp(), **compile_args(), measure_timing=False)
    untimed.fit(tiny_dataset, epochs=1, verbose=0)
    assert untimed.timing.steps == 0 and untimed.timing.first_step_s is None


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "kwargs, error, fragment",
    [
        (dict(epochs=-1), ValueError, "epochs=-1"),
        (dict(steps_per_epoch=0), ValueError, "steps_per_epoch=0"),
        (dict(verbose=3), ValueError, "verbose=3"),
    ],
)
def test_bad_fit_arguments_fail_before_any_step(tiny_dataset, kwargs, error, fragment):
    model = make_mlp()
    trainer = Trainer(model, **compile_args())
    with pytest.raises(error, match=fragment):
        trainer.fit(tiny_dataset, **kwargs)
    assert int(model.optimizer.iterations) == 0


@pytest.mark.parametrize(
    "data, error, fragment",
    [
        (tf.data.Dataset.from_tensor_slices(np.zeros((0, 6), "float32")).batch(4), ValueError, "empty"),
        ("not data", TypeError, "`x`. Received: an object of type str"),
        (object(), TypeError, "Expected NumPy arrays or tensors"),
    ],
)
def test_bad_train_data(data, error, fragment):
    with pytest.raises(error, match=fragment):
        Trainer(make_mlp(), **compile_args()).fit(data, verbose=0)


def test_bad_constructor_arguments():
    with pytest.raises(TypeError, match="keras.Model"):
        Trainer("model")
    with pytest.raises(ValueError, match="steps_per_loop=0"):
        Trainer(make_mlp(), steps_per_loop=0)
    with pytest.raises(ValueError, match="use_tf_function=True"):
        Trainer(make_mlp(), use_tf_function=False, jit_compile=True)


def test_model_without_optimizer_fails_clearly(tiny_dataset):
    uncompiled = make_mlp()
    with pytest.raises(ValueError, match="not compiled"):
        Trainer(uncompiled).fit(tiny_dataset, verbose=0)
    no_optimizer = make_mlp()
    no_optimizer.compile(optimizer=None, loss="sparse_categorical_crossentropy")
    with pytest.raises(ValueError, match="without an optimizer"):
        Trainer(no_optimizer).fit(tiny_dataset, verbose=0)

    class NeedsOptimizer(Trainer):
        def train_step(self, batch):
            return {"lr": self.optimizer.learning_rate}

    with pytest.raises(ValueError, match="needs an optimizer"):
        NeedsOptimizer(make_mlp()).fit(tiny_dataset, verbose=0)


# ------------------------------------------------------------------ bad input, as model.fit rejects it


class FailingBatches(keras.utils.PyDataset):
    def __len__(self):
        return 4

    def __getitem__(self, index):
        if index == 1:
            raise IndexError("batch 1 is missing")
        return np.zeros((2, 6), "float32"), np.zeros(2, "int32")


def labelled(n=16):
    x = np.random.RandomState(0).rand(n, 6).astype("float32")
    return x, (x[:, 0] * 3).astype("int32").clip(0, 2)


def two_output_model():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((6,))
    return keras.Model(inputs, [keras.layers.Dense(3)(inputs), keras.layers.Dense(3)(inputs)])


def generator():
    x, y = labelled()
    for start in range(0, 16, 4):
        yield x[start : start + 4], y[start : start + 4]


def test_a_generator_read_three_times_trains_every_epoch_as_fit_does_with_a_warning():
    # As under model.fit, the epochs after the first read what the generator gives again (the
    # batches Keras kept to learn its shapes); how many depends on Keras's reading, so the test
    # checks that all epochs run and the warning, not the count.
    model = make_mlp()
    with pytest.warns(UserWarning, match="yields its batches once"):
        history = Trainer(model, **compile_args()).fit(generator(), epochs=3, verbose=0)
    assert len(history.history["loss"]) == 3
    assert int(model.optimizer.iterations) > 4


BAD_FIT_CALLS = {
    "validation_split_with_dataset": (
        lambda x, y: dict(x=tf.data.Dataset.from_tensor_slices((x, y)).batch(4), validation_split=0.5),
        "validation_split=0.5 with `x` a",
    ),
    "validation_split_with_generator": (
        lambda x, y: dict(x=generator(), validation_split=0.5),
        "validation_split",
    ),
    "bad_validation_split": (lambda x, y: dict(x=x, y=y, validation_split=1.0), "validation_split=1.0"),
    "bad_validation_freq": (lambda x, y: dict(x=x, y=y, validation_freq=0), "validation_freq=0"),
    "sample_weight_with_dataset": (
        lambda x, y: dict(x=tf.data.Dataset.from_tensor_slices((x, y)).batch(4), sample_weight=np.ones(16)),
        "sample_weights",
    ),
    "dataset_with_y": (
        lambda x, y: dict(x=tf.data.Dataset.from_tensor_slices(x).batch(4), y=y),
        "`y` should not",
    ),
    "py_dataset_raises": (
        lambda x, y: dict(x=FailingBatches()),
        r"FailingBatches.__getitem__\(1\)` raised IndexError",
    ),
    "unbatched_dataset": (
        lambda x, y: dict(x=tf.data.Dataset.from_tensor_slices((x, y))),
        r"single examples, not batches.*dataset.batch",
    ),
    "no_labels": (
        lambda x, y: dict(x=tf.data.Dataset.from_tensor_slices(x).batch(4)),
        "yields inputs only, no targets",
    ),
    "tuple_as_x": (lambda x, y: dict(x=(x, y)), r"write fit\(x, y\)"),
    "negative_initial_epoch": (lambda x, y: dict(x=x, y=y, initial_epoch=-1), "initial_epoch=-1"),
}


@pytest.mark.parametrize("name", sorted(BAD_FIT_CALLS))
def test_what_fit_rejects_fails_before_any_step_and_keeps_the_checkpoint(name, tmp_path):
    x, y = labelled()
    model = make_mlp()
    trainer = Trainer(model, **compile_args(), model_dir=str(tmp_path))
    trainer.fit(x, y, batch_size=8, verbose=0)
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    steps = int(model.optimizer.iterations)
    make_kwargs, fragment = BAD_FIT_CALLS[name]
    with pytest.raises(ValueError, match=fragment):
        trainer.fit(**make_kwargs(x, y), verbose=0)
    assert int(model.optimizer.iterations) == steps
    assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before


def test_class_weight_with_several_outputs_is_refused():
    x, y = labelled()
    model = two_output_model()
    trainer = Trainer(model, "sgd", ["sparse_categorical_crossentropy"] * 2)
    with pytest.raises(ValueError, match="class_weight"):
        trainer.fit(x, [y, y], class_weight={0: 2.0}, verbose=0)
    assert int(model.optimizer.iterations) == 0


def test_unbatched_dataset_for_a_functional_model_says_batch_it():
    x, y = labelled()
    images = tf.data.Dataset.from_tensor_slices((np.zeros((4, 3, 6), "float32"), np.zeros((4, 3), "int32")))
    keras.utils.set_random_seed(1)
    inputs = keras.Input((3, 6))
    model = keras.Model(inputs, keras.layers.Dense(3)(inputs))
    with pytest.raises(ValueError, match=r"single examples, not batches.*\[\[3, 6\]\].*dataset.batch"):
        Trainer(model, **compile_args()).fit(images, verbose=0)


def test_predict_and_evaluate_take_keras_inputs():
    x, y = labelled()
    model = make_mlp()
    trainer = Trainer(model, **compile_args(), steps_per_loop=2)
    expected = model.predict(x, batch_size=4, verbose=0)
    np.testing.assert_allclose(trainer.predict(x, batch_size=4, verbose=0), expected, rtol=1e-6)
    np.testing.assert_allclose(
        trainer.predict(tf.data.Dataset.from_tensor_slices(x).batch(4), verbose=0), expected, rtol=1e-6
    )
    np.testing.assert_allclose(trainer.predict(generator(), verbose=0), expected, rtol=1e-6)
    with pytest.raises(ValueError, match="yielded no batches"):
        trainer.predict(tf.data.Dataset.from_tensor_slices(x).batch(4).filter(lambda v: False), verbose=0)
    assert trainer.evaluate(x, y, verbose=0, steps=2, batch_size=4, return_dict=True) == pytest.approx(
        model.evaluate(x, y, verbose=0, steps=2, batch_size=4, return_dict=True)
    )


def test_a_py_dataset_without_a_length_is_read_until_a_callback_stops_it():
    class Endless(keras.utils.PyDataset):
        @property
        def num_batches(self):
            return None

        def __getitem__(self, index):
            return np.zeros((2, 6), "float32"), np.zeros(2, "int32")

    class StopAt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 3:
                self.model.stop_training = True

    trainer = Trainer(make_mlp(), **compile_args())
    with pytest.warns(UserWarning, match="never ends.*steps_per_epoch=None"):
        history = trainer.fit(Endless(), epochs=3, verbose=0, callbacks=[StopAt()])
    assert len(history.history["loss"]) == 1 and int(trainer.optimizer.iterations) == 4
    history = trainer.fit(Endless(), steps_per_epoch=3, epochs=2, verbose=0)
    assert len(history.history["loss"]) == 2 and int(trainer.optimizer.iterations) == 10


def test_validation_dataset_with_array_batch_size_does_not_warn():
    x, y = labelled()
    trainer = Trainer(make_mlp(), **compile_args())
    validation = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(x, y, batch_size=8, validation_data=validation, shuffle=False, verbose=0)
    assert not [w for w in caught if "batch_size" in str(w.message)]


def test_a_subclass_state_is_tracked_at_assignment_or_declared():
    class TwoOptimizers(Trainer):
        def __init__(self, model):
            super().__init__(model, "sgd", "mse")
            self.critic_optimizer = keras.optimizers.Adam(0.1)
            self.gap = keras.metrics.Mean(name="gap")
            self.scratch = keras.metrics.Mean(name="scratch")
            del self.scratch

    trainer = TwoOptimizers(make_mlp())
    state = trainer.checkpoint_state()
    assert state["owner_critic_optimizer"] is trainer.critic_optimizer
    assert state["owner_metrics"] == list(trainer.gap.variables)
    assert [m.name for m in trainer.metrics][-1] == "gap" and "scratch" not in [
        m.name for m in trainer.metrics
    ]

    class Declared(TwoOptimizers):
        def checkpoint_state(self):
            return {"critic": self.critic_optimizer}

    assert Declared(make_mlp()).checkpoint_state().keys() == {"critic"}


@pytest.mark.parametrize(
    "kwargs, received, expected",
    [
        (dict(rollback_lr_factor=0.5), "rollback_lr_factor=0.5 with on_nonfinite='stop'", "on_nonfinite='rollback'"),
        (dict(max_rollbacks=5), "max_rollbacks=5 with on_nonfinite='stop'", "on_nonfinite='rollback'"),
        (dict(count_flops=True, use_tf_function=False), "count_flops=True with use_tf_function=False", "use_tf_function=True"),
        (dict(peak_flops=1e12), "peak_flops=1000000000000.0 with count_flops=False", "count_flops=True"),
        (dict(max_to_keep=2), "max_to_keep=2 with model_dir=None", "a `model_dir`"),
        (dict(preemption_signals=("SIGUSR1",)), "preemption_signals=(10,) with model_dir=None", "a `model_dir`"),
        (dict(best_checkpoint_mode="min", model_dir="DIR"), "best_checkpoint_mode='min' with best_checkpoint_monitor=None", "a `best_checkpoint_monitor`"),
        (dict(checkpoint_every_steps=5), "checkpoint_every_steps=5 with model_dir=None", "a `model_dir`"),
        (dict(resume_from="elsewhere"), "resume_from='elsewhere' with model_dir=None", "a `model_dir`"),
        (dict(slurm_requeue=True), "slurm_requeue=True with model_dir=None", "a `model_dir`"),
        (dict(slurm_requeue=True, preemption_signals=(), model_dir="DIR"), "slurm_requeue=True with preemption_signals=()", "preemption signals"),
    ],
)
def test_an_option_that_cannot_act_with_the_others_is_refused_when_the_trainer_is_made(
    tmp_path, kwargs, received, expected
):
    kwargs = {key: str(tmp_path / value) if key == "model_dir" else value for key, value in kwargs.items()}
    with pytest.raises(ValueError, match="Invalid combination of arguments") as info:
        Trainer(make_mlp(), "sgd", "mse", **kwargs)
    assert received in str(info.value) and f"Expected {expected}" in str(info.value)


def test_the_options_that_act_together_are_taken(tmp_path):
    Trainer(make_mlp(), "sgd", "mse", preemption_signals=())  # none: nothing to install
    Trainer(make_mlp(), "sgd", "mse", max_to_keep=5, preemption_signals=("SIGTERM",))  # the defaults
    Trainer(
        make_mlp(), "sgd", "mse", model_dir=str(tmp_path), on_nonfinite="rollback", max_rollbacks=5,
        rollback_lr_factor=0.5, max_to_keep=2, preemption_signals=("SIGUSR1",),
        best_checkpoint_monitor="loss", best_checkpoint_mode="min", count_flops=True, peak_flops=1e12,
    )  # fmt: skip
    requeued = Trainer(make_mlp(), "sgd", "mse", model_dir=str(tmp_path / "slurm"), slurm_requeue=True)
    assert requeued.run_options.preemption_signals == (signal.SIGTERM, signal.SIGUSR1)  # SLURM's time-limit signal


def test_check_options_raises_what_the_trainer_raises_without_a_model():
    from tftrain.trainer import OPTION_NAMES, check_options

    check_options(steps_per_loop=4, jit_compile="auto", model_dir="runs/a", on_nonfinite="rollback")
    with pytest.raises(ValueError) as from_trainer:
        tftrain.Trainer(make_mlp(), "sgd", "mse", max_rollbacks=5)
    with pytest.raises(ValueError) as from_check:
        check_options(max_rollbacks=5)
    assert str(from_check.value) == str(from_trainer.value)
    with pytest.raises(TypeError, match=r"Invalid arguments \['strategy'\]"):
        check_options(strategy=None)
    assert "strategy" not in OPTION_NAMES and "services" not in OPTION_NAMES and "ema_decay" in OPTION_NAMES
