"""`tf.summary` inside the training step, and the global step variable it writes at."""

import contextlib
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import ENGINES, compile_args, fail_after_writing, make_mlp, read_run

import tftrain
from tftrain.errors import CheckpointWriteError

STEPS_PER_EPOCH = 5  # 20 examples in batches of 4


def data(examples=20, batch_size=4):
    rng = np.random.RandomState(0)
    x = rng.rand(examples, 6).astype("float32")
    y = (x[:, 0] * 3).astype("int32").clip(0, 2)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size)


class SummaryTrainer(tftrain.Trainer):
    """A custom step that writes a scalar, a histogram and the step it thinks it is."""

    def train_step(self, batch):
        x, y = batch
        with tf.GradientTape() as tape:
            logits = self.model(x, training=True)
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
        variables = self.model.trainable_variables
        self.optimizer.apply(tape.gradient(loss, variables), variables)
        tf.summary.scalar("step_loss_inside", loss)
        tf.summary.scalar("global_step_inside", tf.cast(self.global_step, tf.float32))
        tf.summary.histogram("first_kernel", variables[0])
        return {"loss": loss}


def steps_of(events):
    return [step for step, _ in events]


@pytest.mark.parametrize("engine_name", ["eager", "graph", "loop3"])
def test_summaries_inside_the_step_land_at_their_step_under_every_engine(tmp_path, engine_name):
    trainer = SummaryTrainer(
        make_mlp(), optimizer="sgd", model_dir=str(tmp_path), summary_every_steps=3, **ENGINES[engine_name]
    )
    trainer.fit(data(), epochs=2, verbose=0)
    train = read_run(tmp_path / "train")
    # Every 3 steps, and each epoch's last step (as the Trainer's own summaries).
    expected = [3, 5, 6, 9, 10]
    assert steps_of(train["step_loss_inside"]) == expected
    assert steps_of(train["first_kernel"]) == expected
    assert train["first_kernel"][0][1].ndim == 2  # a histogram: buckets, not a scalar
    # The step inside is the step it is written at: 1-based, counted before the step runs.
    assert [(step, value) for step, value in train["global_step_inside"]] == [(s, float(s)) for s in expected]
    assert int(trainer.global_step.numpy()) == 2 * STEPS_PER_EPOCH


def test_without_summary_every_steps_the_step_records_at_epoch_ends(tmp_path):
    trainer = SummaryTrainer(make_mlp(), optimizer="sgd", model_dir=str(tmp_path))
    trainer.fit(data(), epochs=2, verbose=0)
    assert steps_of(read_run(tmp_path / "train")["step_loss_inside"]) == [5, 10]


def test_a_step_budget_records_its_last_step(tmp_path):
    trainer = SummaryTrainer(make_mlp(), optimizer="sgd", model_dir=str(tmp_path), steps_per_loop=4)
    trainer.fit(data().repeat(), steps_per_epoch=STEPS_PER_EPOCH, total_steps=7, verbose=0)
    # As Keras's steps_per_execution, the second call of 4 runs past the epoch's 5 steps; the
    # budget ends it at step 7, which is recorded.
    assert steps_of(read_run(tmp_path / "train")["step_loss_inside"]) == [7]


def test_validation_steps_write_nothing_into_the_training_run(tmp_path):
    class EvalSummaries(SummaryTrainer):
        def eval_step(self, batch):
            tf.summary.scalar("inside_eval", 1.0)
            return {"loss": tf.constant(0.0)}

    trainer = EvalSummaries(make_mlp(), optimizer="sgd", model_dir=str(tmp_path))
    trainer.fit(data(), epochs=1, validation_data=data(8), verbose=0)
    assert "inside_eval" not in read_run(tmp_path / "train")


def test_summaries_inside_the_step_are_dropped_without_model_dir(tmp_path):
    trainer = SummaryTrainer(make_mlp(), optimizer="sgd")
    trainer.fit(data(), epochs=1, verbose=0)  # no default writer: the summary ops do nothing
    assert int(trainer.global_step.numpy()) == STEPS_PER_EPOCH


@pytest.mark.parametrize("engine_name", ["xla", "xla_loop3"])
def test_xla_steps_train_and_their_summaries_are_not_recorded(tmp_path, engine_name):
    # XLA cannot compile summary ops on CPU/GPU: the step runs, its summaries are skipped.
    trainer = SummaryTrainer(make_mlp(), optimizer="sgd", model_dir=str(tmp_path), **ENGINES[engine_name])
    trainer.fit(data(), epochs=1, verbose=0)
    train = read_run(tmp_path / "train")
    assert "step_loss_inside" not in train
    assert steps_of(train["epoch_loss"]) == [STEPS_PER_EPOCH]


def test_writer_and_condition_serve_every_fit_of_a_trainer(tmp_path):
    # A traced step keeps the writer it was traced with: a second fit must still write.
    trainer = SummaryTrainer(make_mlp(), optimizer="sgd", model_dir=str(tmp_path))
    trainer.fit(data(), epochs=1, verbose=0)
    trainer.fit(data(), epochs=2, verbose=0)  # resumes from the first fit's checkpoint at step 5
    assert steps_of(read_run(tmp_path / "train")["step_loss_inside"]) == [5, 10]
    assert trainer.engines.runner("train").trace_counter.count == 1


# ------------------------------------------------------------ the global step


def test_global_step_is_the_checkpoints_progress_and_is_restored(tmp_path):
    first = tftrain.Trainer(make_mlp(), **compile_args(), model_dir=str(tmp_path))
    first.fit(data(), epochs=1, verbose=0)
    path = tf.train.latest_checkpoint(str(tmp_path / "checkpoints"))
    assert path.endswith(f"ckpt-{STEPS_PER_EPOCH}")
    saved = tf.train.load_checkpoint(path).get_tensor("progress/global_step/.ATTRIBUTES/VARIABLE_VALUE")
    assert saved == STEPS_PER_EPOCH

    second = tftrain.Trainer(make_mlp(seed=2), **compile_args(), model_dir=str(tmp_path))
    steps_seen = []

    class Watch(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            steps_seen.append(int(second.global_step.numpy()))

    second.fit(data(), epochs=2, verbose=0, callbacks=[Watch()])
    assert steps_seen[0] == STEPS_PER_EPOCH  # resumed: the variable holds the checkpoint's step
    assert int(second.global_step.numpy()) == 2 * STEPS_PER_EPOCH


def test_global_step_starts_at_zero_in_each_fit_without_a_checkpoint():
    trainer = tftrain.Trainer(make_mlp(), **compile_args(), steps_per_loop=2)
    trainer.fit(data(), epochs=1, verbose=0)
    assert int(trainer.global_step.numpy()) == STEPS_PER_EPOCH
    trainer.fit(data(), epochs=1, verbose=0)
    assert int(trainer.global_step.numpy()) == STEPS_PER_EPOCH
    assert int(trainer.optimizer.iterations.numpy()) == 2 * STEPS_PER_EPOCH  # Keras's own count goes on


def test_global_step_is_not_part_of_checkpoint_state():
    trainer = tftrain.Trainer(make_mlp(), **compile_args())
    assert trainer.checkpoint_state() == {}


def files_open_under(directory):
    """The files under `directory` this process holds open (Linux's /proc/self/fd)."""
    directory, found = str(directory), []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(directory):
                found.append(target)
    return found


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="lists open files through /proc/self/fd (Linux)")
def test_no_file_under_model_dir_stays_open_after_fit_evaluate_predict_or_a_failed_save(tmp_path, monkeypatch):
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    trainer = SummaryTrainer(make_mlp(), "sgd", loss, model_dir=str(tmp_path), summary_every_steps=2)
    trainer.fit(data(), epochs=1, validation_data=data(), verbose=0)
    assert files_open_under(tmp_path) == []
    trainer.evaluate(data(), verbose=0)
    trainer.predict(data().map(lambda x, y: x), verbose=0)
    assert files_open_under(tmp_path) == []
    trainer.fit(data(), epochs=2, verbose=0)  # the next fit opens a new event file and records in it
    assert steps_of(read_run(tmp_path / "train")["step_loss_inside"]) == [2, 4, 5, 6, 8, 10]
    assert trainer.engines.runner("train").trace_counter.count == 1
    assert files_open_under(tmp_path) == []
    fail_after_writing(monkeypatch)
    with pytest.raises(CheckpointWriteError):
        trainer.fit(data(), epochs=3, verbose=0)
    assert files_open_under(tmp_path) == []
