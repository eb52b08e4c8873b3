"""SimCLR's accuracies count as the reference counts them: argmax top-1, top-5 with ties broken by index;
each mode logs what it computes, under the reference's names."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tftrain.examples.simclr import metrics
from tftrain.examples.simclr import model as model_lib

NUM_CLASSES = 10


def tied_logits(seed, batch=64):
    """Logits of a few levels only, so that most rows tie at the top (and at the top-5 boundary)."""
    rng = np.random.RandomState(seed)
    logits = rng.randint(0, 3, size=(batch, NUM_CLASSES)).astype("float32")
    logits[: batch // 4] = 0.0  # rows of a zero-initialised head
    return rng.randint(0, NUM_CLASSES, size=batch), logits


def argmax_hits(labels, logits):
    return (np.argmax(logits, axis=1) == labels).astype("float32")  # numpy: the first of tied maxima


def top_k_index_hits(labels, logits, k):
    # tf.math.top_k's order: larger first, the lower index first among equal values.
    first_k = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    return (first_k == labels[:, None]).any(axis=1).astype("float32")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_top_1_on_tied_logits_is_the_argmax_accuracy(seed):
    labels, logits = tied_logits(seed)
    np.testing.assert_array_equal(metrics.label_top_k_hits(labels, logits, k=1), argmax_hits(labels, logits))
    accuracy = metrics.LabelTopKAccuracy(k=1)
    accuracy.update_state(labels, logits)
    assert float(accuracy.result()) == pytest.approx(argmax_hits(labels, logits).mean())
    assert accuracy.name == "label_top_1_accuracy"


def test_all_zero_logits_score_only_the_labels_their_argmax_names():
    labels = np.arange(40) % NUM_CLASSES  # 4 of each class
    zeros = np.zeros([40, NUM_CLASSES], "float32")
    top_1, top_5 = metrics.LabelTopKAccuracy(k=1), metrics.LabelTopKAccuracy(k=5)
    top_1.update_state(labels, zeros)
    top_5.update_state(labels[:, None], zeros)  # labels as [batch, 1] too
    assert float(top_1.result()) == pytest.approx(0.1)  # argmax is class 0: 4 of 40
    assert float(top_5.result()) == pytest.approx(0.5)  # top_k's first five: classes 0-4
    # What this replaces: in_top_k counts every tied class as a hit.
    keras_top_1 = keras.metrics.SparseTopKCategoricalAccuracy(k=1)
    keras_top_1.update_state(labels, zeros)
    assert float(keras_top_1.result()) == 1.0


@pytest.mark.parametrize("seed", [0, 1])
def test_top_5_breaks_ties_as_top_k(seed):
    labels, logits = tied_logits(seed)
    want = top_k_index_hits(labels, logits, 5)
    np.testing.assert_array_equal(metrics.label_top_k_hits(labels, logits, k=5), want)
    indices = tf.math.top_k(logits, k=5).indices.numpy()
    np.testing.assert_array_equal(want, (indices == labels[:, None]).any(axis=1))
    # Distinct logits: the same as Keras's (no ties to break).
    distinct = np.random.RandomState(seed).normal(size=logits.shape).astype("float32")
    ours, theirs = metrics.LabelTopKAccuracy(k=5), keras.metrics.SparseTopKCategoricalAccuracy(k=5)
    for metric in (ours, theirs):
        metric.update_state(labels, distinct)
    assert float(ours.result()) == float(theirs.result())


def test_the_metric_round_trips_its_config_and_checks_k():
    metric = metrics.LabelTopKAccuracy(k=3, name="top_3")
    again = metrics.LabelTopKAccuracy.from_config(metric.get_config())
    assert (again.k, again.name) == (3, "top_3")
    for k in (0, 1.5, True):
        with pytest.raises(ValueError, match=r"Invalid value for argument `k`. Received: k="):
            metrics.LabelTopKAccuracy(k=k)


def tiny_model(**kwargs):
    model = model_lib.SimCLRModel(
        NUM_CLASSES,
        width_multiplier=0.0625,
        proj_out_dim=8,
        num_proj_layers=2,
        lars_handles_decay=False,
        **kwargs,
    )
    model.build_for(16)
    model.compile(optimizer=keras.optimizers.SGD(0.0))
    return model


def test_a_zero_initialised_head_scores_the_argmax_accuracy():
    # The case: fine-tuning from a zero head on random labels reported 0.566 top-1 before.
    model = tiny_model(train_mode="finetune", zero_init_logits_layer=True)
    labels = np.random.RandomState(0).randint(0, NUM_CLASSES, size=32)
    images = np.random.RandomState(1).uniform(size=(32, 16, 16, 3)).astype("float32")
    logs = model.evaluate(images, labels, batch_size=16, verbose=0, return_dict=True)
    assert float(logs["label_top_1_accuracy"]) == pytest.approx(np.mean(labels == 0))
    assert float(logs["label_top_5_accuracy"]) == pytest.approx(np.mean(labels < 5))
    history = model.fit(images, labels, batch_size=16, epochs=1, verbose=0, shuffle=False)
    assert float(history.history["supervised_acc"][0]) == pytest.approx(np.mean(labels == 0))


@pytest.mark.parametrize(
    "kwargs, logged",
    [
        (dict(train_mode="finetune"), {"loss", "supervised_loss", "supervised_acc", "weight_decay"}),
        (
            dict(train_mode="pretrain"),
            {"loss", "contrast_loss", "contrast_acc", "contrast_entropy", "supervised_loss", "supervised_acc"}
            | {"weight_decay"},
        ),
        (
            dict(train_mode="pretrain", lineareval_while_pretraining=False),
            {"loss", "contrast_loss", "contrast_acc", "contrast_entropy", "weight_decay"},
        ),
    ],
)
def test_each_mode_logs_what_it_computes(kwargs, logged):
    model = tiny_model(**kwargs)
    channels = 6 if kwargs["train_mode"] == "pretrain" else 3
    images = np.random.RandomState(0).uniform(size=(8, 16, 16, channels)).astype("float32")
    labels = np.arange(8) % NUM_CLASSES
    history = model.fit(images, labels, batch_size=8, epochs=1, verbose=0, shuffle=False)
    assert set(history.history) == logged
    assert {metric.name for metric in model.training_metrics} == logged
    # The evaluation's metrics are the model's too (reset with the rest); nothing else.
    assert {metric.name for metric in model.metrics} == logged | {
        "supervised_loss",
        "label_top_1_accuracy",
        "label_top_5_accuracy",
    }
