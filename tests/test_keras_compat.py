"""`tftrain._keras_compat`: every private Keras/TF API is checked at first use and fails loudly."""

import keras
import pytest
import tensorflow as tf

from tftrain import _keras_compat


def test_every_accessor_finds_its_api_in_the_installed_keras():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse", metrics=["mae"])
    assert issubclass(_keras_compat.functional_class(), keras.Model)
    assert _keras_compat.functional_init_arguments(("inputs", "outputs"), {})
    assert not _keras_compat.functional_init_arguments((), {"name": "m"})
    _keras_compat.symbolic_build(model, (tf.TensorSpec((None, 3)), tf.TensorSpec((None, 2))))
    assert model.optimizer.built
    assert _keras_compat.loss_tracker(model).name == "loss"
    assert model in _keras_compat.flatten_layers(model)
    _keras_compat.set_initial_epoch(model, 3)
    assert _keras_compat.initial_epoch(model) == 3
    _keras_compat.set_initial_epoch(model, None)
    assert _keras_compat.pythonify_logs({"a": tf.constant(1.0), "b": {"c": 2}}) == {"a": 1.0, "c": 2.0}
    assert _keras_compat.batches_read_for_spec() >= 1
    assert _keras_compat.trackable_object_graph().nodes is not None
    joined = _keras_compat.concat_batches([tf.ones((2, 1)), tf.zeros((1, 1))])
    assert joined.shape == (3, 1)


def test_an_uncompiled_model_has_no_loss_tracker():
    assert _keras_compat.loss_tracker(keras.Sequential([keras.layers.Dense(1)])) is None


def test_a_missing_module_attribute_names_both_versions(monkeypatch):
    import keras.src.utils.python_utils as python_utils

    _keras_compat._attribute.cache_clear()
    monkeypatch.delattr(python_utils, "pythonify_logs")
    try:
        with pytest.raises(_keras_compat.KerasInternalsError) as info:
            _keras_compat.pythonify_logs({})
    finally:
        _keras_compat._attribute.cache_clear()
    message = str(info.value)
    assert "keras.src.utils.python_utils.pythonify_logs" in message
    assert keras.__version__ in message and tf.__version__ in message
    assert _keras_compat.TESTED_KERAS[0] in message and "pip install" in message


def test_a_missing_model_method_is_loud_not_a_fallback(monkeypatch):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    monkeypatch.setattr(type(model), "_symbolic_build", None, raising=False)
    with pytest.raises(_keras_compat.KerasInternalsError, match="Sequential._symbolic_build"):
        _keras_compat.symbolic_build(model, tf.TensorSpec((None, 3)))


def test_replace_base_rewrites_the_hierarchy_below_the_new_base():
    class Old:
        pass

    class New(Old):
        pass

    class Middle(Old):
        pass

    class Leaf(Middle):
        pass

    _keras_compat.replace_base(Leaf, Old, New)
    assert Middle.__bases__ == (New,) and New.__bases__ == (Old,)
    assert issubclass(Leaf, New)
