"""`Trainer.save` and `Trainer.export`: the trained model to a `.keras` file or a SavedModel.

A mixin of `tftrain.Trainer`, kept apart to keep each module small.
"""

from __future__ import annotations

from typing import Any


class ExportMixin:
    """`save` and `export` for `tftrain.Trainer` (which sets `self.model`)."""

    def save(self, filepath: str, *, overwrite: bool = True) -> None:
        """Saves the model with its optimizer state to a `.keras` file (as `model.save`).

        Load it with `keras.models.load_model(filepath)` (pass `custom_objects`
        for subclassed models, or register them with
        `keras.saving.register_keras_serializable`). Optimizers kept in a
        Trainer subclass's own attributes are not in the file: use
        `model_dir` checkpoints to keep a full training state.

        Args:
            filepath: The file to write; must end in `.keras`.
            overwrite: Replace an existing file.

        Raises:
            ValueError: `filepath` does not end in `.keras`.
        """
        if not str(filepath).endswith(".keras"):
            raise ValueError(
                f"Invalid value for argument `filepath`. Received: filepath={filepath!r}. Expected a "
                "path ending in `.keras`; for a SavedModel for serving, use `trainer.export(path)`."
            )
        self.model.save(filepath, overwrite=overwrite)

    def export(self, filepath: str, **kwargs: Any) -> None:
        """Exports the model as a TensorFlow SavedModel for serving (as `model.export`).

        The SavedModel holds the forward pass only (no optimizer); load it
        with `tf.saved_model.load(filepath)` and call its `serve` endpoint.

        Args:
            filepath: The directory to write.
            **kwargs: Passed to `keras.Model.export` (e.g. `input_signature`).

        Raises:
            ValueError: the model is not built yet (train it, or call it on a batch, first).
        """
        if not self.model.built:
            raise ValueError(
                "Cannot export a model that is not built: its input shapes are unknown. Expected a "
                "built model: train it first, call it once on a batch, or `model.build(input_shape)`."
            )
        self.model.export(filepath, **kwargs)
