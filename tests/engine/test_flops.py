"""Tests for `tftrain.engine.flops`: one training step's FLOPs in `trainer.timing` (`Trainer(count_flops=True)`)."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import TWO_CPU_MIRRORED_SETUP, run_result_script

import tftrain
from tftrain import timing
from tftrain.engine import flops
from tftrain.options import RunOptions

IN, HIDDEN, OUT, BATCH = 32, 64, 10, 16


def analytic_step_flops(batch: int) -> int:
    """FLOPs of one SGD step of the 32-64-10 MLP on `batch` examples, derived by hand (2 per multiply-add).

    Forward: two matmuls (2*b*in*out each) and two bias adds (b*out). Backward:
    the second layer's weight and input gradients (two matmuls of its size),
    the first layer's weight gradient (its input needs none), and each bias
    gradient (a sum over the batch: (b-1)*out additions). SGD: one multiply
    (learning rate x gradient) per weight; the subtraction is an assign op,
    which TensorFlow does not count. The loss's few scalar ops are left out.
    """
    matmul_1, matmul_2 = 2 * batch * IN * HIDDEN, 2 * batch * HIDDEN * OUT
    forward = matmul_1 + matmul_2 + batch * (HIDDEN + OUT)
    backward = matmul_1 + 2 * matmul_2 + (batch - 1) * (HIDDEN + OUT)
    weights = IN * HIDDEN + HIDDEN + HIDDEN * OUT + OUT
    return forward + backward + weights


def make_trainer(**kwargs) -> tftrain.Trainer:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((IN,)), keras.layers.Dense(HIDDEN, activation="relu"), keras.layers.Dense(OUT)]
    )
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return tftrain.Trainer(model, keras.optimizers.SGD(0.1), loss, **kwargs)


def data(examples: int = 64):
    rng = np.random.RandomState(0)
    return rng.rand(examples, IN).astype("float32"), rng.randint(0, OUT, examples)


def test_analytic_count_is_the_hand_derivation():
    # Matmuls: 2*16*(32*64 + 64*10) forward; backward, the first layer's once, the second's twice.
    matmuls = 86_016 + 65_536 + 2 * 20_480
    assert analytic_step_flops(16) == matmuls + 16 * 74 + 15 * 74 + 2762 == 197_568


# Engine -> (Trainer keyword arguments, how the data is given).
CASES = {
    "graph": (dict(steps_per_loop=1), "arrays"),
    "xla": (dict(jit_compile=True, steps_per_loop=1), "arrays"),
    "loop3": (dict(steps_per_loop=3), "arrays"),
    "xla_loop3": (dict(jit_compile=True, steps_per_loop=3), "arrays"),
    # 70 examples: a partial last batch, so the step traces with an unknown batch size.
    "graph_partial_batch": (dict(steps_per_loop=1), "arrays70"),
    "auto_dataset_partial_batch": (dict(), "dataset70"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_dense_step_count_matches_the_analytic_count(case):
    kwargs, inputs = CASES[case]
    trainer = make_trainer(count_flops=True, **kwargs)
    x, y = data(70 if inputs.endswith("70") else 64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "FLOPs are unknown" (a CPU has no peak: silent)
        warnings.filterwarnings("ignore", message=".*shuffle")
        if inputs.startswith("dataset"):
            trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH), epochs=2, verbose=0)
        else:
            trainer.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    report = trainer.timing
    assert report.flops_per_step == pytest.approx(analytic_step_flops(BATCH), rel=0.05)
    assert report.flops_per_sec == pytest.approx(report.flops_per_step / report.step_time_median_s)
    assert report.peak_flops is None and report.utilization is None  # CPU: no table entry
    assert report.trace_count == 1  # counting traced nothing


def test_mirrored_strategy_counts_every_replica():
    script = TWO_CPU_MIRRORED_SETUP + (
        "\nout = {}\n"
        "for name, kwargs in {'graph': dict(steps_per_loop=1), 'loop3': dict(steps_per_loop=3)}.items():\n"
        "    with strategy.scope():\n"
        "        keras.utils.set_random_seed(0)\n"
        f"        model = keras.Sequential([keras.Input(({IN},)), keras.layers.Dense({HIDDEN}, "
        f"activation='relu'), keras.layers.Dense({OUT})])\n"
        "    trainer = tftrain.Trainer(model, keras.optimizers.SGD(0.1), keras.losses."
        "SparseCategoricalCrossentropy(from_logits=True), strategy=strategy, count_flops=True, **kwargs)\n"
        f"    xx, yy = rng.rand(64, {IN}).astype('float32'), rng.randint(0, {OUT}, 64)\n"
        f"    trainer.fit(xx, yy, batch_size={BATCH}, epochs=2, verbose=0)\n"
        "    out[name] = trainer.timing.flops_per_step\n"
        "print('RESULT' + json.dumps(out))\n"
    )
    result = run_result_script(script, timeout=300)
    # The global batch of 16 is split: each of the 2 replicas runs a step on 8 examples.
    per_replica = analytic_step_flops(BATCH // 2)
    assert result["graph"] == pytest.approx(2 * per_replica, rel=0.05)
    assert result["loop3"] == result["graph"]


def test_off_by_default_it_does_nothing(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("FLOPs counted with count_flops=False")

    monkeypatch.setattr(flops, "report_with_flops", fail)
    trainer = make_trainer(steps_per_loop=1)
    assert trainer.run_options.count_flops is False and trainer.run_options.peak_flops is None
    trainer.fit(*data(), batch_size=BATCH, verbose=0)
    report = trainer.timing
    assert (report.flops_per_step, report.flops_per_sec, report.peak_flops, report.utilization) == (None,) * 4
    assert "FLOP" not in report.summary()


def test_counting_traces_nothing_again_and_changes_no_step():
    counted, plain = make_trainer(count_flops=True), make_trainer()
    for trainer in (counted, plain):
        trainer.fit(*data(), batch_size=BATCH, shuffle=False, verbose=0)
    for mine, theirs in zip(counted.model.get_weights(), plain.model.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)  # counting changed no step
    counter = counted.engines.runners["train"].trace_counter
    assert counted.timing.trace_count == plain.timing.trace_count
    assert counter.count == plain.engines.runners["train"].trace_counter.count
    traces = counter.count
    assert flops.step_flops(counter, BATCH).flops == counted.timing.flops_per_step
    assert counter.count == traces


def test_user_peak_gives_the_utilization():
    trainer = make_trainer(count_flops=True, peak_flops=1e9, steps_per_loop=1)
    trainer.fit(*data(), batch_size=BATCH, epochs=2, verbose=0)
    report = trainer.timing
    assert report.peak_flops == 1e9
    assert report.utilization == pytest.approx(report.flops_per_sec / 1e9)
    assert {"flops_per_step", "flops_per_sec", "peak_flops", "utilization"} <= set(report.to_dict())
    summary = report.summary()
    assert "FLOP/s" in summary and f"{report.utilization:.1%} of 1 GFLOP/s" in summary


@pytest.mark.parametrize("peak", [0, -1.0, "fast", float("nan"), float("inf"), True, [1e12]])
def test_invalid_peak_flops_is_refused_with_the_value_received(peak):
    with pytest.raises(ValueError, match="Invalid value for argument `peak_flops`") as info:
        RunOptions(count_flops=True, peak_flops=peak)
    assert f"peak_flops={peak!r}" in str(info.value)


def test_peak_flops_needs_count_flops_and_count_flops_a_bool():
    with pytest.raises(ValueError, match="peak_flops=1000000000000.0 with count_flops=False"):
        make_trainer(peak_flops=1e12)
    with pytest.raises(TypeError, match="count_flops='yes'"):
        RunOptions(count_flops="yes")
    assert RunOptions(count_flops=True, peak_flops=np.float32(2e12)).peak_flops == np.float32(2e12)


def test_the_eager_engine_is_refused_when_the_trainer_is_made():
    # It traces no graph to count: refused at once, not a warning after the whole fit.
    with pytest.raises(ValueError, match=r"count_flops=True with use_tf_function=False\. Expected use_tf_function=True"):
        make_trainer(count_flops=True, use_tf_function=False)


def test_an_unknown_batch_size_is_none_with_the_reason():
    # A dataset without drop_remainder, k=3 fixed: no one-step call shows a full batch.
    trainer = make_trainer(count_flops=True, steps_per_loop=3)
    x, y = data(70)
    with pytest.warns(UserWarning, match="unknown batch size.*drop_remainder=True"):
        trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH), shuffle=False, verbose=0)
    assert trainer.timing.flops_per_step is None


def test_a_while_loop_in_the_step_is_none_with_the_reason():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3, 2)), keras.layers.SimpleRNN(4), keras.layers.Dense(1)])
    trainer = tftrain.Trainer(model, "sgd", "mse", count_flops=True)
    with pytest.warns(UserWarning, match="while_loop"):
        trainer.fit(np.ones((8, 3, 2), "float32"), np.ones((8, 1), "float32"), batch_size=4, verbose=0)
    assert trainer.timing.flops_per_step is None


def test_no_trace_no_count():
    assert flops.step_flops(timing.TraceCounter(), BATCH) == flops.FlopCount(
        None, "the training step was never traced (no step ran)"
    )


def test_per_replica_batch_size_prefers_the_run_then_the_adapter():
    strategy = tf.distribute.get_strategy()
    timer = timing.StepTimer()
    adapter = type("Adapter", (), {"batch_size": 32})()
    assert flops.per_replica_batch_size(adapter, timer, strategy) == 32  # no call yet: the adapter's
    for steps, examples in [(1, 16), (1, 6), (2, 32)]:
        timer.begin_call()
        timer.end_call(steps=steps, examples=examples, traced=False)
    assert timer.full_batch_size == 16
    assert flops.per_replica_batch_size(adapter, timer, strategy) == 16
    assert flops.per_replica_batch_size(None, None, strategy) is None
