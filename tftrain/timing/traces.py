"""Trace counting: how often a step function traced, and a warning naming what changed."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

__all__ = ["RETRACE_WARNING_THRESHOLD", "TraceCounter", "describe_arguments"]

# A step function that traced this many times is called "retracing" and warned
# about once, naming what changed. Two traces are normal: the first batch, and a
# relaxed shape after a partial last batch (`reduce_retracing=True`).
RETRACE_WARNING_THRESHOLD = 4


@tf.autograph.experimental.do_not_convert
def describe_arguments(args: Any) -> dict[str, str]:
    """Describes a step's arguments as `{path: "dtype[shape]" or repr}`.

    Used at trace time, where tensors are symbolic: their dtype and shape are
    what decides whether `tf.function` retraces.
    """
    described = {}
    for path_parts, value in keras.tree.flatten_with_path(args):
        path = "".join(f"[{part!r}]" for part in path_parts)
        if isinstance(value, (tf.Tensor, tf.Variable)) or hasattr(value, "shape"):
            shape = getattr(value, "shape", ())
            rank_known = getattr(shape, "rank", 0) is not None  # a relaxed retrace may drop the rank
            dtype = getattr(getattr(value, "dtype", None), "name", str(getattr(value, "dtype", "")))
            described[path] = f"{dtype}{list(shape)}" if rank_known else f"{dtype}[unknown rank]"
        else:
            described[path] = f"python value {value!r}"
    return described


class TraceCounter:
    """Counts how often a step function traces and names what changed.

    `wrap(fn)` returns a function to hand to `tf.function`: its Python body
    runs only while tracing, so counting there costs nothing at run time.

    Args:
        name: The function's name, used in the retracing warning.
        argument_name: What the traced argument is called for users.
    """

    def __init__(self, name: str = "train_step", argument_name: str = "batch"):
        self.name = name
        self.argument_name = argument_name
        self.count = 0
        self._last_signature: dict[str, str] | None = None
        self._warned = False
        self._graphs: list[weakref.ref] = []  # the graph of each trace, held weakly

    def traced_graphs(self) -> list[tf.Graph]:
        """The graphs the function traced into, oldest first (those still alive: `tf.function` keeps them).

        What `tftrain.engine.flops` counts, so that counting never traces again.
        """
        graphs = [reference() for reference in self._graphs]
        return [graph for graph in graphs if graph is not None]

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Returns `fn` with trace counting around it."""

        def counted(*args):
            if not tf.executing_eagerly():
                self._record(args[0] if len(args) == 1 else args)
            return fn(*args)

        # TensorFlow's own retracing warning names the function by these.
        counted.__name__ = getattr(fn, "__name__", self.name)
        counted.__qualname__ = getattr(fn, "__qualname__", counted.__name__)
        return counted

    @tf.autograph.experimental.do_not_convert
    def _record(self, args: Any) -> None:
        signature = describe_arguments(args)
        changes = _signature_changes(self._last_signature, signature, self.argument_name)
        self._last_signature = signature
        self.count += 1
        self._graphs.append(weakref.ref(tf.compat.v1.get_default_graph()))  # the graph being traced
        if self.count >= RETRACE_WARNING_THRESHOLD and not self._warned:
            self._warned = True
            what = "; ".join(changes) if changes else "no argument changed (a new Python object or closure?)"
            warnings.warn(
                f"`{self.name}` has traced {self.count} times, which is slow. The last retrace "
                f"saw a change in {what}. Keep shapes and dtypes stable "
                "(e.g. `dataset.batch(..., drop_remainder=True)`), and pass changing Python "
                "numbers as tensors.",
                stacklevel=2,
            )


def _signature_changes(before: dict[str, str] | None, after: dict[str, str], argument_name: str) -> list[str]:
    if before is None:
        return []
    changes = []
    for path in sorted(set(before) | set(after)):
        old, new = before.get(path, "missing"), after.get(path, "missing")
        if old != new:
            changes.append(f"{argument_name}{path}: {old} -> {new}")
    return changes
