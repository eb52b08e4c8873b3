"""Label accuracy counted as google-research/simclr counts it: one class per prediction, ties broken by index.

The reference scores top-1 as `argmax(logits) == label`. Keras's
`SparseTopKCategoricalAccuracy` is built on `tf.math.in_top_k`, which counts
every class tied at the boundary as in the top k: on all-zero logits (a
zero-initialised head) its top-1 is 1.0. Here a prediction is the first k
indices of `tf.math.top_k` (the lower index first among equal logits;
`argmax` for k = 1), so a batch of tied logits scores the labels it really
names.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

from tftrain.arguments import check_int


def label_top_k_hits(labels: tf.Tensor, logits: tf.Tensor, k: int = 1) -> tf.Tensor:
    """1.0 where the label is among the top `k` predicted classes, else 0.0, per example.

    The top `k` classes are `tf.math.top_k(logits, k).indices`: among equal
    logits the lower class index comes first, so each example predicts exactly
    `k` classes. For `k=1` this is the reference's `argmax(logits) == label`.

    Args:
        labels: Integer class labels, shape `[batch]` (or `[batch, 1]`).
        logits: Scores, shape `[batch, num_classes]` (`num_classes >= k`).
        k: How many classes each prediction names.

    Returns:
        A float32 tensor of shape `[batch]`.

    Raises:
        ValueError: `k` is not an integer >= 1.
    """
    check_int("k", k)
    logits = tf.convert_to_tensor(logits)
    labels = tf.reshape(tf.cast(labels, tf.int64), tf.shape(logits)[:-1])
    if k == 1:
        hits = tf.equal(tf.argmax(logits, axis=-1), labels)
    else:
        top = tf.cast(tf.math.top_k(logits, k=k).indices, tf.int64)
        hits = tf.reduce_any(tf.equal(top, labels[..., None]), axis=-1)
    return tf.cast(hits, tf.float32)


class LabelTopKAccuracy(keras.metrics.MeanMetricWrapper):
    """The fraction of examples whose label is among the top `k` predictions (`label_top_k_hits`).

    A sparse-label accuracy as `keras.metrics.SparseTopKCategoricalAccuracy`,
    but ties are broken by class index instead of all counted as hits:
    `update_state(labels, logits)` with all-zero logits counts only labels
    below `k`. Top-1 is the reference's `argmax` accuracy.

    Args:
        k: How many classes each prediction names.
        name: The metric's name (default `label_top_{k}_accuracy`, the reference's).
        dtype: The dtype of the metric's result.
    """

    def __init__(self, k: int = 1, name: str | None = None, dtype: Any = None):
        check_int("k", k)
        super().__init__(label_top_k_hits, name=name or f"label_top_{k}_accuracy", dtype=dtype, k=k)
        self.k = k

    def get_config(self) -> dict[str, Any]:
        return {"k": self.k, "name": self.name, "dtype": self.dtype}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> LabelTopKAccuracy:
        return cls(**config)
