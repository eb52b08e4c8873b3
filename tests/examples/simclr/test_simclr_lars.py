"""LARS against a NumPy implementation of its update rule, its config, and training a Keras model."""

import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import run_result_script

from tftrain.examples.simclr.lars import LARS


def lars_reference(
    weights,
    grads,
    excluded_decay,
    excluded_adaptation,
    *,
    lr,
    momentum,
    weight_decay,
    eeta,
    classic_momentum,
    nesterov,
):
    """Runs the LARS rule in NumPy over a list of steps; returns the final weights."""
    weights = {name: value.astype(np.float64) for name, value in weights.items()}
    velocity = {name: np.zeros_like(value) for name, value in weights.items()}

    def trust(w, u):
        w_norm, u_norm = np.linalg.norm(w), np.linalg.norm(u)
        return eeta * w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0

    for step_grads in grads:
        for name, g in step_grads.items():
            w, v = weights[name], velocity[name]
            if weight_decay and name not in excluded_decay:
                g = g + weight_decay * w
            adapt = name not in excluded_adaptation
            if classic_momentum:
                scaled_lr = lr * (trust(w, g) if adapt else 1.0)
                v = momentum * v + scaled_lr * g
                update = momentum * v + scaled_lr * g if nesterov else v
                w = w - update
            else:
                v = momentum * v + g
                update = momentum * v + g if nesterov else v
                w = w - lr * (trust(w, update) if adapt else 1.0) * update
            weights[name], velocity[name] = w, v
    return weights


def make_variables():
    rng = np.random.RandomState(0)
    values = {
        "dense/kernel": rng.randn(3, 2).astype("float32"),
        "dense/bias": rng.randn(2).astype("float32"),
        "batch_normalization/gamma": rng.rand(2).astype("float32") + 0.5,
        "zeros/kernel": np.zeros((2, 2), "float32"),  # ||w|| = 0: trust ratio 1
    }
    variables = {}
    for path, value in values.items():
        layer, name = path.split("/")
        with keras.name_scope(layer):
            variables[path] = keras.Variable(value, name=name)
        assert variables[path].path == path
    return values, variables


def make_grads(steps):
    rng = np.random.RandomState(1)
    shapes = {
        "dense/kernel": (3, 2),
        "dense/bias": (2,),
        "batch_normalization/gamma": (2,),
        "zeros/kernel": (2, 2),
    }
    grads = [
        {name: rng.randn(*shape).astype("float32") for name, shape in shapes.items()} for _ in range(steps)
    ]
    for step_grads in grads[:2]:
        step_grads["dense/bias"] = np.zeros(2, "float32")  # ||g|| = 0 on the first steps
    return grads


@pytest.mark.parametrize(
    "classic_momentum, nesterov, weight_decay, adaptation",
    [
        (True, False, 0.1, None),
        (True, True, 0.1, None),
        (False, False, 0.1, None),
        (False, True, 0.05, None),
        (True, False, 0.0, None),
        (True, False, 0.1, ("gamma",)),
    ],
)
def test_matches_the_numpy_rule(classic_momentum, nesterov, weight_decay, adaptation):
    values, variables = make_variables()
    grads = make_grads(steps=4)
    hyper = dict(
        lr=0.5,
        momentum=0.9,
        weight_decay=weight_decay,
        eeta=0.01,
        classic_momentum=classic_momentum,
        nesterov=nesterov,
    )
    optimizer = LARS(
        learning_rate=0.5,
        momentum=0.9,
        weight_decay=weight_decay,
        eeta=0.01,
        classic_momentum=classic_momentum,
        nesterov=nesterov,
        exclude_from_layer_adaptation=adaptation,
    )
    names = list(variables)
    for step_grads in grads:
        optimizer.apply(
            [tf.constant(step_grads[name]) for name in names], [variables[name] for name in names]
        )
    excluded_decay = {"dense/bias", "batch_normalization/gamma"}
    excluded_adaptation = excluded_decay if adaptation is None else {"batch_normalization/gamma"}
    expected = lars_reference(values, grads, excluded_decay, excluded_adaptation, **hyper)
    for name in names:
        np.testing.assert_allclose(
            variables[name].numpy(), expected[name], rtol=1e-5, atol=1e-6, err_msg=name
        )
        assert not np.allclose(variables[name].numpy(), values[name]), name  # every variable moved


def test_trust_ratio_scales_the_step_of_adapted_variables_only():
    values, variables = make_variables()
    kernel, bias = variables["dense/kernel"], variables["dense/bias"]
    optimizer = LARS(learning_rate=1.0, momentum=0.0, eeta=0.001)
    grad = np.ones((3, 2), "float32")
    optimizer.apply([tf.constant(grad), tf.ones(2)], [kernel, bias])
    ratio = 0.001 * np.linalg.norm(values["dense/kernel"]) / np.linalg.norm(grad)
    np.testing.assert_allclose(kernel.numpy(), values["dense/kernel"] - ratio * grad, rtol=1e-5)
    np.testing.assert_allclose(bias.numpy(), values["dense/bias"] - 1.0, rtol=1e-5)  # excluded: plain SGD


def test_runs_in_a_tf_function_with_a_schedule():
    _, variables = make_variables()
    kernel = variables["dense/kernel"]
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
    optimizer = LARS(learning_rate=schedule, weight_decay=1e-4)

    @tf.function
    def step():
        optimizer.apply([tf.ones_like(kernel)], [kernel])

    before = kernel.numpy()
    step()
    step()
    assert int(optimizer.iterations.numpy()) == 2
    assert not np.allclose(kernel.numpy(), before)


def test_get_config_round_trips():
    optimizer = LARS(
        learning_rate=0.3,
        momentum=0.8,
        weight_decay=1e-6,
        eeta=0.002,
        classic_momentum=False,
        nesterov=True,
        exclude_from_weight_decay=["batch_normalization", "bias", "head_supervised"],
        exclude_from_layer_adaptation=["bias"],
        clipnorm=1.0,
    )
    config = optimizer.get_config()
    assert config["weight_decay"] == 1e-6
    restored = LARS.from_config(config)
    assert restored.get_config() == config
    assert restored.lars_weight_decay == 1e-6 and restored.weight_decay is None
    assert restored.weight_decay_exclusions == ("batch_normalization", "bias", "head_supervised")
    assert restored.layer_adaptation_exclusions == ("bias",)
    revived = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert isinstance(revived, LARS) and revived.get_config() == config
    default = LARS.from_config(LARS().get_config())
    assert default.layer_adaptation_exclusions is None
    assert default.weight_decay_exclusions == ("batch_normalization", "bias")


def test_bad_arguments_are_clear_errors():
    for kwargs, argument in [
        ({"momentum": 1.5}, "momentum"),
        ({"weight_decay": -1.0}, "weight_decay"),
        ({"eeta": 0.0}, "eeta"),
        ({"exclude_from_weight_decay": "bias"}, "exclude_from_weight_decay"),
    ]:
        with pytest.raises(ValueError, match=f"Invalid value for argument `{argument}`"):
            LARS(**kwargs)


def test_trains_a_keras_model_with_fit():
    keras.utils.set_random_seed(0)
    rng = np.random.RandomState(0)
    x = rng.rand(64, 4).astype("float32")
    y = (x[:, :1] * 2 - x[:, 1:2]).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=LARS(learning_rate=1.0, momentum=0.9, weight_decay=1e-4, eeta=0.01), loss="mse")
    history = model.fit(x, y, batch_size=16, epochs=8, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.5 * losses[0]


SCRIPT = textwrap.dedent(
    """
    import json
    import keras, numpy as np, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from tftrain.examples.simclr.lars import LARS

    rng = np.random.RandomState(0)
    x = rng.rand(32, 4).astype("float32")
    y = (x @ rng.randn(4, 2)).astype("float32")

    def train(strategy):
        with strategy.scope():
            keras.utils.set_random_seed(0)
            inputs = keras.Input((4,))
            model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Dense(6, activation="relu")(inputs)))
            model.compile(LARS(0.5, weight_decay=0.01, eeta=0.01, nesterov=True), "mse")
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        return model.get_weights()

    mirrored = train(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
    one = train(tf.distribute.get_strategy())
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    start = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Dense(6, activation="relu")(inputs)))
    print("RESULT" + json.dumps({
        "diff": max(float(np.abs(a - b).max()) for a, b in zip(mirrored, one)),
        "moved": min(float(np.abs(a - b).max()) for a, b in zip(one, start.get_weights())),
    }))
    """
)


def test_mirrored_two_replicas_match_one_device():
    result = run_result_script(SCRIPT, timeout=120)
    assert result["moved"] > 1e-3
    assert result["diff"] < 1e-5
