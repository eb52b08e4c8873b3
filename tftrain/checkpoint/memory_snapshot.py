"""An in-memory copy of a run's training state, to roll back to without reading a checkpoint.

`StateSnapshot` keeps the values of every variable of the training state a
checkpoint restores (`Checkpointer.training_state`: the model, its
optimizer, the metrics, the seed-generator states and the owner's extra
state), read by one traced function where the variables live (on the
accelerator; under a `tf.distribute` strategy, the first replica's value of
a mirrored variable, which every replica gets back). TensorFlow tensors are
immutable: a kept value is not copied when it is read, only when training
next updates its variable. So a snapshot costs one copy of the state in
device memory and, per snapshot, about one optimizer update's memory
traffic: a fraction of a training step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import keras
import tensorflow as tf

from tftrain.checkpoint.state import Progress

__all__ = ["KeptState", "Rollback", "StateSnapshot", "state_variables"]


def state_variables(state: Mapping[str, Any]) -> list[Any]:
    """Every variable of a training state (name -> trackable), once each, in a fixed order."""
    found: dict[int, Any] = {}
    root = tf.train.Checkpoint(**state)  # the view holds it weakly
    for node in tf.train.TrackableView(root).descendants():
        if isinstance(node, keras.Variable | tf.Variable):
            found.setdefault(id(node), node)
    return list(found.values())


def _backing(variable: Any) -> Any:
    """The TensorFlow variable behind a Keras variable (a distributed one under a strategy)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def _fingerprint(state: Mapping[str, Any]) -> tuple[Any, ...]:
    """What changes when a state gains a variable (a late-built layer), cheaper than walking its graph."""

    def size(value: Any) -> int:
        if isinstance(value, list | tuple):
            return len(value)
        variables = getattr(value, "variables", None)
        return len(variables) if variables is not None else -1

    return tuple(
        (name, None if isinstance(value, list | tuple) else id(value), size(value))
        for name, value in sorted(state.items())
    )


def _finite_checked(state: Mapping[str, Any]) -> list[Any]:
    """The floating variables of the model and its optimizer: what a checkpoint save checks finite."""
    variables = list(state["model"].variables)
    if state.get("optimizer") is not None:
        variables += list(state["optimizer"].variables)
    return [_backing(v) for v in variables if tf.as_dtype(_backing(v).dtype).is_floating]


class StateSnapshot:
    """The training state's values at one moment, kept in device memory.

    Args:
        state: Returns the training state (name -> trackable), as
            `Checkpointer.training_state` does; called at each `take`, so
            variables made late (a model built in its first step) are kept too.
    """

    def __init__(self, state: Callable[[], Mapping[str, Any]]):
        self._state = state
        self._variables: list[Any] = []
        self._fingerprint: tuple[Any, ...] | None = None
        self._values: list[tf.Tensor] | None = None
        self._read: Callable[[], Any] | None = None
        self._assign: Callable[[list[tf.Tensor]], None] | None = None

    @property
    def taken(self) -> bool:
        """Whether a state is kept."""
        return self._values is not None

    def take(self) -> bool:
        """Keeps the current values, if the model's and optimizer's variables are all finite.

        Returns:
            Whether they were kept; if not, the state kept before stays.
        """
        state = self._state()
        fingerprint = _fingerprint(state)
        if fingerprint != self._fingerprint:
            self._build([_backing(variable) for variable in state_variables(state)], _finite_checked(state))
            self._fingerprint = fingerprint
        values, finite = self._read()
        if not bool(finite):
            return False
        self._values = values
        return True

    def restore(self) -> None:
        """Assigns the kept values back to their variables.

        Raises:
            ValueError: nothing is kept.
        """
        if self._values is None:
            raise ValueError("Cannot restore a snapshot: no state is kept. Expected `take()` first.")
        self._assign(self._values)

    def _build(self, variables: list[Any], checked: list[Any]) -> None:
        """Traces the read (with its finiteness test) and the assignment of `variables`, once per state."""
        self._variables = variables

        @tf.function(autograph=False)
        def read() -> tuple[list[tf.Tensor], tf.Tensor]:
            finite = tf.reduce_all(
                tf.stack([True] + [tf.reduce_all(tf.math.is_finite(variable)) for variable in checked])
            )
            return [tf.identity(variable) for variable in variables], finite

        @tf.function(autograph=False)
        def assign(values: list[tf.Tensor]) -> None:
            for variable, value in zip(variables, values, strict=True):
                variable.assign(value)

        self._read, self._assign = read, assign


@dataclasses.dataclass(frozen=True)
class KeptState:
    """Where a run's kept state is from.

    Attributes:
        progress: The run's progress when it was kept.
        steps_kept_in_epoch: Steps of that epoch whose training the state
            holds (fewer than `progress.step_in_epoch` after a rollback).
        since: The global step since which training went on from it: where
            it was kept, or the step of the last rollback to it.
    """

    progress: Progress
    steps_kept_in_epoch: int
    since: int


class Rollback(NamedTuple):
    """What a rollback restored.

    Attributes:
        restored: The progress of the state restored (where it was kept).
        steps_lost: Steps trained since that state and thrown away, the bad one included.
    """

    restored: Progress
    steps_lost: int
