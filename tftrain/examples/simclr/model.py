"""The SimCLR model: a ResNet encoder, a projection head and a linear probe, as one `CustomModel`.

Its `train_step` is the whole SimCLR algorithm, so it trains unchanged under
`model.fit` and under `tftrain.Trainer.fit`:

* pretrain: both augmented views of each image (stacked on the channel axis
  by the input pipeline) go through the encoder and the projection head; the
  NT-Xent loss pulls the two views of an image together and pushes the other
  images apart (negatives gathered across replicas). With
  `lineareval_while_pretraining`, a linear probe learns the labels from the
  encoder's features through `stop_gradient`, so it measures the
  representation without shaping it.
* finetune: one view, the probe's cross-entropy trains the whole network.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf

import tftrain
from tftrain.examples.simclr import batch_norm, lars, objective, resnet
from tftrain.examples.simclr import metrics as metrics_lib

PROJ_HEAD_MODES = ("none", "linear", "nonlinear")
TRAIN_MODES = ("pretrain", "finetune")
# Variables LARS leaves out of weight decay and of its trust ratio, as the reference: batch
# norm, biases and the supervised head (which gets an explicit L2 loss instead).
LARS_EXCLUDE_FROM_WEIGHT_DECAY = ("batch_normalization", "bias", "head_supervised")
LARS_EXCLUDE_FROM_LAYER_ADAPTATION = LARS_EXCLUDE_FROM_WEIGHT_DECAY
# The reference's dense layers in the heads start from N(0, 0.01).
HEAD_KERNEL_STDDEV = 0.01


def lars_optimizer(learning_rate: Any, momentum: float, weight_decay: float) -> lars.LARS:
    """LARS as SimCLR trains with it: no weight decay or layer adaptation for batch norm, biases and the probe."""
    return lars.LARS(
        learning_rate,
        momentum=momentum,
        weight_decay=weight_decay,
        exclude_from_weight_decay=LARS_EXCLUDE_FROM_WEIGHT_DECAY,
        exclude_from_layer_adaptation=LARS_EXCLUDE_FROM_LAYER_ADAPTATION,
    )


class ProjectionHead(keras.layers.Layer):
    """`num_layers` dense layers (with batch norm) mapping features to the contrastive space.

    Args:
        mode: "none" (identity), "linear" (one layer) or "nonlinear" (ReLU between layers).
        out_dim: Size of the last layer's output.
        num_layers: Layers in "nonlinear" mode; the hidden ones keep the input width.
        ft_proj_selector: Which layer's output the probe (and finetuning)
            reads: 0 is the encoder output (no projection layer), 1 after the
            first layer, ..., -1 after the last (as SimCLR's flag).
        batch_norm_decay: The batch norms' moving-average momentum.
        sync_batch_norm: Batch norm statistics over all replicas.
    """

    def __init__(
        self,
        mode: str = "nonlinear",
        out_dim: int = 128,
        num_layers: int = 3,
        ft_proj_selector: int = 0,
        batch_norm_decay: float = resnet.BATCH_NORM_MOMENTUM,
        sync_batch_norm: bool = False,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.batch_norm_decay = batch_norm_decay
        self.sync_batch_norm = sync_batch_norm
        if mode not in PROJ_HEAD_MODES:
            raise ValueError(
                f"Invalid value for argument `proj_head_mode`. Received: {mode!r}. Expected one of "
                f"{', '.join(PROJ_HEAD_MODES)}."
            )
        self.mode = mode
        self.out_dim = out_dim
        self.num_layers = 0 if mode == "none" else (1 if mode == "linear" else num_layers)
        if not -1 <= ft_proj_selector <= self.num_layers:
            raise ValueError(
                f"Invalid value for argument `ft_proj_selector`. Received: {ft_proj_selector}. Expected "
                f"0..{self.num_layers} (the projection head has {self.num_layers} layers), or -1 for "
                "the last layer."
            )
        # The number of projection layers below the probe's input.
        self.ft_proj_selector = self.num_layers if ft_proj_selector == -1 else ft_proj_selector
        self.dense_layers: list[keras.layers.Dense] = []
        self.norm_layers: list[keras.layers.BatchNormalization] = []

    def build(self, input_shape):
        width = int(input_shape[-1])
        for index in range(self.num_layers):
            last = index == self.num_layers - 1
            dense = keras.layers.Dense(
                self.out_dim if last else width,
                use_bias=False,
                kernel_initializer=keras.initializers.RandomNormal(stddev=HEAD_KERNEL_STDDEV),
                name=f"proj_dense_{index}",
            )
            # The last layer's batch norm has no offset: a shift would not change the loss.
            norm = batch_norm.BatchNormalization(
                momentum=self.batch_norm_decay,
                epsilon=resnet.BATCH_NORM_EPSILON,
                center=not last,
                synchronized=self.sync_batch_norm,
                name=f"batch_normalization_proj_{index}",
            )
            self.dense_layers.append(dense)
            self.norm_layers.append(norm)
            # Keras 3 lists are not checkpoint dependencies: attributes put the layers in checkpoints
            # (as `model/projection_head/proj_dense_0`, ...).
            setattr(self, dense.name, dense)
            setattr(self, norm.name, norm)
        shape = input_shape
        for dense, norm in zip(self.dense_layers, self.norm_layers, strict=True):
            dense.build(shape)
            shape = dense.compute_output_shape(shape)
            norm.build(shape)

    def call(self, inputs, training=False):
        hiddens = [inputs]
        for index, (dense, norm) in enumerate(zip(self.dense_layers, self.norm_layers, strict=True)):
            x = norm(dense(hiddens[-1]), training=training)
            if self.mode == "nonlinear" and index != self.num_layers - 1:
                x = keras.ops.relu(x)
            hiddens.append(x)
        return hiddens[-1], hiddens[self.ft_proj_selector]


class SimCLRModel(tftrain.CustomModel):
    """SimCLR as a `keras.Model`: `model(images)` returns `(projection, probe_logits)`.

    Training inputs are `(features, labels)`: in pretrain mode `features` holds
    the two augmented views stacked on the channel axis (`[B, H, W, 6]`), in
    finetune mode one view (`[B, H, W, 3]`). Evaluation inputs are one view.

    Args:
        num_classes: Classes the probe predicts.
        resnet_depth: 18, 34 or 50.
        width_multiplier: Encoder width (fractional for CPU runs).
        cifar_stem: The small-image stem (3x3 conv, no max-pool).
        proj_head_mode: "none", "linear" or "nonlinear".
        proj_out_dim: The projection's output size.
        num_proj_layers: Layers of a nonlinear projection head.
        ft_proj_selector: Which projection layer's output feeds the probe
            (0: the encoder's; -1: the last layer's).
        train_mode: "pretrain" (contrastive) or "finetune" (supervised).
        lineareval_while_pretraining: Train the probe on stop-gradient features
            while pretraining.
        temperature: NT-Xent temperature.
        hidden_norm: L2-normalize projections before the contrastive loss.
        weight_decay: L2 weight decay. With LARS (`lars_handles_decay`) only
            the probe gets an explicit L2 loss; LARS decays the rest itself.
        lars_handles_decay: Whether the optimizer is LARS.
        sync_batch_norm: Batch norm statistics over all replicas (encoder and
            projection head).
        batch_norm_decay: The batch norms' moving-average momentum.
        se_ratio: Squeeze-and-excitation in the encoder's blocks (0: none).
        sk_ratio: Selective kernels in the encoder (0: none).
        fine_tune_after_block: The encoder is frozen up to this block group
            (0: the stem; 4: all of it; -1: nothing frozen; finetune mode only).
        zero_init_logits_layer: The supervised head starts at zero instead of
            N(0, 0.01).
    """

    def __init__(
        self,
        num_classes: int,
        *,
        resnet_depth: int = 18,
        width_multiplier: float = 1.0,
        cifar_stem: bool = True,
        proj_head_mode: str = "nonlinear",
        proj_out_dim: int = 128,
        num_proj_layers: int = 3,
        ft_proj_selector: int = 0,
        train_mode: str = "pretrain",
        lineareval_while_pretraining: bool = True,
        temperature: float = 0.5,
        hidden_norm: bool = True,
        weight_decay: float = 1e-6,
        lars_handles_decay: bool = True,
        sync_batch_norm: bool = False,
        batch_norm_decay: float = resnet.BATCH_NORM_MOMENTUM,
        se_ratio: float = 0.0,
        sk_ratio: float = 0.0,
        fine_tune_after_block: int = -1,
        zero_init_logits_layer: bool = False,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if train_mode not in TRAIN_MODES:
            raise ValueError(
                f"Invalid value for argument `train_mode`. Received: {train_mode!r}. Expected one of "
                f"{', '.join(TRAIN_MODES)}."
            )
        if train_mode == "pretrain" and fine_tune_after_block != -1:
            raise ValueError(
                "Invalid value for argument `fine_tune_after_block`. Received: "
                f"fine_tune_after_block={fine_tune_after_block!r} with train_mode='pretrain'. Expected -1: "
                "as the reference, pretraining freezes no layer (freezing is for train_mode='finetune')."
            )
        self.num_classes = num_classes
        self.train_mode = train_mode
        self.lineareval_while_pretraining = lineareval_while_pretraining
        self.temperature = temperature
        self.hidden_norm = hidden_norm
        self.weight_decay = weight_decay
        self.lars_handles_decay = lars_handles_decay
        self.encoder = resnet.resnet(
            resnet_depth,
            width_multiplier,
            cifar_stem=cifar_stem,
            sync_batch_norm=sync_batch_norm,
            batch_norm_decay=batch_norm_decay,
            se_ratio=se_ratio,
            sk_ratio=sk_ratio,
            fine_tune_after_block=fine_tune_after_block,
        )
        self.projection_head = ProjectionHead(
            proj_head_mode,
            proj_out_dim,
            num_proj_layers,
            ft_proj_selector,
            batch_norm_decay=batch_norm_decay,
            sync_batch_norm=sync_batch_norm,
            name="head_contrastive",
        )
        self.supervised_head = keras.layers.Dense(
            num_classes,
            kernel_initializer="zeros"
            if zero_init_logits_layer
            else keras.initializers.RandomNormal(stddev=HEAD_KERNEL_STDDEV),
            name="head_supervised",
        )
        self.total_loss_tracker = keras.metrics.Mean(name="loss")
        self.contrast_loss_tracker = keras.metrics.Mean(name="contrast_loss")
        self.contrast_accuracy = keras.metrics.Mean(name="contrast_acc")
        self.contrast_entropy = keras.metrics.Mean(name="contrast_entropy")
        # The reference's names for the probe's (or finetuning's) training loss and accuracy.
        self.probe_loss_tracker = keras.metrics.Mean(name="supervised_loss")
        self.supervised_accuracy = keras.metrics.Mean(name="supervised_acc")
        # The probe's evaluation, as the reference counts it: argmax, and top-5 with ties broken by index.
        self.top_1 = metrics_lib.LabelTopKAccuracy(k=1, name="label_top_1_accuracy")
        self.top_5 = metrics_lib.LabelTopKAccuracy(k=min(5, num_classes), name="label_top_5_accuracy")
        self.weight_decay_tracker = keras.metrics.Mean(name="weight_decay")

    # ------------------------------------------------------------------ forward

    @property
    def uses_probe(self) -> bool:
        return self.train_mode == "finetune" or self.lineareval_while_pretraining

    def call(self, features, training=False):
        """Returns `(projection, probe_logits)` for a batch of images (or stacked views)."""
        if training and self.train_mode == "pretrain":
            views = tf.split(features, num_or_size_splits=features.shape[-1] // 3, axis=-1)
            features = tf.concat(views, axis=0)
        else:
            features = features[..., :3]
        hidden = self.encoder(features, training=training)
        projection, probe_input = self.projection_head(hidden, training=training)
        if self.train_mode == "pretrain":
            probe_input = tf.stop_gradient(probe_input)
        return projection, self.supervised_head(probe_input)

    def build_for(self, image_size: int) -> None:
        """Creates every variable by running one image through the model."""
        self(tf.zeros([1, image_size, image_size, 3]), training=False)

    # ------------------------------------------------------------------ losses

    def weight_decay_loss(self) -> tf.Tensor:
        """L2 loss as the reference: the probe's kernel under LARS (which decays the rest), else every
        trainable variable but batch norm's."""
        if self.lars_handles_decay:
            variables = [v for v in self.supervised_head.trainable_variables if "bias" not in v.path]
        else:
            variables = self.trainable_variables
        kernels = [v for v in variables if "batch_normalization" not in v.path]
        if not kernels or not self.weight_decay:
            return tf.constant(0.0)
        return self.weight_decay * tf.add_n([tf.nn.l2_loss(v) for v in kernels])

    @property
    def training_metrics(self) -> list[keras.metrics.Metric]:
        """What `train_step` computes in this model's mode, which it logs, under the reference's names.

        `loss` (the reference's `train/total_loss`) and `weight_decay`;
        pretraining adds `contrast_loss`, `contrast_acc` and
        `contrast_entropy`; the probe (finetuning, or
        `lineareval_while_pretraining`) adds `supervised_loss` and
        `supervised_acc` (argmax accuracy).
        """
        computed = [self.total_loss_tracker]
        if self.train_mode == "pretrain":
            computed += [self.contrast_loss_tracker, self.contrast_accuracy, self.contrast_entropy]
        if self.uses_probe:
            computed += [self.probe_loss_tracker, self.supervised_accuracy]
        return [*computed, self.weight_decay_tracker]

    @property
    def metrics(self):
        """The metrics the steps update (reset at each epoch): `training_metrics` and the evaluation's."""
        evaluation = (self.probe_loss_tracker, self.top_1, self.top_5)
        used = {id(metric) for metric in (*self.training_metrics, *evaluation)}
        everything = (
            self.total_loss_tracker,
            self.contrast_loss_tracker,
            self.contrast_accuracy,
            self.contrast_entropy,
            self.probe_loss_tracker,
            self.supervised_accuracy,
            self.top_1,
            self.top_5,
            self.weight_decay_tracker,
        )
        # One fixed order (checkpoints list the metrics' variables by position).
        return [metric for metric in everything if id(metric) in used]

    def train_step(self, data):
        """One SimCLR step: NT-Xent (pretrain) and/or probe loss, weight decay, one update."""
        features, labels = data
        strategy = tf.distribute.get_strategy()
        with tf.GradientTape() as tape:
            projection, logits = self(features, training=True)
            loss = tf.constant(0.0)
            if self.train_mode == "pretrain":
                contrast_loss, logits_con, labels_con = objective.contrastive_loss(
                    projection, self.hidden_norm, self.temperature, strategy=strategy
                )
                loss += contrast_loss
                self.contrast_loss_tracker.update_state(contrast_loss)
                hits = tf.equal(tf.argmax(labels_con, axis=1), tf.argmax(logits_con, axis=1))
                self.contrast_accuracy.update_state(tf.cast(hits, tf.float32))
                probabilities = tf.nn.softmax(logits_con)
                self.contrast_entropy.update_state(
                    -tf.reduce_mean(tf.reduce_sum(probabilities * tf.math.log(probabilities + 1e-8), -1))
                )
                labels = tf.concat([labels, labels], axis=0)  # the probe sees both views
            if self.uses_probe:
                probe_loss = tf.reduce_mean(
                    keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
                )
                loss += probe_loss
                self.probe_loss_tracker.update_state(probe_loss)
                self.supervised_accuracy.update_state(metrics_lib.label_top_k_hits(labels, logits, k=1))
            decay = self.weight_decay_loss()
            loss += decay
            self.weight_decay_tracker.update_state(decay)
            self.total_loss_tracker.update_state(loss)
            # Gradients are summed over replicas: each contributes its share.
            scaled = self.optimizer.scale_loss(loss / strategy.num_replicas_in_sync)
        gradients = tape.gradient(scaled, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        return {metric.name: metric.result() for metric in self.training_metrics}

    def test_step(self, data):
        """Scores the probe on one batch of single views (loss, top-1, top-5)."""
        features, labels = data
        _, logits = self(features, training=False)
        probe_loss = tf.reduce_mean(
            keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        )
        self.probe_loss_tracker.update_state(probe_loss)
        self.top_1.update_state(labels, logits)
        self.top_5.update_state(labels, logits)
        return {m.name: m.result() for m in (self.probe_loss_tracker, self.top_1, self.top_5)}
