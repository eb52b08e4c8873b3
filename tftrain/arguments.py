"""Argument checks: the checks of single arguments that every layer shares.

Each check raises in Keras's form: "Invalid value for argument `x`.
Received: x=... Expected ...", and returns the value (converted where it
says so). The option dataclasses of `tftrain.options` use them, and so do
the data, the engine, the services, the loops and the callbacks for the
arguments they take. `tftrain.options` re-exports them.

A bottom layer: imports nothing from tftrain but `tftrain.layout` (the
directory a path resolves to).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import tensorflow as tf

from tftrain import layout

__all__ = [
    "check_directory_path",
    "check_every_steps",
    "check_int",
    "check_jit_compile",
    "check_left_at_default",
    "check_lr_sweep",
    "check_path_not_empty",
    "check_port",
    "check_profile_steps",
    "check_validation_every_steps",
    "check_validation_freq",
    "check_validation_split",
    "check_verbose",
]


def check_int(
    argument: str, value: Any, minimum: int = 1, *, optional: bool = False, meaning: str = ""
) -> Any:
    """Returns `value` if it is an integer >= `minimum` (or None, if `optional`); else raises.

    Args:
        argument: The argument's name, for the message.
        value: What was received. A bool is not an integer here.
        minimum: The smallest valid value.
        optional: Whether None is valid.
        meaning: What the value means, appended to the message (e.g. "(1 = one
            step per host call)").

    Returns:
        `value`, unchanged.

    Raises:
        ValueError: `value` is not valid.
    """
    if value is None and optional:
        return value
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        expected = f"{'None or ' if optional else ''}an integer >= {minimum}"
        raise ValueError(
            f"Invalid value for argument `{argument}`. Received: {argument}={value!r}. "
            f"Expected {expected}{' ' + meaning if meaning else ''}."
        )
    return value


def check_verbose(verbose: int | str) -> int:
    """`verbose` as Keras's `fit`, `evaluate` and `predict` take it: 0, 1, 2 or `"auto"` (1).

    Returns:
        The level as an integer.

    Raises:
        ValueError: `verbose` is none of those.
    """
    if verbose == "auto":
        return 1
    if verbose in (0, 1, 2) and not isinstance(verbose, bool):
        return int(verbose)
    raise ValueError(
        f"Invalid value for argument `verbose`. Received: verbose={verbose!r}. "
        'Expected 0 (silent), 1 (progress bar), 2 (one line per epoch) or "auto".'
    )


def check_jit_compile(value: Any) -> bool | str:
    """`Trainer(jit_compile=...)` as `keras.Model.compile` takes it: True, False or `"auto"`.

    Args:
        value: What was received.

    Returns:
        `value`, unchanged (`"auto"` is resolved against the model by
        `tftrain.engine.model_setup.resolve_jit_compile`).

    Raises:
        ValueError: `value` is none of those.
    """
    if isinstance(value, bool) or (isinstance(value, str) and value == "auto"):
        return value
    raise ValueError(
        f"Invalid value for argument `jit_compile`. Received: jit_compile={value!r}. Expected True (XLA), "
        'False, or "auto" (XLA where `model.compile(jit_compile="auto")` would use it).'
    )


def check_every_steps(value: Any, argument: str) -> None:
    """Raises ValueError unless `value` is None or an integer >= 1."""
    check_int(argument, value, optional=True)


def check_port(argument: str, value: Any, *, optional: bool = False, variable: bool = False) -> int | None:
    """Returns the port number `value` gives (an integer, not a bool, in 1..65535), or None where `optional`; else raises.

    Args:
        argument: The argument's name (with `variable`, the environment variable's), for the message.
        value: What was received: an integer or, with `variable`, the text of one.
        optional: Whether None is valid.
        variable: `value` is an environment variable's text (surrounding spaces ignored).

    Raises:
        ValueError: `value` gives no port number.
    """
    if value is None and optional:
        return None
    number = int(value) if variable and isinstance(value, str) and value.strip().isdigit() else value
    if isinstance(number, bool) or not isinstance(number, int) or not 0 < number < 65536:
        raise ValueError(
            f"Invalid value for {'environment variable' if variable else 'argument'} `{argument}`. "
            f"Received: {argument}={value!r}. Expected a port number in 1..65535{', or None' if optional else ''}."
        )
    return number


def check_profile_steps(profile_steps: Any, total_steps: int | None = None) -> tuple[int, int] | None:
    """Validates a profiler window `(start, stop)` of 1-based training steps, both included.

    Args:
        profile_steps: None or a pair of integers with 1 <= start <= stop.
        total_steps: Steps the run will train, if known: the window must end
            within them.

    Returns:
        The window as a tuple, or None.

    Raises:
        ValueError: a malformed window, or one that ends after the run.
    """
    if profile_steps is None:
        return None
    window = tuple(profile_steps) if isinstance(profile_steps, (tuple, list)) else None
    if (
        window is None
        or len(window) != 2
        or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in window)
        or not 1 <= window[0] <= window[1]
    ):
        raise ValueError(
            f"Invalid value for argument `profile_steps`. Received: profile_steps={profile_steps!r}. "
            "Expected a pair (start, stop) of training steps with 1 <= start <= stop, e.g. (10, 20) "
            "profiles steps 10 to 20."
        )
    start, stop = int(window[0]), int(window[1])
    if total_steps is not None and stop > total_steps:
        raise ValueError(
            f"Invalid value for argument `profile_steps`. Received: profile_steps={profile_steps!r}, "
            f"but this run trains only {total_steps} steps. Expected stop <= {total_steps}."
        )
    return start, stop


def check_validation_split(value: Any) -> float:
    """`validation_split` as `model.fit` takes it: a number in `[0, 1)`."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise ValueError(
            f"Invalid value for argument `validation_split`. Received: validation_split={value!r}. "
            "Expected a fraction in [0, 1) of the array inputs to hold out for validation."
        )
    return value


def check_validation_every_steps(value: Any, has_validation_data: bool) -> int | None:
    """`fit(validation_every_steps=...)`: None, or an integer >= 1 with validation data to validate on."""
    if check_int("validation_every_steps", value, optional=True) is not None and not has_validation_data:
        raise ValueError(
            f"Invalid combination of arguments. Received: validation_every_steps={value!r} "
            "with no validation data. Expected `validation_data=` or `validation_split=`."
        )
    return value


def check_validation_freq(value: Any) -> int | list[int]:
    """`validation_freq` as `model.fit` takes it: an integer >= 1 (every n epochs) or a list of epochs (1-based)."""
    if isinstance(value, bool):
        pass
    elif isinstance(value, int) and value >= 1:
        return value
    elif isinstance(value, list | tuple) and all(
        isinstance(epoch, int) and not isinstance(epoch, bool) and epoch >= 1 for epoch in value
    ):
        return list(value)
    raise ValueError(
        f"Invalid value for argument `validation_freq`. Received: validation_freq={value!r}. Expected an "
        "integer >= 1 (validate every n epochs) or a list of 1-based epochs to validate after, e.g. [1, 5]."
    )


def _is_number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float | np.integer | np.floating)


def check_lr_sweep(min_lr: Any, max_lr: Any, steps: Any, smoothing: Any, stop_factor: Any) -> None:
    """`Trainer.find_learning_rate`'s arguments: `0 < min_lr < max_lr`, `steps >= 2`, `0 <= smoothing < 1`, `stop_factor > 1`.

    Raises:
        ValueError: a value out of its range (or not a number), named with what was received.
    """
    if not _is_number(min_lr) or not 0 < min_lr < float("inf"):
        raise ValueError(
            f"Invalid value for argument `min_lr`. Received: min_lr={min_lr!r}. Expected a finite number "
            "> 0: the first learning rate of the sweep, e.g. 1e-7."
        )
    if not _is_number(max_lr) or not min_lr < max_lr < float("inf"):
        raise ValueError(
            f"Invalid value for argument `max_lr`. Received: max_lr={max_lr!r} with min_lr={min_lr!r}. "
            "Expected a finite number > min_lr: the last learning rate of the sweep, e.g. 10."
        )
    check_int("steps", steps, 2, meaning="(one training step per learning rate, from min_lr to max_lr)")
    if not _is_number(smoothing) or not 0 <= smoothing < 1:
        raise ValueError(
            f"Invalid value for argument `smoothing`. Received: smoothing={smoothing!r}. Expected a number "
            "in [0, 1): the weight of the past in the loss's moving average (0: no smoothing)."
        )
    if not _is_number(stop_factor) or not stop_factor > 1:
        raise ValueError(
            f"Invalid value for argument `stop_factor`. Received: stop_factor={stop_factor!r}. Expected a "
            "number > 1: the sweep stops once the smoothed loss exceeds this many times its lowest "
            "(float('inf'): only at a non-finite loss)."
        )


def check_path_not_empty(path: str | bytes | os.PathLike, argument: str) -> str:
    """`path` as a string, checked not empty (an empty directory would put its files at `/name`).

    Raises:
        ValueError: `path` is empty.
    """
    text = os.fsdecode(os.fspath(path))
    if not text:
        raise ValueError(
            f"Invalid value for argument `{argument}`. Received: {argument}={text!r}. Expected a "
            "directory path: an empty one names no directory (e.g. an unset environment variable read "
            f"with a default of ''). Pass a path such as 'runs/exp1', or {argument}=None for none."
        )
    return text


def check_directory_path(path: Any, argument: str) -> str:
    """Checks, without creating or writing anything, that `path` can be a writable directory.

    Local paths only are checked for permissions (a remote one, e.g. `gs://`,
    is checked when the run creates it).

    Returns:
        The directory as `tftrain.layout.resolve` gives it: a local path made
        absolute (the working directory read once, here), a remote one as given.

    Raises:
        TypeError: `path` is not a path.
        ValueError: `path` is empty or a file, it (or the directory it would
            be created in) is not writable, or it holds a character TensorFlow's
            checkpoints read as a file pattern (`tftrain.layout.resolve`).
    """
    if not isinstance(path, (str, bytes)) and not hasattr(path, "__fspath__"):
        raise TypeError(
            f"Invalid value for argument `{argument}`. Received: {argument}={path!r}. "
            "Expected a directory path (str or os.PathLike)."
        )
    given = check_path_not_empty(path, argument)
    path = layout.resolve(given, argument)
    if tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path):
        raise ValueError(
            f"Invalid value for argument `{argument}`. Received: {argument}={given!r}, which is a "
            "file. Expected a directory (it is created if missing)."
        )
    if "://" not in path:
        existing = path
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ValueError(
                f"Invalid value for argument `{argument}`. Received: {argument}={given!r}, which "
                f"cannot be written ({existing} is not writable). Expected a writable directory."
                + _readable_checkpoint(path)
            )
    return path


def _readable_checkpoint(directory: str) -> str:
    """Where a directory that cannot be written holds a checkpoint: how to train on from it elsewhere."""
    newest = tf.train.latest_checkpoint(layout.ModelDirLayout(directory).checkpoints) if os.path.isdir(directory) else None
    if newest is None:
        return ""
    return (
        f" Its newest checkpoint, {newest}, can still be read: to train on from it, pass "
        f"`resume_from={newest!r}` with a writable `model_dir`."
    )


def check_left_at_default(options: Any, names: tuple[str, ...], *, received: str, expected: str) -> None:
    """Refuses an option that cannot act: one of `names` (fields of the dataclass `options`) not at its default.

    Args:
        options: A dataclass instance.
        names: Its fields that act only with `expected`. An empty tuple counts as the default (none).
        received: What makes them unable to act, e.g. `"model_dir=None"`.
        expected: What they need, e.g. ``"a `model_dir`"``.

    Raises:
        ValueError: one of them is set to another value.
    """
    defaults = {field.name: field.default for field in dataclasses.fields(options)}
    for name in names:
        value, default = getattr(options, name), defaults[name]
        if value != default and value != ():
            raise ValueError(
                f"Invalid combination of arguments. Received: {name}={value!r} with {received}. "
                f"Expected {expected} for it to act on, or {name} left at its default ({default!r})."
            )
