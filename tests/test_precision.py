"""Mixed precision: policy switching of built models, loss scaling, hand-written steps (CPU)."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import make_mlp

from tftrain import precision

LOW_DTYPE = {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}


@pytest.fixture(autouse=True)
def restore_global_policy():
    """Other tests assume float32: put back the global policy whatever a test set."""
    previous = keras.config.dtype_policy()
    yield
    keras.config.set_dtype_policy(previous)


def _loss():
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _record_output_dtypes(layer):
    """Records the dtype of `layer`'s output each time its `call` runs (or is traced)."""
    seen = []
    call = layer.call

    def recording_call(*args, **kwargs):
        outputs = call(*args, **kwargs)
        seen.append(keras.backend.standardize_dtype(outputs.dtype))
        return outputs

    layer.call = recording_call
    return seen


def _repeated(tiny_data):
    return tf.data.Dataset.from_tensor_slices(tiny_data).batch(8).repeat()


# ------------------------------------------------------------ check_policy


@pytest.mark.parametrize("name", [None, "mixed_float16", "mixed_bfloat16", "float32"])
def test_check_policy_accepts_the_offered_names(name):
    assert precision.check_policy(name) == name


@pytest.mark.parametrize(
    "name, error",
    [
        ("float16", ValueError),
        ("mixed_fp16", ValueError),
        ("", ValueError),
        (16, TypeError),
        (True, TypeError),
        (keras.DTypePolicy("mixed_float16"), TypeError),
    ],
)
def test_check_policy_rejects_anything_else_and_lists_valid_names(name, error):
    with pytest.raises(error, match="mixed_precision") as info:
        precision.check_policy(name)
    for valid in precision.POLICIES:
        assert repr(valid) in str(info.value)


# ------------------------------------------------------------ apply_policy


@pytest.mark.parametrize("name", ["mixed_float16", "mixed_bfloat16"])
def test_model_built_in_float32_trains_in_low_precision_after_apply_policy(name, tiny_data):
    model = make_mlp()  # built under the float32 global policy
    hidden = _record_output_dtypes(model.layers[0])
    precision.apply_policy(model, name)
    model.compile(optimizer=precision.wrap_optimizer(keras.optimizers.SGD(0.1), name), loss=_loss())
    history = model.fit(_repeated(tiny_data), epochs=4, steps_per_epoch=5, verbose=0)

    low = LOW_DTYPE[name]
    assert hidden and set(hidden) == {low}  # the hidden layer computed in the low dtype inside fit
    x, y = tiny_data
    y_pred = model(x[:8])
    assert keras.backend.standardize_dtype(y_pred.dtype) == low  # outputs are left in the low dtype
    loss = model.compute_loss(x[:8], y[:8], y_pred)
    assert keras.backend.standardize_dtype(loss.dtype) == "float32"  # compiled losses cast them
    assert {v.dtype for v in model.weights} == {"float32"}
    assert {v.dtype for v in model.optimizer.variables if "float" in v.dtype} == {"float32"}
    losses = history.history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0] - 0.02
    is_scaled = isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert is_scaled == (name == "mixed_float16")


def test_apply_policy_retraces_keras_functions_and_wrap_model_optimizer_adds_loss_scaling(tiny_data):
    model = make_mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=_loss())
    model.fit(_repeated(tiny_data), epochs=1, steps_per_epoch=2, verbose=0)  # traced in float32
    sgd = model.optimizer
    hidden = _record_output_dtypes(model.layers[0])

    precision.apply_policy(model, "mixed_float16")
    precision.wrap_model_optimizer(model, "mixed_float16")
    history = model.fit(_repeated(tiny_data), epochs=1, steps_per_epoch=3, verbose=0)

    assert hidden and set(hidden) == {"float16"}  # not the stale float32 graph
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert model.optimizer.inner_optimizer is sgd
    assert (
        int(sgd.iterations) == 5
    )  # the inner optimizer kept its state (Keras 3.7: the wrapper counts apart)
    assert float(model.optimizer.dynamic_scale) == 2.0**15
    assert np.isfinite(history.history["loss"]).all()


def test_wrap_model_optimizer_leaves_models_without_optimizer_or_scaling_alone():
    model = make_mlp()
    precision.wrap_model_optimizer(model, "mixed_float16")  # not compiled: nothing to wrap
    assert getattr(model, "optimizer", None) is None
    sgd = keras.optimizers.SGD()
    model.compile(optimizer=sgd, loss=_loss())
    for name in (None, "mixed_bfloat16", "float32"):
        precision.wrap_model_optimizer(model, name)
        assert model.optimizer is sgd


def test_apply_policy_float32_turns_a_mixed_model_back_and_compile_does_not_wrap():
    keras.config.set_dtype_policy("mixed_float16")
    model = make_mlp()
    keras.config.set_dtype_policy("float32")
    assert keras.backend.standardize_dtype(model(np.zeros((2, 6))).dtype) == "float16"
    precision.apply_policy(model, "float32")
    assert keras.backend.standardize_dtype(model.layers[0](np.zeros((2, 6))).dtype) == "float32"
    model.compile(optimizer=keras.optimizers.SGD(), loss=_loss())
    assert isinstance(model.optimizer, keras.optimizers.SGD)


def test_apply_policy_keeps_layers_given_another_policy_on_purpose():
    keras.config.set_dtype_policy("mixed_float16")
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    outputs = keras.layers.Activation("softmax", dtype="float32")(keras.layers.Dense(3)(hidden))
    model = keras.Model(inputs, outputs)
    keras.config.set_dtype_policy("float32")
    precision.apply_policy(model, "mixed_bfloat16")
    x = np.zeros((2, 6), "float32")
    assert keras.backend.standardize_dtype(model.layers[1](x).dtype) == "bfloat16"
    assert model.layers[-1].dtype_policy.name == "float32"
    assert keras.backend.standardize_dtype(model(x).dtype) == "float32"


def test_apply_policy_keeps_an_explicit_float32_layer_of_a_float32_model():
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    outputs = keras.layers.Dense(3, dtype="float32")(hidden)  # the same name as the model's policy
    model = keras.Model(inputs, outputs)
    precision.apply_policy(model, "mixed_bfloat16")
    x = np.zeros((2, 6), "float32")
    assert keras.backend.standardize_dtype(model.layers[1](x).dtype) == "bfloat16"
    assert model.layers[-1].dtype_policy.name == "float32"
    assert keras.backend.standardize_dtype(model(x).dtype) == "float32"


def test_apply_policy_switches_a_model_rebuilt_from_its_config_by_name():
    model = keras.models.clone_model(make_mlp())  # one policy object per layer
    assert len({id(layer.dtype_policy) for layer in model.layers}) == len(model.layers)
    precision.apply_policy(model, "mixed_bfloat16")
    assert {layer.dtype_policy.name for layer in model.layers} == {"mixed_bfloat16"}


def test_apply_policy_refuses_a_model_with_low_precision_variables():
    keras.config.set_dtype_policy("float16")
    model = make_mlp()  # float16 variables
    keras.config.set_dtype_policy("float32")
    with pytest.raises(ValueError, match=r"float16.*set_global_policy\('mixed_float16'\)"):
        precision.apply_policy(model, "mixed_float16")
    assert model.layers[0].dtype_policy.name == "float16"  # nothing half-switched


def test_apply_policy_none_does_nothing_and_bad_arguments_raise():
    model = make_mlp()
    precision.apply_policy(model, None)
    assert {layer.dtype_policy.name for layer in model.layers} == {"float32"}
    with pytest.raises(ValueError, match="mixed_precision"):
        precision.apply_policy(model, "fp16")
    with pytest.raises(TypeError, match="keras.Model"):
        precision.apply_policy(object(), "mixed_float16")
    per_layer = keras.layers.Dense(3, dtype=keras.dtype_policies.DTypePolicyMap())
    with pytest.raises(ValueError, match="map or quantized"):
        precision.apply_policy(per_layer, "mixed_float16")


# ---------------------------------------------------------- wrap_optimizer


def test_wrap_optimizer_adds_loss_scaling_only_for_float16_and_never_twice():
    sgd = keras.optimizers.SGD()
    wrapped = precision.wrap_optimizer(sgd, "mixed_float16")
    assert isinstance(wrapped, keras.optimizers.LossScaleOptimizer)
    assert wrapped.inner_optimizer is sgd
    assert precision.wrap_optimizer(wrapped, "mixed_float16") is wrapped
    by_name = precision.wrap_optimizer("adam", "mixed_float16")
    assert isinstance(by_name.inner_optimizer, keras.optimizers.Adam)
    for name in (None, "mixed_bfloat16", "float32"):
        assert precision.wrap_optimizer(sgd, name) is sgd
    assert precision.wrap_optimizer(None, "mixed_float16") is None
    with pytest.raises(ValueError, match="mixed_precision"):
        precision.wrap_optimizer(sgd, "half")


def test_compile_keeps_a_wrapped_optimizer_and_wraps_a_plain_one_itself():
    model = make_mlp()
    precision.apply_policy(model, "mixed_float16")
    wrapped = precision.wrap_optimizer(keras.optimizers.SGD(), "mixed_float16")
    model.compile(optimizer=wrapped, loss=_loss())
    assert model.optimizer is wrapped  # no LossScaleOptimizer around a LossScaleOptimizer
    sgd = keras.optimizers.SGD()
    model.compile(optimizer=sgd, loss=_loss())  # Keras wraps: the model's policy is mixed_float16
    assert model.optimizer.inner_optimizer is sgd


# ------------------------------------------------------ hand-written steps


def test_scale_loss_is_identity_for_a_plain_optimizer():
    loss = tf.constant(1.5)
    assert float(keras.optimizers.SGD().scale_loss(loss)) == 1.5


def test_hand_written_step_with_scale_loss_trains_and_loss_scaling_reacts(tiny_data):
    model = make_mlp()
    precision.apply_policy(model, "mixed_float16")
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), dynamic_growth_steps=2)
    assert precision.wrap_optimizer(optimizer, "mixed_float16") is optimizer
    optimizer.build(model.trainable_variables)  # before tracing: scale_loss then reads the variable
    loss_fn = _loss()

    @tf.function
    def train_step(x, y, multiplier):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True)) * multiplier
            scaled_loss = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled_loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    x, y = (tf.constant(t[:8]) for t in tiny_data)
    one = tf.constant(1.0)
    first_loss = float(train_step(x, y, one))
    assert float(optimizer.dynamic_scale) == 2.0**15
    train_step(x, y, one)
    assert float(optimizer.dynamic_scale) == 2.0**16  # grew after dynamic_growth_steps finite steps

    # A loss 1e4 times larger is finite in float32, but its scaled gradients
    # overflow float16 in the backward pass: the step is skipped, the scale halved.
    weights = [v.numpy() for v in model.trainable_variables]
    iterations = int(optimizer.iterations)
    huge_loss = float(train_step(x, y, tf.constant(1e4)))
    assert np.isfinite(huge_loss)
    assert float(optimizer.dynamic_scale) == 2.0**15
    assert int(optimizer.iterations) == iterations
    for before, variable in zip(weights, model.trainable_variables, strict=True):
        np.testing.assert_array_equal(before, variable.numpy())

    for _ in range(2):
        last_loss = float(train_step(x, y, one))
    assert float(optimizer.dynamic_scale) == 2.0**16
    assert last_loss < first_loss
    assert {v.dtype for v in model.trainable_variables} == {"float32"}
