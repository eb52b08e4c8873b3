"""Linear evaluation of a frozen encoder: the standard measure of a learned representation.

A logistic-regression probe is trained on the frozen encoder's features of the
training split and scored on the evaluation split. The same probe on a
randomly initialized encoder of the same architecture is the baseline that
shows what pretraining added.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tftrain.examples.simclr import metrics


def encoder_features(encoder: keras.Model, *datasets: tf.data.Dataset) -> list[tuple[np.ndarray, np.ndarray]]:
    """Runs a frozen encoder (inference mode) over batched `(images, labels)` datasets.

    Returns:
        `(features, labels)` arrays for each dataset, in order.
    """
    extract = tf.function(lambda images: encoder(images[..., :3], training=False), reduce_retracing=True)
    results = []
    for dataset in datasets:
        features, labels = [], []
        for images, batch_labels in dataset:
            features.append(extract(images).numpy())
            labels.append(batch_labels.numpy())
        results.append((np.concatenate(features), np.concatenate(labels)))
    return results


def linear_probe_accuracy(
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    num_classes: int,
    *,
    steps: int = 500,
    learning_rate: float = 0.01,
    l2: float = 1e-4,
    seed: int = 0,
) -> float:
    """Top-1 accuracy on `test` of a softmax classifier trained on `train` features.

    Features are standardized with the training statistics; a single dense
    layer is trained by full-batch Adam (features are small, so one
    `tf.function` runs every step without per-epoch host work).

    Args:
        train: `(features, labels)` to fit on.
        test: `(features, labels)` to score.
        num_classes: Output classes.
        steps: Full-batch Adam steps.
        learning_rate: Adam's learning rate.
        l2: L2 penalty on the weights.
        seed: Initialization seed.

    Returns:
        The top-1 accuracy on `test`, in [0, 1], as the reference counts it
        (`metrics.label_top_k_hits`: `argmax(logits) == label`).
    """
    train_x, train_y = train
    test_x, test_y = test
    mean, std = train_x.mean(axis=0), train_x.std(axis=0) + 1e-6
    train_x = tf.constant((train_x - mean) / std, tf.float32)
    test_x = tf.constant((test_x - mean) / std, tf.float32)
    train_y = tf.constant(train_y, tf.int64)
    keras.utils.set_random_seed(seed)
    classifier = keras.layers.Dense(num_classes)
    classifier.build((None, int(train_x.shape[1])))
    optimizer = keras.optimizers.Adam(learning_rate)
    optimizer.build(classifier.trainable_variables)

    @tf.function
    def fit():
        for _ in tf.range(steps):
            with tf.GradientTape() as tape:
                logits = classifier(train_x)
                loss = tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=train_y, logits=logits)
                ) + l2 * tf.reduce_sum(tf.square(classifier.kernel))
            grads = tape.gradient(loss, classifier.trainable_variables)
            optimizer.apply(grads, classifier.trainable_variables)

    fit()
    hits = metrics.label_top_k_hits(test_y, classifier(test_x), k=1).numpy()
    return float(np.mean(hits, dtype=np.float64))
