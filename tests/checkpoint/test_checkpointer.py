"""Checkpoints: what a save holds, crash leftovers, damaged and incompatible checkpoints, resume.

The `Checkpointer` tests drive `tftrain.checkpoint` directly on tiny models
trained eagerly with `train_on_batch`. The resume tests run
`tftrain.Trainer.fit` in this process, under op determinism and fixed seeds,
stop a run with an exception from a callback, and compare the resumed run's
final state to an uninterrupted run's bit for bit. (Killing a real process is
covered by test_trainer_resume.py.)
"""

import glob
import json
import os
import re
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import compile_args, make_mlp

import tftrain
from tftrain import checkpoint as checkpoint_lib
from tftrain.checkpoint import (
    Checkpointer,
    CorruptCheckpointError,
    IncompatibleCheckpointError,
    NonFiniteStateError,
    Progress,
    data_position,
    seed_generator_states,
    training_state,
)
from tftrain.checkpoint.state import SERVICE_STATES_KEY

RNG = np.random.RandomState(0)
X = RNG.rand(40, 6).astype("float32")
Y = (X[:, 0] * 3).astype("int32").clip(0, 2)
DATA = ".data-00000-of-00001"
TWO_SAVES = sorted(["checkpoint", "ckpt-1.index", "ckpt-1" + DATA, "ckpt-2.index", "ckpt-2" + DATA])


# ------------------------------------------------------------------ helpers


def make_model(seed=1, hidden=8, extra=None, run_eagerly=True):
    """A compiled MLP with Dropout and named layers: hidden -> dropout -> logits [-> extra]."""
    keras.utils.set_random_seed(seed)
    layers = [
        keras.Input((6,)),
        keras.layers.Dense(hidden, activation="relu", name="hidden"),
        keras.layers.Dropout(0.25, name="dropout"),
        keras.layers.Dense(3, name="logits"),
    ]
    if extra:
        layers.append(keras.layers.Dense(extra, name="extra"))
    model = keras.Sequential(layers)
    model.compile(**compile_args(), run_eagerly=run_eagerly)
    return model


def trained_model(seed=1, steps=2, **kwargs):
    """`make_model` trained `steps` batches: its optimizer slots, seed and metric states are set."""
    model = make_model(seed, **kwargs)
    for step in range(steps):
        model.train_on_batch(X[8 * step : 8 * step + 8], Y[8 * step : 8 * step + 8])
    return model


def snapshot(model):
    """The whole training state as arrays, by group."""
    groups = {
        "weights": model.weights,
        "optimizer": model.optimizer.variables,
        "seed": seed_generator_states(model),
        "metrics": [variable for metric in model.metrics for variable in metric.variables],
    }
    return {group: [np.array(v.numpy()) for v in variables] for group, variables in groups.items()}


def assert_same_state(actual, expected):
    assert actual.keys() == expected.keys()
    for group in expected:
        assert len(actual[group]) == len(expected[group]), group
        for index, (value, wanted) in enumerate(zip(actual[group], expected[group], strict=True)):
            np.testing.assert_array_equal(value, wanted, err_msg=f"{group} variable {index}")


def assert_every_group_differs(a, b):
    """Guards a round trip: each group of state must differ before the restore."""
    for group in a:
        assert any(not np.array_equal(x, y) for x, y in zip(a[group], b[group], strict=True)), group


def files_of(directory):
    return sorted(os.listdir(directory))


def truncate_data_file(prefix):
    data = prefix + DATA
    with open(data, "r+b") as handle:
        handle.truncate(os.path.getsize(data) // 2)


def save_two(directory):
    """Saves a model twice, training a step in between; returns [(path, progress, state)] per save."""
    model = trained_model(seed=1)
    checkpointer = Checkpointer(directory, training_state(model))
    saves = []
    for number in (1, 2):
        progress = Progress(epoch=number, step_in_epoch=0, global_step=2 * number, batches_in_pass=0)
        saves.append((checkpointer.save(progress), progress, snapshot(model)))
        model.train_on_batch(X[16:24], Y[16:24])
    return checkpointer, saves


def make_leftovers(directory, number):
    """What a save killed half-way leaves: a temporary directory and state file, unrecorded files."""
    temp = os.path.join(directory, f"ckpt-{number}_temp")
    os.makedirs(temp)
    with open(os.path.join(temp, "part-00000-of-00001" + DATA), "wb") as handle:
        handle.write(b"partial")
    with open(os.path.join(directory, "checkpoint.tmp0123abcd"), "w") as handle:
        handle.write("partial")
    for suffix in (".index", DATA):  # complete files, but never recorded in the state file
        with open(os.path.join(directory, f"ckpt-{number - 1}{suffix}"), "rb") as source:
            content = source.read()
        with open(os.path.join(directory, f"ckpt-{number}{suffix}"), "wb") as handle:
            handle.write(content)
    names = ["checkpoint.tmp0123abcd", f"ckpt-{number}_temp", f"ckpt-{number}.index", f"ckpt-{number}{DATA}"]
    return sorted(os.path.join(directory, name) for name in names)


# ---------------------------------------------------------- save and restore


def test_round_trip_restores_weights_optimizer_seeds_metrics_and_progress(tmp_path):
    directory = str(tmp_path)
    model = trained_model(seed=1, steps=2)
    checkpointer = Checkpointer(directory, training_state(model))
    assert checkpointer.restore_latest() is None
    assert checkpointer.latest is None
    progress = Progress(epoch=1, step_in_epoch=2, global_step=7, batches_in_pass=3)
    path = checkpointer.save(progress)
    assert path == os.path.join(directory, "ckpt-1") == checkpointer.latest
    saved = snapshot(model)
    assert len(saved["seed"]) == 1 and len(saved["metrics"]) == 4

    # Another run of the same architecture: other seeds, one more step.
    other = trained_model(seed=2, steps=3)
    assert_every_group_differs(snapshot(other), saved)
    restorer = Checkpointer(directory, training_state(other))
    assert restorer.restore_latest() == progress
    assert restorer.latest == path
    assert_same_state(snapshot(other), saved)
    assert int(other.optimizer.iterations) == 2


# ----------------------------------------------------- interrupted saves


def test_clean_leftovers_removes_only_what_an_interrupted_save_left(tmp_path):
    checkpointer, _ = save_two(str(tmp_path))
    leftovers = make_leftovers(str(tmp_path), 3)
    assert sorted(checkpointer.clean_leftovers()) == leftovers
    assert files_of(tmp_path) == TWO_SAVES
    assert checkpointer.clean_leftovers() == []


def test_restore_latest_cleans_leftovers_and_restores_the_last_recorded(tmp_path):
    _, saves = save_two(str(tmp_path))
    make_leftovers(str(tmp_path), 3)
    model = trained_model(seed=2)
    checkpointer = Checkpointer(str(tmp_path), training_state(model))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the last recorded checkpoint is good: no warning
        assert checkpointer.restore_latest() == saves[1][1]
    assert files_of(tmp_path) == TWO_SAVES
    assert_same_state(snapshot(model), saves[1][2])
    # The next save takes the number of the interrupted one.
    assert checkpointer.save(Progress(global_step=9)) == os.path.join(str(tmp_path), "ckpt-3")


# ------------------------------------------------------ damaged checkpoints


def test_corrupt_latest_falls_back_to_the_previous_checkpoint(tmp_path):
    directory = str(tmp_path)
    _, [(first, first_progress, first_state), (second, _, _)] = save_two(directory)
    truncate_data_file(second)
    model = trained_model(seed=2)
    checkpointer = Checkpointer(directory, training_state(model))
    with pytest.warns(UserWarning, match=re.escape(f"The checkpoint {second} cannot be read")):
        assert checkpointer.restore_latest() == first_progress
    assert_same_state(snapshot(model), first_state)
    assert files_of(directory) == sorted(
        ["checkpoint", "ckpt-1.index", "ckpt-1" + DATA, "ckpt-2.index.corrupt", "ckpt-2" + DATA + ".corrupt"]
    )
    state = tf.train.get_checkpoint_state(directory)
    assert state.model_checkpoint_path == first
    assert list(state.all_model_checkpoint_paths) == [first]
    assert checkpointer.latest == first
    # A later run restores the good checkpoint, without a warning.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert (
            Checkpointer(directory, training_state(trained_model(seed=3))).restore_latest() == first_progress
        )


def test_a_checkpoint_damaged_where_only_its_restore_reads_falls_back_to_the_previous(tmp_path, monkeypatch):
    # A data iterator's state (a variant) is read only when restored: `find` validates the newest,
    # `restore` meets the damage, and the next `find` gives the one before it.
    directory = str(tmp_path)
    _, [(first, first_progress, first_state), (second, _, _)] = save_two(directory)
    checkpointer = Checkpointer(directory, training_state(trained_model(seed=2)))
    restore_from = checkpointer._restore_from

    def damaged_second(path, reader, iterator):
        if path == second:
            raise tf.errors.DataLossError(None, None, "the iterator's state is truncated")
        return restore_from(path, reader, iterator)

    monkeypatch.setattr(checkpointer, "_restore_from", damaged_second)
    assert checkpointer.find().path == second
    with pytest.warns(UserWarning, match=re.escape(f"The checkpoint {second} cannot be read")):
        assert checkpointer.restore_latest() == first_progress
    assert checkpointer.latest == first
    assert os.path.exists(second + ".index.corrupt")


def test_every_checkpoint_corrupt_raises_naming_them(tmp_path):
    directory = str(tmp_path)
    _, saves = save_two(directory)
    for path, _, _ in saves:
        truncate_data_file(path)
    model = trained_model(seed=2)
    before = snapshot(model)
    checkpointer = Checkpointer(directory, training_state(model))
    with pytest.warns(UserWarning, match="cannot be read"):
        with pytest.raises(CorruptCheckpointError) as raised:
            checkpointer.restore_latest()
    message = str(raised.value)
    for path, _, _ in saves:
        assert path in message, message
    assert_same_state(snapshot(model), before)


# ------------------------------------------------- incompatible checkpoints


@pytest.mark.parametrize(
    "saved_kwargs, model_kwargs, expected",
    [
        (
            dict(hidden=8),
            dict(hidden=5),
            r"variable `[\w/]*hidden/kernel` \(checkpoint key \S+\) has shape \(6, 8\) in the checkpoint "
            r"but \(6, 5\) in the model",
        ),
        (
            dict(extra=4),
            dict(),
            r"the checkpoint has `[\w/]*extra/kernel` \(checkpoint key \S+\) of shape \(3, 4\), "
            r"which the model lacks",
        ),
        (dict(), dict(extra=4), r"variable `[\w/]*extra/kernel` of shape \(3, 4\) is not in the checkpoint"),
    ],
    ids=["other_units", "model_lacks_a_layer", "checkpoint_lacks_a_layer"],
)
def test_incompatible_checkpoint_raises_and_restores_nothing(tmp_path, saved_kwargs, model_kwargs, expected):
    directory = str(tmp_path)
    saved = trained_model(seed=1, **saved_kwargs)
    path = Checkpointer(directory, training_state(saved)).save(Progress(epoch=1))
    model = trained_model(seed=2, **model_kwargs)
    before = snapshot(model)
    assert not np.array_equal(before["weights"][-1], saved.weights[-1].numpy())
    checkpointer = Checkpointer(directory, training_state(model))
    with pytest.raises(IncompatibleCheckpointError) as raised:
        checkpointer.restore_latest()
    message = str(raised.value)
    assert f"The checkpoint {path} does not fit this model" in message
    assert re.search(expected, message), message
    assert_same_state(snapshot(model), before)
    assert files_of(directory) == ["checkpoint", "ckpt-1" + DATA, "ckpt-1.index"]


# ---------------------------------------------------------- non-finite state


@pytest.mark.parametrize("where", ["weight", "optimizer_slot"])
def test_save_refuses_non_finite_state(tmp_path, where):
    model = trained_model(seed=1)
    checkpointer = Checkpointer(str(tmp_path), training_state(model))
    first = checkpointer.save(Progress(global_step=2))
    if where == "weight":
        variable = model.get_layer("logits").kernel
        variable.assign(np.full(variable.shape, np.nan, "float32"))
    else:
        variable = next(v for v in model.optimizer.variables if "velocity" in v.path)
        variable.assign(np.full(variable.shape, np.inf, "float32"))
    files = files_of(tmp_path)
    with pytest.raises(NonFiniteStateError, match=re.escape(f"`{variable.path}`")):
        checkpointer.save(Progress(global_step=3))
    assert files_of(tmp_path) == files
    assert checkpointer.latest == first
    assert tf.train.get_checkpoint_state(str(tmp_path)).model_checkpoint_path == first


# ------------------------------------------------------ Trainer bad input


def test_model_dir_that_is_a_file_raises_at_construction(tmp_path):
    path = tmp_path / "a_file"
    path.write_text("keep me")
    with pytest.raises(ValueError, match="which is a file"):
        tftrain.Trainer(make_mlp(), **compile_args(), model_dir=str(path))
    assert path.read_text() == "keep me"


def test_non_writable_model_dir_raises_at_construction(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root can write to a read-only directory")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        for model_dir in (locked, locked / "run"):
            with pytest.raises(ValueError, match="cannot be written"):
                tftrain.Trainer(make_mlp(), **compile_args(), model_dir=str(model_dir))
        assert os.listdir(locked) == []
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(model_dir="DIR", checkpoint_every_steps=0), "checkpoint_every_steps=0"),
        (dict(model_dir="DIR", checkpoint_every_steps=1.5), "checkpoint_every_steps=1.5"),
        (dict(checkpoint_every_steps=2), "checkpoint_every_steps=2 with model_dir=None"),
        (dict(model_dir="DIR", max_to_keep=0), "max_to_keep=0"),
        (dict(model_dir="DIR", max_to_keep=True), "max_to_keep=True"),
    ],
    ids=["every_0", "every_float", "every_without_model_dir", "keep_0", "keep_bool"],
)
def test_bad_checkpoint_options_raise_at_construction(tmp_path, kwargs, match):
    kwargs = {key: str(tmp_path / "run") if value == "DIR" else value for key, value in kwargs.items()}
    with pytest.raises(ValueError, match=re.escape(match)):
        tftrain.Trainer(make_mlp(), **compile_args(), **kwargs)
    assert not (tmp_path / "run" / "checkpoints").exists()


# ------------------------------------------------ resume through Trainer.fit


def shuffled_dataset():
    """40 examples reshuffled each pass (seeded): 5 batches of 8, a fresh iterator per epoch."""
    dataset = tf.data.Dataset.from_tensor_slices((X, Y))
    return dataset.shuffle(40, seed=1, reshuffle_each_iteration=True).batch(8)


def cached_dataset():
    """The 40 examples in order, batched and cached: every pass reads the same batches."""
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(8).cache()


def cached_shuffled_dataset():
    """A cache reshuffled each pass (seeded): tf.data cannot save its iterator symbolically."""
    dataset = tf.data.Dataset.from_tensor_slices((X, Y)).cache()
    return dataset.shuffle(40, seed=1, reshuffle_each_iteration=True).batch(8)


def repeated_dataset():
    """The shuffled dataset repeated: with `steps_per_epoch`, one iterator runs across epochs."""
    return shuffled_dataset().repeat()


def generator_dataset():
    """40 examples from a Python generator, in order: tf.data cannot checkpoint its iterator."""

    def examples():
        yield from zip(X, Y, strict=True)

    signature = (tf.TensorSpec((6,), tf.float32), tf.TensorSpec((), tf.int32))
    return tf.data.Dataset.from_generator(examples, output_signature=signature).batch(8)


class Crash(Exception):
    """Stands for a crash in the middle of training."""


class Probe(keras.callbacks.Callback):
    """Records the step a fit starts at (after any restore); raises `Crash` once `stop_at` steps ran."""

    def __init__(self, stop_at=None):
        super().__init__()
        self.stop_at = stop_at
        self.start_step = None

    def on_train_begin(self, logs=None):
        self.start_step = int(self.model.optimizer.iterations)

    def on_train_batch_end(self, batch, logs=None):
        if self.stop_at is not None and int(self.model.optimizer.iterations) >= self.stop_at:
            raise Crash(f"crashed after step {self.stop_at}")


def fit(model_dir, make_data, epochs, *, steps_per_epoch=None, stop_at=None, **trainer_kwargs):
    """Builds the model, data and Trainer the same way every time and fits; returns (model, probe)."""
    model = make_model(seed=7, run_eagerly=False)
    trainer = tftrain.Trainer(
        model, model_dir=None if model_dir is None else str(model_dir), **trainer_kwargs
    )
    probe = Probe(stop_at)
    trainer.fit(make_data(), epochs=epochs, steps_per_epoch=steps_per_epoch, verbose=0, callbacks=[probe])
    return model, probe


@pytest.fixture(scope="module")
def uninterrupted(deterministic):
    """The final state and epoch logs of an uninterrupted run without `model_dir`, by settings (cached)."""
    cache = {}

    def final_state(make_data, epochs, steps_per_epoch=None, **engine):
        key = (make_data.__name__, epochs, steps_per_epoch, tuple(sorted(engine.items())))
        if key not in cache:
            model, _ = fit(None, make_data, epochs, steps_per_epoch=steps_per_epoch, **engine)
            cache[key] = snapshot(model), model.history.history
        return cache[key]

    return final_state


def assert_same_run(resumed, reference, epochs_run):
    """A resumed run ends in the reference's state, with its logs for the epochs it ran (bit for bit)."""
    state, history = reference
    assert_same_state(snapshot(resumed), state)
    logs = resumed.history.history
    assert logs.keys() == history.keys()
    for key, values in logs.items():
        assert len(values) == epochs_run, key
        assert values == history[key][-epochs_run:], key


def assert_no_iterator_warning(recorded):
    assert not [w for w in recorded if "cannot be checkpointed" in str(w.message)]


def test_resume_at_an_epoch_boundary_matches_an_uninterrupted_run(tmp_path, uninterrupted, recwarn):
    reference = uninterrupted(shuffled_dataset, 3)
    first_epoch, _ = fit(tmp_path, shuffled_dataset, 1)
    assert not np.array_equal(snapshot(first_epoch)["weights"][0], reference[0]["weights"][0])
    resumed, probe = fit(tmp_path, shuffled_dataset, 3)
    assert probe.start_step == 5
    assert int(resumed.optimizer.iterations) == 15
    assert_same_run(resumed, reference, epochs_run=2)
    assert_no_iterator_warning(recwarn)


@pytest.mark.parametrize(
    "make_data, steps_per_epoch, engine, every, stop_at",
    [
        # 5 steps an epoch, a fresh iterator each: saves at steps 2, 4, 5 (epoch end), 6; crash at 7.
        (shuffled_dataset, None, {}, 2, 7),
        # 4 steps an epoch on one iterator, 2 steps a host call: saves at 3, 4, 6; crash at 8.
        (repeated_dataset, 4, dict(steps_per_loop=2), 3, 8),
        # A cache read in a fixed order: no iterator in the checkpoint, the resume skips batches.
        (cached_dataset, None, {}, 2, 7),
        # A cache reshuffled each pass: the iterator is saved with its buffers.
        (cached_shuffled_dataset, None, {}, 2, 7),
    ],
    ids=["finite_data", "repeated_data_steps_per_loop_2", "cached_data", "cached_shuffled_data"],
)
def test_resume_mid_epoch_matches_an_uninterrupted_run(
    tmp_path, uninterrupted, recwarn, make_data, steps_per_epoch, engine, every, stop_at
):
    reference = uninterrupted(make_data, 3, steps_per_epoch, **engine)
    settings = dict(steps_per_epoch=steps_per_epoch, checkpoint_every_steps=every, **engine)
    with pytest.raises(Crash):
        fit(tmp_path, make_data, 3, stop_at=stop_at, **settings)
    resumed, probe = fit(tmp_path, make_data, 3, **settings)
    assert probe.start_step == 6  # one or two steps into epoch 2
    assert_same_run(resumed, reference, epochs_run=2)  # epoch 2's logs need its restored metrics
    assert_no_iterator_warning(recwarn)


def test_rerunning_a_finished_job_trains_no_further_steps(tmp_path, deterministic):
    engine = dict(use_tf_function=False)  # the engine does not matter here: run eagerly, untraced
    model = make_model(seed=7, run_eagerly=False)
    trainer = tftrain.Trainer(model, model_dir=str(tmp_path), **engine)
    trainer.fit(shuffled_dataset(), epochs=1, verbose=0)
    finished = snapshot(model)
    assert int(model.optimizer.iterations) == 5
    # The same trainer again, then new objects as a rerun command makes them: nothing is left to do.
    assert trainer.fit(shuffled_dataset(), epochs=1, verbose=0).history == {}
    rerun, probe = fit(tmp_path, shuffled_dataset, 1, **engine)
    assert probe.start_step == 5
    assert rerun.history.history == {}
    for again in (model, rerun):
        assert int(again.optimizer.iterations) == 5
        assert_same_state(snapshot(again), finished)


def test_uncheckpointable_iterator_warns_and_resume_skips_seen_batches(tmp_path, uninterrupted):
    reference = uninterrupted(generator_dataset, 2)
    # Saves at steps 2, 4, 5 (epoch end) and 6, without the iterator; crash at 7.
    with pytest.warns(UserWarning, match="cannot be checkpointed"):
        with pytest.raises(Crash):
            fit(tmp_path, generator_dataset, 2, stop_at=7, checkpoint_every_steps=2)
    with pytest.warns(UserWarning, match="cannot be checkpointed"):
        resumed, probe = fit(tmp_path, generator_dataset, 2, checkpoint_every_steps=2)
    assert probe.start_step == 6  # then skips the 1 batch of the pass it had trained on
    assert_same_run(resumed, reference, epochs_run=1)


def test_uncheckpointable_iterator_resumes_after_an_epoch_end_at_the_next_pass(tmp_path, uninterrupted):
    reference = uninterrupted(generator_dataset, 2)
    # The only checkpoint before the crash is epoch 1's end (step 5): the next epoch is a fresh pass.
    with pytest.warns(UserWarning, match="cannot be checkpointed"):
        with pytest.raises(Crash):
            fit(tmp_path, generator_dataset, 2, stop_at=6)
    with pytest.warns(UserWarning, match="cannot be checkpointed"):
        resumed, probe = fit(tmp_path, generator_dataset, 2)
    assert probe.start_step == 5
    assert int(resumed.optimizer.iterations) == 10  # epoch 2 trained all 5 of its batches
    assert_same_run(resumed, reference, epochs_run=1)


# ------------------------------------------------------------------ best checkpoint, restore_model


def test_the_best_epoch_is_kept_apart_and_restore_model_loads_it(tmp_path):
    x = np.random.RandomState(0).rand(32, 6).astype("float32")
    y = (x[:, 0] * 3).astype("int32").clip(0, 2)
    weights_at_epoch_end = []

    class Record(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            weights_at_epoch_end.append([w.copy() for w in self.model.get_weights()])

    trainer = tftrain.Trainer(
        make_mlp(),
        keras.optimizers.SGD(0.5),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        model_dir=str(tmp_path),
        max_to_keep=1,
        best_checkpoint_monitor="val_loss",
    )
    history = trainer.fit(
        x, y, batch_size=8, epochs=6, validation_data=(x[:8], y[:8]), callbacks=[Record()], verbose=0
    )
    best_epoch = int(np.argmin(history.history["val_loss"]))
    best = tf.train.latest_checkpoint(str(tmp_path / "best"))
    assert best.endswith(f"ckpt-{(best_epoch + 1) * 4}")  # numbered by the step of that epoch's end
    assert len(glob.glob(str(tmp_path / "best" / "*.index"))) == 1
    fresh = make_mlp(seed=9)
    fresh.compile(keras.optimizers.SGD(0.5), "mse")
    assert checkpoint_lib.restore_model(fresh, str(tmp_path / "best")) == best
    for got, expected in zip(fresh.get_weights(), weights_at_epoch_end[best_epoch], strict=True):
        np.testing.assert_array_equal(got, expected)
    assert int(fresh.optimizer.iterations) == (best_epoch + 1) * 4


def test_the_best_checkpoint_follows_validations_every_n_steps(tmp_path):
    x = np.random.RandomState(0).rand(32, 6).astype("float32")
    y = (x[:, 0] * 3).astype("int32").clip(0, 2)
    weights_at_step = {}

    class Record(keras.callbacks.Callback):
        def on_test_begin(self, logs=None):  # a validation reads the weights of the step it follows
            weights_at_step[int(trainer.global_step.numpy())] = [w.copy() for w in self.model.get_weights()]

    trainer = tftrain.Trainer(
        make_mlp(),
        keras.optimizers.SGD(0.5),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        model_dir=str(tmp_path),
        best_checkpoint_monitor="val_loss",
        steps_per_loop=2,
    )
    history = trainer.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(8).repeat(),
        total_steps=18,
        validation_data=(x[:8], y[:8]),
        validation_every_steps=3,
        validation_freq=[],  # no per-epoch validation: the step validations alone decide
        callbacks=[Record()],
        verbose=0,
    )
    steps, losses = history.step_history["step"], history.step_history["val_loss"]
    assert steps == [3, 6, 9, 12, 15, 18]
    best_step = steps[int(np.argmin(losses))]
    assert tf.train.latest_checkpoint(str(tmp_path / "best")).endswith(f"ckpt-{best_step}")
    fresh = make_mlp(seed=9)
    checkpoint_lib.restore_model(fresh, str(tmp_path / "best"), include_optimizer=False)
    for got, expected in zip(fresh.get_weights(), weights_at_step[best_step], strict=True):
        np.testing.assert_array_equal(got, expected)
    # A monitor the validations do not log fails at the first one, naming the logs there are.
    other = tftrain.Trainer(
        make_mlp(), "sgd", "mse", model_dir=str(tmp_path / "other"), best_checkpoint_monitor="val_acc"
    )
    with pytest.raises(ValueError, match=r"but the validation's logs are \['val_loss'\]"):
        other.fit(
            np.zeros((8, 6), "float32"),
            np.zeros((8, 3), "float32"),
            batch_size=2,
            validation_split=0.5,
            validation_every_steps=1,
            verbose=0,
        )
    assert int(other.global_step.numpy()) == 1


def test_a_best_checkpoint_monitor_that_no_log_provides_fails_at_the_first_epoch_end(tmp_path):
    trainer = tftrain.Trainer(
        make_mlp(), "sgd", "mse", model_dir=str(tmp_path), best_checkpoint_monitor="val_acc"
    )
    with pytest.raises(
        ValueError,
        match=r"best_checkpoint_monitor='val_acc', but the epoch's logs are \['loss', 'val_loss'\]",
    ):
        trainer.fit(
            np.zeros((8, 6), "float32"),
            np.zeros((8, 3), "float32"),
            epochs=3,
            validation_split=0.5,
            verbose=0,
        )
    assert int(trainer.model.optimizer.iterations) == 1
    with pytest.raises(ValueError, match="best_checkpoint_mode='lowest'"):
        tftrain.Trainer(
            make_mlp(), model_dir=str(tmp_path), best_checkpoint_monitor="loss", best_checkpoint_mode="lowest"
        )
    with pytest.raises(ValueError, match="best_checkpoint_monitor='loss' with model_dir=None"):
        tftrain.Trainer(make_mlp(), best_checkpoint_monitor="loss")


def test_restore_model_refuses_what_does_not_fit(tmp_path):
    with pytest.raises(checkpoint_lib.CheckpointError, match="No checkpoint in"):
        checkpoint_lib.restore_model(make_mlp(), str(tmp_path))
    trainer = tftrain.Trainer(make_mlp(), "sgd", "mse", model_dir=str(tmp_path))
    trainer.fit(np.zeros((8, 6), "float32"), np.zeros((8, 3), "float32"), verbose=0)
    wider = keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(9, activation="relu"), keras.layers.Dense(3)]
    )
    before = [w.copy() for w in wider.get_weights()]
    with pytest.raises(checkpoint_lib.IncompatibleCheckpointError, match="shape"):
        checkpoint_lib.restore_model(wider, str(tmp_path / "checkpoints"), include_optimizer=False)
    for got, expected in zip(wider.get_weights(), before, strict=True):
        np.testing.assert_array_equal(got, expected)  # nothing partly restored


# ------------------------------------------------ resume from a chosen checkpoint


def test_resume_from_a_chosen_checkpoint_continues_that_run_exactly(tmp_path, uninterrupted):
    reference = uninterrupted(shuffled_dataset, 3)
    fit(tmp_path / "first", shuffled_dataset, 2, checkpoint_every_steps=3)  # saves at 3, 5, 6, 9, 10
    chosen = str(tmp_path / "first" / "checkpoints" / "ckpt-6")  # one step into epoch 2
    resumed, probe = fit(tmp_path / "second", shuffled_dataset, 3, resume_from=chosen)
    assert probe.start_step == 6
    assert_same_run(resumed, reference, epochs_run=2)
    second = str(tmp_path / "second" / "checkpoints")
    assert tf.train.latest_checkpoint(second).endswith("ckpt-15")
    # The new run's own checkpoints win from now on: the same command again has nothing left to do.
    rerun, probe = fit(tmp_path / "second", shuffled_dataset, 3, resume_from=chosen)
    assert probe.start_step == 15
    assert_same_state(snapshot(rerun), reference[0])


def test_resume_from_refuses_what_it_cannot_use_before_any_step(tmp_path):
    with pytest.raises(ValueError, match="resume_from='x' with model_dir=None"):
        tftrain.Trainer(make_model(), resume_from="x")
    with pytest.raises(ValueError, match="Invalid value for argument `resume_from`"):
        tftrain.Trainer(make_model(), model_dir=str(tmp_path / "bad"), resume_from=3)
    with pytest.raises(checkpoint_lib.CheckpointError, match="resume_from=.*ckpt-404', which does not exist"):
        fit(tmp_path / "new", shuffled_dataset, 1, resume_from=str(tmp_path / "missing" / "ckpt-404"))
    with pytest.raises(checkpoint_lib.CheckpointError, match="No checkpoint in"):
        fit(tmp_path / "new", shuffled_dataset, 1, resume_from=str(tmp_path))
    assert tf.train.latest_checkpoint(str(tmp_path / "new" / "checkpoints")) is None
    # Another model's checkpoint: the mismatch is named and nothing is restored.
    other = make_model(seed=3, hidden=5)
    tftrain.Trainer(other, model_dir=str(tmp_path / "other")).fit(shuffled_dataset(), verbose=0)
    model = make_model(seed=7)
    before = [np.array(weight) for weight in model.get_weights()]
    trainer = tftrain.Trainer(model, model_dir=str(tmp_path / "new"), resume_from=str(tmp_path / "other"))
    with pytest.raises(
        checkpoint_lib.CheckpointError, match="a tftrain `model_dir`. pass .*other/checkpoints"
    ):
        trainer.fit(shuffled_dataset(), verbose=0)
    trainer = tftrain.Trainer(
        model, model_dir=str(tmp_path / "new"), resume_from=str(tmp_path / "other" / "checkpoints")
    )
    with pytest.raises(checkpoint_lib.IncompatibleCheckpointError, match="hidden"):
        trainer.fit(shuffled_dataset(), verbose=0)
    for got, expected in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(got, expected)  # nothing partly restored


# ------------------------------------------------ how checkpoints keep the data position


@pytest.mark.parametrize(
    "make_data, mode, iterator_saved",
    [
        (shuffled_dataset, "symbolic", True),
        (cached_dataset, "position", False),
        (cached_shuffled_dataset, "full", True),
    ],
    ids=["shuffled", "cached", "cached_shuffled"],
)
def test_the_data_position_is_checkpointed_the_cheapest_exact_way(tmp_path, make_data, mode, iterator_saved):
    fit(tmp_path, make_data, 1)
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path / "checkpoints")))
    assert bool(reader.get_tensor("iterator_saved/.ATTRIBUTES/VARIABLE_VALUE")) is iterator_saved
    states = json.loads(reader.get_tensor(SERVICE_STATES_KEY))
    assert states["data"] == {"checkpoint": mode}


def test_a_large_cache_is_not_written_into_each_checkpoint(tmp_path):
    x = np.zeros((4096, 256), "float32")  # a 4 MB cache
    y = np.zeros((4096,), "int32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(64).cache()
    model = keras.Sequential([keras.Input((256,)), keras.layers.Dense(3)])
    trainer = tftrain.Trainer(model, "sgd", "sparse_categorical_crossentropy", model_dir=str(tmp_path))
    trainer.fit(data, verbose=0)
    files = glob.glob(str(tmp_path / "checkpoints" / "ckpt-64.*"))
    assert sum(os.path.getsize(f) for f in files) < 200_000  # the weights, not the 4 MB cache


def test_a_checkpoint_from_before_data_modes_resumes_its_iterator_exactly(
    tmp_path, uninterrupted, monkeypatch
):
    # Written as tftrain wrote checkpoints before: the iterator with its buffers, no "data" state.
    reference = uninterrupted(shuffled_dataset, 3)
    monkeypatch.setattr(data_position, "prepare", lambda dataset, saved: ("full", dataset))
    monkeypatch.setattr(data_position.DataPosition, "state_dict", lambda self: None)
    with pytest.raises(Crash):
        fit(tmp_path, shuffled_dataset, 3, stop_at=7, checkpoint_every_steps=2)
    monkeypatch.undo()
    resumed, probe = fit(tmp_path, shuffled_dataset, 3, checkpoint_every_steps=2)
    assert probe.start_step == 6
    assert_same_run(resumed, reference, epochs_run=2)


def test_an_error_preparing_the_data_is_not_taken_for_a_damaged_checkpoint(tmp_path, monkeypatch):
    fit(tmp_path, shuffled_dataset, 1, checkpoint_every_steps=2)

    def fail(dataset, saved):
        raise RuntimeError("the input pipeline failed")

    monkeypatch.setattr(data_position, "prepare", fail)
    with pytest.raises(RuntimeError, match="the input pipeline failed"):
        fit(tmp_path, shuffled_dataset, 2, checkpoint_every_steps=2)
    assert not [name for name in os.listdir(tmp_path / "checkpoints") if name.endswith(".corrupt")]


def test_progress_saves_and_loads_itself_under_its_own_key(tmp_path):
    progress = Progress(epoch=2, step_in_epoch=3, global_step=11, batches_in_pass=5)
    shared = tf.Variable(11, dtype=tf.int64)
    variables = Progress.variables(shared)
    progress.save_to(variables, shared)
    path = tf.train.Checkpoint(**{Progress.name: variables}).write(str(tmp_path / "ckpt"))
    reader = tf.train.load_checkpoint(path)
    assert Progress.read(reader) == progress == Progress.load(variables)
    assert int(reader.get_tensor(Progress.key("global_step"))) == 11
    with pytest.raises(RuntimeError, match="holds 11 but the run counted 12"):
        Progress(global_step=12).save_to(variables, shared)
