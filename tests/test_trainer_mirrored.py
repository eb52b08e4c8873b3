"""The Trainer under MirroredStrategy on 2 logical CPUs equals one device (fresh process).

Every engine that TF allows there (graph, k-step, eager; XLA is a clear error
on logical CPUs), a hand-written step that averages over the global batch, and
a CustomModel under `model.fit`.

Also resumes a distributed run from a mid-epoch checkpoint: the distributed
iterator cannot be saved, so the resumed run skips the batches already seen.
"""

import textwrap

from helpers import TWO_CPU_MIRRORED_SETUP, run_result_script

SCRIPT = TWO_CPU_MIRRORED_SETUP + textwrap.dedent(
    """

    def build():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(3)])
        model.compile(keras.optimizers.SGD(0.1),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model

    reference = build()
    tftrain.Trainer(reference).fit(dataset, epochs=2, verbose=0)

    def weight_diff(model):
        return max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), reference.get_weights()))

    results = {}
    for name, kwargs in {"graph": {}, "loop2": {"steps_per_loop": 2}}.items():
        with strategy.scope():
            model = build()
        trainer = tftrain.Trainer(model, strategy=strategy, **kwargs)
        trainer.fit(dataset, epochs=2, verbose=0)
        diff = max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), reference.get_weights()))
        results[name] = {"diff": diff, "steps": trainer.timing.steps,
                         "examples_per_sec": trainer.timing.examples_per_sec}

    with strategy.scope():
        model = build()
    trainer = tftrain.Trainer(model, strategy=strategy, use_tf_function=False)
    trainer.fit(dataset, epochs=2, verbose=0)
    results["eager"] = {"diff": weight_diff(model), "steps": trainer.timing.steps,
                        "examples_per_sec": trainer.timing.examples_per_sec}

    # The classic custom-loop style: a hand-written loss averaged over the global batch.
    class HandWritten(tftrain.Trainer):
        def train_step(self, batch):
            x, y = batch
            with tf.GradientTape() as tape:
                per_example = keras.losses.sparse_categorical_crossentropy(
                    y, self.model(x, training=True), from_logits=True)
                loss = tf.nn.compute_average_loss(per_example)
            grads = tape.gradient(loss, self.model.trainable_variables)
            self.optimizer.apply(grads, self.model.trainable_variables)
            return {"loss": loss}

    with strategy.scope():
        model = build()
    trainer = HandWritten(model, strategy=strategy)
    trainer.fit(dataset, epochs=2, verbose=0)
    results["hand_written"] = {"diff": weight_diff(model), "steps": trainer.timing.steps,
                               "examples_per_sec": trainer.timing.examples_per_sec}

    # Run eagerly, a step may log Python numbers (Keras's own train_step does, before Keras 3.14).
    class FloatLogs(HandWritten):
        def train_step(self, batch):
            return {name: float(value) for name, value in super().train_step(batch).items()}

    with strategy.scope():
        model = build()
    trainer = FloatLogs(model, strategy=strategy, use_tf_function=False)
    trainer.fit(dataset, epochs=2, verbose=0)
    results["eager_float_logs"] = {"diff": weight_diff(model), "steps": trainer.timing.steps,
                                   "examples_per_sec": trainer.timing.examples_per_sec}

    # A CustomModel's own train_step under keras fit, with the same strategy.
    with strategy.scope():
        keras.utils.set_random_seed(1)
        inputs = keras.Input((6,))
        hidden = keras.layers.Dense(8, activation="relu")(inputs)
        model = tftrain.CustomModel(inputs, keras.layers.Dense(3)(hidden))
        model.compile(keras.optimizers.SGD(0.1),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    timing_callback = tftrain.callbacks.Timing()  # its in-graph step counter, under a strategy
    model.fit(dataset, epochs=2, verbose=0, shuffle=False, callbacks=[timing_callback])
    results["custom_model_fit"] = {"diff": weight_diff(model),
                                   "steps": timing_callback.report.steps,
                                   "examples_per_sec": timing_callback.report.examples_per_sec}

    errors = {}
    with strategy.scope():
        model = build()
    try:
        tftrain.Trainer(model, strategy=strategy, jit_compile=True).fit(dataset, verbose=0)
    except ValueError as error:
        errors["xla"] = str(error)

    uneven = tf.data.Dataset.from_tensor_slices((x, y)).batch(15, drop_remainder=True)
    try:
        tftrain.Trainer(model, strategy=strategy).fit(uneven, verbose=0)
    except ValueError as error:
        errors["batch"] = str(error)
    try:
        tftrain.Trainer(build(), strategy=strategy)  # built outside the scope
    except ValueError as error:
        errors["scope"] = str(error)

    class Crash(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == 6:
                raise RuntimeError("crash")

    model_dir = tempfile.mkdtemp()
    with strategy.scope():
        model = build()
    trainer = tftrain.Trainer(model, strategy=strategy, model_dir=model_dir, checkpoint_every_steps=3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trainer.fit(dataset, epochs=2, verbose=0, callbacks=[Crash()])
        except RuntimeError:
            pass
    with strategy.scope():
        model = build()
        model.layers[0].kernel.assign(tf.zeros_like(model.layers[0].kernel))  # restored below
    trainer = tftrain.Trainer(model, strategy=strategy, model_dir=model_dir, checkpoint_every_steps=3)
    trainer.fit(dataset, epochs=2, verbose=0)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(model.get_weights(), reference.get_weights()))
    results["resumed"] = {"diff": diff, "steps": int(model.optimizer.iterations.numpy()),
                          "examples_per_sec": 1.0,
                          "warned": any("skip the batches" in str(w.message) for w in caught)}
    # predict and evaluate under the model's strategy (none passed), as model.predict/evaluate under it.
    with strategy.scope():
        model = build()
    expected_predictions = model.predict(x, batch_size=24, verbose=0)
    expected_logs = model.evaluate(x, y, batch_size=24, verbose=0, return_dict=True)
    inference = {}
    for name, kwargs in {"graph": {}, "loop2": {"steps_per_loop": 2}, "eager": {"use_tf_function": False}}.items():
        trainer = tftrain.Trainer(model, **kwargs)
        logs = trainer.evaluate(x, y, batch_size=24, verbose=0, return_dict=True)
        inference[name] = {
            "strategy": trainer.strategy is strategy,
            "predict_diff": float(np.abs(trainer.predict(x, batch_size=24, verbose=0) - expected_predictions).max()),
            "evaluate_diff": max(abs(logs[key] - expected_logs[key]) for key in expected_logs),
        }

    # An optimizer instance made outside the scope trains as under model.fit.
    outside = {}
    for side in ("fit", "trainer"):
        with strategy.scope():
            model = build()
        optimizer = keras.optimizers.SGD(0.1)  # outside the scope
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        if side == "fit":
            model.compile(optimizer, loss)
            model.fit(dataset, epochs=2, verbose=0, shuffle=False)
        else:
            tftrain.Trainer(model, optimizer, loss, strategy=strategy).fit(dataset, epochs=2, verbose=0)
        outside[side] = weight_diff(model)
    print("RESULT" + json.dumps({"results": results, "errors": errors, "inference": inference, "outside": outside}))
    """
)


def test_mirrored_two_replicas_match_one_device_and_resume():
    output = run_result_script(SCRIPT, timeout=300)
    results, errors = output["results"], output["errors"]
    assert set(results) == {
        "graph",
        "loop2",
        "eager",
        "hand_written",
        "eager_float_logs",
        "custom_model_fit",
        "resumed",
    }
    for name, result in results.items():
        assert result["diff"] < 1e-5, name
        assert result["steps"] == 8, name
        assert result["examples_per_sec"] > 0, name
    assert results["resumed"]["warned"]
    assert "jit_compile=True with a strategy over 2 CPU devices" in errors["xla"]
    assert "batches of 15 examples for 2 replicas" in errors["batch"]
    assert "was not created in the scope" in errors["scope"]
    for name, result in output["inference"].items():
        assert result["strategy"], name
        assert result["predict_diff"] < 1e-6, name
        assert result["evaluate_diff"] < 1e-6, name
    assert output["outside"]["fit"] < 1e-5 and output["outside"]["trainer"] < 1e-5
