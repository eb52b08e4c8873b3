"""Before any step runs: a call's arguments checked, its inputs adapted into plans, the variables built.

What `Trainer.fit`, `evaluate` and `predict` do before their loops, in the
order Keras's `fit` does it: argument checks, the validation split, inputs
through Keras's adapters, the step budget, checks of the data against the
model and the strategy, then the variables created before the first trace.
Every error here is raised before any step runs, except those of
`validation_data` that Keras reads to learn its structure (a `PyDataset`, a
generator, a `DataLoader`): it is adapted at the first validation, as `fit`
adapts it (`ValidationData`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import keras
import tensorflow as tf

from tftrain.arguments import (
    check_int,
    check_validation_every_steps,
    check_validation_freq,
    check_validation_split,
    check_verbose,
)
from tftrain.checkpoint.state import CallTarget
from tftrain.engine import model_setup
from tftrain.fit_inputs import distributed_data, fit_checks, inputs
from tftrain.fit_inputs.epoch_plan import EpochPlan
from tftrain.loops import hooks
from tftrain.loops.owner import StepOwner
from tftrain.options import NonFinitePolicy

__all__ = ["FitArguments", "FitCall", "ValidationData", "build", "check_step", "fit_call", "plan_for", "plan_of"]


class ValidationData:
    """`fit`'s validation data, adapted where Keras adapts it.

    Arrays and `tf.data` datasets are adapted and checked against the model
    when `fit` starts (reading no batch). A source that Keras's adapter reads
    to learn its structure (a `keras.utils.PyDataset`, a generator, a
    `torch.utils.data.DataLoader`) is adapted at the first validation, as
    `fit` does: such a source may draw random numbers when read (a shuffled
    `DataLoader` draws its seed from torch's global generator), so the
    draws happen in Keras's order, after the first epoch's training.

    Args:
        open_plan: Adapts the data and returns its checked plan.
        deferred: Adapt at the first `plan`, not now.
    """

    def __init__(self, open_plan: Callable[[], EpochPlan], *, deferred: bool):
        self._open_plan = open_plan
        self._plan = None if deferred else open_plan()

    @property
    def plan(self) -> EpochPlan:
        """The validation plan, adapted on first use."""
        if self._plan is None:
            self._plan = self._open_plan()
        return self._plan

    def close(self) -> None:
        """Closes the plan, if it was opened (a PyDataset's workers stop)."""
        if self._plan is not None:
            self._plan.close()


@dataclasses.dataclass(frozen=True)
class FitCall:
    """One `fit` call's data, target and callbacks, checked by the Trainer.

    Attributes:
        plan: The training data.
        validation: The validation data, or None.
        target: What the call trains to (`epochs`, or a step budget `total_steps`).
        initial_epoch: Where a run with nothing to resume starts.
        callbacks: The user's Keras callbacks.
        verbose: `fit`'s `verbose` as given (what the callbacks see in their `params`).
        verbosity: `verbose` resolved (0, 1 or 2; `"auto"` is 1): what the run prints.
        nonfinite_policy: What a loss blow-up does in this call: the
            Trainer's policy, left to a `TerminateOnNaN` among the callbacks.
        validation_freq: Validate after these epochs (`fit`'s meaning).
        validation_every_steps: Also validate every this many global steps, or None.
    """

    plan: EpochPlan
    validation: ValidationData | None
    target: CallTarget
    initial_epoch: int
    callbacks: Any
    verbose: int | str
    verbosity: int
    nonfinite_policy: NonFinitePolicy
    validation_freq: int | list[int]
    validation_every_steps: int | None


def _once(owner: StepOwner, what: tuple[Any, ...], check: Callable[[], None], *, build: bool = False) -> None:
    """Runs `check` (or the build) unless it ran before in this Trainer on the same model and `what` (the data's spec)."""
    owner.engines.checked.once(what, owner.model, check, built=build)


def check_step(owner: StepOwner, kind: str) -> None:
    """The model's default steps need a compiled model (and an optimizer, to train)."""
    if owner.uses_model_step(kind):
        step = model_setup.MODEL_STEPS[kind]
        _once(owner, (step,), lambda: model_setup.check_compiled_for(owner.model, step, f"{kind}_step"))


def plan_of(owner: StepOwner, data: inputs.AdaptedInput) -> EpochPlan:
    """The pass-by-pass plan over adapted inputs (a distributed dataset's own iterators, checked against the strategy).

    A `tf.distribute.DistributedDataset` is read as it is, as Keras's
    `TFEpochIterator` reads it; other inputs are distributed by the engines.
    """
    if isinstance(data.dataset, distributed_data.DistributedData):
        distributed_data.check_strategy(data.dataset, owner.engines.strategy, data.argument)
        return EpochPlan(data, make_iterator=distributed_data.iterate)
    return owner.engines.plan(data)


def plan_for(owner: StepOwner, kind: str, data: inputs.AdaptedInput, argument: str) -> EpochPlan:
    """The plan over adapted inputs, checked: batched, targets where the loss needs them, an even global batch."""
    plan = plan_of(owner, data)
    model_step = owner.uses_model_step(kind)

    def check() -> None:
        default = model_step and model_setup.uses_default_step(owner.model, model_setup.MODEL_STEPS[kind])
        model_setup.check_data(owner.model, plan.dataset, argument, owner.engines.strategy, default_step=default)

    _once(owner, (kind, model_step, argument, plan.dataset.element_spec), check)
    return plan


def build(owner: StepOwner, dataset: tf.data.Dataset) -> None:
    """Creates the model's, metrics' and optimizer's variables before the first trace."""
    model_step = owner.uses_model_step("train")

    def build_variables() -> None:
        default = model_step and model_setup.uses_default_step(owner.model, "train_step")
        engines = owner.engines
        model_setup.build_variables(owner.model, dataset, engines.strategy, default_train_step=default,
                                    checked=engines.in_scope)  # fmt: skip

    _once(owner, ("build", model_step, dataset.element_spec), build_variables, build=True)


@dataclasses.dataclass(frozen=True)
class FitArguments:
    """`Trainer.fit`'s arguments as the user gave them, by name (Keras's `fit` and tftrain's budget).

    One object crosses from the facade to the preparation (`fit_call`) and
    to the dry run (`Trainer.check`), which take `fit`'s arguments alike.
    """

    x: Any = None
    y: Any = None
    batch_size: int | None = None
    epochs: int = 1
    verbose: int | str = "auto"
    callbacks: Any = None
    validation_split: float = 0.0
    validation_data: Any = None
    shuffle: bool | str = True
    class_weight: dict[int, float] | None = None
    sample_weight: Any = None
    initial_epoch: int = 0
    steps_per_epoch: int | None = None
    validation_steps: int | None = None
    validation_batch_size: int | None = None
    validation_freq: int | list[int] = 1
    total_steps: int | None = None
    validation_every_steps: int | None = None

    @classmethod
    def named_in(cls, values: Mapping[str, Any]) -> FitArguments:
        """The arguments among `values` by name (e.g. a `fit`-like method's `locals()`); others are ignored."""
        return cls(**{field.name: values[field.name] for field in dataclasses.fields(cls) if field.name in values})


def _checked_numbers(arguments: FitArguments) -> tuple[int, int | list[int]]:
    """`fit`'s number arguments checked; returns `verbose` resolved and `validation_freq` (a list, for epochs)."""
    check_int("epochs", arguments.epochs, 0)
    check_int("initial_epoch", arguments.initial_epoch, 0)
    verbosity, validation_freq = check_verbose(arguments.verbose), check_validation_freq(arguments.validation_freq)
    has_validation = check_validation_split(arguments.validation_split) > 0 or arguments.validation_data is not None
    check_int("total_steps", arguments.total_steps, optional=True)
    check_validation_every_steps(arguments.validation_every_steps, has_validation)
    return verbosity, validation_freq


def fit_call(owner: StepOwner, arguments: FitArguments) -> FitCall:
    """`Trainer.fit`'s arguments checked and adapted into a `FitCall`, its variables built."""
    x, y, sample_weight = arguments.x, arguments.y, arguments.sample_weight
    batch_size, epochs, initial_epoch = arguments.batch_size, arguments.epochs, arguments.initial_epoch
    validation_data, total_steps, callbacks = arguments.validation_data, arguments.total_steps, arguments.callbacks
    # The numbers as given, checked once per Trainer: an earlier call that passed every check with them resolved them.
    given = dataclasses.replace(arguments, x=None, y=None, sample_weight=None, callbacks=None,
                                validation_data=validation_data is None)  # fmt: skip
    known = owner.engines.checked.arguments(given)
    verbosity, validation_freq = known if known is not None else _checked_numbers(arguments)
    nonfinite_policy = owner.nonfinite_policy.with_callbacks(hooks.terminates_on_nan(callbacks))
    epochs = inputs.keras_epoch_limit(epochs)
    check_step(owner, "train")
    if owner.run_options.model_dir is not None:
        fit_checks.check_resume_sources(callbacks, owner.run_options.model_dir)
    if arguments.validation_split and validation_data is None:
        (x, y, sample_weight), validation_data = inputs.split_validation(
            x, y, sample_weight, arguments.validation_split
        )
    train = inputs.adapt(
        x,
        y,
        sample_weight,
        batch_size=batch_size,
        steps=arguments.steps_per_epoch,
        shuffle=arguments.shuffle,
        class_weight=arguments.class_weight,
        checked=known is not None,
    )
    if total_steps is not None:
        train, epochs = fit_checks.step_budget_epochs(train, total_steps, epochs)
    plan = plan_for(owner, "train", train, "x")
    if owner.run_options.model_dir is not None:
        plan.keep_array_position()  # arrays resume at their next unread example, in their pass's order
    plan.warn_single_pass(
        epochs - initial_epoch,
        "x",
        "steps_per_epoch",
        f"epochs={epochs}, initial_epoch={initial_epoch}",
    )
    validation = None
    if validation_data is not None:
        check_step(owner, "eval")
        val_x, val_y, val_weight = keras.utils.unpack_x_y_sample_weight(validation_data)
        val_batch_size = arguments.validation_batch_size or (
            batch_size if inputs.input_kind(val_x) == "arrays" else None
        )
        count = sum(fit_checks.should_validate(e, validation_freq) for e in range(initial_epoch, epochs))

        def open_validation() -> EpochPlan:
            adapted = inputs.adapt(
                val_x, val_y, val_weight, batch_size=val_batch_size, steps=arguments.validation_steps,
                argument="validation_data", steps_argument="validation_steps",
            )  # fmt: skip
            validation_plan = plan_for(owner, "eval", adapted, "validation_data")
            validation_plan.warn_single_pass(
                count, "validation_data", "validation_steps", f"{count} validations"
            )
            return validation_plan

        validation = ValidationData(open_validation, deferred=inputs.read_to_adapt(val_x))
    plan.reset()  # as Keras's fit resets its epoch iterator (a PyDataset's on_epoch_end runs)
    build(owner, plan.dataset)
    owner.engines.checked.add_arguments(given, (verbosity, validation_freq))
    return FitCall(
        plan=plan,
        validation=validation,
        target=CallTarget(epochs, total_steps),
        initial_epoch=initial_epoch,
        callbacks=callbacks,
        verbose=arguments.verbose,
        verbosity=verbosity,
        nonfinite_policy=nonfinite_policy,
        validation_freq=validation_freq,
        validation_every_steps=arguments.validation_every_steps,
    )
