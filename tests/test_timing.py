"""Tests for `tftrain.timing`: the report, the step timer, trace counting, the Keras callback."""

import gc
import types
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf
from helpers import TIMING_REPORT_KEYS, compile_args, make_mlp

import tftrain
from tftrain import timing

REPORT_KEYS = TIMING_REPORT_KEYS


class FakeClock:
    """A `time.perf_counter` stand-in that only moves when told to."""

    def __init__(self):
        self.now = 100.0

    def perf_counter(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=fake.perf_counter))
    return fake


def timed_call(timer, clock, seconds, steps, examples, traced=False):
    timer.begin_call()
    clock.now += seconds
    timer.end_call(steps=steps, examples=examples, traced=traced)


# ------------------------------------------------------------------- TimingReport


def test_report_to_dict_has_exactly_the_contract_keys():
    fields = dict(
        first_step_s=1.0,
        step_time_median_s=0.1,
        step_time_p90_s=0.2,
        examples_per_sec=50.0,
        steps=3,
        trace_count=1,
        checkpoint_saves=2,
        checkpoint_save_median_s=0.05,
        engine="xla+loop4",
        flops_per_step=2e6,
        flops_per_sec=2e7,
        peak_flops=1e9,
        utilization=0.02,
    )
    report = timing.TimingReport(**fields)
    assert set(report.to_dict()) == REPORT_KEYS
    assert report.to_dict() == fields
    assert set(timing.TimingReport().to_dict()) == REPORT_KEYS


def test_report_attributes_match_the_contract():
    report = timing.TimingReport()
    for key in REPORT_KEYS:
        assert hasattr(report, key)
    assert (report.steps, report.trace_count, report.first_step_s) == (0, 0, None)


def test_summary_formats_each_value():
    report = timing.TimingReport(
        first_step_s=1.5,
        step_time_median_s=0.0025,
        step_time_p90_s=4.2e-6,
        examples_per_sec=12345.6,
        steps=7,
        trace_count=2,
    )
    lines = report.summary().splitlines()
    assert len(lines) == 6
    rows = {line.split("  ")[0].strip(): line.rsplit("  ", 1)[1].strip() for line in lines}
    assert rows == {
        "steps": "7",
        "trace count": "2",
        "first step (trace+compile+run)": "1.50 s",
        "step time median": "2.50 ms",
        "step time p90": "4.2 us",
        "examples/sec": "12,345.6",
    }
    # A two-column table: every value starts in the same column.
    starts = {len(line) - len(line.rsplit("  ", 1)[1].lstrip()) for line in lines}
    assert len(starts) == 1


def test_summary_names_the_engine_first_where_known():
    lines = timing.TimingReport(steps=3, engine="graph+loop20 (auto)").summary().splitlines()
    assert lines[0].split("  ")[0] == "engine" and lines[0].rsplit("  ", 1)[1] == "graph+loop20 (auto)"
    assert len(lines) == 7
    assert "engine" not in timing.TimingReport().summary()


def test_with_flops_derives_the_rate_and_the_utilization():
    report = timing.TimingReport(steps=3, step_time_median_s=0.01).with_flops(2e6, 1e9)
    assert (report.flops_per_step, report.peak_flops) == (2e6, 1e9)
    assert report.flops_per_sec == pytest.approx(2e8)
    assert report.utilization == pytest.approx(0.2)
    assert report.steps == 3  # the rest of the report is kept
    # Without a steady step time, a count or a peak, what follows from it is None.
    assert timing.TimingReport().with_flops(2e6, 1e9).flops_per_sec is None
    assert timing.TimingReport(step_time_median_s=0.01).with_flops(None, 1e9).utilization is None
    assert timing.TimingReport(step_time_median_s=0.01).with_flops(2e6, None).utilization is None


def test_summary_shows_flops_only_where_counted():
    lines = timing.TimingReport(step_time_median_s=0.01).with_flops(2.5e6, 1e9).summary().splitlines()
    rows = {line.split("  ")[0].strip(): line.rsplit("  ", 1)[1].strip() for line in lines}
    assert rows["FLOPs per step"] == "2.5 MFLOP"
    assert rows["FLOP/s"] == "250 MFLOP/s"
    assert rows["utilisation"] == "25.0% of 1 GFLOP/s"
    assert list(rows).index("FLOP/s") == list(rows).index("examples/sec") + 2
    without_peak = timing.TimingReport(step_time_median_s=0.01).with_flops(2.5e6, None).summary()
    assert "FLOP/s" in without_peak and "utilisation" not in without_peak


def test_summary_of_an_empty_report_says_not_available():
    summary = timing.TimingReport().summary()
    assert summary.count("n/a") == 4
    assert "steps" in summary and "trace count" in summary


# ---------------------------------------------------------------------- StepTimer


def test_step_timer_first_call_and_steady_state(clock):
    timer = timing.StepTimer()
    timed_call(timer, clock, 2.0, steps=1, examples=8, traced=True)  # first: trace+compile+run
    timed_call(timer, clock, 0.1, steps=1, examples=8)  # 0.1 s/step
    timed_call(timer, clock, 0.6, steps=3, examples=24)  # 0.2 s/step
    timed_call(timer, clock, 5.0, steps=1, examples=8, traced=True)  # a retrace: not steady
    timed_call(timer, clock, 0.8, steps=2, examples=16)  # 0.4 s/step
    timed_call(timer, clock, 0.3, steps=1, examples=2)  # 0.3 s/step, partial batch
    report = timer.report(trace_count=2)
    assert report.first_step_s == pytest.approx(2.0)
    assert report.step_time_median_s == pytest.approx(0.25)
    assert report.step_time_p90_s == pytest.approx(float(np.percentile([0.1, 0.2, 0.3, 0.4], 90)))
    assert report.step_time_p90_s == pytest.approx(0.37)
    assert report.examples_per_sec == pytest.approx((8 + 24 + 16 + 2) / (0.1 + 0.6 + 0.8 + 0.3))
    assert report.steps == 9  # every step counts, traced ones included
    assert report.trace_count == 2


def test_step_timer_first_call_is_never_steady_even_without_a_trace(clock):
    timer = timing.StepTimer()
    timed_call(timer, clock, 1.0, steps=2, examples=4, traced=False)
    report = timer.report(trace_count=0)
    assert report.first_step_s == pytest.approx(1.0)
    assert report.step_time_median_s is None
    assert report.step_time_p90_s is None
    assert report.examples_per_sec is None
    assert report.steps == 2


def test_step_timer_unknown_examples_give_no_throughput(clock):
    timer = timing.StepTimer()
    timed_call(timer, clock, 1.0, steps=1, examples=4)
    timed_call(timer, clock, 0.5, steps=1, examples=4)
    timed_call(timer, clock, 0.5, steps=1, examples=None)
    report = timer.report(trace_count=1)
    assert report.examples_per_sec is None
    assert report.step_time_median_s == pytest.approx(0.5)


def test_step_timer_ignores_calls_that_ran_no_step(clock):
    timer = timing.StepTimer()
    timed_call(timer, clock, 9.0, steps=0, examples=0)  # e.g. the data had already ended
    timed_call(timer, clock, 1.0, steps=1, examples=4)
    timed_call(timer, clock, 0.5, steps=1, examples=4)
    timed_call(timer, clock, 7.0, steps=0, examples=0)
    report = timer.report(trace_count=1)
    assert report.first_step_s == pytest.approx(1.0)
    assert report.step_time_median_s == pytest.approx(0.5)
    assert report.examples_per_sec == pytest.approx(8.0)
    assert report.steps == 2


def test_step_timer_full_batch_size(clock):
    timer = timing.StepTimer()
    assert timer.full_batch_size is None  # no call yet
    timed_call(timer, clock, 0.1, steps=3, examples=48)
    assert timer.full_batch_size is None  # a k-step call alone does not show a step's batch
    timed_call(timer, clock, 0.1, steps=1, examples=6)
    assert timer.full_batch_size is None  # 6 is less than the 16 per step the first call averaged
    timed_call(timer, clock, 0.1, steps=1, examples=16)
    timed_call(timer, clock, 0.1, steps=2, examples=22)
    assert timer.full_batch_size == 16
    timer.reset()
    assert timer.full_batch_size is None


def test_step_timer_reset_forgets_everything(clock):
    timer = timing.StepTimer()
    timed_call(timer, clock, 1.0, steps=1, examples=4)
    timed_call(timer, clock, 0.5, steps=1, examples=4)
    timer.reset()
    assert timer.report(trace_count=0) == timing.TimingReport()
    timed_call(timer, clock, 3.0, steps=2, examples=4)
    assert timer.report(trace_count=0).first_step_s == pytest.approx(3.0)


def test_step_timer_files_checkpoint_saves_apart_from_step_times(clock):
    timer = timing.StepTimer()
    timed_call(timer, clock, 1.0, steps=1, examples=4)
    timed_call(timer, clock, 0.5, steps=1, examples=4)
    timer.record_checkpoint_save(0.2)
    timer.record_checkpoint_save(0.4)
    timer.record_checkpoint_save(0.3)
    report = timer.report(trace_count=1)
    assert report.checkpoint_saves == 3
    assert report.checkpoint_save_median_s == pytest.approx(0.3)
    assert report.step_time_median_s == pytest.approx(0.5)  # saves are not steps
    assert "checkpoint save median (3 saves)  300.00 ms" in report.summary()
    restored = timing.StepTimer()
    restored.load_state_dict(timer.state_dict())
    assert restored.report(trace_count=1) == report
    assert "checkpoint" not in timing.TimingReport().summary()


def test_step_timer_loads_a_state_saved_before_checkpoint_times_existed(clock):
    timer = timing.StepTimer()
    timed_call(timer, clock, 1.0, steps=1, examples=4)
    state = timer.state_dict()
    del state["checkpoint_save_times"]
    restored = timing.StepTimer()
    restored.load_state_dict(state)
    assert restored.report(trace_count=1).checkpoint_saves == 0


def test_trainer_timing_counts_its_checkpoint_saves(tmp_path):
    x = np.random.default_rng(0).random((64, 6), dtype=np.float32)
    y = np.zeros(64, dtype=np.int32)
    trainer = tftrain.Trainer(make_mlp(), **compile_args(), model_dir=str(tmp_path), checkpoint_every_steps=2)
    trainer.fit(x, y, batch_size=16, epochs=2, verbose=0)
    # Every 2 steps and at each epoch end (steps 2, 4 = epoch end, 6, 8 = epoch end).
    assert trainer.timing.checkpoint_saves == 4
    assert trainer.timing.checkpoint_save_median_s > 0
    no_dir = tftrain.Trainer(make_mlp(), **compile_args())
    no_dir.fit(x, y, batch_size=16, epochs=1, verbose=0)
    assert no_dir.timing.checkpoint_saves == 0
    assert no_dir.timing.checkpoint_save_median_s is None


def test_step_timer_uses_perf_counter(monkeypatch):
    """The real clock: a sleep in a steady call shows up in the step time."""
    timer = timing.StepTimer()
    timer.begin_call()
    timer.end_call(steps=1, examples=1, traced=True)
    timer.begin_call()
    import time

    time.sleep(0.02)
    timer.end_call(steps=2, examples=2, traced=False)
    report = timer.report(trace_count=1)
    assert 0.009 <= report.step_time_median_s < 1.0


# ------------------------------------------------------------------- TraceCounter


def double(batch):
    return batch["x"] * 2.0


def test_trace_counter_counts_traces_not_calls():
    counter = timing.TraceCounter("my_step")
    counted = counter.wrap(double)
    function = tf.function(counted)
    for _ in range(3):
        assert function({"x": tf.ones((2,))}).numpy().tolist() == [2.0, 2.0]
    assert counter.count == 1
    function({"x": tf.ones((3,))})
    assert counter.count == 2
    # Eager calls of the wrapped function never count.
    for _ in range(3):
        assert counted({"x": tf.ones((5,))}).numpy().tolist() == [2.0] * 5
    assert counter.count == 2


def test_trace_counter_keeps_each_traces_graph_weakly():
    counter = timing.TraceCounter()
    function = tf.function(counter.wrap(double))
    function({"x": tf.ones((2,))})
    function({"x": tf.ones((3,))})
    graphs = counter.traced_graphs()
    assert [graph.inputs[0].shape.as_list() for graph in graphs] == [[2], [3]]
    assert all(any(op.type == "Mul" for op in graph.get_operations()) for graph in graphs)
    del function, graphs
    gc.collect()
    assert counter.traced_graphs() == []  # the function's traces are gone: nothing kept alive


def test_trace_counter_wrap_keeps_the_name_and_arguments():
    counter = timing.TraceCounter()
    counted = counter.wrap(double)
    assert counted.__name__ == "double"
    assert counted.__qualname__ == double.__qualname__  # TensorFlow's retrace warning shows this

    def add(a, b):
        return a + b

    assert float(tf.function(counter.wrap(add))(tf.constant(1.0), tf.constant(2.0))) == 3.0
    assert counter.count == 1


def test_trace_counter_warns_once_at_the_threshold_naming_the_change():
    counter = timing.TraceCounter("my_step")
    function = tf.function(counter.wrap(double))  # no reduce_retracing: each shape traces
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning below the threshold
        for n in range(1, timing.RETRACE_WARNING_THRESHOLD):
            function({"x": tf.ones((n,))})
    assert counter.count == timing.RETRACE_WARNING_THRESHOLD - 1
    n = timing.RETRACE_WARNING_THRESHOLD
    with pytest.warns(UserWarning) as record:
        function({"x": tf.ones((n,))})
    messages = [str(w.message) for w in record if "my_step" in str(w.message)]
    assert len(messages) == 1
    assert f"traced {n} times" in messages[0]
    assert f"batch['x']: float32[{n - 1}] -> float32[{n}]" in messages[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        function({"x": tf.ones((n + 1,))})
        function({"x": tf.ones((n + 2,))})
    assert counter.count == n + 2


def test_trace_counter_names_a_dtype_change_with_the_argument_name():
    counter = timing.TraceCounter("step", argument_name="data")
    counter.count = timing.RETRACE_WARNING_THRESHOLD - 2
    function = tf.function(counter.wrap(lambda data: tf.identity(data[0])), autograph=False)
    function((tf.ones((2,), tf.float32), tf.ones((2,))))
    with pytest.warns(UserWarning, match=r"data\[0\]: float32\[2\] -> int32\[2\]"):
        function((tf.ones((2,), tf.int32), tf.ones((2,))))


def test_describe_arguments():
    described = timing.describe_arguments({"x": tf.zeros((2, 3)), "n": 5})
    assert described == {"['x']": "float32[2, 3]", "['n']": "python value 5"}
    assert timing.describe_arguments((tf.zeros((4,), tf.int32), "a")) == {
        "[0]": "int32[4]",
        "[1]": "python value 'a'",
    }
    assert timing.describe_arguments({"a": {"b": [np.zeros((1, 2), "float64")]}}) == {
        "['a']['b'][0]": "float64[1, 2]"
    }


def test_describe_arguments_shows_unknown_dimensions_while_tracing():
    seen = {}

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def step(x):
        seen.update(timing.describe_arguments(x))
        return x

    step(tf.zeros((2, 3)))
    assert seen == {"": "float32[None, 3]"}

    @tf.function(input_signature=[tf.TensorSpec(None, tf.float32)])
    def any_rank(x):
        seen.update(timing.describe_arguments(x))
        return x

    any_rank(tf.zeros(()))
    assert seen == {"": "float32[unknown rank]"}


def test_batch_size_of():
    assert timing.batch_size_of((tf.zeros((5, 2)), tf.zeros((5,)))) == 5
    assert timing.batch_size_of({"scalar": 3, "x": np.zeros((4, 1))}) == 4
    assert timing.batch_size_of(tf.constant(1.0)) is None


# -------------------------------------------------------------- Timing (keras fit)


def keras_data(num_examples, batch=8):
    rng = np.random.RandomState(0)
    x = rng.rand(num_examples, 6).astype("float32")
    y = (x[:, 0] * 3).astype("int32").clip(0, 2)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(batch)


def compiled_mlp(**compile_kwargs):
    """The tiny classifier with plain SGD and no metrics: the cheapest fit to trace."""
    model = make_mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=compile_args()["loss"], **compile_kwargs)
    return model


class TickingClock:
    """Each reading moves the clock by `tick`: every host call lasts `tick` seconds."""

    def __init__(self, tick):
        self.now = 0.0
        self.tick = tick

    def perf_counter(self):
        self.now += self.tick
        return self.now


@pytest.fixture
def ticking_clock(monkeypatch):
    fake = TickingClock(0.5)
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=fake.perf_counter))
    return fake


def test_timing_callback_report(ticking_clock, capsys):
    """Each host call lasts 0.5 s on the fake clock and runs 2 steps of 8 examples."""
    plain, timed = compiled_mlp(steps_per_execution=2), compiled_mlp(steps_per_execution=2)
    callback = tftrain.callbacks.Timing(verbose=True)
    assert callback.report is None
    plain.fit(keras_data(64), epochs=2, verbose=0, shuffle=False)
    timed.fit(keras_data(64), epochs=2, verbose=0, shuffle=False, callbacks=[callback])
    report = callback.report
    assert isinstance(report, timing.TimingReport)
    assert report.steps == 8 * 2  # training steps, not host calls
    assert report.trace_count >= 1
    assert report.first_step_s == pytest.approx(0.5)
    assert report.step_time_median_s == pytest.approx(0.25)  # per step
    assert report.step_time_p90_s == pytest.approx(0.25)
    assert report.examples_per_sec == pytest.approx(16 / 0.5)
    assert report.summary() in capsys.readouterr().out  # verbose=True prints it
    # The hooked train step trains exactly like the model's own.
    for a, b in zip(plain.get_weights(), timed.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)

    # A second fit with the same callback gives a fresh report (the train function is reused).
    timed.fit(keras_data(32), epochs=1, verbose=0, shuffle=False, callbacks=[callback])
    second = callback.report
    assert second is not report
    assert second.steps == 4
    assert second.trace_count <= report.trace_count
    assert second.first_step_s == pytest.approx(0.5)
    assert second.examples_per_sec == pytest.approx(16 / 0.5)

    # So does another Timing callback on the same model.
    other = tftrain.callbacks.Timing()
    timed.fit(keras_data(32), epochs=1, verbose=0, shuffle=False, callbacks=[other])
    assert other.report.steps == 4
    assert other.report.examples_per_sec == pytest.approx(16 / 0.5)
    assert callback.report is second


def test_timing_callback_counts_a_partial_last_execution():
    """7 batches with steps_per_execution=2: calls of 2, 2, 2, 1 steps."""
    model = compiled_mlp(steps_per_execution=2)
    callback = tftrain.callbacks.Timing()
    model.fit(keras_data(56), epochs=2, verbose=0, shuffle=False, callbacks=[callback])
    assert callback.report.steps == 7 * 2
    assert callback.report.examples_per_sec > 0


# ------------------------------------------------------------------- the engine that ran


class _BatchHooks(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        pass


@pytest.mark.parametrize(
    "trainer_kwargs, callbacks, engine",
    [
        (dict(use_tf_function=False), [], "eager"),
        (dict(steps_per_loop=1), [], "graph"),
        (dict(jit_compile=True, steps_per_loop=3), [], "xla+loop3"),
        (dict(), [_BatchHooks()], "graph (auto)"),  # "auto" runs one step per call for batch hooks
    ],
)
def test_trainer_timing_names_the_engine_that_ran(tiny_dataset, trainer_kwargs, callbacks, engine):
    trainer = tftrain.Trainer(make_mlp(), **compile_args(), **trainer_kwargs)
    trainer.fit(tiny_dataset, epochs=1, verbose=0, callbacks=callbacks)
    assert trainer.timing.engine == engine
    assert trainer.timing.to_dict()["engine"] == engine


def test_trainer_timing_names_the_k_that_auto_chose():
    rng = np.random.default_rng(0)
    x, y = rng.random((120, 6), "float32"), rng.integers(0, 3, 120).astype("int32")
    trainer = tftrain.Trainer(make_mlp(), **compile_args())
    trainer.fit(x, y, batch_size=2, epochs=1, verbose=0)  # 60 steps: the probes (3 + 3 x 8 untraced) fit
    chosen = trainer.chosen_steps_per_loop
    assert chosen is not None
    assert trainer.timing.engine == ("graph (auto)" if chosen == 1 else f"graph+loop{chosen} (auto)")


@pytest.mark.parametrize(
    "compile_kwargs, engine",
    [
        (dict(run_eagerly=True), "eager"),
        (dict(jit_compile=False), "graph"),
        (dict(jit_compile=True, steps_per_execution=4), "xla+loop4"),
    ],
)
def test_timing_callback_names_the_engine_fit_ran(tiny_dataset, compile_kwargs, engine):
    model = make_mlp()
    model.compile(**compile_args(), **compile_kwargs)
    callback = tftrain.callbacks.Timing()
    model.fit(tiny_dataset, epochs=1, verbose=0, callbacks=[callback])
    assert callback.report.engine == engine


def test_the_timing_callback_is_still_found_under_its_former_name():
    import tftrain.callbacks

    with pytest.warns(DeprecationWarning, match="import it from tftrain.callbacks"):
        from tftrain.timing import Timing
    assert Timing is tftrain.callbacks.Timing
    with pytest.raises(AttributeError, match="no attribute 'Missing'"):
        timing.Missing  # noqa: B018
