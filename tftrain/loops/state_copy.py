"""A bit-exact copy of a step owner's training state, put back after a run that must leave no trace.

`StateCopy` keeps, on the host, the value of every variable a training step
may change: the model's (its seed generators included), the optimizer's,
the metrics', the owner's own checkpointed state (`checkpoint_state()`) and
the global step; under a `tf.distribute` strategy, each replica's own value.
`Trainer.find_learning_rate` and `Trainer.check` take one before their steps
and put it back in a `finally`.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tftrain.checkpoint.state import training_state
from tftrain.compat import keras_internals
from tftrain.loops.owner import StepOwner

__all__ = ["StateCopy"]


class StateCopy:
    """A bit-exact copy of the training state's variables, each replica's own value included.

    Args:
        owner: The owner of the steps whose state is copied.
    """

    def __init__(self, owner: StepOwner):
        self._owner = owner
        self._saved: dict[int, list[tuple[tf.Variable, np.ndarray]]] = {}
        self._copied: dict[int, tf.Variable] = {}

    def _variables(self) -> Iterator[tf.Variable]:
        state = training_state(self._owner.model, self._owner.checkpoint_state())
        roots = [state, self._owner.global_step, [metric.variables for metric in self._owner.metrics]]
        for variable in _variables_in(roots):
            yield keras_internals.backend_variable(variable)

    def take(self) -> None:
        """Copies every variable not copied yet (a later call adds those made since)."""
        strategy = self._owner.engines.strategy
        for variable in self._variables():
            if id(variable) not in self._saved:
                components = strategy.experimental_local_results(variable)
                self._saved[id(variable)] = [(part, part.numpy()) for part in components]
                self._copied[id(variable)] = variable

    def restore(self) -> None:
        """Assigns every copied value back to its variable (each replica's part of a distributed one)."""
        for parts in self._saved.values():
            for part, value in parts:
                part.assign(value)

    def zero(self) -> None:
        """Assigns zeros to every copied variable (e.g. to see that a restore assigns them all)."""
        for parts in self._saved.values():
            for part, value in parts:
                part.assign(np.zeros_like(value))

    def variables(self) -> list[tf.Variable]:
        """The variables copied (a distributed one as a whole, not its parts)."""
        return list(self._copied.values())

    def not_copied(self) -> list[tf.Variable]:
        """The variables of the state made since the last `take`."""
        return [variable for variable in self._variables() if id(variable) not in self._saved]

    def warn_not_copied(self, caller: str, *, stacklevel: int) -> None:
        """Warns where variables were made since the last `take`: they keep the values `caller`'s steps gave them."""
        created = self.not_copied()
        if created:
            warnings.warn(
                f"{caller}: {len(created)} variables were created by the first training step "
                f"(e.g. {created[0].name}: an optimizer built in its first step, under eager execution) "
                f"and keep the values {caller} gave them. Build them before (e.g. "
                "`optimizer.build(variables)`) for a state left exactly as it was.",
                stacklevel=stacklevel + 1,
            )


def _variables_in(value: Any) -> Iterator[Any]:
    """Every variable under `value`: containers, Keras objects (their `variables`) and other trackables."""
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple):
        for item in value:
            yield from _variables_in(item)
    elif isinstance(value, tf.Variable | keras.Variable):
        yield value
    elif isinstance(value, keras.optimizers.Optimizer | keras.layers.Layer | keras.metrics.Metric):
        yield from value.variables
    elif value is not None:  # any other trackable a checkpoint saves (a tf.Module, ...)
        for node in tf.train.TrackableView(value).descendants():
            if isinstance(node, tf.Variable | keras.Variable):
                yield node
