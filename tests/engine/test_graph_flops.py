"""Tests for `tftrain.engine.graph_flops`: the FLOPs of a traced graph, op by op and through nested functions."""

import pytest
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

from tftrain.engine.graph_flops import UNCOUNTED_OPS, count_graph_flops, einsum_flops

MATMUL_4x5x6 = 2 * 4 * 5 * 6  # 240


def graph_of(function, *specs):
    return tf.function(function, autograph=False).get_concrete_function(*specs).graph


# ------------------------------------------------------------------ einsum


@pytest.mark.parametrize(
    "equation, shapes, expected",
    [
        ("ij,jk->ik", [(2, 3), (3, 4)], 2 * 2 * 3 * 4),  # a matmul
        ("bij,bjk->bik", [(5, 2, 3), (5, 3, 4)], 2 * 5 * 2 * 3 * 4),
        ("ij,jk", [(2, 3), (3, 4)], 2 * 2 * 3 * 4),  # implicit output "ik"
        ("ij,ij->ij", [(2, 3), (2, 3)], 6),  # elementwise: one multiply each
        ("i,j->ij", [(2,), (3,)], 6),  # outer product
        ("ij->ji", [(2, 3)], 0),  # a transpose
        ("ij->i", [(2, 3)], 6),  # a sum: one addition per element
        ("...ij,jk->...ik", [(7, 2, 3), (3, 4)], 2 * 7 * 2 * 3 * 4),
        ("...ij,...jk", [(7, 1, 2, 3), (5, 3, 4)], 2 * 7 * 5 * 2 * 3 * 4),  # broadcast batch dims
        ("...i,...i->", [(7, 3), (7, 3)], 2 * 7 * 3),  # the batch dims summed too
    ],
)
def test_einsum_flops(equation, shapes, expected):
    assert einsum_flops(equation, shapes) == expected


@pytest.mark.parametrize(
    "equation, shapes", [("ij,jk->ik", [(2, 3)]), ("ijk,jk->ik", [(2, 3), (3, 4)]), ("i,i,i->", [(2,)] * 3)]
)
def test_einsum_flops_refuses_what_does_not_match(equation, shapes):
    with pytest.raises(ValueError, match="einsum"):
        einsum_flops(equation, shapes)


def test_einsum_op_counts_as_einsum_flops():
    graph = graph_of(
        lambda a, b: tf.einsum("bqd,bkd->bqk", a, b), tf.TensorSpec([2, 3, 4]), tf.TensorSpec([2, 5, 4])
    )
    assert (
        count_graph_flops(graph) == einsum_flops("bqd,bkd->bqk", [(2, 3, 4), (2, 5, 4)]) == 2 * 2 * 3 * 5 * 4
    )


# ------------------------------------------------------------------ TensorFlow's statistics, graphs


def test_matmul_and_elementwise_ops_count_as_tensorflow_counts_them():
    graph = graph_of(
        lambda a, b: tf.nn.bias_add(a @ b, tf.ones([6])), tf.TensorSpec([4, 5]), tf.TensorSpec([5, 6])
    )
    assert count_graph_flops(graph) == MATMUL_4x5x6 + 4 * 6


def test_integer_ops_count_zero():
    graph = graph_of(lambda a, b: a * b + a, tf.TensorSpec([4, 5], tf.int32), tf.TensorSpec([4, 5], tf.int32))
    assert count_graph_flops(graph) == 0


@pytest.mark.parametrize(
    "convolution, x_shape, w_shape",
    [
        (lambda x, w: tf.nn.conv3d(x, w, [1] * 5, "VALID"), [1, 4, 4, 4, 2], [2, 2, 2, 2, 3]),
        (lambda x, w: tf.nn.depthwise_conv2d(x, w, [1] * 4, "VALID"), [1, 5, 5, 2], [3, 3, 2, 2]),
        (lambda x, w: tf.nn.conv2d(x, w, 1, "VALID"), [1, 5, 5, 2], [3, 3, 2, 4]),
    ],
    ids=["conv3d", "depthwise", "conv2d"],
)
def test_a_convolutions_gradients_count_as_the_convolution(convolution, x_shape, w_shape):
    def forward(x, w):
        return tf.reduce_sum(convolution(x, w))

    def with_gradients(x, w):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            total = forward(x, w)
        return tape.gradient(total, [x, w])

    specs = tf.TensorSpec(x_shape), tf.TensorSpec(w_shape)
    forward_graph = graph_of(forward, *specs)
    conv = next(op for op in forward_graph.get_operations() if "onv" in op.type)
    reduction = conv.outputs[0].shape.num_elements() - 1  # the sum: one addition per element but one
    convolution_flops = count_graph_flops(forward_graph) - reduction
    assert convolution_flops > 0
    # Forward, input gradient and filter gradient: the same multiply-adds each.
    assert count_graph_flops(graph_of(with_gradients, *specs)) == 3 * convolution_flops + reduction


def test_nested_functions_count_once_per_call():
    inner = tf.function(lambda a, b: a @ b, jit_compile=True, autograph=False)
    graph = graph_of(lambda a, b: inner(a, b) + inner(a, b), tf.TensorSpec([4, 5]), tf.TensorSpec([5, 6]))
    assert count_graph_flops(graph) == 2 * MATMUL_4x5x6 + 4 * 6


def test_a_cond_counts_its_costliest_branch():
    def step(pred, a, b):
        return tf.cond(pred, lambda: a @ b, lambda: tf.zeros([4, 6]) + 1.0)

    graph = graph_of(step, tf.TensorSpec([], tf.bool), tf.TensorSpec([4, 5]), tf.TensorSpec([5, 6]))
    assert count_graph_flops(graph) == MATMUL_4x5x6


def test_a_while_loop_cannot_be_counted():
    def step(a):
        return tf.while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x * 2.0), [0, a])[1]

    with pytest.raises(ValueError, match="while_loop"):
        count_graph_flops(graph_of(step, tf.TensorSpec([4])))


def test_an_uncounted_op_makes_the_count_unavailable():
    assert "SparseTensorDenseMatMul" in UNCOUNTED_OPS

    def step(a, b):
        return tf.sparse.sparse_dense_matmul(tf.sparse.from_dense(a), b)

    with pytest.raises(ValueError, match="SparseTensorDenseMatMul"):
        count_graph_flops(graph_of(step, tf.TensorSpec([4, 5]), tf.TensorSpec([5, 6])))


def test_unknown_shapes_are_refused_then_inferred_from_argument_shapes():
    weights = tf.Variable(tf.ones([5, 6]))
    inner = tf.function(lambda a: a @ weights, autograph=False)  # a nested call reading a captured variable

    def step(a):
        return tf.reduce_mean(inner(a) + inner(a))

    graph = graph_of(step, tf.TensorSpec([None, 5]))
    with pytest.raises(ValueError, match="not fully defined"):
        count_graph_flops(graph)
    traces = graph_of(step, tf.TensorSpec([4, 5]))  # the same function traced for 4 examples
    expected = count_graph_flops(traces)
    assert expected == 2 * MATMUL_4x5x6 + 4 * 6 + 4 * 6  # the add, then the mean (TF: one per element)
    assert count_graph_flops(graph, [tf.TensorShape([4, 5])]) == expected
    with pytest.raises(ValueError, match="argument shapes"):
        count_graph_flops(graph, [tf.TensorShape([4, 5])] * 2)


def test_shapes_the_trace_set_complete_those_inferred_again():
    def step(a, w):
        made = tf.numpy_function(lambda value: value[:, :4], [a], tf.float32)  # a shape nothing infers
        made.set_shape([3, 4])
        return made @ w

    graph = graph_of(step, tf.TensorSpec([None, 5]), tf.TensorSpec([4, 6]))
    assert count_graph_flops(graph, [tf.TensorShape([3, 5]), tf.TensorShape([4, 6])]) == 2 * 3 * 4 * 6


def test_tpu_replicated_ops_count_once_per_replica():
    graph = tf.Graph()
    with graph.as_default():
        a, b = tf.compat.v1.placeholder(tf.float32, [4, 5]), tf.compat.v1.placeholder(tf.float32, [5, 6])
        with graph._attr_scope({"_tpu_replicate": attr_value_pb2.AttrValue(s=b"cluster")}):
            tf.raw_ops.TPUReplicateMetadata(num_replicas=4)
            tf.matmul(a, b)  # built once, run by each of the 4 replicas
        tf.matmul(a, b)  # outside the replicated computation: once
    assert count_graph_flops(graph) == 5 * MATMUL_4x5x6
