"""A Trainer's engines: one per kind of step (train, eval, predict), built once, and how many steps each call runs.

`Engines` is what the fit and evaluation loops run steps through: the
`tftrain.engine.step_runner.StepRunner` of each kind (made by `make_runner` on
first use and cached, as Keras caches its `train_function`), the input plan
of a pass (plain or distributed iterators), the steps per host call
(`steps_per_loop`, or the `"auto"` chooser that learns k once per kind), and
the writer of `tf.summary` calls inside the training step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Callable, Hashable, Iterator, Mapping
from typing import Any

import keras
import tensorflow as tf

from tftrain import distribute
from tftrain.compat import keras_internals
from tftrain.engine import step_runner
from tftrain.engine.auto_steps import StepsPerCall
from tftrain.fit_inputs import inputs
from tftrain.fit_inputs.epoch_plan import EpochPlan
from tftrain.loops import hooks
from tftrain.options import UNTESTED, EngineOptions, NonFinitePolicy
from tftrain.services.step_summaries import InStepSummaries

__all__ = ["KINDS", "CheckedOnce", "Engines"]

KINDS = ("train", "eval", "predict")
_HOOK_KINDS = {"train": "train", "eval": "test", "predict": "predict"}


def _key(value: Any) -> Hashable:
    """`value` (numbers, strings, lists, dicts, dataclasses of them) as a hashable key that tells types apart.

    `True` and `1` differ, as do a list and a tuple. Raises `TypeError` for
    anything else that is not hashable.
    """
    if isinstance(value, (list, tuple)):
        return type(value), tuple(map(_key, value))
    if isinstance(value, dict):
        return dict, tuple((_key(name), _key(item)) for name, item in value.items())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return type(value), tuple(_key(getattr(value, field.name)) for field in dataclasses.fields(value))
    hash(value)
    return type(value), value


def _ref(value: Any) -> Hashable:
    """`value` as a key part that no object made later equals: a weak reference where it takes one.

    An `id` may be reused by a new object once the old one is freed; a weak
    reference to a freed object equals no other reference. Strings, numbers
    and None stand for themselves, lists and dicts part by part; anything
    else gets a key that equals nothing (it is checked every time).
    """
    if value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        return tuple(map(_ref, value))
    if isinstance(value, dict):
        return tuple((name, _ref(item)) for name, item in value.items())
    try:
        return weakref.ref(value)
    except TypeError:
        return object()


class CheckedOnce:
    """What a Trainer's calls checked that depends only on what they name, so that a later call skips it.

    Two kinds, each a dict of at most `limit` entries (the oldest dropped
    first): the checks and builds of the model (keyed by what was checked,
    e.g. the data's spec, and the model's compile: its optimizer, loss and
    metrics by weak reference, so a recompile is checked again even where a
    new object takes a freed one's `id`), and `fit`'s number arguments (keyed
    by their values, mapped to what they resolve to).

    Args:
        limit: The most entries of each kind.
    """

    def __init__(self, limit: int = 64):
        self.limit = limit
        self._model: dict[Hashable, None] = {}
        self._arguments: dict[Hashable, Any] = {}

    def _add(self, entries: dict[Hashable, Any], key: Callable[[], Hashable], value: Any) -> None:
        try:
            entries[key()] = value
        except TypeError:  # a part that is not hashable (e.g. an attrs batch's spec): not kept, checked again
            return
        while len(entries) > self.limit:
            del entries[next(iter(entries))]

    @staticmethod
    def _model_key(what: Any, model: Any, built: bool) -> Hashable:
        optimizer = getattr(model, "optimizer", None)
        state = (model.compiled, _ref(optimizer), _ref(model.loss), tuple(map(_ref, model.metrics)))
        if built:
            state = (*state, getattr(optimizer, "built", None), len(model.variables))
        return _key(what), state

    def once(self, what: Any, model: Any, check: Callable[[], None], *, built: bool = False) -> None:
        """Runs `check` unless it ran before on `what` and the model as it is compiled now.

        `built`: the key also holds whether the optimizer is built and the
        number of the model's variables, taken after `check` (a build).
        """
        try:
            known = self._model_key(what, model, built) in self._model
        except TypeError:
            known = False
        if not known:
            check()
            self._add(self._model, lambda: self._model_key(what, model, built), None)

    def arguments(self, given: Any) -> Any:
        """What arguments equal to `given` resolved to in a call that passed their checks, or None."""
        try:
            return self._arguments.get(_key(given))
        except TypeError:
            return None

    def add_arguments(self, given: Any, resolved: Any) -> None:
        """Keeps what `given` resolved to (not where a part of it is not hashable)."""
        self._add(self._arguments, lambda: _key(given), resolved)


class Engines:
    """The engines of one Trainer, built once per kind and kept across calls.

    Args:
        step_of: Kind (`"train"`, `"eval"`, `"predict"`) -> the step function
            (`batch -> logs`, or predictions) and whether it is user code
            that AutoGraph converts (`make_runner`'s `autograph`), asked when
            that kind's engine is first built (as Keras's
            `make_train_function` looks up `train_step`).
        options: How the steps run.
        strategy: The strategy they run under.
        global_step: The run's global step, incremented before each training step.
        nonfinite_policy: What a non-finite loss does to training calls (the Trainer's).
        model: The model whose `train_function`, `test_function` and
            `predict_function` the engines stand for. Where one was reset
            since its engine was built (`compile` and `quantize` set them to
            None, and so may a callback's `set_model`:
            `keras_internals.step_function_reset`), that engine is dropped
            and built again on next use, as Keras rebuilds a function it
            finds None: a layer unfrozen and compiled again trains, and
            `tftrain.callbacks.Timing` counts every `fit`. None: never rebuilt.
        in_scope: The model's and its optimizer's variables checked to belong to
            `strategy` when the Trainer was made (`model_setup.prepare_model`).
    """

    def __init__(
        self,
        step_of: Callable[[str], tuple[Callable[[Any], Any], bool]],
        options: EngineOptions,
        strategy: tf.distribute.Strategy,
        global_step: tf.Variable,
        *,
        nonfinite_policy: NonFinitePolicy,
        model: keras.Model | None = None,
        in_scope: Mapping[int, Any] | None = None,
    ):
        self.step_of = step_of
        self.model = model
        self.options = options
        self.strategy = strategy
        self.global_step = global_step
        self.nonfinite_policy = nonfinite_policy
        self.in_scope = in_scope
        self.runners: dict[str, step_runner.StepRunner] = {}
        self._past_nonfinite: step_runner.StepRunner | None = None  # built for a fit with `TerminateOnNaN`
        self.auto_steps: dict[str, StepsPerCall] = {}
        self._in_step_summaries: InStepSummaries | None = None
        # What the strategy is, resolved once (as Keras fixes a model's strategy): a fit asks again and again.
        self.default_strategy = distribute.is_default_strategy(strategy)
        self.worker, self.workers = distribute.worker_role(strategy), distribute.num_workers(strategy)
        self.checked = CheckedOnce()

    @contextlib.contextmanager
    def fresh_cache(self) -> Iterator[None]:
        """Runs the `with` body on engines built anew (a side run's), then puts the cached ones back.

        The engines, their traces, `steps_per_loop="auto"`'s measurements and
        the in-step summaries' writer of the Trainer's own calls are kept
        apart from the body's, as `Trainer.check` and `find_learning_rate` need.
        """
        cache = self.runners, self._past_nonfinite, self.auto_steps, self._in_step_summaries
        self.runners, self._past_nonfinite, self.auto_steps, self._in_step_summaries = {}, None, {}, None
        try:
            yield
        finally:
            self.runners, self._past_nonfinite, self.auto_steps, self._in_step_summaries = cache

    def runner(self, kind: str, nonfinite_policy: NonFinitePolicy | None = None) -> step_runner.StepRunner:
        """The engine of `kind`, built on first use, and again after the model's function of `kind` was reset.

        Asked for after a pass's callbacks are set (`set_model`), as Keras
        calls `make_train_function`, so that a reset there is seen.

        A `fit` call's `nonfinite_policy` that `flags` (its callbacks hold
        Keras's `TerminateOnNaN`) asks for a training engine whose calls run
        all their steps past a non-finite loss, flagging it
        (`StepRunner.past_nonfinite`). It is built on first use around the
        same traced step (a Trainer that never needs it never traces it).
        """
        if kind in self.runners and self.model is not None and keras_internals.step_function_reset(self.model, kind):
            del self.runners[kind]
            if kind == "train":
                self._past_nonfinite = None
        if kind not in self.runners:
            self.runners[kind] = self.new_runner(kind)
            if self.model is not None:
                keras_internals.hold_step_function(self.model, kind)
        if kind != "train" or nonfinite_policy is None or not nonfinite_policy.flags:
            return self.runners[kind]
        if self._past_nonfinite is None:
            self._past_nonfinite = self.runners[kind].past_nonfinite()
        return self._past_nonfinite

    def new_runner(self, kind: str) -> step_runner.StepRunner:
        """A new engine of `kind`, made as `runner` makes it but kept nowhere (a dry run's: the cached engines untouched)."""
        step, autograph = self.step_of(kind)
        return step_runner.make_runner(
            step,
            self.options,
            self.strategy,
            f"{kind}_step",
            nonfinite_policy=self.nonfinite_policy if kind == "train" else UNTESTED,
            collect=kind == "predict",
            step_counter=self.global_step if kind == "train" else None,
            autograph=autograph,
            single_device=self.default_strategy,
        )

    def plan(self, data: inputs.AdaptedInput) -> EpochPlan:
        """The pass-by-pass plan over adapted inputs: plain iterators, or distributed under a strategy."""
        if self.default_strategy:
            return EpochPlan(data, make_iterator=iter)
        return EpochPlan(
            data, make_iterator=lambda dataset: iter(self.strategy.experimental_distribute_dataset(dataset))
        )

    def steps_per_call(self, kind: str, callback_list: keras.callbacks.CallbackList) -> int | StepsPerCall:
        """Steps per host call in a pass of `kind`.

        With `steps_per_loop="auto"`: the chooser of `kind` (what it learned
        is kept across calls), or 1 while a callback implements that kind's
        batch hooks (it may count on one call per step), and 1 under several
        workers (each would measure its own times, and every worker must run
        the same steps per call).
        """
        if not self.options.auto:
            return self.options.fixed_steps
        if self.workers > 1:
            return 1
        if hooks.relies_on_batch_hooks(callback_list, _HOOK_KINDS[kind]):
            return 1
        return self.auto_steps.setdefault(kind, StepsPerCall("auto"))

    def train_engine_name(self, callback_list: keras.callbacks.CallbackList) -> str:
        """The name of the training engine a `fit` with these callbacks ran (`EngineOptions.ran_name`).

        XLA as resolved, and with `steps_per_loop="auto"` the steps per call
        it ran: the k it chose, or 1 where callbacks implement batch hooks or
        several workers train; e.g. `"xla+loop4"`, `"graph+loop20 (auto)"`.
        """
        steps = self.steps_per_call("train", callback_list)
        return self.options.ran_name(steps.chosen if isinstance(steps, StepsPerCall) else steps)

    @property
    def chosen_steps_per_loop(self) -> int | None:
        """The training steps per call that `"auto"` chose (None before it chose, or without "auto")."""
        chooser = self.auto_steps.get("train")
        return chooser.chosen if chooser is not None else None

    def in_step_summaries(self, model_dir: str | None, every_steps: int | None) -> InStepSummaries | None:
        """The writer and cadence of `tf.summary` calls in the training step, made once.

        A traced step keeps the writer and condition it was traced with, so
        they are made once per Trainer. None without `model_dir`, on a worker
        other than the chief, and under XLA (it cannot compile summary ops on
        CPU and GPU, so the step's summaries are not recorded there).
        """
        if model_dir is None or not self.worker[0] or self.options.jit_compile:
            return None
        if self._in_step_summaries is None:
            self._in_step_summaries = InStepSummaries(model_dir, self.global_step, every_steps)
        return self._in_step_summaries
