"""`tftrain.compat.tf_internals`: every private TensorFlow API is checked at first use and fails loudly."""

import inspect

import keras
import pytest
import tensorflow as tf

from tftrain.compat import private_api, tf_internals
from tftrain.errors import KerasInternalsError


def test_the_checkpoint_and_dataset_accessors_find_tensorflow_s_internals():
    assert tf_internals.trackable_object_graph().nodes is not None
    ops = {node.op for node in tf_internals.dataset_graph_nodes(tf.data.Dataset.range(4).map(lambda x: x + 1))}
    assert {"RangeDataset", "MapDataset", "AddV2"} <= ops


def test_distributed_dataset_accessors_find_tensorflow_s_internals():
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    dataset = tf.data.Dataset.range(4).batch(2)
    distributed = strategy.experimental_distribute_dataset(dataset)
    from_function = strategy.distribute_datasets_from_function(lambda _: dataset)
    assert tf_internals.distributed_dataset_strategy(distributed) is strategy
    assert tf_internals.distributed_dataset_strategy(from_function) is strategy
    assert tf_internals.made_from_function(from_function)
    assert not tf_internals.made_from_function(distributed)
    spec = tf.TensorSpec((None, 3))
    assert tf_internals.per_replica_spec(spec) is spec
    from tensorflow.python.distribute.values import PerReplicaSpec

    assert tf_internals.per_replica_spec(PerReplicaSpec(spec, spec)) == spec
    with pytest.raises(KerasInternalsError, match="_strategy"):
        tf_internals.distributed_dataset_strategy(object())


def test_a_missing_tensorflow_attribute_names_both_versions(monkeypatch):
    import tensorflow.python.distribute.values as values

    private_api.attribute.cache_clear()
    monkeypatch.delattr(values, "PerReplicaSpec")
    try:
        with pytest.raises(KerasInternalsError) as info:
            tf_internals.per_replica_spec(tf.TensorSpec((None, 3)))
    finally:
        private_api.attribute.cache_clear()
    message = str(info.value)
    assert "tensorflow.python.distribute.values.PerReplicaSpec" in message and "distributed datasets" in message
    assert keras.__version__ in message and tf.__version__ in message
    assert private_api.TESTED_TENSORFLOW[0] in message


def test_tf_internals_reach_no_private_keras_module():
    source = inspect.getsource(tf_internals)
    assert "tensorflow.python" in source
    assert "keras.src" not in source and "import keras" not in source
