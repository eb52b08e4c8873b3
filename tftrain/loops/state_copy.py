"""The sandbox of a side run (`Trainer.check`, `Trainer.find_learning_rate`): the fit loop, leaving no trace.

`StateCopy` keeps, on the host, the value of every variable a training step
may change: the model's (its seed generators included), the optimizer's,
the metrics', the owner's own checkpointed state (`checkpoint_state()`) and
the global step; under a `tf.distribute` strategy, each replica's own value.
`Sandbox` takes one, and sets aside everything else a `fit` changes: the
engines' cache (their traces, `steps_per_loop="auto"`'s measurements), the
model's step functions, `history` and `stop_training`, the NumPy and Python
global random states, and the owner's run options and services (replaced for
the side run: e.g. a temporary `model_dir`). All of it is put back on exit,
also after an error or a KeyboardInterrupt.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import random
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tftrain.checkpoint.checkpointer import Checkpointer
from tftrain.checkpoint.state import Progress, training_state
from tftrain.compat import keras_internals
from tftrain.loops import fit_loop
from tftrain.loops.owner import StepOwner
from tftrain.loops.preparation import FitCall

__all__ = ["Sandbox", "StateCopy"]


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


# What a fit changes besides the variables and the engines' cache: the model's attributes that fit sets.
_ABSENT = object()
_MODEL_ATTRIBUTES = ("history", "stop_training", "train_function", "test_function", "predict_function")


class Sandbox:
    """A side run's sandbox: the training state copied, the rest set aside, all put back on exit.

    Args:
        owner: The owner of the steps.
        caller: The public name of the side run (for the warning of `StateCopy.warn_not_copied`).

    Attributes:
        copy: The `StateCopy` taken on entry (`take` it again for variables made later).
        directory: A temporary directory of the side run's own, removed on exit.
    """

    def __init__(self, owner: StepOwner, caller: str):
        self._owner, self._caller = owner, caller
        self.copy = StateCopy(owner)
        self.directory = ""
        self._exit = contextlib.ExitStack()

    def __enter__(self) -> Sandbox:
        stack, owner = self._exit, self._owner
        self.copy.take()
        stack.callback(self.copy.warn_not_copied, self._caller, stacklevel=4)
        self.directory = tempfile.mkdtemp(prefix=f"tftrain_{self._caller}_")
        stack.callback(shutil.rmtree, self.directory, ignore_errors=True)
        stack.callback(random.setstate, random.getstate())
        stack.callback(np.random.set_state, np.random.get_state())
        stack.callback(self.copy.restore)
        stack.enter_context(warnings.catch_warnings())
        # A budget's last epoch may end the data; a side run's checkpoints are not the run's.
        warnings.filterwarnings("ignore", message=".*(ran out of data|cannot be checkpointed)")
        _set_aside(stack, owner.model, _MODEL_ATTRIBUTES)
        stack.enter_context(owner.engines.fresh_cache())
        return self

    def use_run_options(self, **run_options: Any) -> None:
        """Sets the owner's run options for the side run: `run_options`, and nothing that reaches past it.

        No profiler window, signal handler, requeue, `resume_from` or FLOPs
        count; the owner's own options are put back on exit.
        """
        owner = self._owner
        self.set_aside(owner, run_options=dataclasses.replace(
            owner.run_options, profile_steps=None, preemption_signals=(), slurm_requeue=False, resume_from=None,
            count_flops=False, **run_options,
        ))  # fmt: skip

    def fit(self, call: FitCall) -> float:
        """Runs the fit loop on `call`, its training step traced first; returns the seconds of the trace.

        The variables the preparation and the trace made are copied at their
        initial values (`use_run_options` first sets the side run's options).
        """
        owner = self._owner
        self.copy.take()  # the variables the preparation built (were the trace to fail)
        start, runner = time.perf_counter(), owner.engines.runner("train")
        if hasattr(runner.step, "get_concrete_function"):
            runner.step.get_concrete_function(call.plan.next_iterator().element_spec)
        self.copy.take()  # and those the trace made
        trace_s = time.perf_counter() - start
        fit_loop.run_fit(owner, call)
        return trace_s

    def round_trip(self) -> tuple[float, float]:
        """Saves the training state to a checkpoint in `directory` and restores it; returns both times.

        Raises:
            ValueError: a variable did not come back to its saved value.
            tftrain.checkpoint.CheckpointError: the checkpoint cannot be written or read.
        """
        owner, variables = self._owner, self.copy.variables()
        checkpointer = Checkpointer(
            os.path.join(self.directory, "round_trip"), lambda: training_state(owner.model, owner.checkpoint_state()),
            max_to_keep=1, global_step=owner.global_step, async_write=owner.run_options.async_checkpoint,
        )  # fmt: skip
        saved, start = _fingerprints(variables), time.perf_counter()
        checkpointer.save(Progress(global_step=int(owner.global_step.numpy())))
        checkpointer.sync()
        self.copy.zero()  # a variable the restore misses would stay zero
        middle = time.perf_counter()
        checkpointer.restore_latest()
        differing = [v.name for v, a, b in zip(variables, saved, _fingerprints(variables), strict=True) if a != b]
        if differing:
            raise ValueError(
                f"The checkpoint saved did not restore {len(differing)} variables to their saved values "
                f"(e.g. {differing[0]}). Expected every variable of the training state back."
            )
        return middle - start, time.perf_counter() - middle

    def on_exit(self, function: Callable[..., Any], *args: Any) -> None:
        """Calls `function(*args)` on exit (first of all), to put back something else the side run changed."""
        self._exit.callback(function, *args)

    def set_aside(self, target: Any, **values: Any) -> None:
        """Sets attributes of `target` for the side run (e.g. the owner's `run_options`), put back on exit."""
        _set_aside(self._exit, target, tuple(values), values)

    def __exit__(self, *error: Any) -> None:
        self._exit.close()


def _set_aside(stack: contextlib.ExitStack, target: Any, names: tuple[str, ...], values: dict | None = None) -> None:
    """Puts back each of `names` of `target` on exit; with `values`, sets them now (None where not given)."""
    for name in names:
        stack.callback(_put_back, target, name, getattr(target, name, _ABSENT))
        if values is not None:
            setattr(target, name, values.get(name))


def _put_back(target: Any, name: str, value: Any) -> None:
    if value is not _ABSENT:
        setattr(target, name, value)
    elif hasattr(target, name):
        delattr(target, name)


def _fingerprints(variables: list[Any]) -> list[bytes]:
    """A digest of each variable's value (a distributed one's value as a whole, as a checkpoint saves it)."""
    return [
        hashlib.blake2b(np.ascontiguousarray(v.numpy()).tobytes(), digest_size=16).digest() for v in variables
    ]


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
