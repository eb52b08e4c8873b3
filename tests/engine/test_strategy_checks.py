"""A model and its data must fit the strategy: clear errors before the first step."""

import types

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import make_mlp

import tftrain
from tftrain import distribute
from tftrain.engine import strategy_checks


@pytest.fixture
def one_device_mirrored():
    return tf.distribute.MirroredStrategy(["/cpu:0"])


def test_a_model_built_outside_the_scope_is_refused(one_device_mirrored):
    model = make_mlp()
    with pytest.raises(
        ValueError, match=r"variable `.*kernel` was not created in the scope.*strategy\.scope"
    ):
        tftrain.Trainer(model, strategy=one_device_mirrored)


def test_an_optimizer_built_outside_the_scope_is_refused(one_device_mirrored):
    with one_device_mirrored.scope():
        model = make_mlp()
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)  # outside the scope
    model.compile(optimizer, "mse")
    with pytest.raises(ValueError, match="was not created in the scope"):
        strategy_checks.check_model_in_scope(model, one_device_mirrored)


def test_a_model_built_in_a_scope_trains_under_that_strategy(one_device_mirrored):
    with one_device_mirrored.scope():
        model = make_mlp()
    assert (
        tftrain.Trainer(model).strategy is one_device_mirrored
    )  # as model.fit takes model.distribute_strategy
    with pytest.raises(ValueError, match="created under a distribution strategy, but the Trainer got none"):
        tftrain.Trainer(model, strategy=tf.distribute.get_strategy())


def test_a_model_built_outside_the_scope_after_the_trainer_was_made_is_refused_at_fit(one_device_mirrored):
    model = keras.Sequential([keras.layers.Dense(1)])
    trainer = tftrain.Trainer(model, "sgd", "mse", strategy=one_device_mirrored)  # nothing to check yet
    model.build((None, 2))  # outside the scope, after the Trainer checked the model
    with pytest.raises(ValueError, match="was not created in the scope"):
        trainer.fit(np.zeros((4, 2), "float32"), np.zeros((4, 1), "float32"), batch_size=2, verbose=0)


def test_a_new_optimizer_compiled_outside_the_scope_after_the_trainer_was_made_is_refused_at_fit(
    one_device_mirrored,
):
    with one_device_mirrored.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    trainer = tftrain.Trainer(model, "sgd", "mse", strategy=one_device_mirrored)
    model.compile(keras.optimizers.Adam(1e-4), "mse")  # outside the scope: its variables are not mirrored
    with pytest.raises(ValueError, match="was not created in the scope"):
        trainer.fit(np.zeros((4, 2), "float32"), np.zeros((4, 1), "float32"), batch_size=2, verbose=0)


def test_an_unused_optimizer_made_outside_the_scope_is_recreated_inside(one_device_mirrored):
    with one_device_mirrored.scope():
        model = make_mlp()
    outside = keras.optimizers.SGD(0.05, momentum=0.5)
    trainer = tftrain.Trainer(model, outside, "mse", strategy=one_device_mirrored)
    assert trainer.optimizer is not outside
    assert trainer.optimizer.get_config() == outside.get_config()
    trainer.fit(np.zeros((8, 6), "float32"), np.zeros((8, 3), "float32"), batch_size=4, verbose=0)
    assert int(trainer.optimizer.iterations.numpy()) == 2
    strategy_checks.check_model_in_scope(model, one_device_mirrored)


def test_an_optimizer_holding_state_outside_the_scope_is_refused(one_device_mirrored):
    with one_device_mirrored.scope():
        model = make_mlp()
    used = keras.optimizers.SGD(0.1)
    used.build(model.trainable_variables)
    with pytest.raises(ValueError, match="already holds state"):
        tftrain.Trainer(model, used, "mse", strategy=one_device_mirrored)


def test_a_model_in_scope_and_an_unbuilt_model_pass(one_device_mirrored):
    with one_device_mirrored.scope():
        model = make_mlp()
        model.compile(keras.optimizers.SGD(0.1), "mse")
        model.optimizer.build(model.trainable_variables)
    strategy_checks.check_model_in_scope(model, one_device_mirrored)
    strategy_checks.check_model_in_scope(keras.Sequential([keras.layers.Dense(2)]), one_device_mirrored)


TWO_REPLICAS = types.SimpleNamespace(num_replicas_in_sync=2)


def test_an_uneven_static_global_batch_is_refused():
    dataset = tf.data.Dataset.from_tensor_slices(tf.zeros((30, 6))).batch(15, drop_remainder=True)
    with pytest.raises(ValueError, match=r"`train_data`.*batches of 15 examples for 2 replicas.*e\.g\. 14"):
        strategy_checks.check_global_batch(dataset.element_spec, TWO_REPLICAS, "train_data")


def test_even_or_unknown_batch_sizes_pass():
    even = tf.data.Dataset.from_tensor_slices(tf.zeros((32, 6))).batch(16, drop_remainder=True)
    unknown = tf.data.Dataset.from_tensor_slices(tf.zeros((30, 6))).batch(15)  # a short last batch
    for dataset in (even, unknown):
        strategy_checks.check_global_batch(dataset.element_spec, TWO_REPLICAS, "train_data")
    odd = tf.data.Dataset.from_tensor_slices(tf.zeros((30, 6))).batch(15, drop_remainder=True)
    strategy_checks.check_global_batch(odd.element_spec, types.SimpleNamespace(num_replicas_in_sync=1), "x")


def test_num_workers_of_local_strategies(one_device_mirrored):
    assert distribute.num_workers(tf.distribute.get_strategy()) == 1
    assert distribute.num_workers(one_device_mirrored) == 1


class FakeResolver:
    def __init__(self, cluster, task_type, task_id):
        self.task_type, self.task_id = task_type, task_id
        self._spec = tf.train.ClusterSpec(cluster)

    def cluster_spec(self):
        return self._spec


@pytest.mark.parametrize(
    "cluster, task, expected",
    [
        ({"worker": ["a:1", "b:1"]}, ("worker", 0), (True, "worker-0")),
        ({"worker": ["a:1", "b:1"]}, ("worker", 1), (False, "worker-1")),
        ({"chief": ["c:1"], "worker": ["a:1"]}, ("chief", 0), (True, "chief-0")),
        ({"chief": ["c:1"], "worker": ["a:1"]}, ("worker", 0), (False, "worker-0")),
        ({"worker": ["a:1"]}, ("worker", 0), (True, "chief")),
    ],
)
def test_worker_role(cluster, task, expected):
    strategy = types.SimpleNamespace(cluster_resolver=FakeResolver(cluster, *task))
    assert distribute.worker_role(strategy) == expected
    assert distribute.num_workers(strategy) == len(cluster.get("chief", [])) + len(cluster["worker"])


def test_worker_role_of_one_process(one_device_mirrored):
    assert distribute.worker_role(tf.distribute.get_strategy()) == (True, "chief")
    assert distribute.worker_role(one_device_mirrored) == (True, "chief")
