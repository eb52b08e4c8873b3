"""Mixed precision for a model that already exists: dtype policies and loss scaling.

Under Keras 3's `"mixed_float16"` and `"mixed_bfloat16"` policies a layer
computes in the low dtype and keeps float32 variables (cast when read inside
its call), so a model built under `"float32"` can be switched afterwards by
setting `layer.dtype_policy` on its layers: `apply_policy`. Float16 also needs
loss scaling against gradient underflow: `wrap_optimizer` returns a
`keras.optimizers.LossScaleOptimizer`. A hand-written step follows one rule
(a no-op for a plain optimizer):

```python
with tf.GradientTape() as tape:
    loss = ...                                     # float32 (see below)
    scaled_loss = optimizer.scale_loss(loss)
grads = tape.gradient(scaled_loss, variables)
optimizer.apply(grads, variables)  # unscales; skips a step with inf/NaN grads
```

Model outputs stay in the compute dtype (e.g. float16). Keras losses cast
predictions to their float32 dtype first, so compiled losses are float32; a
loss written by hand should do the same: `keras.ops.cast(y_pred, "float32")`.
"""

from __future__ import annotations

from typing import Any

import keras

from tftrain.compat import keras_internals

POLICIES = ("mixed_float16", "mixed_bfloat16", "float32")

# Traced Keras step functions keep the precision they were traced in.
_KERAS_STEP_FUNCTIONS = ("train_function", "test_function", "predict_function")
_HINT = (
    "Instead, call `keras.mixed_precision.set_global_policy({name!r})` before building the model "
    "(and `set_global_policy('float32')` afterwards if other models must stay float32)."
)


def check_policy(name: Any) -> str | None:
    """Validates a mixed precision policy name.

    Args:
        name: None (use the model as built), or one of `POLICIES`.

    Returns:
        `name`, unchanged.

    Raises:
        TypeError: `name` is neither None nor a string.
        ValueError: `name` is a string that is not in `POLICIES`.
    """
    if name is None or (isinstance(name, str) and name in POLICIES):
        return name
    expected = "Expected None (use the model as built) or one of " + ", ".join(map(repr, POLICIES)) + "."
    if not isinstance(name, str):
        raise TypeError(
            f"Invalid value for argument `mixed_precision`. Received: mixed_precision={name!r} "
            f"(type {type(name).__name__}). {expected}"
        )
    raise ValueError(
        f"Invalid value for argument `mixed_precision`. Received: mixed_precision={name!r}. {expected}"
    )


def apply_policy(model: keras.layers.Layer, name: str | None) -> None:
    """Makes `model` compute in the precision of policy `name`, in place.

    Every layer with the model's own policy (the global one when it was
    built), the model included, gets policy `name`; layers given a policy
    on purpose keep it (a `dtype="float32"` output layer, integer layers),
    also when it has the model's name: Keras gives every layer built without
    `dtype` the global policy object itself, so a layer with an object of its
    own chose it. In a model rebuilt from a config (`keras.models.load_model`,
    `clone_model`) every layer has its own object; there, layers whose
    policy has the model's name switch. Variables are untouched: float32 under all of `POLICIES`. Step
    functions that `fit`/`evaluate`/`predict` traced are dropped, to be
    traced again. Sublayers created later, in a `build()` that has not run
    yet, take the global policy instead. Outputs stay in the compute dtype
    (Keras losses cast them to float32; metrics accumulate in float32).

    Args:
        model: A `keras.Model` (or layer), built or not.
        name: One of `POLICIES`; None does nothing.

    Raises:
        TypeError: `model` is not a Keras layer or model; `name` is not a string.
        ValueError: `name` is unknown; the model's policy is a map or quantized; or it was built
            with variables that are not float32 (e.g. under a `"float16"` policy).
    """
    name = check_policy(name)
    if name is None:
        return
    if not isinstance(model, keras.layers.Layer):
        raise TypeError(
            f"Invalid value for argument `model`. Received: an object of type {type(model).__name__}. "
            "Expected a keras.Model."
        )
    source = model.dtype_policy
    if isinstance(source, keras.dtype_policies.DTypePolicyMap) or source.quantization_mode is not None:
        raise ValueError(
            f"Cannot switch model {model.name!r} to {name!r}: its dtype policy {source.name!r} is "
            f"a per-layer map or quantized. {_HINT.format(name=name)}"
        )
    sublayers = [
        layer
        for layer in keras_internals.flatten_layers(model)
        if not isinstance(layer, keras.layers.InputLayer)
    ]
    # Layers built with `dtype=None` share the model's policy object (Keras hands
    # out the global policy itself); a layer given `dtype="float32"` on purpose
    # has its own object even when the names match. A model restored from a
    # config has an object per layer, so there only the names can tell.
    shared = [layer for layer in sublayers if layer.dtype_policy is source]
    same_name = [layer for layer in sublayers if layer.dtype_policy.name == source.name]
    layers = shared if len(shared) > 1 else same_name
    switched = {id(layer) for layer in layers}
    kept = {id(v) for layer in sublayers if id(layer) not in switched for v in layer.weights}
    for variable in (v for layer in layers for v in layer.weights if id(v) not in kept):
        if keras.backend.is_float_dtype(variable.dtype) and variable.dtype != "float32":
            raise ValueError(
                f"Cannot switch model {model.name!r} to {name!r}: it was built under the "
                f"{source.name!r} policy, and its variable {variable.path!r} is {variable.dtype}, "
                f"not float32. {_HINT.format(name=name)}"
            )
    for layer in layers:
        layer.dtype_policy = name
    for attribute in _KERAS_STEP_FUNCTIONS:
        if getattr(model, attribute, None) is not None:
            setattr(model, attribute, None)


def wrap_optimizer(optimizer: Any, name: str | None) -> Any:
    """Adds dynamic loss scaling to `optimizer` where policy `name` needs it.

    Under `"mixed_float16"`: a `keras.optimizers.LossScaleOptimizer` around
    `optimizer` (a name such as `"adam"` is resolved first), or `optimizer`
    itself if it is one. Otherwise (bfloat16 has float32's range), or for a
    None optimizer: `optimizer` unchanged; a `LossScaleOptimizer` is kept, as
    it is correct in any precision. Call it in the `tf.distribute.Strategy`
    scope of training: an optimizer creates variables when constructed.

    Args:
        optimizer: A `keras.optimizers.Optimizer`, an optimizer name, or None.
        name: One of `POLICIES`, or None.

    Returns:
        The optimizer to train with.

    Raises:
        TypeError, ValueError: `name` is not valid.
    """
    name = check_policy(name)
    if name != "mixed_float16" or optimizer is None:
        return optimizer
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer
    # The name `model.compile` gives the optimizer it wraps itself.
    return keras.optimizers.LossScaleOptimizer(keras.optimizers.get(optimizer), name="loss_scale_optimizer")


def wrap_model_optimizer(model: keras.Model, name: str | None) -> None:
    """Replaces a compiled model's optimizer with `wrap_optimizer(model.optimizer, name)`.

    For a model compiled before its policy changed (`model.compile` wraps only
    when the model's policy is then `"mixed_float16"`). No optimizer: no-op.

    Args:
        model: A `keras.Model`.
        name: One of `POLICIES`, or None.
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        model.optimizer = wrap_optimizer(optimizer, name)
