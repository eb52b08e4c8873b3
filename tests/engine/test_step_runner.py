"""Tests for `tftrain.engine.step_runner`: engine options and the step loops of every engine."""

import dataclasses
import gc
import weakref

import numpy as np
import pytest
import tensorflow as tf

from tftrain import options, timing
from tftrain.engine import step_runner

# Engines as `EngineOptions` keyword arguments.
LOOP_ENGINES = {
    "eager": dict(use_tf_function=False),
    "graph": dict(),
    "xla": dict(jit_compile=True),
    "graph_loop3": dict(steps_per_loop=3),
    "eager_loop3": dict(use_tf_function=False, steps_per_loop=3),
    "xla_loop3": dict(jit_compile=True, steps_per_loop=3),
}

# 20 values in batches of 3: 7 batches, the last one holds 2 values (18, 19).
NUM_VALUES, BATCH = 20, 3
BATCHES = [np.arange(NUM_VALUES, dtype="float32")[i : i + BATCH] for i in range(0, NUM_VALUES, BATCH)]


def make_dataset():
    return tf.data.Dataset.range(NUM_VALUES).map(lambda v: tf.cast(v, tf.float32)).batch(BATCH)


class Counter:
    """A stateful step: sums every value it sees and counts its steps."""

    def __init__(self):
        self.total = tf.Variable(0.0)
        self.steps = tf.Variable(0, dtype=tf.int64)

    def __call__(self, batch):
        self.total.assign_add(tf.reduce_sum(batch))
        self.steps.assign_add(1)
        return {"total": self.total.read_value(), "first": batch[0], "size": tf.shape(batch)[0]}


@pytest.fixture(params=sorted(LOOP_ENGINES), ids=sorted(LOOP_ENGINES))
def loop_options(request):
    return options.EngineOptions(**LOOP_ENGINES[request.param])


# ------------------------------------------------------------------ EngineOptions


@pytest.mark.parametrize("steps", [0, -1, 1.5, True, "3", None, "AUTO"])
def test_steps_per_loop_must_be_a_positive_int_or_auto(steps):
    with pytest.raises(ValueError, match="steps_per_loop") as info:
        options.EngineOptions(steps_per_loop=steps)
    assert repr(steps) in str(info.value)
    assert '"auto"' in str(info.value)


def test_auto_steps_per_loop_runs_the_graph_loop_and_is_one_step_eagerly():
    auto = options.EngineOptions(steps_per_loop="auto")
    assert auto.auto and auto.in_graph_loop and auto.name == "graph+auto"
    assert options.EngineOptions(jit_compile=True, steps_per_loop="auto").name == "xla+auto"
    eager = options.EngineOptions(use_tf_function=False, steps_per_loop="auto")
    assert not eager.auto and not eager.in_graph_loop and eager.fixed_steps == 1 and eager.name == "eager"


def test_jit_compile_needs_tf_function():
    with pytest.raises(ValueError, match="jit_compile=True") as info:
        options.EngineOptions(use_tf_function=False, jit_compile=True)
    assert "use_tf_function" in str(info.value)


@pytest.mark.parametrize("name", ["use_tf_function", "jit_compile"])
@pytest.mark.parametrize("value", [1, 0, "yes", None, np.bool_(True)])
def test_bool_options_must_be_bool(name, value):
    with pytest.raises(TypeError, match=f"`{name}`"):
        options.EngineOptions(**{name: value})


def test_valid_options_are_kept_and_frozen():
    engine_options = options.EngineOptions(use_tf_function=True, jit_compile=True, steps_per_loop=7)
    assert (engine_options.use_tf_function, engine_options.jit_compile, engine_options.steps_per_loop) == (
        True,
        True,
        7,
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        engine_options.steps_per_loop = 2


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(), "graph"),
        (dict(use_tf_function=False), "eager"),
        (dict(jit_compile=True), "xla"),
        (dict(steps_per_loop=20), "graph+loop20"),
        (dict(jit_compile=True, steps_per_loop=4), "xla+loop4"),
        (dict(use_tf_function=False, steps_per_loop=3), "eager+loop3"),
        (dict(steps_per_loop=1), "graph"),
    ],
)
def test_engine_names(kwargs, name):
    assert options.EngineOptions(**kwargs).name == name


@pytest.mark.parametrize(
    "kwargs, steps_per_call, name",
    [
        (dict(steps_per_loop="auto"), 20, "graph+loop20 (auto)"),
        (dict(jit_compile=True, steps_per_loop="auto"), 1, "xla (auto)"),
        (dict(steps_per_loop="auto"), None, "graph+auto"),  # "auto" had not chosen yet
        (dict(jit_compile=True, steps_per_loop=4), 4, "xla+loop4"),
        (dict(use_tf_function=False, steps_per_loop="auto"), 1, "eager"),
    ],
)
def test_the_engine_that_ran_is_named_with_the_k_auto_chose(kwargs, steps_per_call, name):
    assert options.EngineOptions(**kwargs).ran_name(steps_per_call) == name


# ---------------------------------------------------------------------- make_runner


def test_loop_kind_per_engine(loop_options):
    loop = step_runner.make_runner(Counter(), loop_options)
    assert loop.in_graph == (loop_options.use_tf_function and loop_options.steps_per_loop > 1)
    assert isinstance(loop.step, tf.types.experimental.PolymorphicFunction) == loop_options.use_tf_function


def test_partial_final_loop_and_partial_last_batch(loop_options):
    """7 batches, 3 steps per call: the calls run 3, 3, 1, then 0 steps."""
    counter = Counter()
    loop = step_runner.make_runner(counter, loop_options)
    iterator = iter(make_dataset())
    assert loop(iterator, 0)[:3] == (0, 0, None)  # zero steps pull nothing
    expected = [(3, 9, 0), (3, 9, 3), (1, 2, 6)]  # (steps, examples, index of the first batch)
    seen = 0
    for steps, examples, first_batch in expected:
        ran, count, logs, _ = loop(iterator, 3)
        assert (ran, count) == (steps, examples)
        last = first_batch + steps - 1
        seen += sum(float(b.sum()) for b in BATCHES[first_batch : last + 1])
        # Logs are the last step's outputs.
        assert float(logs["total"]) == pytest.approx(seen)
        assert float(logs["first"]) == BATCHES[last][0]
        assert int(logs["size"]) == len(BATCHES[last])
    assert loop(iterator, 3)[:3] == (0, 0, None)
    assert float(counter.total.numpy()) == float(np.arange(NUM_VALUES).sum())
    assert int(counter.steps.numpy()) == len(BATCHES)
    # The same loop on a fresh iterator, asking for more steps than there are batches.
    ran, examples, logs, _ = loop(iter(make_dataset()), 100)
    assert (ran, examples) == (len(BATCHES), NUM_VALUES)
    assert float(logs["total"]) == 2 * float(np.arange(NUM_VALUES).sum())


def test_loop_does_not_pull_a_batch_it_does_not_train_on(loop_options):
    """After a call of 2 steps the next call starts at the third batch."""
    counter = Counter()
    loop = step_runner.make_runner(counter, loop_options)
    iterator = iter(make_dataset())
    ran, examples, logs, _ = loop(iterator, 2)
    assert (ran, examples, float(logs["first"])) == (2, 6, BATCHES[1][0])
    assert loop(iterator, 0)[:3] == (0, 0, None)
    ran, examples, logs, _ = loop(iterator, 1)
    assert (ran, examples, float(logs["first"])) == (1, 3, BATCHES[2][0])
    assert float(counter.total.numpy()) == float(np.concatenate(BATCHES[:3]).sum())
    assert int(counter.steps.numpy()) == 3
    # The remaining batches are all still there.
    assert next(iterator).numpy().tolist() == BATCHES[3].tolist()


def test_in_graph_loop_traces_once_for_any_num_steps():
    loop = step_runner.make_runner(Counter(), options.EngineOptions(steps_per_loop=3))
    for _ in range(3):  # three passes over the data, calls of 3, 3, 1 and 0 steps
        iterator = iter(make_dataset())
        assert [loop(iterator, 3)[0] for _ in range(4)] == [3, 3, 1, 0]
        for num_steps in (2, 1, 5):
            loop(iter(make_dataset()), num_steps)
    assert loop.trace_counter.count == 1
    # The loop function itself did not retrace for new `num_steps` values either.
    assert loop._graph_loop.experimental_get_tracing_count() == 1


def test_graph_step_traces_at_most_twice_with_a_partial_batch():
    """One trace for the full batches, one relaxed retrace for the partial one."""
    loop = step_runner.make_runner(Counter(), options.EngineOptions())
    for _ in range(3):
        loop(iter(make_dataset()), 100)
    assert 1 <= loop.trace_counter.count <= 2


@pytest.mark.parametrize("steps_per_loop", [1, 3])
def test_eager_engine_never_traces(steps_per_loop):
    loop = step_runner.make_runner(
        Counter(), options.EngineOptions(use_tf_function=False, steps_per_loop=steps_per_loop)
    )
    assert loop(iter(make_dataset()), 100)[0] == len(BATCHES)
    assert loop.trace_counter.count == 0


def test_trace_counter_is_named_after_the_step():
    loop = step_runner.make_runner(Counter(), options.EngineOptions(), name="eval_step")
    assert loop.trace_counter.name == "eval_step"


def test_structured_batches_count_examples_of_the_first_tensor(loop_options):
    """A (features, labels) batch: examples are the rows of the first tensor."""
    dataset = tf.data.Dataset.from_tensor_slices(
        ({"x": np.ones((5, 2), "float32")}, np.arange(5, dtype="int32"))
    ).batch(2)
    total = tf.Variable(0, dtype=tf.int32)

    def step(batch):
        features, labels = batch
        total.assign_add(tf.reduce_sum(labels))
        return {"rows": tf.shape(features["x"])[0]}

    loop = step_runner.make_runner(step, loop_options)
    assert loop(iter(dataset), 10)[:2] == (3, 5)
    assert int(total.numpy()) == 10


def test_explicit_strategy_runs_the_step():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        counter = Counter()
    loop = step_runner.make_runner(counter, options.EngineOptions(steps_per_loop=2), strategy)
    dataset = strategy.experimental_distribute_dataset(make_dataset())
    ran, _, logs, _ = loop(iter(dataset), 100)
    assert ran == len(BATCHES)
    assert float(logs["total"]) == float(np.arange(NUM_VALUES).sum())


# ------------------------------------------------------- one step per call, in the graph


@pytest.mark.parametrize("engine", ["graph", "xla"])
def test_one_step_calls_run_the_single_step_traced_once(engine):
    """`dispatch(..., available=True)` at one step per call: the single step (XLA: on a batch read in Python)."""
    counter = Counter()
    loop = step_runner.make_runner(counter, options.EngineOptions(**LOOP_ENGINES[engine]))
    iterator = iter(make_dataset())
    seen = 0.0
    for index, batch in enumerate(BATCHES):
        ran, examples, logs, nonfinite = loop.dispatch(iterator, 1, available=True).result()
        seen += float(batch.sum())
        assert (ran, examples, nonfinite) == (1, len(batch), False)
        assert float(logs["first"]) == batch[0] and float(logs["total"]) == pytest.approx(seen)
        assert int(counter.steps.numpy()) == index + 1
    # The partial last batch needed no new trace of the single step (its spec has no batch size).
    assert loop._single_step.experimental_get_tracing_count() == 1
    assert loop.traces == loop.trace_counter.count + 1
    assert loop._single_step_on_batch == (engine == "xla")
    with pytest.raises(StopIteration):  # every batch was trained on, none fetched beyond
        next(iterator)


@pytest.mark.parametrize("engine", ["graph", "xla"])
def test_one_step_call_trains_on_the_peeked_batch_and_fetches_no_other(engine):
    counter = Counter()
    loop = step_runner.make_runner(counter, options.EngineOptions(**LOOP_ENGINES[engine]))
    iterator = iter(make_dataset())
    first = loop.peek(iterator)
    ran, examples, logs, _ = loop.dispatch(iterator, 1, first).result()
    assert (ran, examples, float(logs["first"])) == (1, BATCHES[0].size, BATCHES[0][0])
    assert next(iterator).numpy().tolist() == BATCHES[1].tolist()
    assert loop._single_step.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("engine", ["graph", "xla"])
def test_one_step_call_flags_a_non_finite_loss_in_the_graph(engine):
    def step(batch):
        return {"loss": tf.math.log(tf.reduce_min(batch)), "other": tf.constant(float("nan"))}

    loop = step_runner.make_runner(step, options.EngineOptions(**LOOP_ENGINES[engine]), nonfinite_policy=options.NonFinitePolicy())
    iterator = iter(make_dataset())  # the first batch holds 0: log(0) = -inf
    assert loop.dispatch(iterator, 1, available=True).result().nonfinite
    assert not loop.dispatch(iterator, 1, available=True).result().nonfinite  # "other" is not a loss
    unguarded = step_runner.make_runner(step, options.EngineOptions())
    assert not unguarded.dispatch(iter(make_dataset()), 1, available=True).result().nonfinite


def test_one_step_calls_keep_the_host_loop_where_the_graph_cannot_read_the_batch():
    """Eager steps, unannounced data, unbatched scalars and distributed iterators fetch in Python."""
    eager = step_runner.make_runner(Counter(), options.EngineOptions(use_tf_function=False))
    assert eager._single_step is None
    graph = step_runner.make_runner(Counter(), options.EngineOptions())
    assert graph.dispatch(iter(make_dataset()), 1).result()[:2] == (1, BATCH)  # not `available`
    assert not graph._single_step_suits(iter(tf.data.Dataset.range(3)))  # scalars: no rows to count
    assert graph._single_step_suits(iter(make_dataset()))
    assert graph._single_step.experimental_get_tracing_count() == 0
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    assert not graph._single_step_suits(iter(strategy.experimental_distribute_dataset(make_dataset())))


@pytest.mark.parametrize("engine", ["graph", "xla", "graph_loop3"])
def test_a_loop_does_not_keep_a_finished_iterator_alive(engine):
    """The concrete functions are kept per iterator, which they hold weakly (its buffers can go)."""
    loop = step_runner.make_runner(Counter(), options.EngineOptions(**LOOP_ENGINES[engine]))
    iterator = iter(make_dataset())
    assert loop.dispatch(iterator, 1, available=True).result()[0] == 1
    assert loop._concrete_calls  # the call went through a cached concrete function
    ref = weakref.ref(iterator)
    del iterator
    gc.collect()
    assert ref() is None


# ------------------------------------------------------------------ the collecting loop (predict)


def doubled(batch):
    return {"double": 2.0 * batch, "size": tf.shape(batch)[0]}


@pytest.mark.parametrize("available", [True, False], ids=["counted", "optional"])
def test_collecting_loop_joins_every_step_and_reads_no_batch_beyond_its_steps(available):
    """Calls of 3 over 7 batches (the last partial): outputs joined along the example axis, nothing skipped."""
    loop = step_runner.make_runner(doubled, options.EngineOptions(steps_per_loop=3), collect=True)
    iterator = iter(make_dataset())
    chunks = []
    for steps, batches in ((3, 3), (3, 3), (1, 1)):  # the last call asks for what is left
        result = loop.dispatch(iterator, steps, available=available).result()
        assert result.steps == batches
        chunks.extend(result.logs)  # a call's outputs: one chunk, its steps joined
    assert np.concatenate([c["double"] for c in chunks]).tolist() == (2 * np.arange(NUM_VALUES)).tolist()
    assert np.concatenate([c["size"] for c in chunks]).tolist() == [len(b) for b in BATCHES]
    assert list(iterator) == []  # every batch was read, once


def test_collecting_loop_traces_one_counted_function_for_any_num_steps():
    """A counted pass (the host knows the batches are there) traces once, whatever k each call runs."""
    loop = step_runner.make_runner(doubled, options.EngineOptions(steps_per_loop="auto"), collect=True)
    for _ in range(2):
        iterator = iter(make_dataset())
        for steps in (1, 1, 3, 2):
            assert loop.dispatch(iterator, steps, available=True).result().steps == steps
    assert loop._graph_loop.experimental_get_tracing_count() == 1
    assert loop.traces == 1  # the step, traced once: the loop's traces are not counted separately


def test_collecting_loop_with_a_peeked_batch_collects_it_first():
    loop = step_runner.make_runner(doubled, options.EngineOptions(steps_per_loop=3), collect=True)
    iterator = iter(make_dataset())
    first = loop.peek(iterator)
    result = loop.dispatch(iterator, 2, first).result()
    assert result.steps == 2
    assert result.logs[0]["double"].numpy().tolist() == (2 * np.arange(6)).tolist()


# ------------------------------------------------------------------ the call path, chosen once

# (engine, `make_runner` keyword arguments, the path every call takes, steps per call)
CALL_PATHS = {
    "graph+collect": ("graph_loop3", dict(collect=True), "_collecting_call", 3),
    "graph": ("graph_loop3", dict(), "_graph_call", 3),
    "compiled single step": ("graph", dict(), "_single_or_host_call", 1),
    "xla single step": ("xla", dict(), "_single_or_host_call", 1),
    "host loop": ("eager_loop3", dict(), "_plain_host_call", 3),
    "host loop, guarded": ("eager", dict(nonfinite_policy=options.NonFinitePolicy()), "_guarded_host_call", 1),
    "host loop, collecting": ("eager_loop3", dict(collect=True), "_plain_host_call", 3),
}


def _chosen(loop):
    return loop._call.__func__.__name__


@pytest.mark.parametrize("config", sorted(CALL_PATHS), ids=sorted(CALL_PATHS))
def test_the_call_path_is_chosen_once_when_the_loop_is_built(config, monkeypatch):
    engine, kwargs, path, steps_per_call = CALL_PATHS[config]
    collect = kwargs.get("collect", False)
    loop = step_runner.make_runner(
        doubled if collect else Counter(), options.EngineOptions(**LOOP_ENGINES[engine]), **kwargs
    )
    assert _chosen(loop) == path

    def chosen_again(self):
        raise AssertionError("a call chose its path again")

    # Nothing is chosen per call: every dispatch goes through the path chosen at construction.
    monkeypatch.setattr(step_runner.StepRunner, "_choose_call", chosen_again)
    monkeypatch.setattr(step_runner.StepRunner, "_choose_host_call", chosen_again)
    taken = []
    call = loop._call
    loop._call = lambda *args: taken.append(args[1]) or call(*args)
    sizes = [len(BATCHES[index : index + steps_per_call]) for index in range(0, len(BATCHES), steps_per_call)]
    iterator = iter(make_dataset())
    calls = []
    for steps in sizes:  # each dispatched before the previous one is read
        calls.append(loop.dispatch(iterator, steps, available=True, after=calls[-1] if calls else None))
    results = [call.result() for call in calls]
    assert taken == [result.steps for result in results] == sizes
    assert [result.examples for result in results] == [
        sum(len(batch) for batch in BATCHES[index : index + steps_per_call])
        for index in range(0, len(BATCHES), steps_per_call)
    ]
    if collect:
        doubles = np.concatenate([chunk["double"] for result in results for chunk in result.logs])
        assert doubles.tolist() == (2 * np.arange(NUM_VALUES)).tolist()
    else:
        assert float(results[-1].logs["total"]) == float(np.arange(NUM_VALUES).sum())
        assert float(results[-1].logs["first"]) == BATCHES[-1][0]
        assert not any(result.nonfinite for result in results)
    with pytest.raises((StopIteration, tf.errors.OutOfRangeError)):  # every batch trained on, none beyond
        next(iterator)


@pytest.mark.parametrize(
    "engine, path",
    [("graph_loop3", "_graph_call"), ("graph", "_single_or_host_call"), ("eager", "_flagging_host_call")],
)
def test_an_engine_past_nonfinite_losses_chooses_its_own_path(engine, path):
    loop = step_runner.make_runner(
        Counter(), options.EngineOptions(**LOOP_ENGINES[engine]), nonfinite_policy=options.NonFinitePolicy()
    )
    assert _chosen(loop.past_nonfinite()) == path
    assert loop.past_nonfinite().pipelines == loop.pipelines == (path == "_graph_call")


def test_a_runner_refuses_an_unknown_single_step():
    counter = timing.TraceCounter("train_step")
    with pytest.raises(ValueError, match="Invalid StepRunner arguments"):
        step_runner.StepRunner(lambda batch: batch, counter, False, tf.distribute.get_strategy(), single_step="xla")


def test_past_nonfinite_keeps_the_single_step_and_flags():
    runner = step_runner.make_runner(
        lambda batch: {"loss": tf.reduce_sum(batch)}, options.EngineOptions(steps_per_loop=1), nonfinite_policy=options.NonFinitePolicy()
    )
    flagging = runner.past_nonfinite()
    assert (runner.nonfinite_policy.stops, runner.nonfinite_policy.flags) == (True, False)
    assert (flagging.nonfinite_policy.stops, flagging.nonfinite_policy.flags) == (False, True)
    assert flagging._single_step_kind == runner._single_step_kind == "iterator"
    result = flagging(iter(make_dataset()), 1)
    assert result.steps == 1 and not result.nonfinite
