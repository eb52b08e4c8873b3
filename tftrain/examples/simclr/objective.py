"""The NT-Xent contrastive loss of SimCLR, with negatives gathered across replicas."""

from __future__ import annotations

import tensorflow as tf

# Added to the logits of an example against itself so that softmax ignores them.
LARGE_NUM = 1e9


def contrastive_loss(
    hidden: tf.Tensor,
    hidden_norm: bool = True,
    temperature: float = 1.0,
    strategy: tf.distribute.Strategy | None = None,
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Computes the NT-Xent loss on a batch of paired projections.

    Row `i` of the first half of `hidden` and row `i` of the second half are the
    two views of one example (a positive pair); every other row of the batch,
    and with a strategy of more than one replica every row of every replica, is
    a negative. For each anchor the loss is the softmax cross-entropy of its
    positive against the positive and all negatives (the anchor itself is
    masked out), in both directions (view 1 against view 2 and back).

    Note the returned loss is the mean over the local pairs of the *sum* of the
    two directions, i.e. twice the per-anchor average of the paper.

    Args:
        hidden: A `[2N, d]` float tensor: the N first-view rows, then the N
            second-view rows, in the same example order.
        hidden_norm: Whether to L2-normalise the rows first (cosine similarity).
        temperature: The softmax temperature; the logits are divided by it.
        strategy: The `tf.distribute.Strategy` the step runs under. With more
            than one replica the function must be called in replica context
            (inside `strategy.run`) and each replica's local batch must have
            the same size; negatives then come from all replicas.

    Returns:
        `(loss, logits_ab, labels)`: the scalar loss of this replica's pairs;
        `logits_ab`, the `[N, N * R]` similarities of the local first views
        against all second views (R replicas; R = 1 without a strategy), for
        contrastive accuracy; and `labels`, the `[N, 2 * N * R]` one-hot
        targets, whose first `N * R` columns line up with `logits_ab`.

    Raises:
        ValueError: a bad `temperature`, or `hidden` not of rank 2, or a
            multi-replica strategy used outside its replica context.
    """
    if not temperature > 0:
        raise ValueError(
            f"Invalid value for argument `temperature`. Received: temperature={temperature!r}. "
            "Expected a number > 0."
        )
    hidden = tf.convert_to_tensor(hidden)
    if hidden.shape.rank is not None and hidden.shape.rank != 2:
        raise ValueError(
            f"Invalid value for argument `hidden`. Received: a tensor of shape {hidden.shape}. "
            "Expected shape [2 * batch, dim]: the first views, then the second views."
        )
    if hidden.dtype in (tf.float16, tf.bfloat16):
        hidden = tf.cast(hidden, tf.float32)  # LARGE_NUM does not fit in half precision.
    if hidden_norm:
        hidden = tf.math.l2_normalize(hidden, axis=-1)
    hidden1, hidden2 = tf.split(hidden, 2, axis=0)
    batch_size = tf.shape(hidden1)[0]

    if strategy is not None and strategy.num_replicas_in_sync > 1:
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync != strategy.num_replicas_in_sync:
            raise ValueError(
                "Invalid value for argument `strategy`. Received: a strategy with "
                f"{strategy.num_replicas_in_sync} replicas, but contrastive_loss was not called in "
                "its replica context. Expected a call inside `strategy.run`."
            )
        # Every replica's rows, replica 0 first; gradients flow back to each replica.
        hidden1_large = context.all_gather(hidden1, axis=0)
        hidden2_large = context.all_gather(hidden2, axis=0)
        replica_id = tf.cast(context.replica_id_in_sync_group, tf.int32)
        label_index = tf.range(batch_size) + replica_id * batch_size
    else:
        hidden1_large, hidden2_large = hidden1, hidden2
        label_index = tf.range(batch_size)
    large_batch_size = tf.shape(hidden1_large)[0]
    labels = tf.one_hot(label_index, large_batch_size * 2, dtype=hidden.dtype)
    masks = tf.one_hot(label_index, large_batch_size, dtype=hidden.dtype)

    temperature = tf.cast(temperature, hidden.dtype)
    logits_aa = tf.matmul(hidden1, hidden1_large, transpose_b=True) / temperature - masks * LARGE_NUM
    logits_bb = tf.matmul(hidden2, hidden2_large, transpose_b=True) / temperature - masks * LARGE_NUM
    logits_ab = tf.matmul(hidden1, hidden2_large, transpose_b=True) / temperature
    logits_ba = tf.matmul(hidden2, hidden1_large, transpose_b=True) / temperature

    loss_a = tf.nn.softmax_cross_entropy_with_logits(labels, tf.concat([logits_ab, logits_aa], axis=1))
    loss_b = tf.nn.softmax_cross_entropy_with_logits(labels, tf.concat([logits_ba, logits_bb], axis=1))
    return tf.reduce_mean(loss_a + loss_b), logits_ab, labels
