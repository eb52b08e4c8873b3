"""The SimCLR contrastive loss against the paper's NT-Xent formula, on one device and on two replicas."""

import textwrap

import numpy as np
import pytest
import tensorflow as tf
from helpers import run_result_script

from tftrain.examples.simclr.objective import contrastive_loss


def nt_xent_reference(hidden, hidden_norm, temperature):
    """The paper's NT-Xent, pair by pair: both directions summed, averaged over pairs."""
    z = np.asarray(hidden, np.float64)
    if hidden_norm:
        z = z / np.linalg.norm(z, axis=1, keepdims=True)
    two_n = z.shape[0]
    n = two_n // 2
    similarity = z @ z.T / temperature

    def pair_loss(i, j):
        others = [k for k in range(two_n) if k != i]
        return -(similarity[i, j] - np.log(np.sum(np.exp(similarity[i, others]))))

    return np.mean([pair_loss(k, k + n) + pair_loss(k + n, k) for k in range(n)])


@pytest.mark.parametrize(
    "n, dim, hidden_norm, temperature",
    [(4, 8, True, 1.0), (4, 8, True, 0.1), (3, 5, False, 0.5), (6, 3, False, 2.0), (1, 4, True, 0.2)],
)
def test_matches_the_nt_xent_formula(n, dim, hidden_norm, temperature):
    rng = np.random.RandomState(n * 10 + dim)
    hidden = rng.randn(2 * n, dim).astype("float32")
    if not hidden_norm:
        hidden *= 0.5  # keep the unnormalised logits moderate
    loss, logits_ab, labels = contrastive_loss(tf.constant(hidden), hidden_norm, temperature)
    np.testing.assert_allclose(float(loss), nt_xent_reference(hidden, hidden_norm, temperature), rtol=1e-4)
    assert logits_ab.shape == (n, n)
    assert labels.shape == (n, 2 * n)
    np.testing.assert_array_equal(np.argmax(labels.numpy(), axis=1), np.arange(n))


def test_perfectly_separated_pairs_give_a_low_loss_and_the_argmax_is_the_positive():
    views = np.eye(4, dtype="float32")
    hidden = tf.constant(np.concatenate([views, views]))
    loss, logits_ab, _ = contrastive_loss(hidden, temperature=0.05)
    assert float(loss) < 1e-3
    np.testing.assert_array_equal(np.argmax(logits_ab.numpy(), axis=1), np.arange(4))


def test_works_in_a_tf_function_and_has_gradients():
    hidden = tf.Variable(np.random.RandomState(0).randn(8, 4).astype("float32"))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = contrastive_loss(hidden, temperature=0.5)[0]
        return loss, tape.gradient(loss, hidden)

    loss, grad = step()
    assert np.isfinite(float(loss))
    assert float(tf.reduce_sum(tf.abs(grad))) > 0


def test_half_precision_input_is_computed_in_float32():
    hidden = np.random.RandomState(1).randn(6, 4).astype("float32")
    loss = contrastive_loss(tf.constant(hidden, tf.float16), temperature=0.5)[0]
    assert loss.dtype == tf.float32
    np.testing.assert_allclose(float(loss), nt_xent_reference(hidden, True, 0.5), rtol=1e-2)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="Invalid value for argument `temperature`"):
        contrastive_loss(tf.ones((4, 2)), temperature=0.0)
    with pytest.raises(ValueError, match="Invalid value for argument `hidden`"):
        contrastive_loss(tf.ones((4, 2, 1)))


SCRIPT = textwrap.dedent(
    """
    import json
    import numpy as np, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from tftrain.examples.simclr.objective import contrastive_loss

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    replicas = strategy.num_replicas_in_sync
    rng = np.random.RandomState(0)
    n, dim, temperature = 6, 5, 0.3
    view1, view2 = rng.randn(n, dim).astype("float32"), rng.randn(n, dim).astype("float32")
    local = n // replicas
    one_device = contrastive_loss(tf.constant(np.concatenate([view1, view2])), temperature=temperature)

    def per_replica(context):
        r = context.replica_id_in_sync_group
        rows = slice(r * local, (r + 1) * local)
        return tf.constant(np.concatenate([view1[rows], view2[rows]]))

    hidden = strategy.experimental_distribute_values_from_function(per_replica)

    @tf.function
    def step(hidden):
        return strategy.run(
            lambda h: contrastive_loss(h, temperature=temperature, strategy=strategy), args=(hidden,))

    losses, logits, labels = step(hidden)
    losses = [float(v) for v in strategy.experimental_local_results(losses)]
    logits = [v.numpy() for v in strategy.experimental_local_results(logits)]
    labels = [v.numpy() for v in strategy.experimental_local_results(labels)]
    one_logits = one_device[1].numpy()
    errors = []
    try:
        contrastive_loss(tf.ones((4, 2)), strategy=strategy)
    except ValueError as error:
        errors.append(str(error))
    print("RESULT" + json.dumps({
        "replicas": replicas,
        "losses": losses,
        "one_device": float(one_device[0]),
        "logits_shapes": [list(v.shape) for v in logits],
        "labels_shapes": [list(v.shape) for v in labels],
        "label_argmax": [np.argmax(v, axis=1).tolist() for v in labels],
        "logits_diff": max(float(np.abs(v - one_logits[r * local:(r + 1) * local]).max())
                           for r, v in enumerate(logits)),
        "errors": errors,
    }))
    """
)


def test_two_replicas_gather_negatives_and_match_one_device():
    result = run_result_script(SCRIPT, timeout=120)
    assert result["replicas"] == 2
    # Each replica's loss differs (different anchors), but their mean is the global loss.
    assert result["losses"][0] != pytest.approx(result["losses"][1])
    assert np.mean(result["losses"]) == pytest.approx(result["one_device"], rel=1e-5)
    assert result["logits_shapes"] == [[3, 6], [3, 6]]
    assert result["labels_shapes"] == [[3, 12], [3, 12]]
    assert result["label_argmax"] == [[0, 1, 2], [3, 4, 5]]
    assert result["logits_diff"] < 1e-5
    assert "replica context" in result["errors"][0]
