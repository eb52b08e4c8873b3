"""The dry run before a long run: `Trainer.check`, the fit loop with a budget, timed, then everything put back.

A long run that fails at its first validation, checkpoint or export has lost
an epoch. `run_check` takes `fit`'s own arguments and runs, in seconds, what
the run will do, in its order, through the same code: `fit`'s preparation
(`fit`'s argument checks, inputs adapted, variables built), then the fit
loop (`fit_loop.run_fit`) with a budget of two epochs of one host call each,
each validated on one batch, in a `Sandbox` whose `model_dir` is a temporary
directory: the run's services do there what they do in the run (checkpoints,
the best checkpoint and its monitor, summaries, the run record). Then the
training state is saved and restored (every variable checked to come back),
one batch is predicted and, where asked, the model exported. The first epoch
times each stage's first call (the trace, XLA compilation, and the steps), the
second its steady call. Each runs on the engine the `fit` would use (eager,
`tf.function`, XLA, k steps per call, the strategy, the mixed-precision
policy), through engines made for the check alone.

Then everything is put back (`Sandbox`), also after an error or a
KeyboardInterrupt: every variable of the training state, bit for bit, the
NumPy and Python global random states, the Trainer's engines (their traces,
`steps_per_loop="auto"`'s measurements). No callback hook of the user's runs,
nothing is written to `model_dir` (nor is it read or created), and
`trainer.timing` is the last fit's. The first failing stage stops the check:
the state is put back and `DryRunError` raised, naming the stage.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import keras
import tensorflow as tf

from tftrain.arguments import check_verbose
from tftrain.checkpoint import files, state
from tftrain.errors import DryRunError
from tftrain.fit_inputs import inputs
from tftrain.fit_inputs.epoch_plan import EpochPlan
from tftrain.loops import inference, preparation
from tftrain.loops.owner import StepOwner
from tftrain.loops.state_copy import Sandbox

__all__ = ["STAGES", "DryRunReport", "DryRunStage", "check_export", "run_check"]

STAGES = ("prepare", "train", "validate", "checkpoint", "predict", "export")
"""The stages of a dry run, in the order they run."""


@dataclasses.dataclass(frozen=True)
class DryRunStage:
    """One stage of a dry run: whether it ran, how long it took, what it met.

    Attributes:
        name: One of `STAGES`.
        ran: Whether it ran. A stage that does not apply (no validation data,
            no export asked for) or that comes after a failed one did not.
        seconds: How long it took; for `"train"`, `"validate"` and
            `"predict"`, the first call: the step's trace (and XLA
            compilation) with its steps. None where it did not run.
        steady_seconds: For `"train"`, `"validate"` and `"predict"`: a second
            call of as many steps, traced already (what each call costs in
            the run); None where the data held no more batches.
        detail: What ran (steps, batches, what was saved), or why it did not.
        error: The error it met, as `"TypeName: first line"`, or None.
    """

    name: str
    ran: bool
    seconds: float | None = None
    steady_seconds: float | None = None
    detail: str = ""
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class DryRunReport:
    """What `Trainer.check` ran, how long each stage took, and the first error.

    Attributes:
        engine: The engine the stages ran on, e.g. `"graph+loop20"`,
            `"xla+auto"` (as `tftrain.options.EngineOptions.name`).
        stages: One `DryRunStage` per name of `STAGES`, in that order.
        seconds: The whole check, putting the state back included.
    """

    engine: str
    stages: tuple[DryRunStage, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        """Whether no stage failed."""
        return self.failed_stage is None

    @property
    def failed_stage(self) -> DryRunStage | None:
        """The stage that failed (the check stops at the first), or None."""
        return next((stage for stage in self.stages if stage.error is not None), None)

    def stage(self, name: str) -> DryRunStage:
        """The stage of this name.

        Raises:
            ValueError: `name` is not one of `STAGES`.
        """
        names = [stage.name for stage in self.stages]
        if name not in names:
            raise ValueError(f"Invalid value for argument `name`. Received: name={name!r}. Expected one of {STAGES}.")
        return self.stages[names.index(name)]

    def summary(self) -> str:
        """The report as text: each stage, its times or why it did not run, and the first error."""
        outcome = "ok" if self.ok else f"failed in its {self.failed_stage.name!r} stage"
        lines = [f"dry run ({self.engine}): {outcome}, {self.seconds:.2f} s in all"]
        for stage in self.stages:
            if stage.error is not None:
                text = f"FAILED after {stage.seconds:.3f} s: {stage.error}"
            elif not stage.ran:
                text = f"not run: {stage.detail}"
            else:
                steady = "" if stage.steady_seconds is None else f" (first call), {stage.steady_seconds:.3f} s (steady call)"
                text = f"{stage.seconds:.3f} s{steady}" + (f": {stage.detail}" if stage.detail else "")
            lines.append(f"  {stage.name:<10} {text}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain Python values (e.g. for JSON)."""
        return dataclasses.asdict(self)


def check_export(export: Any) -> dict[str, Any] | None:
    """`check`'s `export` as the keyword arguments of the export to run, or None for no export.

    Raises:
        TypeError: `export` is not a bool or a mapping of keyword arguments.
    """
    if isinstance(export, bool):
        return {} if export else None
    if isinstance(export, Mapping) and all(isinstance(key, str) for key in export):
        return dict(export)
    raise TypeError(f"Invalid value for argument `export`. Received: export={export!r}. Expected True (export to a "
                    "temporary directory, with `Trainer.export`'s defaults), False (no export), or a dict of keyword "
                    'arguments for `Trainer.export` (e.g. {"format": "tf_saved_model"}).')


def run_check(
    owner: StepOwner,
    fit_arguments: preparation.FitArguments,
    *,
    export_to: Callable[..., None],
    export: Any = False,
) -> DryRunReport:
    """Runs the dry run of a `fit` call on `owner` and puts everything back.

    `Trainer.check` calls this with itself as `owner`; it documents what
    runs, what is put back and the errors.

    Args:
        owner: The owner of the steps.
        fit_arguments: `fit`'s arguments; with `verbose` other than 0, the
            report's summary is printed.
        export_to: Exports the model to a path, with keyword arguments
            (`Trainer.export`), where `export` asks for an export.
        export: `check`'s `export` (`check_export`): whether to export, or
            the keyword arguments of the export.

    Returns:
        The `DryRunReport`, every stage passed.

    Raises:
        TypeError, ValueError: a bad `export` or `verbose` (before anything runs).
        DryRunError: a stage failed (its error chained).
    """
    verbose, export_arguments = check_verbose(fit_arguments.verbose), check_export(export)
    start, stages = time.perf_counter(), _Stages()
    try:
        with Sandbox(owner, "check") as sandbox:
            _run_stages(owner, fit_arguments, sandbox, stages)
            if export_arguments is None:
                stages.file("export", "not asked for (`export=True`)", ran=False)
            else:  # quiet by default: Keras's message would name the temporary directory
                stages.enter("export")
                export_to(os.path.join(sandbox.directory, "export"), **{"verbose": False, **export_arguments})
                stages.file("export", "to a temporary directory")
    except Exception as error:
        stages.fail(error)
    report = DryRunReport(owner.engines.options.name, stages.report(), time.perf_counter() - start)
    if verbose:
        print(report.summary())
    if stages.error is not None:
        failed = report.stage(stages.current)
        message = (
            f"The dry run failed in its {failed.name!r} stage: {failed.error} (everything was put back as it "
            "was: fix this and run `check` again)."
        )
        raise DryRunError(message, stage=failed.name, report=report) from stages.error
    return report


def _run_stages(owner: StepOwner, arguments: preparation.FitArguments, sandbox: Sandbox, stages: _Stages) -> None:
    """Runs the stages but the export in the sandbox, filing each with `stages`; raises the first stage's error."""
    call = preparation.fit_call(owner, arguments)
    stages.file("prepare", "fit's arguments checked, inputs adapted, variables built")
    # The budget: two epochs of one call (the first and the steady one), one batch per validation.
    steps = call.plan.steps_per_epoch = min(owner.engines.options.fixed_steps, call.plan.steps or math.inf)
    validation = call.validation and preparation.ValidationData(lambda: _one_batch(call.validation.plan), deferred=True)
    budget = dataclasses.replace(
        call,
        target=state.CallTarget(epochs=2),
        initial_epoch=0,
        callbacks=[stages],
        verbose=0,
        verbosity=0,
        validation=validation,
        validation_freq=1,
        validation_every_steps=None,
    )
    if validation is None:
        stages.file("validate", "no validation data (`validation_data`, `validation_split`)", ran=False)
    stages.enter("train", timed=False)
    sandbox.use_run_options(model_dir=os.path.join(sandbox.directory, "run"))  # the run's services write there
    trace_s = sandbox.fit(budget)
    stages.times["train"][0] += trace_s  # the trace is the first call's
    stages.file("train", f"{steps} step{'s' if steps > 1 else ''} per call of the training step")
    if validation is not None:
        stages.file("validate", "1 batch per call of the evaluation step")
    stages.enter("checkpoint")
    save_s, restore_s = sandbox.round_trip()
    stages.file("checkpoint", f"saved in {save_s:.3f} s, restored in {restore_s:.3f} s, every variable back", save_s + restore_s)
    stages.enter("predict", timed=False)
    x, argument, batch_size = arguments.x, "x", arguments.batch_size
    if arguments.validation_data is not None:  # its inputs, as `predict` reads them
        x, argument = keras.utils.unpack_x_y_sample_weight(arguments.validation_data)[0], "validation_data"
        batch_size = arguments.validation_batch_size or batch_size
    if inputs.input_kind(x) == "generator":
        return stages.file("predict", f"`{argument}` is a generator, read once by then", ran=False)
    data = inputs.adapt(x, batch_size=batch_size, argument=argument)
    if inputs.input_kind(x) != "arrays" and isinstance(data.dataset, tf.data.Dataset):  # a batch's inputs alone
        data = dataclasses.replace(data, dataset=data.dataset.map(_inputs_only))
    plan = _one_batch(preparation.plan_of(owner, data))
    for _ in range(2):  # the first call, and the steady one
        inference.run_prediction(owner, plan, inference.callback_list([stages], 0, plan, owner.model))
    plan.close()
    stages.file("predict", f"1 batch per call of the prediction step, on `{argument}`")


def _inputs_only(*batch: Any) -> Any:
    """A batch's inputs, without its targets and sample weights."""
    return keras.utils.unpack_x_y_sample_weight(batch)[0]


def _enters(name: str, *, timed: bool = True) -> Callable[..., None]:
    """A hook of `_Stages`: the stage `name` runs from the hook on (timed: a call of it)."""
    return lambda self, *args, **kwargs: self.enter(name, timed=timed)


class _Stages(keras.callbacks.Callback):
    """The stages filed so far, and the stage running now, told apart by the budgeted fit's hooks.

    Each stage's calls are timed from hook to hook: an epoch's training from
    its begin hook to its validation's (or its end hook), the validation to
    its end hook, a prediction from its begin hook to its end hook; the
    services' epoch end (the best checkpoint, the checkpoints) runs as the
    `"checkpoint"` stage. A stage's second call is its steady one.
    """

    def __init__(self):
        super().__init__()
        self.stages: dict[str, DryRunStage] = {}
        self.times: dict[str, list[float]] = {}  # the seconds of each call of a stage
        self.error: Exception | None = None
        self.current, self._timed, self._start = "prepare", True, time.perf_counter()

    def enter(self, name: str, *, timed: bool = True) -> None:
        """The stage `name` runs from now (timed: a call of it); files the time of the call before."""
        now = time.perf_counter()
        if self._timed:
            self.times.setdefault(self.current, []).append(now - self._start)
        self.current, self._timed, self._start = name, timed, now

    on_epoch_begin = _enters("train")
    on_test_begin = _enters("validate")
    on_predict_begin = _enters("predict")
    on_test_end = on_predict_end = _enters("train", timed=False)
    on_epoch_end = on_train_end = _enters("checkpoint", timed=False)

    def file(self, name: str, detail: str, seconds: float | None = None, *, ran: bool = True) -> None:
        """Files stage `name`: run (its first call's time, or `seconds`, and its second, the steady call), or not."""
        self.enter(name, timed=False)
        times = self.times.get(name, [None])  # none for a stage not run
        self.stages[name] = DryRunStage(name, ran, times[0] if seconds is None else seconds, times[1] if len(times) > 1 else None, detail)

    def fail(self, error: Exception) -> None:
        """Files the error of the stage running now."""
        seconds, self.error = time.perf_counter() - self._start, error
        self.stages[self.current] = DryRunStage(self.current, True, seconds, error=files.error_line(error))

    def report(self) -> tuple[DryRunStage, ...]:
        """Every stage in order: where one failed, those before it as far as they ran, none after it."""
        failed = STAGES.index(self.current) if self.error is not None else len(STAGES)
        stages = []
        for index, name in enumerate(STAGES):
            if index > failed:
                stages.append(DryRunStage(name, False, detail=f"the {self.current!r} stage failed"))
            else:
                stages.append(self.stages.get(name) or DryRunStage(name, True, (self.times.get(name) or [None])[0]))
        return tuple(stages)


def _one_batch(plan: EpochPlan) -> EpochPlan:
    """`plan`, its passes cut to one batch (the dry run's budget of a validation or a prediction)."""
    plan.steps_per_epoch = 1
    return plan
