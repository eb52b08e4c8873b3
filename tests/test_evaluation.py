"""Continuous evaluation (`tftrain.evaluation`): each checkpoint of a model_dir, evaluated as it appears."""

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time

import keras
import numpy as np
import pytest
from helpers import compile_args, make_mlp, read_run

import tftrain
from tftrain import evaluation
from tftrain.checkpoint import IncompatibleCheckpointError, restore_model
from tftrain.checkpoint.writer_lock import WriterLock

JOB = os.path.join(os.path.dirname(__file__), "jobs", "resume_job.py")
STEPS = [2, 4, 6, 8]  # the finished run: 2 epochs of 4 steps, a checkpoint every 2 steps
FAST = dict(timeout_s=30.0, poll_interval_s=0.01)


def data():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(32, 6)).astype("float32")
    return x, (x[:, 0] > 0).astype("int32") + (x[:, 1] > 0).astype("int32")


def evaluator(seed=2, **kwargs):
    """A Trainer on a freshly initialised model of the training run's architecture."""
    return tftrain.Trainer(make_mlp(seed), **compile_args(), **kwargs)


def snapshot(directory):
    return {name: os.path.getmtime(os.path.join(directory, name)) for name in os.listdir(directory)}


@pytest.fixture(scope="module")
def finished_dir(tmp_path_factory):
    """A model_dir whose training run has ended: checkpoints at steps 2, 4, 6 and 8."""
    model_dir = str(tmp_path_factory.mktemp("finished"))
    x, y = data()
    trainer = tftrain.Trainer(make_mlp(1), **compile_args(), model_dir=model_dir, checkpoint_every_steps=2)
    trainer.fit(x, y, batch_size=8, epochs=2, verbose=0)
    return model_dir


def test_after_training_matches_evaluate_of_each_checkpoint(finished_dir, tmp_path):
    model_dir = str(tmp_path / "run")
    shutil.copytree(finished_dir, model_dir)
    checkpoints = os.path.join(model_dir, "checkpoints")
    before = snapshot(checkpoints)
    x, y = data()

    results = evaluator(model_dir=model_dir).evaluate_continuously(x, y, batch_size=8, **FAST)

    assert list(results) == STEPS
    reference = evaluator(seed=5)
    for step in STEPS:
        restore_model(reference.model, os.path.join(checkpoints, f"ckpt-{step}"), include_optimizer=False)
        expected = reference.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)
        assert results[step].keys() == expected.keys()
        for key, value in expected.items():
            np.testing.assert_allclose(results[step][key], value, rtol=1e-6, err_msg=f"{key} at {step}")
    assert len({results[step]["loss"] for step in STEPS}) == len(STEPS)  # each checkpoint its own weights
    with open(os.path.join(model_dir, "eval", "results.json")) as handle:
        assert {int(step): logs for step, logs in json.load(handle).items()} == results
    assert evaluation.read_results(model_dir) == results
    events = read_run(os.path.join(model_dir, "eval"))
    for key in ("loss", "accuracy"):
        assert [step for step, _ in events[key]] == STEPS
        assert [value for _, value in events[key]] == pytest.approx([results[step][key] for step in STEPS])
    # Read-only towards the training run: no file written or touched there, no lock taken.
    assert snapshot(checkpoints) == before
    assert not os.path.exists(os.path.join(model_dir, "writer.lock"))


class CountEvaluations(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.count = 0

    def on_test_begin(self, logs=None):
        self.count += 1


def test_restarted_evaluator_skips_evaluated_steps(finished_dir, tmp_path):
    model_dir = str(tmp_path / "run")
    shutil.copytree(finished_dir, model_dir)
    x, y = data()
    first = evaluation.evaluate_continuously(evaluator(), x, y, model_dir=model_dir, **FAST)
    results_file = os.path.join(model_dir, "eval", "results.json")
    saved = json.load(open(results_file))
    del saved["6"]  # as if the evaluator had stopped before step 6
    with open(results_file, "w") as handle:
        json.dump(saved, handle)

    counter = CountEvaluations()
    again = evaluation.evaluate_continuously(
        evaluator(), x, y, model_dir=model_dir, callbacks=[counter], **FAST
    )

    assert counter.count == 1  # step 6 only
    assert again.keys() == first.keys()
    for step in STEPS:
        assert again[step] == pytest.approx(first[step])
    counter = CountEvaluations()
    evaluation.evaluate_continuously(evaluator(), x, y, model_dir=model_dir, callbacks=[counter], last_step=8)
    assert counter.count == 0
    # TensorBoard got the first evaluator's steps, then step 6 again (dropped from the JSON), nothing more.
    assert [step for step, _ in read_run(os.path.join(model_dir, "eval"))["loss"]] == [2, 4, 6, 8, 6]


def test_checkpoint_rotated_away_is_skipped(finished_dir, tmp_path, caplog):
    model_dir = str(tmp_path / "run")
    shutil.copytree(finished_dir, model_dir)
    for name in os.listdir(os.path.join(model_dir, "checkpoints")):
        if name.startswith("ckpt-4."):  # still recorded, its files gone: what rotation leaves a reader
            os.remove(os.path.join(model_dir, "checkpoints", name))
    x, y = data()
    with caplog.at_level(logging.WARNING, logger="tftrain"):
        results = evaluation.evaluate_continuously(evaluator(), x, y, model_dir=model_dir, **FAST)
    assert list(results) == [2, 6, 8]
    assert "ckpt-4" in caplog.text and "skipping" in caplog.text


def test_checkpoint_of_another_model_fails_loudly(finished_dir, tmp_path):
    model_dir = str(tmp_path / "run")
    shutil.copytree(finished_dir, model_dir)
    keras.utils.set_random_seed(0)
    other = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5), keras.layers.Dense(3)])
    trainer = tftrain.Trainer(other, **compile_args())
    x, y = data()
    with pytest.raises(IncompatibleCheckpointError, match="ckpt-2"):
        evaluation.evaluate_continuously(trainer, x, y, model_dir=model_dir, **FAST)
    assert not os.path.exists(os.path.join(model_dir, "eval", "results.json"))


def test_waits_while_a_live_writer_holds_the_lock(finished_dir, tmp_path):
    model_dir = str(tmp_path / "run")
    shutil.copytree(finished_dir, model_dir)
    x, y = data()
    lock = WriterLock(model_dir)  # this process, alive: as a training run in progress
    try:
        with pytest.raises(evaluation.EvaluationTimeoutError, match="a training process is writing to it"):
            evaluation.evaluate_continuously(
                evaluator(), x, y, model_dir=model_dir, timeout_s=0.3, poll_interval_s=0.05
            )
        assert list(evaluation.read_results(model_dir)) == STEPS  # evaluated, then waited for more
    finally:
        lock.close()
    # A lock left by a dead process is no writer: the evaluator returns.
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    with open(os.path.join(model_dir, "writer.lock"), "w") as handle:
        json.dump({"host": socket.gethostname(), "pid": int(dead.stdout), "since": time.time()}, handle)
    assert list(evaluation.evaluate_continuously(evaluator(), x, y, model_dir=model_dir, **FAST)) == STEPS


@pytest.mark.parametrize("exists", [True, False], ids=["empty", "missing"])
def test_no_checkpoint_times_out(tmp_path, exists):
    model_dir = tmp_path / "run"
    if exists:
        model_dir.mkdir()
    x, y = data()
    start = time.monotonic()
    with pytest.raises(evaluation.EvaluationTimeoutError) as caught:
        evaluation.evaluate_continuously(
            evaluator(), x, y, model_dir=model_dir, timeout_s=0.3, poll_interval_s=0.05
        )
    assert 0.3 <= time.monotonic() - start < 10
    assert isinstance(caught.value, TimeoutError)
    message = str(caught.value)
    assert str(model_dir) in message and "0.3 s" in message
    assert ("holds no checkpoint" if exists else "does not exist") in message
    assert not os.path.exists(model_dir / "eval")


def test_timeout_names_the_newest_checkpoint(finished_dir, tmp_path):
    model_dir = str(tmp_path / "run")
    shutil.copytree(finished_dir, model_dir)
    x, y = data()
    with pytest.raises(evaluation.EvaluationTimeoutError, match=r"waiting for step 9.*ckpt-8"):
        evaluation.evaluate_continuously(
            evaluator(), x, y, model_dir=model_dir, last_step=9, timeout_s=0.2, poll_interval_s=0.05
        )
    assert list(evaluation.read_results(model_dir)) == STEPS


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(timeout_s=0), "timeout_s=0"),
        (dict(timeout_s=-1.0), "timeout_s=-1.0"),
        (dict(timeout_s="60"), "timeout_s='60'"),
        (dict(timeout_s=True), "timeout_s=True"),
        (dict(poll_interval_s=0), "poll_interval_s=0"),
        (dict(poll_interval_s=None), "poll_interval_s=None"),
        (dict(last_step=0), "last_step=0"),
        (dict(last_step=2.5), "last_step=2.5"),
        (dict(verbose=3), "verbose=3"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, match):
    x, y = data()
    with pytest.raises(ValueError, match=rf"Invalid value for argument `\w+`. Received: {match}\. Expected"):
        evaluation.evaluate_continuously(evaluator(), x, y, model_dir=tmp_path, **kwargs)


def test_bad_trainer_data_or_directory(tmp_path):
    x, y = data()
    with pytest.raises(TypeError, match="argument `trainer`.*Expected a tftrain.Trainer"):
        evaluation.evaluate_continuously(make_mlp(), x, y, model_dir=tmp_path)
    with pytest.raises(TypeError, match="argument `x`.*iterated again"):
        evaluation.evaluate_continuously(evaluator(), iter([(x, y)]), model_dir=tmp_path)
    with pytest.raises(ValueError, match="argument `model_dir`. Received: model_dir=None"):
        evaluator().evaluate_continuously(x, y)
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(ValueError, match="argument `model_dir`.*a file"):
        evaluator().evaluate_continuously(x, y, model_dir=a_file)


def test_evaluates_alongside_a_training_process(tmp_path):
    """A training job writes checkpoints (steps 3, 4, 6, 8, 9, 12) while the evaluator watches."""
    model_dir = tmp_path / "run"  # created by the job, after the evaluator has started waiting
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    job = subprocess.Popen(
        [sys.executable, JOB, str(model_dir), "--step-sleep=0.4"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((6,)),
                keras.layers.Dense(16, activation="relu"),
                keras.layers.Dropout(0.3),
                keras.layers.Dense(2),
            ]
        )
        trainer = tftrain.Trainer(model, **compile_args())
        training_when_evaluated = []

        class WhileTraining(keras.callbacks.Callback):
            def on_test_begin(self, logs=None):
                training_when_evaluated.append(job.poll() is None)

        rng = np.random.default_rng(0)
        x = rng.normal(size=(48, 6)).astype("float32")
        y = (x[:, 0] + x[:, 1] > 0).astype("int32")
        results = trainer.evaluate_continuously(
            x,
            y,
            model_dir=model_dir,
            callbacks=[WhileTraining()],
            last_step=12,
            timeout_s=120,
            poll_interval_s=0.05,
        )
        stdout, stderr = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 0, stderr[-3000:]
    steps = list(results)
    assert steps == sorted(steps) and steps[-1] == 12 and set(steps) <= {3, 4, 6, 8, 9, 12}
    assert len(steps) >= 3, steps
    assert training_when_evaluated[0], "the first checkpoint was evaluated while training ran"
    assert evaluation.read_results(model_dir) == results
    assert [step for step, _ in read_run(model_dir / "eval")["loss"]] == steps
