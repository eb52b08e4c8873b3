"""`CustomModel`: a `keras.Model` whose training step is made of small overridable pieces.

The default `train_step`/`test_step` do what Keras 3's do (unpack, forward,
`compute_loss`, gradients, `optimizer.apply`, metrics), so a `CustomModel`
trains the same under `model.fit` and under `tftrain.Trainer.fit`. Research
code overrides only the piece it changes: `compute_loss` for a new objective,
`apply_gradients` for a new update, or `train_step` for a whole new algorithm.
"""

from __future__ import annotations

import warnings
from typing import Any

import keras
import tensorflow as tf

from tftrain.compat import keras_internals

Functional = keras_internals.functional_class()


def _unscale_loss_for_distribution(loss: tf.Tensor) -> tf.Tensor:
    """Undoes Keras's `1 / num_replicas` loss scaling for reporting.

    Keras's `compute_loss` divides by the number of replicas so that summed
    gradients average over the global batch; the logged loss should not be.
    """
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if replicas > 1:
        loss = loss * tf.cast(replicas, loss.dtype)
    return loss


class CustomModel(keras.Model):
    """A `keras.Model` with a train step split into overridable pieces.

    Subclass it like `keras.Model` (functional or subclassed). The pieces,
    in the order `train_step` calls them:

    1. `unpack_batch(data)` -> `(x, y, sample_weight)`
    2. `forward(x, training=True)` -> `y_pred`
    3. `compute_loss(x, y, y_pred, sample_weight, training)` (Keras's own)
    4. `compute_gradients(tape, loss)` -> gradients of the trainable weights
    5. `apply_gradients(gradients)` -> the optimizer update
    6. `compute_metrics(x, y, y_pred, sample_weight)` (Keras's own) -> logs

    Example:
        ```python
        class ClippedModel(tftrain.CustomModel):
            def compute_gradients(self, tape, loss):
                grads = super().compute_gradients(tape, loss)
                return [tf.clip_by_norm(g, 1.0) for g in grads]
        ```
    """

    # Called with `(inputs, outputs)`, `keras.Model.__init__` rewrites the
    # `__bases__` of every class between the model and `keras.Model`, which
    # would turn CustomModel itself functional for the rest of the process
    # (breaking every subclassed CustomModel). Instead, the user's class gets
    # the functional twin `FunctionalCustomModel` as its base.
    def __new__(cls, *args, **kwargs):
        if cls is CustomModel and keras_internals.functional_init_arguments(args, kwargs):
            cls = FunctionalCustomModel
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, *args, **kwargs):
        if keras_internals.functional_init_arguments(args, kwargs) and not isinstance(self, Functional):
            keras_internals.replace_base(type(self), CustomModel, FunctionalCustomModel)
            # The next class after CustomModel in the MRO is now Functional.
        super().__init__(*args, **kwargs)

    def unpack_batch(self, data: Any) -> tuple[Any, Any, Any]:
        """Splits a batch into `(x, y, sample_weight)`; missing parts are None."""
        return keras.utils.unpack_x_y_sample_weight(data)

    def forward(self, x: Any, training: bool) -> Any:
        """Runs the model: `self(x, training=training)`."""
        return self(x, training=training)

    def track_loss(self, loss: tf.Tensor, x: Any) -> None:
        """Updates the `loss` metric that Keras's logs report, weighted by batch size."""
        tracker = keras_internals.loss_tracker(self)  # created by `compile`
        if tracker is None:
            return
        batch_size = tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0]
        tracker.update_state(_unscale_loss_for_distribution(loss), sample_weight=batch_size)

    def compute_gradients(self, tape: tf.GradientTape, loss: tf.Tensor) -> list[Any]:
        """Gradients of `loss` for `self.trainable_weights`, with loss scaling applied.

        Args:
            tape: The tape that recorded the forward pass and loss.
            loss: The loss as returned by `compute_loss`, already scaled by
                `optimizer.scale_loss` (for mixed precision) inside the tape.

        Returns:
            A list of gradients aligned with `self.trainable_weights`.
        """
        return tape.gradient(loss, self.trainable_weights)

    def apply_gradients(self, gradients: list[Any]) -> None:
        """Applies gradients with `self.optimizer` (unscaling, clipping, EMA included)."""
        optimizer = getattr(self, "optimizer", None)  # absent until `compile`
        if optimizer is None:
            raise ValueError(
                f"{type(self).__name__} has no optimizer, so its default train step cannot "
                "update the weights. Call `model.compile(optimizer=..., loss=...)` or pass "
                "`optimizer=` to `tftrain.Trainer`."
            )
        optimizer.apply(gradients, self.trainable_weights)

    def train_step(self, data: Any) -> dict[str, Any]:
        """One training step on one batch; returns the logs (metric results)."""
        x, y, sample_weight = self.unpack_batch(data)
        with tf.GradientTape() as tape:
            y_pred = self.forward(x, training=True)
            loss = self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
            self.track_loss(loss, x)
            optimizer = getattr(self, "optimizer", None)
            if optimizer is not None:
                loss = optimizer.scale_loss(loss)
        if self.trainable_weights:
            self.apply_gradients(self.compute_gradients(tape, loss))
        else:
            warnings.warn(f"{type(self).__name__} has no trainable weights.", stacklevel=2)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def test_step(self, data: Any) -> dict[str, Any]:
        """One evaluation step on one batch; returns the logs (metric results)."""
        x, y, sample_weight = self.unpack_batch(data)
        y_pred = self.forward(x, training=False)
        loss = self.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False)
        self.track_loss(loss, x)
        return self.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


class FunctionalCustomModel(CustomModel, Functional):
    """CustomModel built from `(inputs, outputs)`: CustomModel's steps, Functional's graph."""
