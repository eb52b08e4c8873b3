"""The dry run (`Trainer.check`): each stage of a fit once, timed; the first error named; everything put back."""

import inspect
import pathlib
import pickle
import tempfile
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import TWO_CPU_MIRRORED_SETUP, compile_args, make_mlp, run_result_script
from test_lr_sweep import HandWritten as SweptTrainer  # a sibling test module: its custom-loop Trainer

import tftrain
from tftrain.checkpoint.files import error_line
from tftrain.loops import dry_run

STAGES_WITH_CALLS = ("train", "validate", "predict")


def trainer_state(trainer):
    """Every variable a step may change, as NumPy arrays: model, optimizer, metrics, own state, global step."""
    variables = list(trainer.model.variables) + list(trainer.optimizer.variables)
    variables += [variable for metric in trainer.metrics for variable in metric.variables]
    for value in trainer.checkpoint_state().values():
        variables += list(getattr(value, "variables", None) or tf.nest.flatten(value))
    variables.append(trainer.global_step)
    return [np.array(variable.numpy()) for variable in variables]


def assert_same(before, after):
    assert len(before) == len(after)
    for index, (old, new) in enumerate(zip(before, after, strict=True)):
        assert old.dtype == new.dtype and old.tobytes() == new.tobytes(), index


def model_variables(trainer):
    return [np.array(variable.numpy()) for variable in trainer.model.variables]


def assert_as_built(trainer, weights):
    """A Trainer checked before it trained: the model as it was, what the check built at its initial values."""
    assert_same(weights, model_variables(trainer))
    assert int(trainer.optimizer.iterations) == 0 and int(trainer.global_step) == 0
    assert all(not np.any(variable.numpy()) for metric in trainer.metrics for variable in metric.variables)
    slots = [variable for variable in trainer.optimizer.variables if "learning_rate" not in variable.path]
    assert all(not np.any(variable.numpy()) for variable in slots)


def files_under(directory):
    """Every file under `directory` with its bytes (empty if it does not exist)."""
    root = pathlib.Path(directory)
    return {
        str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()
    }


class ValidationBug(keras.Sequential):
    """A classifier whose evaluation step raises while `bug` is set (read when the step traces or runs)."""

    bug = False

    def test_step(self, data):
        if self.bug:
            raise ValueError("the validation step has a bug")
        return super().test_step(data)


def bug_model(seed=1):
    keras.utils.set_random_seed(seed)
    return ValidationBug([keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])


def left_in(directory):
    """What the check left in a temporary directory (AutoGraph writes its own files there too)."""
    return [path.name for path in directory.iterdir() if path.name.startswith("tftrain_dry_run_")]


@pytest.fixture
def quiet_temp(tmp_path, monkeypatch):
    """The check's temporary files go under a directory of the test's own, to see that none is left."""
    directory = tmp_path / "temp"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    return directory


def test_check_takes_fits_arguments_with_fits_defaults():
    fit = inspect.signature(tftrain.Trainer.fit).parameters
    check = inspect.signature(tftrain.Trainer.check).parameters
    assert list(check)[: len(fit)] == list(fit)
    for name, parameter in fit.items():
        assert (check[name].default, check[name].kind) == (parameter.default, parameter.kind), name
    assert list(check)[len(fit) :] == ["export"]


def test_each_stage_runs_and_is_timed_and_the_state_is_put_back(engine, tiny_data, quiet_temp):
    trainer = tftrain.Trainer(make_mlp(), **compile_args(), **engine)
    x, y = tiny_data
    trainer.fit(x, y, batch_size=8, epochs=1, verbose=0)  # slots, metrics, step and timing not at their start
    before, timing = trainer_state(trainer), trainer.timing
    loops = dict(trainer.engines.runners)
    traces = {kind: loop.traces for kind, loop in loops.items()}

    report = trainer.check(x, y, batch_size=8, validation_split=0.2, export=True, verbose=0)

    assert report.ok and report.failed_stage is None
    assert [stage.name for stage in report.stages] == list(dry_run.STAGES)
    assert all(stage.ran and stage.error is None and stage.seconds > 0 for stage in report.stages)
    for name in STAGES_WITH_CALLS:  # each has a second batch: a steady call is measured
        assert report.stage(name).steady_seconds > 0, name
    assert report.engine == trainer.options.name
    steps = trainer.options.fixed_steps
    assert report.stage("train").detail.startswith(f"{steps} step")
    assert 0 < report.seconds < 120
    assert_same(before, trainer_state(trainer))
    assert trainer.timing is timing and trainer.engines.runners == loops
    assert {kind: loop.traces for kind, loop in loops.items()} == traces  # the Trainer's engines were not run
    assert int(trainer.global_step) == int(trainer.optimizer.iterations) == 7
    assert left_in(quiet_temp) == []  # the checkpoint and the export were removed


def test_a_validation_bug_is_named_and_a_fit_afterwards_is_bit_identical(
    engine, tiny_data, deterministic, tmp_path
):
    x, y = tiny_data
    model_dir = tmp_path / "run"
    trainer = tftrain.Trainer(bug_model(), **compile_args(), model_dir=str(model_dir), **engine)
    weights = model_variables(trainer)
    trainer.model.bug = True

    with pytest.raises(tftrain.DryRunError) as caught:
        trainer.check(x, y, batch_size=8, epochs=2, validation_split=0.2, verbose=0)

    error = caught.value
    assert error.stage == "validate" and error.report.failed_stage.name == "validate"
    assert "'validate' stage" in str(error) and "the validation step has a bug" in str(error)
    assert len(str(error).splitlines()) == 1
    assert isinstance(error.__cause__, ValueError)
    report = error.report
    assert not report.ok and report.seconds < 60
    assert [stage.ran for stage in report.stages] == [True, True, True, False, False, False]
    assert "'validate' stage failed" in report.stage("checkpoint").detail
    assert_as_built(trainer, weights)
    assert not model_dir.exists()

    trainer.model.bug = False
    history = trainer.fit(x, y, batch_size=8, epochs=2, validation_split=0.2, verbose=0)
    reference = tftrain.Trainer(
        bug_model(), **compile_args(), model_dir=str(tmp_path / "reference"), **engine
    )
    expected = reference.fit(x, y, batch_size=8, epochs=2, validation_split=0.2, verbose=0)
    assert_same(trainer_state(reference), trainer_state(trainer))
    assert history.history == expected.history
    assert trainer.timing.trace_count == reference.timing.trace_count


def test_a_fit_after_a_check_of_shuffled_arrays_reads_the_same_order(tiny_data, deterministic):
    """Keras shuffles arrays with TensorFlow's random ops; the check draws no order a fit would draw."""
    x, y = tiny_data

    def run(check):
        keras.utils.set_random_seed(7)
        trainer = tftrain.Trainer(make_mlp(), **compile_args())
        if check:
            trainer.check(x, y, batch_size=8, validation_split=0.2, verbose=0)
        history = trainer.fit(x, y, batch_size=8, epochs=2, validation_split=0.2, verbose=0)
        return trainer_state(trainer), history.history, np.random.rand(), tf.random.uniform(())

    checked, plain = run(True), run(False)
    assert_same(plain[0], checked[0])
    assert checked[1] == plain[1]
    assert checked[2] == plain[2] and float(checked[3]) == float(plain[3])


class ShuffledBatches(keras.utils.PyDataset):
    """Batches in an order NumPy's global generator draws at each epoch end (as many PyDatasets shuffle)."""

    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y
        self.order = np.arange(len(x))

    def __len__(self):
        return len(self.x) // 8

    def __getitem__(self, index):
        rows = self.order[index * 8 : (index + 1) * 8]
        return self.x[rows], self.y[rows]

    def on_epoch_end(self):
        self.order = np.random.permutation(len(self.x))


def test_numpys_global_random_state_is_put_back(tiny_data, deterministic):
    """The check runs the PyDataset's epoch hooks, which draw from NumPy: a fit afterwards draws the same orders."""
    x, y = tiny_data

    def run(check):
        keras.utils.set_random_seed(7)
        trainer = tftrain.Trainer(make_mlp(), **compile_args())
        if check:
            trainer.check(ShuffledBatches(x, y), verbose=0)
        trainer.fit(ShuffledBatches(x, y), epochs=3, verbose=0)
        return trainer_state(trainer)

    assert_same(run(False), run(True))


class PerExample(keras.Model):
    """Divides by the batch size read in Python: trains on fixed batches, cannot be exported (its batch is None)."""

    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(3)

    def call(self, x):
        return self.dense(x) / float(int(x.shape[0]))


def test_a_misspelled_best_checkpoint_monitor_fails_the_check_not_the_fit(tiny_data, tmp_path):
    """The run's services check at each epoch end what they monitor: the check runs them."""
    x, y = tiny_data
    model_dir = tmp_path / "run"
    trainer = tftrain.Trainer(make_mlp(), **compile_args(), model_dir=str(model_dir), best_checkpoint_monitor="val_los")
    weights = model_variables(trainer)

    with pytest.raises(tftrain.DryRunError, match="'checkpoint' stage: ValueError: .*'val_los'") as caught:
        trainer.check(x[:40], y[:40], batch_size=8, validation_data=(x[40:], y[40:]), epochs=2, verbose=0)

    assert caught.value.stage == "checkpoint"
    assert [stage.ran for stage in caught.value.report.stages] == [True, True, True, True, False, False]
    assert_as_built(trainer, weights)
    assert not model_dir.exists()


def test_a_failing_export_is_named_export(tiny_dataset, quiet_temp):
    keras.utils.set_random_seed(1)
    trainer = tftrain.Trainer(PerExample(), **compile_args())
    trainer.model(np.zeros((8, 6), "float32"))  # built on a batch of 8
    weights = model_variables(trainer)
    fixed = tiny_dataset.unbatch().batch(8, drop_remainder=True)

    with pytest.raises(tftrain.DryRunError, match="'export' stage: TypeError: .* int") as caught:
        trainer.check(fixed, export=True, verbose=0)

    report = caught.value.report
    assert caught.value.stage == "export" and isinstance(caught.value.__cause__, TypeError)
    assert [stage.ran for stage in report.stages] == [True, True, False, True, True, True]
    assert "no validation data" in report.stage("validate").detail
    assert report.stage("predict").detail.endswith("on `x`")
    assert_as_built(trainer, weights)
    assert left_in(quiet_temp) == []


def test_a_resumed_model_dir_is_untouched_and_resumes_as_before(tiny_data, deterministic, tmp_path):
    x, y = tiny_data
    arguments = dict(batch_size=8, epochs=2, validation_split=0.2, verbose=0)

    def first_epoch(directory):
        trainer = tftrain.Trainer(make_mlp(), **compile_args(), model_dir=str(directory))
        trainer.fit(x, y, **{**arguments, "epochs": 1})
        return trainer

    checked, plain = first_epoch(tmp_path / "checked"), first_epoch(tmp_path / "plain")
    files = files_under(tmp_path / "checked")
    assert any(name.startswith("checkpoints/ckpt-") for name in files)

    report = checked.check(x, y, **arguments)

    assert report.ok and files_under(tmp_path / "checked") == files
    checked.fit(x, y, **arguments)
    plain.fit(x, y, **arguments)
    assert_same(trainer_state(plain), trainer_state(checked))
    assert int(checked.global_step) == 10  # 2 epochs of 40 examples in batches of 8


def test_a_nonfinite_first_loss_is_named_train(tiny_dataset):
    model = make_mlp()
    trainer = tftrain.Trainer(model, keras.optimizers.SGD(0.01), "mse")
    trainer.fit(
        tiny_dataset.map(lambda features, labels: (features, tf.one_hot(labels, 3))).take(1), verbose=0
    )
    before = trainer_state(trainer)
    huge = tiny_dataset.map(lambda features, labels: (features, tf.one_hot(labels, 3) * 1e30))

    with pytest.raises(tftrain.DryRunError, match="'train' stage: NonFiniteLossError") as caught:
        trainer.check(huge, verbose=0)

    assert isinstance(caught.value.__cause__, tftrain.NonFiniteLossError)
    assert_same(before, trainer_state(trainer))


def test_a_state_no_checkpoint_takes_is_named_checkpoint(tiny_dataset):
    """Without the NaN guard a blow-up trains on; the checkpoint refuses the non-finite weights."""
    trainer = tftrain.Trainer(make_mlp(), keras.optimizers.SGD(0.01), "mse", terminate_on_nan=False)
    huge = tiny_dataset.map(lambda features, labels: (features, tf.one_hot(labels, 3) * 1e30))

    with pytest.raises(tftrain.DryRunError, match="'checkpoint' stage: NonFiniteStateError") as caught:
        trainer.check(huge, verbose=0)

    assert [stage.ran for stage in caught.value.report.stages] == [True, True, False, True, False, False]
    assert np.all(np.isfinite(trainer.model.get_weights()[0]))


def test_a_restore_that_misses_variables_is_named_checkpoint(tiny_dataset, monkeypatch):
    trainer = tftrain.Trainer(make_mlp(), **compile_args())
    trainer.fit(tiny_dataset, verbose=0)
    before = trainer_state(trainer)
    monkeypatch.setattr(tftrain.checkpoint.Checkpointer, "restore_latest", lambda self, *args, **kwargs: None)

    with pytest.raises(
        tftrain.DryRunError, match="'checkpoint' stage: ValueError: The checkpoint saved did not"
    ):
        trainer.check(tiny_dataset, verbose=0)

    assert_same(before, trainer_state(trainer))


def test_an_error_is_named_in_one_line():
    """What the report and `DryRunError` name: a layer's message past Keras's preamble, no op prefix or styles."""

    class Broken(keras.layers.Layer):
        def call(self, x):
            raise ValueError("the layer has a bug")

    with pytest.raises(ValueError) as layer_error:
        Broken()(np.zeros((2, 3), "float32"))
    with pytest.raises(tf.errors.InvalidArgumentError) as op_error:
        tf.function(lambda x: tf.gather(x, 5))(tf.zeros(3))
    layer_line, op_line = error_line(layer_error.value), error_line(op_error.value)
    assert layer_line.startswith("ValueError: Exception encountered when calling Broken")
    assert layer_line.endswith(" the layer has a bug") and "\x1b" not in layer_line
    assert op_line.startswith("InvalidArgumentError: ") and op_line.endswith("is not in [0, 3)")
    assert "{{" not in op_line and "\n" not in op_line + layer_line


def test_a_bad_argument_is_named_prepare(tiny_data):
    trainer = tftrain.Trainer(make_mlp(), **compile_args())
    with pytest.raises(
        tftrain.DryRunError, match="'prepare' stage: ValueError: Invalid value for argument `epochs`"
    ) as caught:
        trainer.check(*tiny_data, epochs=-1, verbose=0)
    copied = pickle.loads(pickle.dumps(caught.value))  # e.g. from a worker process
    assert (str(copied), copied.stage, copied.report) == (str(caught.value), "prepare", caught.value.report)
    with pytest.raises(TypeError, match="Invalid value for argument `export`"):
        trainer.check(*tiny_data, export="yes", verbose=0)


class HandWritten(SweptTrainer):
    """The custom-loop style: its own steps, a metric and a counter of its own (checkpointed state)."""

    def eval_step(self, batch):
        x, y = batch
        self.loss_mean.update_state(
            keras.losses.sparse_categorical_crossentropy(y, self.model(x), from_logits=True)
        )
        return {"loss": self.loss_mean.result()}

    def predict_step(self, batch):
        return tf.nn.softmax(self.model(batch))


@pytest.mark.parametrize("engine", ["eager", "graph"])
def test_custom_loop_style_state_is_put_back(engine, tiny_data, tiny_dataset):
    trainer = HandWritten(make_mlp(), keras.optimizers.Adam(0.01), use_tf_function=engine == "graph")
    trainer.fit(tiny_dataset, epochs=1, verbose=0)
    before = trainer_state(trainer)
    assert int(trainer.calls) == 7 and "owner_calls" in trainer.checkpoint_state()

    report = trainer.check(tiny_dataset, validation_data=tiny_dataset, verbose=0)

    assert report.ok and report.stage("predict").detail.endswith("on `validation_data`")
    assert_same(before, trainer_state(trainer))


def test_an_interrupt_puts_the_state_back_and_goes_on(tiny_dataset):
    class Interrupted(HandWritten):
        def eval_step(self, batch):
            raise KeyboardInterrupt

    trainer = Interrupted(make_mlp(), keras.optimizers.Adam(0.01), use_tf_function=False)
    trainer.optimizer.build(trainer.model.trainable_variables)
    before = trainer_state(trainer)
    with pytest.raises(KeyboardInterrupt):
        trainer.check(tiny_dataset, validation_data=tiny_dataset, verbose=0)
    assert_same(before, trainer_state(trainer))


def test_a_generator_is_not_read_again_for_predict(tiny_data):
    x, y = tiny_data

    def batches():
        for start in range(0, 48, 8):
            yield x[start : start + 8], y[start : start + 8]

    trainer = tftrain.Trainer(make_mlp(), **compile_args())
    report = trainer.check(batches(), verbose=0)
    assert report.ok and not report.stage("predict").ran
    assert "generator" in report.stage("predict").detail


def test_verbose_prints_the_summary(tiny_dataset, capsys):
    trainer = tftrain.Trainer(make_mlp(), **compile_args(), steps_per_loop=2)
    trainer.check(tiny_dataset, verbose=0)
    assert capsys.readouterr().out == ""

    report = trainer.check(tiny_dataset)

    printed = capsys.readouterr().out
    assert printed.strip() == report.summary()
    assert printed.startswith("dry run (graph+loop2): ok")
    for name in dry_run.STAGES:
        assert f"  {name} " in printed
    assert "  export     not run: not asked for" in printed
    assert report.to_dict()["stages"][1]["name"] == "train"


MIRRORED_SCRIPT = TWO_CPU_MIRRORED_SETUP + textwrap.dedent(
    """
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(3)])
        model.compile(keras.optimizers.Adam(0.01),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    trainer = tftrain.Trainer(model, strategy=strategy, steps_per_loop=2)
    trainer.fit(dataset, epochs=1, verbose=0)

    def replica_values():
        variables = model.variables + model.optimizer.variables + model.metrics_variables
        return [part.numpy() for v in variables + [trainer.global_step]
                for part in strategy.experimental_local_results(
                    v.value if isinstance(v, keras.Variable) else v)]

    before = replica_values()
    report = trainer.check(dataset, validation_data=dataset, export=True, verbose=0)
    after = replica_values()
    same = len(before) == len(after) and all(
        a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(before, after))
    print("RESULT" + json.dumps({"same": same, "ran": [stage.ran for stage in report.stages],
                                 "ok": report.ok, "engine": report.engine}))
    """
)


def test_under_mirrored_strategy_on_two_cpus():
    result = run_result_script(MIRRORED_SCRIPT, timeout=240)
    assert result["same"] and result["ok"], result
    assert result["ran"] == [True] * 6 and result["engine"] == "graph+loop2"


def test_a_report_names_the_stage_asked_for_or_says_which_it_has():
    from tftrain.loops.dry_run import DryRunReport, DryRunStage

    report = DryRunReport("graph", (DryRunStage("prepare", True, 0.1),), 0.1)
    assert report.stage("prepare").seconds == 0.1
    for name in ("train", "trian"):  # a stage this report lacks, and no stage at all
        with pytest.raises(ValueError, match="Received: name="):
            report.stage(name)
