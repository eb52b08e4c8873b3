"""FLOPs of one run of a traced function, counted on its graph with TensorFlow's own op statistics.

Each op counts what TensorFlow's profiler counts for it (its
`RegisterStatistics(op, "flops")` functions: MatMul, convolutions, BiasAdd,
reductions, elementwise arithmetic), except where tftrain counts: `Einsum`
and the depthwise and 3-D convolution gradients, which TensorFlow does not
count, and the 2-D convolution gradients, which it counts over the input
image (too many for a "valid" convolution): each gradient of a convolution
multiply-adds as many times as the convolution. A multiply-add is 2 FLOPs. Elementwise ops without a TensorFlow count
(activations, `exp`, casts) and ops on integers count zero.

- Nested functions are walked: a called `tf.function` (`PartitionedCall`, an
  XLA-compiled replica step) counts once per call; a `tf.cond` or
  `tf.switch_case` its costliest branch (one branch runs: an upper bound
  where they differ); TPUStrategy's replicated computation, built once,
  once per replica.
- A `tf.while_loop` makes the count unavailable (its number of iterations is
  known only when it runs), as does an op with heavy math that nobody counts
  (`UNCOUNTED_OPS`) or a shape that is not static. Static shapes can be given
  for the function's arguments: TensorFlow's shape inference then runs again
  on the traced graph (imported into a new graph: nothing is retraced).

The count is of the graph as traced, before Grappler or XLA rewrite it: under
XLA (`jit_compile=True`) the same math runs, fused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from tftrain.compat import tf_internals

__all__ = ["UNCOUNTED_OPS", "count_graph_flops", "einsum_flops"]

UNCOUNTED_OPS = frozenset(
    {
        "CudnnRNN", "CudnnRNNV2", "CudnnRNNV3", "CudnnRNNBackprop", "CudnnRNNBackpropV2",
        "CudnnRNNBackpropV3", "Conv", "Conv2DBackpropInputV2", "Conv3DBackpropInput",
        "Conv3DBackpropFilter", "SparseMatMul", "SparseTensorDenseMatMul", "XlaConv", "XlaConvV2",
        "XlaDot", "XlaDotV2", "XlaEinsum",
    }
)  # fmt: skip
"""Ops with heavy math that neither TensorFlow nor tftrain counts: a step with one has no count."""

_CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})
_BRANCHES = frozenset({"If", "StatelessIf", "Case", "StatelessCase"})
_LOOPS = frozenset({"While", "StatelessWhile"})
_PREFIX = "tftrain_flops"  # names of a graph imported to run shape inference again


class _Uncountable(ValueError):
    """The graph cannot be counted; the message says why."""


def einsum_flops(equation: str, shapes: Sequence[Sequence[int]]) -> int:
    """FLOPs of one `tf.einsum` of one or two operands (what TensorFlow's `Einsum` op computes).

    2 per multiply-add over the product of every index's size when an index
    is summed (`"ij,jk->ik"` is a matmul: 2*i*j*k); 1 per product when none
    is (an outer or elementwise product); a sum over one operand's indices
    costs one addition per element, a transpose nothing.

    Args:
        equation: The einsum equation, e.g. `"bqhd,bkhd->bhqk"` (`...` broadcasts).
        shapes: The operands' static shapes.

    Raises:
        ValueError: an equation that does not match the shapes, or over two operands.
    """
    equation = equation.replace(" ", "")
    inputs, _, output = equation.partition("->")
    operands = inputs.split(",")
    if len(operands) != len(shapes) or len(operands) > 2:
        raise ValueError(f"einsum {equation!r} with {len(shapes)} operands")
    if "->" not in equation:  # implicit output: the indices that appear once, in order
        letters = inputs.replace(",", "").replace(".", "")
        output = "..." + "".join(sorted(label for label in set(letters) if letters.count(label) == 1))
    sizes: dict[str, int] = {}
    broadcast = []
    for operand, shape in zip(operands, shapes, strict=True):
        shape = [int(dim) for dim in shape]
        labels = operand.replace("...", "")
        if "..." in operand:
            start, extra = operand.index("..."), len(shape) - len(labels)
            broadcast.append(shape[start : start + extra])
            shape = shape[:start] + shape[start + extra :]
        if len(labels) != len(shape):
            raise ValueError(f"einsum operand {operand!r} does not match shape {shape}")
        for label, dim in zip(labels, shape, strict=True):
            sizes[label] = max(sizes.get(label, 1), dim)
    ellipsis = np.broadcast_shapes(*[tuple(dims) for dims in broadcast]) if broadcast else ()
    product = math.prod(sizes.values()) * math.prod(ellipsis)
    summed = any(label not in output for label in sizes) or (math.prod(ellipsis) > 1 and "..." not in output)
    if len(operands) == 1:
        return product if summed else 0
    return product * (2 if summed else 1)


def _static(shape: tf.TensorShape) -> list[int]:
    if not shape.is_fully_defined():
        raise ValueError(f"Shape {shape} is not fully defined")
    return shape.as_list()


def _einsum_op(op: tf.Operation) -> int:
    return einsum_flops(op.get_attr("equation").decode(), [_static(tensor.shape) for tensor in op.inputs])


def _conv_gradient(window_dims: int):
    """The FLOPs of a convolution's gradient op: those TensorFlow counts for the convolution itself.

    Both gradients multiply-add what the convolution does: once per output
    element (the gradient `out_backprop` has its shape) and filter tap, the
    taps being the filter's first `window_dims` dims: height, width and input
    depth for 2-D (3), time too for 3-D (4), height and width for depthwise (2).
    """

    def count(op: tf.Operation) -> int:
        # (input or input_sizes, filter or filter_sizes, out_backprop): the filter
        # is the op's output for the filter gradient.
        kernel = op.outputs[0] if "Filter" in op.type else op.inputs[1]
        window = _static(kernel.shape)[:window_dims]
        return 2 * math.prod(_static(op.inputs[2].shape)) * math.prod(window)

    return count


_TFTRAIN_COUNTS = {
    "Einsum": _einsum_op,
    "Conv2DBackpropInput": _conv_gradient(3),
    "Conv2DBackpropFilter": _conv_gradient(3),
    "DepthwiseConv2dNativeBackpropInput": _conv_gradient(2),
    "DepthwiseConv2dNativeBackpropFilter": _conv_gradient(2),
    "Conv3DBackpropInputV2": _conv_gradient(4),
    "Conv3DBackpropFilterV2": _conv_gradient(4),
}


def count_graph_flops(graph: tf.Graph, argument_shapes: Sequence[tf.TensorShape] | None = None) -> int:
    """FLOPs of one run of a traced function, from its graph (a `tf.function`'s concrete function's `graph`).

    Args:
        graph: The `FuncGraph` a function traced into.
        argument_shapes: Static shapes for the function's arguments
            (`graph.inputs` less the captured tensors), where the trace's are
            not: shape inference runs again on the graph with them.

    Returns:
        The FLOPs, an integer.

    Raises:
        ValueError: the graph cannot be counted; the message says why.
    """
    shapes = None
    if argument_shapes is not None:
        arguments = tf_internals.function_arguments(graph)
        if len(arguments) != len(argument_shapes):
            raise ValueError(
                f"{len(argument_shapes)} argument shapes for a function of {len(arguments)} arguments"
            )
        refined = {
            id(tensor): tf.TensorShape(shape)
            for tensor, shape in zip(arguments, argument_shapes, strict=True)
        }
        shapes = [refined.get(id(tensor), tensor.shape) for tensor in graph.inputs]
    return _count_function(graph, shapes)


def _count_function(traced: tf.Graph, input_shapes: list[tf.TensorShape] | None) -> int:
    """FLOPs of `traced`, its inputs (`traced.inputs`, captures included) refined to `input_shapes`."""
    graph = traced
    if input_shapes is not None:
        merged = []
        for tensor, shape in zip(traced.inputs, input_shapes, strict=True):
            try:
                merged.append(tensor.shape.merge_with(shape))
            except ValueError as error:
                raise _Uncountable(f"`{traced.name}` was traced for {tensor.shape}, not {shape}") from error
        if any(
            _known(new) != _known(tensor.shape) for new, tensor in zip(merged, traced.inputs, strict=True)
        ):
            graph = _reinferred(traced, merged)
    return _count_ops(graph, traced)


def _known(shape: tf.TensorShape) -> tuple[Any, ...] | None:
    return None if shape.rank is None else tuple(shape.as_list())


def _reinferred(traced: tf.Graph, input_shapes: list[tf.TensorShape]) -> tf.Graph:
    """A copy of `traced` whose shapes TensorFlow inferred again from inputs of `input_shapes` (nothing is retraced)."""
    copy = tf.Graph()
    try:
        with copy.as_default():
            input_map = {}
            for index, (tensor, shape) in enumerate(zip(traced.inputs, input_shapes, strict=True)):
                placeholder = tf.compat.v1.placeholder(tensor.dtype, shape, name=f"tftrain_input_{index}")
                if tensor.dtype == tf.resource:  # the variable's shape, for `ReadVariableOp`
                    tf_internals.copy_handle_data(tensor, placeholder)
                input_map[tensor.name] = placeholder
            tf.graph_util.import_graph_def(traced.as_graph_def(), input_map=input_map, name=_PREFIX)
    except (ValueError, TypeError, tf.errors.OpError) as error:
        raise _Uncountable(
            f"TensorFlow could not infer the shapes of `{traced.name}` again: {error}"
        ) from error
    return copy


def _count_ops(graph: tf.Graph, traced: tf.Graph) -> int:
    """FLOPs of the ops of `graph` (`traced` itself, or its `_reinferred` copy), nested functions included."""
    total = 0
    replicas = _tpu_replicas(graph)
    for op in graph.get_operations():
        flops = _count_op(graph, op, traced)
        total += replicas.get(_tpu_cluster(op), 1) * flops if replicas and flops else flops
    return total


def _tpu_cluster(op: tf.Operation) -> str | None:
    value = op.node_def.attr.get("_tpu_replicate")
    return None if value is None else value.s.decode()


def _tpu_replicas(graph: tf.Graph) -> dict[str, int]:
    """TPUStrategy's replicated computations in `graph`: cluster -> replicas (its ops are built once for all)."""
    metadata = [op for op in graph.get_operations() if op.type == "TPUReplicateMetadata"]
    return {_tpu_cluster(op): op.get_attr("num_replicas") for op in metadata if _tpu_cluster(op) is not None}


def _count_op(graph: tf.Graph, op: tf.Operation, traced: tf.Graph) -> int:
    """FLOPs of one op of `graph`, a function call's included."""
    if op.type in _LOOPS:
        raise _Uncountable(
            f"the step runs a tf.while_loop (`{op.name}`), whose number of iterations is known only when it runs"
        )
    if op.type in _CALLS:
        return _count_call(op, traced, op.get_attr("f").name, list(op.inputs))
    if op.type in _BRANCHES:  # one branch runs: the costliest one counts
        names = (
            [branch.name for branch in op.get_attr("branches")]
            if "Case" in op.type
            else [op.get_attr("then_branch").name, op.get_attr("else_branch").name]
        )
        return max(_count_call(op, traced, name, list(op.inputs)[1:]) for name in names)
    if any(value.HasField("func") or value.list.func for value in op.node_def.attr.values()):
        raise _Uncountable(f"`{op.name}` ({op.type}) calls a function tftrain does not count")
    if op.type in UNCOUNTED_OPS:
        raise _Uncountable(
            f"the step runs `{op.name}` ({op.type}), whose FLOPs neither TensorFlow nor tftrain count"
        )
    return _op_flops(graph, op, traced)


def _count_call(op: tf.Operation, traced: tf.Graph, name: str, inputs: list[tf.Tensor]) -> int:
    body = tf_internals.function_body_graph(traced, name)
    if len(body.inputs) != len(inputs):
        raise _Uncountable(
            f"`{op.name}` passes {len(inputs)} inputs to `{name}`, which takes {len(body.inputs)}"
        )
    return _count_function(body, [tensor.shape for tensor in inputs])


def _op_flops(graph: tf.Graph, op: tf.Operation, traced: tf.Graph) -> int:
    tensors = [*op.inputs, *op.outputs]
    if not any(tensor.dtype.is_floating or tensor.dtype.is_complex for tensor in tensors):
        return 0  # integer bookkeeping (counters, indices) is no floating-point work
    try:
        return _registered_flops(graph, op)
    except ValueError as error:
        # A copy's shapes come from inference alone; the trace may know more (a nested call's outputs).
        if graph is traced or not _refine_from_trace(tensors, traced):
            raise _Uncountable(f"`{_traced_name(op.name)}` ({op.type}) cannot be counted: {error}") from error
    try:
        return _registered_flops(graph, op)
    except ValueError as error:
        raise _Uncountable(f"`{_traced_name(op.name)}` ({op.type}) cannot be counted: {error}") from error


def _registered_flops(graph: tf.Graph, op: tf.Operation) -> int:
    """tftrain's count of the op where it has one, else TensorFlow's registered one (0 where none is)."""
    count = _TFTRAIN_COUNTS.get(op.type)
    value = count(op) if count is not None else tf_internals.op_flops(graph, op.node_def)
    return int(value or 0)


def _traced_name(name: str) -> str:
    return name.removeprefix(f"{_PREFIX}/")


def _refine_from_trace(tensors: list[tf.Tensor], traced: tf.Graph) -> bool:
    """Gives each tensor of a `_reinferred` copy what its traced twin's shape adds; whether any was refined."""
    refined = False
    for tensor in tensors:
        if tensor.shape.is_fully_defined():
            continue
        try:
            twin = traced.get_tensor_by_name(_traced_name(tensor.name))
        except (KeyError, ValueError):
            continue  # an input placeholder of the copy: its shape is already the refined one
        before = _known(tensor.shape)
        try:
            tensor.set_shape(twin.shape)
        except ValueError as error:
            raise _Uncountable(
                f"`{twin.name}` was traced as {twin.shape}, inferred as {tensor.shape}"
            ) from error
        refined = refined or _known(tensor.shape) != before
    return refined
