"""Keras callback plumbing shared by the Trainer's loops: batch hooks, verbosity, host syncs."""

from __future__ import annotations

from typing import Any

import keras

_BATCH_HOOKS = {
    "train": ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end"),
    "test": ("on_test_batch_begin", "on_test_batch_end"),
    "predict": ("on_predict_batch_begin", "on_predict_batch_end"),
}


def batch_hooks(callback_list: keras.callbacks.CallbackList, kind: str):
    """The list's batch hooks for `kind`, or no-ops if no callback overrides them.

    Keras's CallbackList converts the logs to Python values on every batch
    hook call (a host wait for the device), even when no callback reads them.
    """
    if not any(_implements_batch_hooks(cb, kind) for cb in callback_list.callbacks):
        return _no_hook, _no_hook
    return getattr(callback_list, f"on_{kind}_batch_begin"), getattr(callback_list, f"on_{kind}_batch_end")


def relies_on_batch_hooks(callback_list: keras.callbacks.CallbackList, kind: str) -> bool:
    """Whether a callback other than Keras's progress bar and History implements `kind`'s batch hooks.

    Such a callback (a user's, or Keras's TensorBoard, ModelCheckpoint with
    `save_freq=N`, TerminateOnNaN, ...) may count on one hook call per step,
    so `steps_per_loop="auto"` keeps one step per host call for it.
    """
    per_call = (keras.callbacks.History, keras.callbacks.ProgbarLogger)
    return any(
        _implements_batch_hooks(cb, kind) for cb in callback_list.callbacks if not isinstance(cb, per_call)
    )


def terminates_on_nan(callbacks: Any) -> bool:
    """Whether `fit`'s `callbacks` (a list, a `CallbackList` or None) hold Keras's `TerminateOnNaN` (or a subclass).

    Such a `fit` leaves the NaN policy to that callback: the Trainer's NaN
    guard steps aside (`tftrain.services.nan_guard`).
    """
    callbacks = getattr(callbacks, "callbacks", callbacks) or ()
    return any(isinstance(callback, keras.callbacks.TerminateOnNaN) for callback in callbacks)


def _implements_batch_hooks(callback: keras.callbacks.Callback, kind: str) -> bool:
    """Whether a callback overrides any of `kind`'s batch hooks.

    A hook is implemented if it is not Callback's own method (LambdaCallback
    sets hooks as instance attributes, so look at the bound attribute).
    """
    base = keras.callbacks.Callback
    return any(
        getattr(getattr(callback, name), "__func__", None) is not getattr(base, name)
        for name in _BATCH_HOOKS[kind]
    )


def _no_hook(batch: int, logs: Any = None) -> None:
    del batch, logs


def is_no_hook(hook: Any) -> bool:
    """Whether `hook` is the no-op `batch_hooks` returns (nothing reads the logs it would be given)."""
    return hook is _no_hook
