"""A `tf.distribute.DistributedDataset` given to `fit`/`evaluate`/`predict`, as `model.fit` takes it.

In this process: Keras's own case (a one-replica `MirroredStrategy` dataset for
a model built outside any scope). In a fresh process with 2 logical CPUs:
both kinds of distributed dataset under `MirroredStrategy`, every engine,
against Keras's `fit`/`evaluate`/`predict` on the same data; a dataset of
another strategy of as many replicas runs, one of more replicas than the
Trainer's is an error; a resumed run skips the batches already read
(a distributed iterator cannot be checkpointed).
"""

import textwrap

import keras
import numpy as np
import tensorflow as tf
from helpers import TWO_CPU_MIRRORED_SETUP, run_result_script

import tftrain


def _model():
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)]
    )
    model.compile(keras.optimizers.SGD(0.1), "mse", metrics=["mae"])
    return model


def test_a_one_replica_distributed_dataset_trains_as_under_model_fit():
    rng = np.random.RandomState(0)
    x, y = rng.rand(16, 3).astype("float32"), rng.rand(16, 1).astype("float32")
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])  # not the models' (they are built outside it)

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    # Keras 3.7 refuses a `distribute_datasets_from_function` dataset: Keras reads the other kind.
    keras_data = strategy.experimental_distribute_dataset(dataset)
    reference = _model()
    keras_history = reference.fit(keras_data, epochs=2, verbose=0)
    for trainer_data in (
        strategy.experimental_distribute_dataset(dataset),
        strategy.distribute_datasets_from_function(lambda _: dataset),
    ):
        model = _model()
        trainer = tftrain.Trainer(model, steps_per_loop=2)
        history = trainer.fit(trainer_data, epochs=2, verbose=0)
        for a, b in zip(reference.get_weights(), model.get_weights(), strict=True):
            np.testing.assert_allclose(a, b, atol=1e-6)
        np.testing.assert_allclose(history.history["loss"], keras_history.history["loss"], rtol=1e-6)
        np.testing.assert_allclose(
            trainer.evaluate(trainer_data, verbose=0), reference.evaluate(keras_data, verbose=0), rtol=1e-6
        )
        np.testing.assert_allclose(
            trainer.predict(trainer_data, verbose=0), reference.predict(keras_data, verbose=0), rtol=1e-6
        )


SCRIPT = TWO_CPU_MIRRORED_SETUP + textwrap.dedent(
    """

    def distributed(kind):
        if kind == "dataset":
            return strategy.experimental_distribute_dataset(dataset)
        # Each replica reads its own batches of 8 from one pipeline: the same global batches of 16.
        return strategy.distribute_datasets_from_function(
            lambda context: tf.data.Dataset.from_tensor_slices((x, y)).batch(context.get_per_replica_batch_size(16)))

    def build(scope=True):
        keras.utils.set_random_seed(1)
        with (strategy.scope() if scope else tf.distribute.get_strategy().scope()):
            model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                      keras.layers.Dense(3)])
            model.compile(keras.optimizers.SGD(0.1),
                          keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return model

    def weight_diff(a, b):
        return max(float(np.abs(p - q).max()) for p, q in zip(a.get_weights(), b.get_weights()))

    class Params(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.steps = self.params["steps"]

    results, keras_side = {}, {}
    for kind in ("dataset", "function"):
        reference, keras_params = build(), Params()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Keras counts a function's batches per pipeline, and runs out
            history = reference.fit(distributed(kind), epochs=2, validation_data=distributed(kind), verbose=0,
                                    callbacks=[keras_params])
            evaluated = reference.evaluate(distributed(kind), verbose=0)
            predicted = reference.predict(distributed(kind), verbose=0)
        keras_side[kind] = reference
        engines = {"graph": {"steps_per_loop": 1}, "loop2": {"steps_per_loop": 2}, "auto": {},
                   "eager": {"use_tf_function": False}}
        for name, kwargs in engines.items():
            model, params = build(), Params()
            trainer = tftrain.Trainer(model, strategy=strategy, **kwargs)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                got = trainer.fit(distributed(kind), epochs=2, validation_data=distributed(kind), verbose=0,
                                  callbacks=[params])
            results[f"{kind}-{name}"] = {
                "diff": weight_diff(model, reference),
                "history": max(abs(a - b) for key in history.history
                               for a, b in zip(got.history[key], history.history[key])),
                "history_keys": sorted(got.history) == sorted(history.history),
                "steps": trainer.timing.steps,
                "params_steps": [params.steps, keras_params.steps],
                "ran_out_warned": any("ran out of data" in str(w.message) for w in caught),
                "evaluate": float(np.abs(np.subtract(trainer.evaluate(distributed(kind), verbose=0),
                                                     evaluated)).max()),
                "predict": float(np.abs(trainer.predict(distributed(kind), verbose=0) - predicted).max()),
            }

    errors = {}
    try:  # a model of no strategy: the Trainer's is the default one, of one replica
        tftrain.Trainer(build(scope=False)).fit(distributed("dataset"), verbose=0)
    except ValueError as error:
        errors["default"] = str(error)
    # Another strategy of as many replicas: run under the Trainer's, as under Keras's `fit`.
    other = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    other_model = build()
    tftrain.Trainer(other_model, strategy=strategy).fit(
        other.experimental_distribute_dataset(dataset), epochs=2, verbose=0)
    other_diff = weight_diff(other_model, keras_side["dataset"])

    # Resume: the distributed iterator is not saved; the resumed run skips the batches already read.
    class Crash(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == 6:
                raise RuntimeError("crash")

    model_dir = tempfile.mkdtemp()
    trainer = tftrain.Trainer(build(), strategy=strategy, model_dir=model_dir, checkpoint_every_steps=3,
                              steps_per_loop=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trainer.fit(distributed("dataset"), epochs=2, verbose=0, callbacks=[Crash()])
        except RuntimeError:
            pass
    model = build()
    model.layers[0].kernel.assign(tf.zeros_like(model.layers[0].kernel))  # restored below
    trainer = tftrain.Trainer(model, strategy=strategy, model_dir=model_dir, checkpoint_every_steps=3)
    trainer.fit(distributed("dataset"), epochs=2, verbose=0)
    resumed = {"diff": weight_diff(model, keras_side["dataset"]), "steps": int(model.optimizer.iterations.numpy()),
               "warned": any("skip the batches" in str(w.message) for w in caught)}
    print("RESULT" + json.dumps({"results": results, "errors": errors, "resumed": resumed,
                                 "other_diff": other_diff}))
    """
)


def test_distributed_datasets_under_two_replicas_match_model_fit_and_resume():
    output = run_result_script(SCRIPT, timeout=300)
    assert len(output["results"]) == 8
    for name, result in output["results"].items():
        assert result["diff"] < 1e-6, name
        assert result["history"] < 1e-5 and result["history_keys"], name
        assert result["steps"] == 8, name  # 4 global batches per epoch, for both kinds
        # Keras counts a function dataset's batches of one pipeline (8) as the steps, and warns.
        assert result["params_steps"] == ([4, 4] if name.startswith("dataset") else [8, 8]), name
        assert result["ran_out_warned"] == name.startswith("function"), name
        assert result["evaluate"] < 1e-6 and result["predict"] < 1e-6, name
    errors = output["errors"]
    assert "distributed by a MirroredStrategy of 2 replicas" in errors["default"]
    assert "under the default strategy of one replica" in errors["default"]
    assert output["other_diff"] < 1e-6
    resumed = output["resumed"]
    assert resumed["diff"] < 1e-6 and resumed["steps"] == 8 and resumed["warned"], resumed
