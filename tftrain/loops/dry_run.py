"""The dry run before a long run: `Trainer.check`, each stage of a `fit` once, timed, and everything put back.

A long run that fails at its first validation, checkpoint or export has lost
an epoch. `run_check` takes `fit`'s own arguments and runs, in seconds, what
the run will do, in its order: the call's preparation (`fit`'s argument
checks, inputs adapted, variables built), one host call of training (and a
second, timed as the steady call), one batch of validation through the
evaluation step, a checkpoint saved and restored in a temporary directory
(every variable checked to come back), one batch of prediction and, where
asked, an export to a temporary directory. Each stage runs on the engine the
`fit` would use (eager, `tf.function`, XLA, k steps per call, the strategy,
the mixed-precision policy), through step loops made for the check alone
(`Engines.new_runner`): the Trainer's own engines, their traces and
`steps_per_loop="auto"`'s measurements are not touched.

Then everything is put back, also after an error or a KeyboardInterrupt:
every variable of the training state, bit for bit (`StateCopy`: the model,
its seed generators, the optimizer, the metrics, `checkpoint_state()`, the
global step), and the NumPy and Python global random states. No callback
hook runs, nothing is written to `model_dir` (nor is it read or created),
and `trainer.timing` is the last fit's. The first failing stage stops the
check: the state is put back and `DryRunError` raised, naming the stage.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tftrain import checkpoint as checkpoint_lib
from tftrain.arguments import check_verbose
from tftrain.engine.calls import LoopResult
from tftrain.engine.step_runner import StepRunner
from tftrain.errors import DryRunError, NonFiniteLossError
from tftrain.fit_inputs import inputs
from tftrain.fit_inputs.epoch_plan import EpochPlan
from tftrain.loops import preparation
from tftrain.loops.owner import StepOwner
from tftrain.loops.state_copy import StateCopy

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
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise ValueError(
            f"Invalid value for argument `name`. Received: name={name!r}. Expected one of {STAGES}."
        )

    def summary(self) -> str:
        """The report as text: each stage, its times or why it did not run, and the first error."""
        failed = self.failed_stage
        outcome = "ok" if failed is None else f"failed in its {failed.name!r} stage"
        lines = [f"dry run ({self.engine}): {outcome}, {self.seconds:.2f} s in all"]
        for stage in self.stages:
            if stage.error is not None:
                text = f"FAILED after {stage.seconds:.3f} s: {stage.error}"
            elif not stage.ran:
                text = f"not run: {stage.detail}"
            else:
                text = f"{stage.seconds:.3f} s"
                if stage.steady_seconds is not None:
                    text += f" (first call), {stage.steady_seconds:.3f} s (steady call)"
                text += f": {stage.detail}" if stage.detail else ""
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
    raise TypeError(
        f"Invalid value for argument `export`. Received: export={export!r}. Expected True (export "
        "to a temporary directory, with `Trainer.export`'s defaults), False (no export), or a dict of "
        'keyword arguments for `Trainer.export` (e.g. {"format": "tf_saved_model"}).'
    )


def run_check(
    owner: StepOwner,
    fit_arguments: preparation.FitArguments,
    *,
    export_to: Callable[..., None],
    export: Any = False,
    verbose: int | str = "auto",
) -> DryRunReport:
    """Runs the dry run of a `fit` call on `owner` and puts everything back.

    `Trainer.check` calls this with itself as `owner`; it documents what
    runs, what is put back and the errors.

    Args:
        owner: The owner of the steps.
        fit_arguments: `fit`'s arguments.
        export_to: Exports the model to a path, with keyword arguments
            (`Trainer.export`), where `export` asks for an export.
        export: `check`'s `export` (`check_export`): whether to export, or
            the keyword arguments of the export.
        verbose: As `fit`'s: prints the report's summary unless 0.

    Returns:
        The `DryRunReport`, every stage passed.

    Raises:
        TypeError, ValueError: a bad `export` or `verbose` (before anything runs).
        DryRunError: a stage failed (its error chained).
    """
    verbose = check_verbose(verbose)
    export_arguments = check_export(export)
    start = time.perf_counter()
    run = _DryRun(owner, fit_arguments, export_to if export_arguments is not None else None, export_arguments)
    stages: list[DryRunStage] = []
    error: Exception | None = None
    try:
        for name in STAGES:
            if error is None:
                stage, error = _run_stage(run, name)
            else:
                stage = DryRunStage(name, False, detail=f"the {_failed_name(stages)!r} stage failed")
            stages.append(stage)
    finally:
        run.put_back()
    report = DryRunReport(owner.engines.options.name, tuple(stages), time.perf_counter() - start)
    if verbose:
        print(report.summary())
    if error is not None:
        failed = report.failed_stage
        raise DryRunError(
            f"The dry run failed in its {failed.name!r} stage: {failed.error} (everything was put back "
            "as it was: fix this and run `check` again).",
            stage=failed.name,
            report=report,
        ) from error
    return report


def _run_stage(run: _DryRun, name: str) -> tuple[DryRunStage, Exception | None]:
    """Runs one stage; returns it, and the error it met (any error: each is reported with its stage)."""
    start = time.perf_counter()
    try:
        return getattr(run, name)(), None
    except Exception as error:
        return DryRunStage(name, True, seconds=time.perf_counter() - start, error=_one_line(error)), error


def _failed_name(stages: list[DryRunStage]) -> str:
    """The name of the stage that failed among `stages`."""
    return next(stage.name for stage in stages if stage.error is not None)


# First lines that only announce the message on the lines after them.
_PREAMBLES = ("Exception encountered when calling", "Graph execution error")
_NOT_THE_MESSAGE = ("Detected at node", "Arguments received by")
_ANSI_STYLE = re.compile(r"\x1b\[[0-9;]*m")  # Keras sets the message of a layer's error in bold


def _one_line(error: BaseException) -> str:
    """`"TypeName: message"` on one line: the first line, and where it only announces the message (a Keras
    layer's or a graph's execution error), the first line of the message itself."""
    lines = [line.rstrip() for line in _ANSI_STYLE.sub("", str(error)).splitlines() if line.strip()]
    text = lines[0].strip() if lines else ""
    if text.startswith(_PREAMBLES):
        message = [
            line for line in lines[1:] if not line[0].isspace() and not line.startswith(_NOT_THE_MESSAGE)
        ]
        text = f"{text} {message[0]}" if message else text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _host_call(runner: StepRunner, plan: EpochPlan, iterator: Iterator[Any], done: int, steps: int) -> LoopResult:
    """One host call of up to `steps` steps, as the epoch loop makes it, read (its device work done).

    Batches known to be there are read directly; where the data may end
    unannounced, the first batch is peeked (a call with none runs no step).
    """
    left = plan.batches_left(done)
    if left is not None:
        steps = min(steps, left)
        if steps <= 0:
            return LoopResult(0, 0, None)
    first = None
    if plan.may_end_unannounced:
        first = runner.peek(iterator)
        if not first.has_value():
            return LoopResult(0, 0, None)
    return runner.dispatch(iterator, steps, first, available=not plan.may_end_unannounced).result()


@dataclasses.dataclass
class _Calls:
    """Two host calls of one stage: the first (trace and steps) and the steady one."""

    first: LoopResult
    first_s: float
    second: LoopResult
    second_s: float

    def stage(self, name: str, detail: str) -> DryRunStage:
        """The stage that ran these calls: the first call's time, and the second's where it ran a step."""
        steady = self.second_s if self.second.steps else None
        return DryRunStage(name, True, seconds=self.first_s, steady_seconds=steady, detail=detail)


class _DryRun:
    """The stages of one dry run, each a method named after it, and what puts everything back."""

    def __init__(
        self,
        owner: StepOwner,
        fit_arguments: preparation.FitArguments,
        export: Callable[..., None] | None,
        export_arguments: dict[str, Any] | None,
    ):
        self.owner, self.engines = owner, owner.engines
        self.fit_arguments = fit_arguments
        self.export_call, self.export_arguments = export, export_arguments or {}
        self.copy = StateCopy(owner)
        self.copy.take()
        self.random_states = (np.random.get_state(), random.getstate())
        self.call: preparation.FitCall | None = None
        self.train_iterator: Iterator[Any] | None = None
        self.plans: list[EpochPlan] = []
        self.directory: str | None = None

    # ---------------------------------------------------------------- stages

    def prepare(self) -> DryRunStage:
        start = time.perf_counter()
        self.call = preparation.fit_call(self.owner, self.fit_arguments)
        self.plans.append(self.call.plan)
        self.copy.take()  # variables the preparation built, at their initial values
        return DryRunStage(
            "prepare",
            True,
            seconds=time.perf_counter() - start,
            detail="fit's arguments checked, inputs adapted, variables built",
        )

    def train(self) -> DryRunStage:
        plan, steps = self.call.plan, self.engines.options.fixed_steps
        runner = self.engines.new_runner("train")
        self.owner.reset_metrics()  # as each epoch starts
        self.train_iterator = plan.begin_epoch()
        calls = self._two_calls(runner, plan, self.train_iterator, steps, "x")
        for result in (calls.first, calls.second):
            if result.nonfinite:
                raise NonFiniteLossError(
                    "The training loss was NaN or infinite (or above `loss_spike_threshold`) in the dry "
                    f"run's first {calls.first.steps + calls.second.steps} steps: `fit` would stop there. "
                    "Check the data, the loss and the learning rate."
                )
        return calls.stage("train", f"{_steps(calls.first.steps)} per call of the training step")

    def validate(self) -> DryRunStage:
        if self.call.validation is None:
            return DryRunStage(
                "validate", False, detail="no validation data (`validation_data`, `validation_split`)"
            )
        plan = self.call.validation.plan  # adapted here where `fit` adapts it at its first validation
        runner = self.engines.new_runner("eval")
        self.owner.reset_metrics()  # as an evaluation starts
        with self.owner.averaged_weights():
            calls = self._two_calls(runner, plan, plan.begin_epoch(), 1, "validation_data")
        return calls.stage("validate", "1 batch per call of the evaluation step")

    def checkpoint(self) -> DryRunStage:
        """Saves and restores the training state in a temporary directory; every variable must come back."""
        owner = self.owner
        checkpointer = checkpoint_lib.Checkpointer(
            os.path.join(self._directory(), "checkpoints"),
            lambda: checkpoint_lib.training_state(owner.model, owner.checkpoint_state()),
            max_to_keep=1,
            global_step=owner.global_step,
            async_write=owner.run_options.async_checkpoint,
        )
        variables = self.copy.variables()
        saved = _fingerprints(variables)
        start = time.perf_counter()
        checkpointer.save(checkpoint_lib.Progress(global_step=int(owner.global_step.numpy())))
        checkpointer.sync()
        save_s = time.perf_counter() - start
        self.copy.zero()  # a variable the restore misses would stay zero
        start = time.perf_counter()
        checkpointer.restore_latest()
        restore_s = time.perf_counter() - start
        differing = [
            variable.name
            for variable, before, after in zip(variables, saved, _fingerprints(variables), strict=True)
            if before != after
        ]
        if differing:
            raise ValueError(
                f"The checkpoint saved did not restore {len(differing)} variables to their saved values "
                f"(e.g. {differing[0]}). Expected every variable of the training state back."
            )
        return DryRunStage(
            "checkpoint",
            True,
            seconds=save_s + restore_s,
            detail=f"saved in {save_s:.3f} s, restored in {restore_s:.3f} s, every variable back",
        )

    def predict(self) -> DryRunStage:
        x, argument, batch_size = self._prediction_input()
        if inputs.input_kind(x) == "generator":
            return DryRunStage("predict", False, detail=f"`{argument}` is a generator, read once by then")
        adapted = inputs.adapt(x, batch_size=batch_size, argument=argument)
        if inputs.input_kind(x) != "arrays" and isinstance(adapted.dataset, tf.data.Dataset):
            # `predict` is given inputs: a batch's targets and weights are left out.
            adapted = dataclasses.replace(adapted, dataset=adapted.dataset.map(_inputs_only))
        plan = preparation.plan_of(self.owner, adapted)
        self.plans.append(plan)
        runner = self.engines.new_runner("predict")
        with self.owner.averaged_weights():
            calls = self._two_calls(runner, plan, plan.begin_epoch(), 1, argument)
        return calls.stage("predict", f"1 batch per call of the prediction step, on `{argument}`")

    def export(self) -> DryRunStage:
        if self.export_call is None:
            return DryRunStage("export", False, detail="not asked for (`export=True`)")
        start = time.perf_counter()
        # Quiet by default: Keras's message would name the temporary directory.
        arguments = {"verbose": False, **self.export_arguments}
        self.export_call(os.path.join(self._directory(), "export"), **arguments)
        return DryRunStage(
            "export", True, seconds=time.perf_counter() - start, detail="to a temporary directory"
        )

    # --------------------------------------------------------------- helpers

    def _two_calls(
        self, runner: StepRunner, plan: EpochPlan, iterator: Iterator[Any], steps: int, argument: str
    ) -> _Calls:
        """Two host calls of `steps` steps; the first traces the step (its new variables copied first)."""
        start = time.perf_counter()
        if hasattr(runner.step, "get_concrete_function"):
            runner.step.get_concrete_function(iterator.element_spec)
        trace_s = time.perf_counter() - start
        self.copy.take()  # variables the trace made, at their initial values
        start = time.perf_counter()
        first = _host_call(runner, plan, iterator, 0, steps)
        first_s = trace_s + time.perf_counter() - start
        if first.steps == 0:
            raise ValueError(
                f"Invalid value for argument `{argument}`: the data yielded no batches. Expected at least "
                "one batch; check filters or `take`."
            )
        start = time.perf_counter()
        second = _host_call(runner, plan, iterator, first.steps, steps)
        return _Calls(first, first_s, second, time.perf_counter() - start)

    def _prediction_input(self) -> tuple[Any, str, int | None]:
        """What the predict stage reads: the validation data's inputs, else the training inputs (and their batch size)."""
        arguments = self.fit_arguments
        if arguments.validation_data is not None:
            x = keras.utils.unpack_x_y_sample_weight(arguments.validation_data)[0]
            return x, "validation_data", arguments.validation_batch_size or arguments.batch_size
        return arguments.x, "x", arguments.batch_size

    def _directory(self) -> str:
        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="tftrain_dry_run_")
        return self.directory

    # ---------------------------------------------------------------- put back

    def put_back(self) -> None:
        """Closes the plans, puts every variable and the global random states back, removes the temporary files."""
        with contextlib.ExitStack() as stack:
            if self.directory is not None:
                stack.callback(shutil.rmtree, self.directory, ignore_errors=True)
            stack.callback(self.copy.warn_not_copied, "check", stacklevel=4)
            stack.callback(random.setstate, self.random_states[1])
            stack.callback(np.random.set_state, self.random_states[0])
            stack.callback(self.copy.restore)
            for plan in self.plans:
                stack.callback(plan.close)
            if self.call is not None and self.call.validation is not None:
                stack.callback(self.call.validation.close)


def _fingerprints(variables: list[Any]) -> list[bytes]:
    """A digest of each variable's value (a distributed one's value as a whole, as a checkpoint saves it)."""
    return [
        hashlib.blake2b(np.ascontiguousarray(v.numpy()).tobytes(), digest_size=16).digest() for v in variables
    ]


def _inputs_only(*batch: Any) -> Any:
    """A batch's inputs (`x` of `(x, y, sample_weight)`), as Keras's `predict_step` unpacks them."""
    return keras.utils.unpack_x_y_sample_weight(batch)[0]


def _steps(count: int) -> str:
    return f"{count} step" if count == 1 else f"{count} steps"
