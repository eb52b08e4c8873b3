"""`tftrain.callbacks` for `keras.Model.fit`: summaries, checkpoint-and-resume, the standard set."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator

import tftrain
from tftrain import callbacks as callbacks_lib
from tftrain import checkpoint as checkpoint_lib


def make_model(seed=3):
    """A functional CustomModel with Dropout (its seed state must survive a resume)."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dropout(0.25)(keras.layers.Dense(8, activation="relu")(inputs))
    model = tftrain.CustomModel(inputs, keras.layers.Dense(3)(hidden))
    model.compile(
        optimizer=keras.optimizers.Adam(0.01),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model


def scalars(run_dir):
    """tag -> {step: value} of the scalars in a run's event files."""
    accumulator = event_accumulator.EventAccumulator(str(run_dir), size_guidance={"tensors": 0})
    accumulator.Reload()
    return {
        tag: {event.step: float(tf.make_ndarray(event.tensor_proto)) for event in accumulator.Tensors(tag)}
        for tag in accumulator.Tags()["tensors"]
    }


def test_standard_callbacks_give_fit_summaries_checkpoints_and_timing(tmp_path, tiny_dataset):
    model = make_model()
    cbs = callbacks_lib.standard_callbacks(str(tmp_path), summary_every_steps=3)
    assert [type(cb) for cb in cbs] == [
        callbacks_lib.Timing,
        callbacks_lib.TensorBoardSummaries,
        callbacks_lib.CheckpointAndResume,
    ]
    history = model.fit(tiny_dataset, epochs=2, validation_data=tiny_dataset, callbacks=cbs, verbose=0)
    assert cbs[0].report.steps == 14
    train, validation = scalars(tmp_path / "train"), scalars(tmp_path / "validation")
    assert sorted(train["epoch_loss"]) == [7, 14]
    np.testing.assert_allclose(
        [train["epoch_loss"][7], train["epoch_loss"][14]], history.history["loss"], rtol=1e-6
    )
    np.testing.assert_allclose(
        [validation["epoch_accuracy"][7], validation["epoch_accuracy"][14]],
        history.history["val_accuracy"],
        rtol=1e-6,
    )
    assert sorted(train["step_loss"]) == [3, 6, 9, 12]
    assert {"learning_rate", "steps_per_sec", "examples_per_sec", "step_time_s", "trace_time_s"} <= set(train)
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-14")  # numbered by step


def test_fit_resumes_at_the_next_epoch_and_ends_as_an_uninterrupted_fit(tmp_path, tiny_dataset):
    reference = make_model()
    reference.fit(tiny_dataset, epochs=3, verbose=0)

    first = make_model()
    first.fit(tiny_dataset, epochs=1, verbose=0, callbacks=[callbacks_lib.CheckpointAndResume(str(tmp_path))])
    resumed = make_model(seed=99)  # other initial weights: all must come from the checkpoint
    resume = callbacks_lib.CheckpointAndResume(str(tmp_path))
    history = resumed.fit(tiny_dataset, epochs=3, verbose=0, callbacks=[resume])
    assert history.epoch == [1, 2]
    assert resume.restored.epoch == 1
    assert int(resumed.optimizer.iterations) == 21
    for got, want in zip(resumed.get_weights(), reference.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    # Done: another fit with the same target trains nothing more.
    again = resumed.fit(
        tiny_dataset, epochs=3, verbose=0, callbacks=[callbacks_lib.CheckpointAndResume(str(tmp_path))]
    )
    assert again.epoch == [] and int(resumed.optimizer.iterations) == 21
    assert resumed._initial_epoch is None  # a later plain fit starts at epoch 0


def test_non_finite_weights_are_never_checkpointed(tmp_path, tiny_dataset):
    model = make_model()

    class Poison(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                kernel = self.model.weights[0]
                kernel.assign(tf.fill(kernel.shape, np.nan))

    with pytest.raises(checkpoint_lib.NonFiniteStateError, match="NaN or infinite") as info:
        model.fit(
            tiny_dataset,
            epochs=3,
            verbose=0,
            callbacks=[Poison(), callbacks_lib.CheckpointAndResume(str(tmp_path))],
        )
    assert "ckpt-7" in str(info.value)  # the last good checkpoint (epoch 1, step 7) is named and kept
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-7")


def test_resuming_an_unbuilt_subclassed_model_is_a_clear_error(tmp_path, tiny_dataset):
    make_model().fit(
        tiny_dataset, epochs=1, verbose=0, callbacks=[callbacks_lib.CheckpointAndResume(str(tmp_path))]
    )

    class Subclassed(tftrain.CustomModel):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, x):
            return self.dense(x)

    model = Subclassed()
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match="not built") as info:
        model.fit(
            tiny_dataset, epochs=2, verbose=0, callbacks=[callbacks_lib.CheckpointAndResume(str(tmp_path))]
        )
    assert "ckpt-7" in str(info.value)


def test_profile_window_writes_a_trace_under_fit(tmp_path, tiny_dataset):
    make_model().fit(
        tiny_dataset,
        epochs=1,
        verbose=0,
        callbacks=[callbacks_lib.TensorBoardSummaries(str(tmp_path), profile_steps=(2, 3))],
    )
    traces = [name for _, _, files in os.walk(tmp_path / "train" / "plugins" / "profile") for name in files]
    assert any(name.endswith(".xplane.pb") for name in traces)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(every_steps=0), "every_steps"),
        (dict(profile_steps=(3, 1)), "profile_steps"),
    ],
)
def test_summaries_callback_rejects_bad_arguments(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        callbacks_lib.TensorBoardSummaries(str(tmp_path), **kwargs)


def test_profile_window_past_the_run_fails_before_training(tmp_path, tiny_dataset):
    model = make_model()
    with pytest.raises(ValueError, match="trains only 7 steps"):
        model.fit(
            tiny_dataset,
            epochs=1,
            verbose=0,
            callbacks=[callbacks_lib.TensorBoardSummaries(str(tmp_path), profile_steps=(2, 30))],
        )
    assert int(model.optimizer.iterations) == 0


def test_callbacks_reject_a_file_as_directory(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(ValueError, match="which is a file"):
        callbacks_lib.CheckpointAndResume(str(path))
    with pytest.raises(ValueError, match="which is a file"):
        callbacks_lib.TensorBoardSummaries(str(path))
    with pytest.raises(ValueError, match="max_to_keep"):
        callbacks_lib.CheckpointAndResume(str(tmp_path), max_to_keep=0)


def test_timing_counts_a_second_fit_of_the_same_trainer_as_under_model_fit(engine):
    # The step traced in the first fit has no Timing hook: the Timing's reset of the
    # train function rebuilds it, as `model.fit` does.
    x = np.random.RandomState(0).rand(24, 6).astype("float32")
    y = np.zeros((24,), "int32")

    def second_fit_steps(runner_of):
        model = make_model()
        model.compile(
            keras.optimizers.SGD(0.01),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            run_eagerly=not engine.get("use_tf_function", True),
        )
        runner = runner_of(model)
        runner.fit(x, y, batch_size=4, epochs=1, verbose=0)
        timing = tftrain.callbacks.Timing()
        runner.fit(x, y, batch_size=4, epochs=2, verbose=0, callbacks=[timing])
        return timing.report.steps, timing.report.trace_count

    keras_steps, _ = second_fit_steps(lambda model: model)
    trainer_steps, trainer_traces = second_fit_steps(lambda model: tftrain.Trainer(model, **engine))
    assert keras_steps == trainer_steps == 12
    if engine.get("use_tf_function", True):
        assert trainer_traces >= 1  # the rebuilt step traced in this fit


def test_run_record_logger_hands_a_trainers_run_record_to_log_params(tmp_path, tiny_data):
    logged = []
    model_dir = str(tmp_path / "run")
    trainer = tftrain.Trainer(make_model(), model_dir=model_dir, hparams={"width": 8}, steps_per_loop=2)
    logger = callbacks_lib.RunRecordLogger(logged.append, model_dir)
    trainer.fit(*tiny_data, batch_size=25, epochs=1, verbose=0, callbacks=[logger])
    assert len(logged) == 1 and logged[0] == logger.params
    params = logged[0]
    assert params["width"] == 8 and params["trainer.steps_per_loop"] == 2 and params["data.global_batch_size"] == 25
    assert params["optimizer.class"] == "keras.optimizers.Adam" and params["optimizer.learning_rate"] == 0.01
    assert "model.layers" not in params and all(isinstance(v, bool | int | float | str) for v in params.values())


def test_run_record_logger_says_when_there_is_no_record_and_refuses_a_non_callable(tmp_path, tiny_data):
    logged = []
    model = make_model()
    with pytest.warns(UserWarning, match=r"no run record to log: .*run_record.json is missing.*`model.fit` writes none"):
        model.fit(*tiny_data, epochs=1, verbose=0, callbacks=[callbacks_lib.RunRecordLogger(logged.append, str(tmp_path))])
    assert logged == []
    with pytest.raises(TypeError, match=r"Invalid value for argument `log_params`\. Received: log_params='mlflow'"):
        callbacks_lib.RunRecordLogger("mlflow", str(tmp_path))
