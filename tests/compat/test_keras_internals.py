"""`tftrain.compat.keras_internals`: every private Keras API is checked at first use and fails loudly."""

import inspect

import keras
import pytest
import tensorflow as tf

from tftrain.compat import keras_internals


def test_every_accessor_finds_its_api_in_the_installed_keras():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse", metrics=["mae"])
    assert issubclass(keras_internals.functional_class(), keras.Model)
    assert keras_internals.functional_init_arguments(("inputs", "outputs"), {})
    assert not keras_internals.functional_init_arguments((), {"name": "m"})
    keras_internals.symbolic_build(model, (tf.TensorSpec((None, 3)), tf.TensorSpec((None, 2))))
    assert model.optimizer.built
    assert keras_internals.loss_tracker(model).name == "loss"
    assert model in keras_internals.flatten_layers(model)
    assert keras_internals.resolve_auto_jit_compile(model) is bool(model._resolve_auto_jit_compile())
    keras_internals.set_initial_epoch(model, 3)
    assert keras_internals.initial_epoch(model) == 3
    keras_internals.set_initial_epoch(model, None)
    assert keras_internals.pythonify_logs({"a": tf.constant(1.0), "b": {"c": 2}}) == {"a": 1.0, "c": 2.0}
    assert keras_internals.batches_read_for_spec() >= 1
    joined = keras_internals.concat_batches([tf.ones((2, 1)), tf.zeros((1, 1))])
    assert joined.shape == (3, 1)


def test_an_uncompiled_model_has_no_loss_tracker():
    assert keras_internals.loss_tracker(keras.Sequential([keras.layers.Dense(1)])) is None


def test_a_missing_module_attribute_names_both_versions(monkeypatch):
    import keras.src.utils.python_utils as python_utils

    keras_internals._attribute.cache_clear()
    monkeypatch.delattr(python_utils, "pythonify_logs")
    try:
        with pytest.raises(keras_internals.KerasInternalsError) as info:
            keras_internals.pythonify_logs({})
    finally:
        keras_internals._attribute.cache_clear()
    message = str(info.value)
    assert "keras.src.utils.python_utils.pythonify_logs" in message
    assert keras.__version__ in message and tf.__version__ in message
    assert keras_internals.TESTED_KERAS[0] in message and "pip install" in message


def test_a_missing_model_method_is_loud_not_a_fallback(monkeypatch):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    monkeypatch.setattr(type(model), "_symbolic_build", None, raising=False)
    with pytest.raises(keras_internals.KerasInternalsError, match="Sequential._symbolic_build"):
        keras_internals.symbolic_build(model, tf.TensorSpec((None, 3)))


def test_replace_base_rewrites_the_hierarchy_below_the_new_base():
    class Old:
        pass

    class New(Old):
        pass

    class Middle(Old):
        pass

    class Leaf(Middle):
        pass

    keras_internals.replace_base(Leaf, Old, New)
    assert Middle.__bases__ == (New,) and New.__bases__ == (Old,)
    assert issubclass(Leaf, New)


def test_keras_internals_reach_no_private_tensorflow_module():
    source = inspect.getsource(keras_internals)
    assert "keras.src." in source
    assert "tensorflow.python" not in source
