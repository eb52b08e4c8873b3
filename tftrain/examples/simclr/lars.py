"""LARS: SGD with momentum and a per-layer trust ratio (You et al., 2017), for Keras 3."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import keras
from keras import ops

# The trust coefficient of the LARS paper.
EETA_DEFAULT = 0.001


def _names(argument: str, value: Sequence[str] | str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str) or not all(isinstance(name, str) for name in value):
        raise ValueError(
            f"Invalid value for argument `{argument}`. Received: {argument}={value!r}. "
            "Expected a sequence of strings (substrings of variable paths), or None."
        )
    return tuple(value)


def _check_float(argument: str, value: Any, valid: Callable[[float], bool], expected: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not valid(value):
        raise ValueError(
            f"Invalid value for argument `{argument}`. Received: {argument}={value!r}. Expected a float {expected}."
        )


def _as_list(names: tuple[str, ...] | None) -> list[str] | None:
    return None if names is None else list(names)


@keras.saving.register_keras_serializable(package="tftrain")
class LARS(keras.optimizers.Optimizer):
    """Layer-wise Adaptive Rate Scaling, as used by SimCLR.

    With `classic_momentum=True` (the default), for each variable `w` with
    gradient `g`:

    ```
    g = g + weight_decay * w                 # unless excluded from weight decay
    trust_ratio = eeta * ||w|| / ||g||       # 1 if either norm is 0, or if excluded
    v = momentum * v + learning_rate * trust_ratio * g
    w = w - v                                # nesterov: w - (momentum * v + lr * trust_ratio * g)
    ```

    With `classic_momentum=False` the momentum is accumulated on the raw
    (weight-decayed) gradient, `v = momentum * v + g`, and the trust ratio is
    computed from the update `u` (`v`, or `momentum * v + g` with nesterov):
    `w = w - learning_rate * eeta * ||w|| / ||u|| * u`.

    The weight decay is part of the gradient (L2 regularisation), unlike the
    decoupled `weight_decay` of other Keras optimizers, so the base class's
    weight decay is never used.

    Exclusions match substrings of each variable's `path` (e.g.
    `"dense/bias"`, `"batch_normalization/gamma"`).

    Args:
        learning_rate: A float, a `keras.optimizers.schedules.LearningRateSchedule`
            or a callable with no arguments.
        momentum: The momentum, in [0, 1].
        weight_decay: The L2 coefficient added to the gradient, >= 0.
        eeta: The LARS trust coefficient, > 0.
        classic_momentum: Whether the trust ratio scales the learning rate
            before momentum (True) or scales the momentum update (False).
        nesterov: Whether to use Nesterov momentum.
        exclude_from_weight_decay: Substrings of variable paths that get no
            weight decay, or None for none excluded.
        exclude_from_layer_adaptation: Substrings of variable paths that get no
            trust ratio (1.0). None: the same as `exclude_from_weight_decay`.
        name: The optimizer's name.
        **kwargs: The other `keras.optimizers.Optimizer` arguments
            (`clipnorm`, `global_clipnorm`, `use_ema`, ...), except
            `weight_decay`'s decoupled form.
    """

    def __init__(
        self,
        learning_rate=0.001,
        momentum=0.9,
        weight_decay=0.0,
        eeta=EETA_DEFAULT,
        classic_momentum=True,
        nesterov=False,
        exclude_from_weight_decay=("batch_normalization", "bias"),
        exclude_from_layer_adaptation=None,
        name="LARS",
        **kwargs,
    ):
        super().__init__(learning_rate=learning_rate, weight_decay=None, name=name, **kwargs)
        _check_float("momentum", momentum, lambda value: 0 <= value <= 1, "in [0, 1]")
        weight_decay = 0.0 if weight_decay is None else weight_decay
        _check_float("weight_decay", weight_decay, lambda value: value >= 0, ">= 0")
        _check_float("eeta", eeta, lambda value: value > 0, "> 0")
        self.momentum = float(momentum)
        # Not `self.weight_decay`: the base class would also apply it as decoupled decay.
        self.lars_weight_decay = float(weight_decay)
        self.eeta = float(eeta)
        self.classic_momentum = bool(classic_momentum)
        self.nesterov = bool(nesterov)
        # Not `self.exclude_from_weight_decay`: that is a method of the base class.
        self.weight_decay_exclusions = _names("exclude_from_weight_decay", exclude_from_weight_decay)
        self.layer_adaptation_exclusions = _names(
            "exclude_from_layer_adaptation", exclude_from_layer_adaptation
        )

    def build(self, variables):
        """Creates one momentum slot per variable.

        Args:
            variables: The model variables this optimizer will update.
        """
        if self.built:
            return
        super().build(variables)
        self.momentums = self.add_optimizer_variables(variables, "momentum")

    def _path(self, variable) -> str:
        # Under a tf.distribute strategy `variable` is one replica's plain tf.Variable: use its Keras
        # variable's path (the name would add the model's scope and a replica suffix).
        keras_variable = self._trainable_variables[self._get_variable_index(variable)]
        return getattr(keras_variable, "path", None) or str(keras_variable.name)

    def _excluded(self, variable, patterns: tuple[str, ...] | None) -> bool:
        path = self._path(variable)
        return any(pattern in path for pattern in patterns or ())

    def _use_lars_weight_decay(self, variable) -> bool:
        return bool(self.lars_weight_decay) and not self._excluded(variable, self.weight_decay_exclusions)

    def _do_layer_adaptation(self, variable) -> bool:
        patterns = self.layer_adaptation_exclusions
        return not self._excluded(variable, self.weight_decay_exclusions if patterns is None else patterns)

    def _trust_ratio(self, weights, update):
        """eeta * ||weights|| / ||update||, or 1 where either norm is 0."""
        w_norm = ops.sqrt(ops.sum(ops.square(weights)))
        u_norm = ops.sqrt(ops.sum(ops.square(update)))
        ratio = ops.cast(self.eeta, weights.dtype) * w_norm / ops.where(u_norm > 0, u_norm, 1.0)
        return ops.where(ops.logical_and(w_norm > 0, u_norm > 0), ratio, ops.ones_like(ratio))

    def update_step(self, gradient, variable, learning_rate):
        """Applies one LARS update to `variable`.

        Args:
            gradient: The gradient of the loss with respect to `variable`.
            variable: The model variable to update.
            learning_rate: The current learning rate.
        """
        dtype = variable.dtype
        learning_rate = ops.cast(learning_rate, dtype)
        gradient = ops.cast(gradient, dtype)
        momentum = ops.cast(self.momentum, dtype)
        velocity = self.momentums[self._get_variable_index(variable)]
        weights = ops.convert_to_tensor(variable)
        if self._use_lars_weight_decay(variable):
            gradient = gradient + ops.cast(self.lars_weight_decay, dtype) * weights
        adapt = self._do_layer_adaptation(variable)

        if self.classic_momentum:
            scaled_lr = learning_rate * self._trust_ratio(weights, gradient) if adapt else learning_rate
            next_velocity = momentum * velocity + scaled_lr * gradient
            update = momentum * next_velocity + scaled_lr * gradient if self.nesterov else next_velocity
            next_weights = weights - update
        else:
            next_velocity = momentum * velocity + gradient
            update = momentum * next_velocity + gradient if self.nesterov else next_velocity
            scaled_lr = learning_rate * self._trust_ratio(weights, update) if adapt else learning_rate
            next_weights = weights - scaled_lr * update
        self.assign(velocity, next_velocity)
        self.assign(variable, next_weights)

    def get_config(self) -> dict:
        """Returns the optimizer's config; `LARS.from_config` rebuilds it."""
        return {
            **super().get_config(),
            "momentum": self.momentum,
            "weight_decay": self.lars_weight_decay,
            "eeta": self.eeta,
            "classic_momentum": self.classic_momentum,
            "nesterov": self.nesterov,
            "exclude_from_weight_decay": _as_list(self.weight_decay_exclusions),
            "exclude_from_layer_adaptation": _as_list(self.layer_adaptation_exclusions),
        }
