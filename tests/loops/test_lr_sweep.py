"""The learning-rate range test (`Trainer.find_learning_rate`): the sweep, its suggestion, and the state left as it was."""

import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import ENGINES, TWO_CPU_MIRRORED_SETUP, run_result_script

import tftrain
from tftrain.compat import keras_internals
from tftrain.loops import lr_sweep

# A convex problem: least squares y = X w with full-batch SGD. The loss is the MSE,
# whose Hessian is H = 2/n X^T X: gradient descent is stable for lr < 2 / lambda_max(H),
# and for lr >= 0.1 / lambda_max its stiffest direction shrinks by 10% or more per step.
N, D = 64, 4
_rng = np.random.RandomState(0)
X = _rng.randn(N, D).astype("float32")
Y = X @ _rng.randn(D, 1).astype("float32")
LAMBDA_MAX = float(np.linalg.eigvalsh(2 / N * X.T.astype("float64") @ X).max())


def linear_trainer(learning_rate=0.01, **kwargs):
    model = keras.Sequential(
        [keras.Input((D,)), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")]
    )
    return tftrain.Trainer(model, keras.optimizers.SGD(learning_rate), "mse", **kwargs)


def classifier(seed=1):
    """A small classifier with state of every kind: weights, a Dropout seed generator, Adam slots, metrics."""
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dropout(0.3, seed=3),
            keras.layers.Dense(3),
        ]
    )


def classifier_trainer(trainer_class=tftrain.Trainer, optimizer=None, **kwargs):
    return trainer_class(
        classifier(),
        optimizer or keras.optimizers.Adam(0.01),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        **kwargs,
    )


def state_of(trainer):
    """Every variable of the training state, by name, as NumPy arrays."""
    groups = {
        "model": trainer.model.variables,
        "optimizer": trainer.optimizer.variables,
        "metrics": [v for metric in trainer.metrics for v in metric.variables],
        "global_step": [trainer.global_step],
    }
    for name, value in trainer.checkpoint_state().items():
        groups[name] = value.variables if hasattr(value, "variables") else tf.nest.flatten(value)
    return {f"{group}/{i}": v.numpy() for group, variables in groups.items() for i, v in enumerate(variables)}


def assert_same_state(before, after):
    assert before.keys() == after.keys()
    for key, value in before.items():
        assert after[key].dtype == value.dtype, key
        np.testing.assert_array_equal(after[key], value, err_msg=key)


def dependencies(optimizer):
    """The names under which a checkpoint saves the optimizer's children."""
    return sorted(tf.train.TrackableView(optimizer).children(optimizer))


@pytest.mark.parametrize("engine", ["eager", "graph", "xla"])
def test_state_is_unchanged_bit_for_bit(engine, tiny_dataset):
    trainer = classifier_trainer(**ENGINES[engine])
    trainer.fit(
        tiny_dataset, epochs=1, verbose=0
    )  # slots, metrics, global step and timing not at their start
    before, timing, loops = state_of(trainer), trainer.timing, dict(trainer.engines.runners)
    traces, names = trainer.engines.runners["train"].traces, dependencies(trainer.optimizer)

    sweep = trainer.find_learning_rate(tiny_dataset, steps=15, max_lr=1.0)

    assert len(sweep.losses) == 15 and not sweep.stopped_early
    assert_same_state(before, state_of(trainer))
    assert int(trainer.optimizer.iterations) == 7 and int(trainer.global_step) == 7
    assert trainer.timing is timing and trainer.engines.runners == loops
    assert trainer.engines.runners["train"].traces == traces  # the engine was not traced for the sweep
    assert dependencies(trainer.optimizer) == names


def test_schedule_is_replaced_for_the_sweep_and_put_back():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=1, decay_rate=0.5)
    trainer = linear_trainer(schedule)
    trainer.fit(X, Y, batch_size=16, epochs=1, verbose=0)
    before, names = state_of(trainer), dependencies(trainer.optimizer)

    sweep = trainer.find_learning_rate(X, Y, batch_size=N, steps=30, max_lr=1.0)

    assert keras_internals.learning_rate_object(trainer.optimizer) is schedule
    assert_same_state(before, state_of(trainer))
    assert dependencies(trainer.optimizer) == names
    # The sweep's learning rates, not the schedule's, trained: as with a float learning rate.
    reference = linear_trainer()
    reference.model.set_weights(trainer.model.get_weights())
    expected = reference.find_learning_rate(X, Y, batch_size=N, steps=30, max_lr=1.0)
    assert sweep.losses == expected.losses


def test_loss_scale_optimizer_sweeps_its_inner_learning_rate():
    schedule = keras.optimizers.schedules.ExponentialDecay(1e-6, decay_steps=1, decay_rate=0.5)
    trainer = linear_trainer(schedule, mixed_precision="mixed_float16")
    assert isinstance(trainer.optimizer, keras.optimizers.LossScaleOptimizer)
    trainer.optimizer.build(trainer.model.trainable_variables)
    before = state_of(trainer)

    sweep = trainer.find_learning_rate(X, Y, batch_size=N, steps=30, max_lr=0.5)

    assert (
        sweep.losses[-1] < sweep.losses[0] / 10
    )  # trained at the sweep's rates, not the schedule's tiny ones
    assert keras_internals.learning_rate_object(trainer.optimizer) is schedule
    assert_same_state(before, state_of(trainer))


def test_the_keras_internals_the_sweep_needs():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    optimizer = keras.optimizers.SGD(schedule)
    assert keras_internals.learning_rate_object(optimizer) is schedule
    keras_internals.set_learning_rate_object(optimizer, lambda: 0.25)
    assert float(optimizer.learning_rate) == 0.25 and optimizer.variables == [optimizer.iterations]
    wrapped = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.5))
    assert (
        keras_internals.learning_rate_object(wrapped) is wrapped.inner_optimizer.variables[1]
    )  # not its own
    variable = keras.Variable(1.0)
    assert type(keras_internals.backend_variable(variable)) is not keras.Variable
    assert isinstance(keras_internals.backend_variable(variable), tf.Variable)
    with pytest.raises(tftrain.errors.KerasInternalsError, match="_learning_rate.*Keras 3"):
        keras_internals.learning_rate_object(object())


class HandWritten(tftrain.Trainer):
    """The custom-loop style: its own step, a metric and a counter of its own (checkpointed state)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_mean = keras.metrics.Mean(name="loss")
        self.calls = tf.Variable(0, dtype=tf.int64)

    def train_step(self, batch):
        x, y = batch
        with tf.GradientTape() as tape:
            loss = keras.losses.sparse_categorical_crossentropy(
                y, self.model(x, training=True), from_logits=True
            )
            loss = tf.reduce_mean(loss)
        variables = self.model.trainable_variables
        self.optimizer.apply(tape.gradient(loss, variables), variables)
        self.loss_mean.update_state(loss)
        self.calls.assign_add(1)
        return {"loss": self.loss_mean.result()}


def test_custom_loop_style_state_is_unchanged(tiny_dataset):
    trainer = classifier_trainer(HandWritten)
    trainer.fit(tiny_dataset, epochs=1, verbose=0)
    before = state_of(trainer)
    assert int(trainer.calls) == 7 and "owner_calls" in trainer.checkpoint_state()

    sweep = trainer.find_learning_rate(tiny_dataset, steps=30, max_lr=10.0)

    assert_same_state(before, state_of(trainer))
    assert sweep.suggestion is not None and sweep.suggestion in sweep.learning_rates


def test_fit_after_the_sweep_is_bit_identical_to_a_fit_without_it(tiny_data):
    def run(sweep):
        trainer = classifier_trainer()
        if sweep:
            trainer.find_learning_rate(*tiny_data, batch_size=8, steps=10)
        trainer.fit(*tiny_data, batch_size=8, epochs=2, verbose=0)
        return trainer

    with_sweep, without = run(True), run(False)
    assert_same_state(state_of(without), state_of(with_sweep))
    assert with_sweep.timing.trace_count == without.timing.trace_count
    assert with_sweep.timing.steps == without.timing.steps


@pytest.mark.parametrize("smoothing", [0.98, 0.0])
def test_suggestion_on_a_convex_problem_is_in_the_stable_range(smoothing):
    trainer = linear_trainer()
    sweep = trainer.find_learning_rate(X, Y, batch_size=N, smoothing=smoothing)

    assert 0.1 / LAMBDA_MAX <= sweep.suggestion < 2 / LAMBDA_MAX, (sweep.suggestion, LAMBDA_MAX)
    assert sweep.learning_rates[0] == pytest.approx(1e-7)
    ratios = np.diff(np.log(sweep.learning_rates))
    np.testing.assert_allclose(ratios, np.log(1e8) / 99, rtol=1e-9)  # exponential, 100 steps over 1e-7..10
    assert sweep.no_suggestion_reason is None


def test_early_stop_when_the_loss_diverges():
    sweep = linear_trainer().find_learning_rate(X, Y, batch_size=N, max_lr=1e3, steps=60)

    assert sweep.stopped_early and "rose above 4 times its lowest" in sweep.stop_reason
    assert len(sweep.losses) == len(sweep.learning_rates) == len(sweep.smoothed_losses) < 60
    assert sweep.learning_rates[-1] > 2 / LAMBDA_MAX  # it stopped past the stable range
    assert sweep.smoothed_losses[-1] > 4 * min(sweep.smoothed_losses[:-1])


def test_early_stop_at_a_non_finite_loss():
    trainer = linear_trainer()
    sweep = trainer.find_learning_rate(X, Y, batch_size=N, max_lr=1e30, steps=60, stop_factor=float("inf"))

    assert sweep.stopped_early and "not finite" in sweep.stop_reason
    assert not np.isfinite(sweep.losses[-1]) and all(np.isfinite(sweep.losses[:-1]))
    assert np.all(trainer.model.get_weights()[0] == 0)  # restored from the diverged state


def test_data_is_cycled_and_a_generator_read_once():
    trainer = linear_trainer()
    three_batches = tf.data.Dataset.from_tensor_slices((X, Y)).batch(24)  # 24, 24, 16
    assert len(trainer.find_learning_rate(three_batches, steps=8).losses) == 8
    of_unknown_length = three_batches.filter(lambda x, y: True)
    assert len(trainer.find_learning_rate(of_unknown_length, steps=8).losses) == 8

    generator = ((X[i : i + 16], Y[i : i + 16]) for i in range(0, N, 16))
    sweep = trainer.find_learning_rate(generator, steps=8)
    assert len(sweep.losses) == 4 and sweep.stopped_early and "data ended after 4 steps" in sweep.stop_reason


def test_losses_are_each_steps_own():
    # Keras's `loss` log is a mean since the metrics' last reset: reset before each step, it is the step's loss.
    trainer = linear_trainer()
    sweep = trainer.find_learning_rate(X, Y, batch_size=16, min_lr=1e-12, max_lr=1e-11, steps=4)
    # The weights stay zero (the learning rates are too small to move them): each batch's loss is its mean y^2.
    expected = [float(np.mean(Y[i : i + 16] ** 2)) for i in range(0, N, 16)]
    assert np.ptp(expected) > 0.5
    np.testing.assert_allclose(sweep.losses, expected, rtol=1e-5)


def test_suggest():
    rates = lr_sweep.learning_rates(1e-4, 1.0, 30)
    assert rates[0] == pytest.approx(1e-4) and rates[-1] == pytest.approx(1.0) and len(rates) == 30
    falling = list(1.0 - np.tanh(np.linspace(-3, 3, 30)))  # falls fastest at its middle
    suggestion, reason = lr_sweep.suggest(rates, falling)
    assert reason is None and suggestion in (rates[14], rates[15])

    suggestion, reason = lr_sweep.suggest(rates[:3], falling[:3])
    assert suggestion is None and "too few points: 3 steps ran" in reason

    suggestion, reason = lr_sweep.suggest(rates, list(np.linspace(1, 2, 30)))
    assert suggestion is None and "never fell" in reason


def test_plot_draws_the_curve_and_the_suggestion():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    sweep = linear_trainer().find_learning_rate(X, Y, batch_size=N, steps=40)
    ax = sweep.plot()
    try:
        lines = ax.get_lines()
        np.testing.assert_array_equal(lines[0].get_xdata(), sweep.learning_rates)
        np.testing.assert_array_equal(lines[0].get_ydata(), sweep.losses)
        np.testing.assert_array_equal(lines[1].get_ydata(), sweep.smoothed_losses)
        assert lines[2].get_xdata()[0] == sweep.suggestion  # the suggestion's vertical line
        assert ax.get_xscale() == "log"
        _, own = plt.subplots()
        assert sweep.plot(own, show_suggestion=False) is own and len(own.get_lines()) == 2
    finally:
        plt.close("all")


def test_plot_without_matplotlib_names_the_extra(monkeypatch):
    sweep = lr_sweep.LearningRateSweep([1e-3, 1e-2], [1.0, 0.5], [1.0, 0.7], None, False)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ImportError, match=r'pip install "tftrain\[plot\]"'):
        sweep.plot()


def test_to_dict():
    sweep = linear_trainer().find_learning_rate(X, Y, batch_size=N, steps=3)
    values = sweep.to_dict()
    assert values["losses"] == sweep.losses and values["suggestion"] is None
    assert (
        "too few points" in values["no_suggestion_reason"]
        and tftrain.LearningRateSweep is lr_sweep.LearningRateSweep
    )


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(min_lr=0.0), "min_lr=0.0"),
        (dict(min_lr=True), "min_lr=True"),
        (dict(min_lr=1e-3, max_lr=1e-4), "max_lr=0.0001 with min_lr=0.001"),
        (dict(max_lr=float("inf")), "max_lr=inf"),
        (dict(steps=1), "steps=1"),
        (dict(steps=10.0), "steps=10.0"),
        (dict(smoothing=1.0), "smoothing=1.0"),
        (dict(smoothing=-0.1), "smoothing=-0.1"),
        (dict(stop_factor=1), "stop_factor=1"),
    ],
)
def test_bad_arguments(arguments, message):
    trainer = linear_trainer()
    with pytest.raises(ValueError, match=rf"Invalid value for argument .*Received: {message}"):
        trainer.find_learning_rate(X, Y, **arguments)


def test_missing_loss_log_or_optimizer_is_a_clear_error(tiny_dataset):
    with pytest.raises(
        ValueError, match=r"monitor='val_loss', but the training step returned the logs \['loss'"
    ):
        linear_trainer().find_learning_rate(X, Y, monitor="val_loss", steps=2)

    class OwnOptimizer(HandWritten):
        def train_step(self, batch):
            return {"loss": tf.constant(1.0)}

    trainer = OwnOptimizer(classifier())
    with pytest.raises(ValueError, match="sweeps the learning rate of the model's optimizer"):
        trainer.find_learning_rate(tiny_dataset, steps=2)
    with pytest.raises(ValueError, match="not compiled"):  # as fit says it
        tftrain.Trainer(classifier()).find_learning_rate(tiny_dataset, steps=2)


@pytest.mark.parametrize("engine", ["eager", "graph"])
def test_optimizer_built_in_the_first_step(engine, tiny_dataset):
    """A second optimizer built in the first step: traced first, it is restored too; eager, a warning says it is not."""

    class TwoOptimizers(tftrain.Trainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.head_optimizer = keras.optimizers.Adam(0.1)  # not built

        def train_step(self, batch):
            x, y = batch
            with tf.GradientTape(persistent=True) as tape:
                logits = self.model(x, training=True)
                loss = tf.reduce_mean(
                    keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
                )
            body, head = self.model.trainable_variables[:2], self.model.trainable_variables[2:]
            self.optimizer.apply(tape.gradient(loss, body), body)
            self.head_optimizer.apply(tape.gradient(loss, head), head)
            return {"loss": loss}

    trainer = TwoOptimizers(classifier(), keras.optimizers.SGD(0.1), **ENGINES[engine])
    before = [v.numpy() for v in trainer.model.variables]
    if engine == "eager":
        with pytest.warns(UserWarning, match="variables were created by the first training step"):
            trainer.find_learning_rate(tiny_dataset, steps=3)
    else:
        trainer.find_learning_rate(tiny_dataset, steps=3)
        assert int(trainer.head_optimizer.iterations) == 0
        assert all(not np.any(v.numpy()) for v in trainer.head_optimizer.variables[2:])  # zero slots
    assert all(np.array_equal(a, b.numpy()) for a, b in zip(before, trainer.model.variables, strict=True))


def test_state_is_restored_after_an_interrupt(tiny_dataset):
    class Interrupted(HandWritten):
        def train_step(self, batch):
            logs = super().train_step(batch)
            if int(self.calls) == 4:
                raise KeyboardInterrupt
            return logs

    trainer = classifier_trainer(Interrupted, use_tf_function=False)
    trainer.optimizer.build(trainer.model.trainable_variables)
    before = state_of(trainer)
    with pytest.raises(KeyboardInterrupt):
        trainer.find_learning_rate(tiny_dataset, steps=10)
    assert_same_state(before, state_of(trainer))


MIRRORED_SCRIPT = TWO_CPU_MIRRORED_SETUP + textwrap.dedent(
    """
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(3)])
        model.compile(keras.optimizers.Adam(0.01),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    trainer = tftrain.Trainer(model, strategy=strategy)
    trainer.fit(dataset, epochs=1, verbose=0)

    def replica_values():
        variables = model.variables + model.optimizer.variables + model.metrics_variables
        return [part.numpy() for v in variables + [trainer.global_step]
                for part in strategy.experimental_local_results(
                    v.value if isinstance(v, keras.Variable) else v)]

    before = replica_values()
    sweep = trainer.find_learning_rate(dataset, steps=30)
    after = replica_values()
    same = len(before) == len(after) and all(
        a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(before, after))
    # A metric's total is summed over the replicas: each replica keeps its own part.
    parts = [p.numpy().item() for p in strategy.experimental_local_results(model.metrics_variables[0].value)]
    print("RESULT" + json.dumps({"same": same, "suggestion": sweep.suggestion, "points": len(sweep.losses),
                                 "parts": parts, "iterations": int(model.optimizer.iterations.numpy())}))
    """
)


def test_under_mirrored_strategy_on_two_cpus():
    result = run_result_script(MIRRORED_SCRIPT, timeout=240)
    assert result["same"], result
    assert result["suggestion"] is not None and result["points"] >= 12
    assert len(result["parts"]) == 2 and result["iterations"] == 4
