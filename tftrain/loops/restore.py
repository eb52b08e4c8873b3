"""Restoring a run: one function, `restore_run`, whose steps are named in the order they run.

With a `model_dir`, a `fit` resumes in this order:

1. find: the newest checkpoint of `model_dir` (else `resume_from`'s);
2. validate: every tensor of it is read and its services' states parsed
   (a damaged one is skipped, warned, for the one before); nothing of a
   checkpoint is used before it validates; then the run record: the new call
   is compared with the checkpoint's record (`tftrain.checkpoint.run_record`),
   and a change it cannot follow is refused, naming it;
3. model and optimizer (and the data iterator), checked compatible before
   anything is assigned (`tftrain.checkpoint.Checkpointer.restore_latest`);
   then the changes taken from the record are put in effect (the user's new
   learning rate over the checkpoint's), said one line each, and written to
   `model_dir/run_record.json`;
4. the services' state (each service's `load_state_dict`, by name): the
   services are built after step 3, from what it restored;
5. the data position (`EpochPlan.resume`; arrays at their next unread
   example, in their pass's saved order).
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from tftrain import checkpoint as checkpoint_lib
from tftrain.checkpoint import data_position, run_record
from tftrain.fit_inputs.epoch_plan import EpochPlan
from tftrain.options import RunOptions
from tftrain.services.protocol import Service

__all__ = ["Restored", "RestoreRequest", "report_resume", "restore_run"]

# The order of a shuffled array pass, as `CheckpointService(data_state=...)` saves it.
_ORDER_KEY = "data/epoch_order" + checkpoint_lib.VARIABLE_SUFFIX


def report_resume(message: str, verbose: int) -> None:
    """Logs where a run resumed (`tftrain` logger), and prints it unless `verbose` is 0."""
    logging.getLogger("tftrain").info(message)
    if verbose:
        print(message)


@dataclasses.dataclass(frozen=True)
class RestoreRequest:
    """What a restore reads and restores into.

    Attributes:
        options: The run options (`model_dir`, `resume_from`, `on_data_change`).
        model: The model, with its optimizer.
        plan: The training data's plan (its pipeline and position).
        record: The call's run record, or None (no record kept).
        verbose: 0 logs the resume; otherwise it is printed too.
        writes_record_file: Whether this process writes `model_dir/run_record.json` (the chief).
        built_in_names: The built-in services' names: a checkpoint's state of
            one the run does not have is dropped without a word (a user's is warned).
        optimizers: The run's optimizers by their place in the record
            (`run_record.optimizers_of`); None: the model's alone.
    """

    options: RunOptions
    model: Any
    plan: EpochPlan
    record: dict[str, Any] | None
    verbose: int
    writes_record_file: bool
    built_in_names: frozenset[str] = frozenset()
    optimizers: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Restored:
    """What steps 1 to 3 found and restored.

    Attributes:
        progress: Where the run resumes (None: nothing to resume).
        data_mode: How checkpoints keep the data position: the validated
            checkpoint's (a resume reads it as it was saved), else the one
            that suits the pipeline; None where the iterators are
            distributed (never saved).
        comparison: The call against the checkpoint's run record, its
            changes taken already in effect.
        saved_order: The order of the pass of shuffled arrays the checkpoint
            was in (None: none saved).
        at_next_epoch: The run resumes at the start of the epoch after the
            checkpoint's (`on_data_change="next_epoch"` took a data change).
    """

    progress: checkpoint_lib.Progress | None
    data_mode: str | None
    comparison: run_record.Comparison
    saved_order: Any = None
    at_next_epoch: bool = False


def restore_run(
    checkpointer: checkpoint_lib.Checkpointer,
    request: RestoreRequest,
    build_services: Callable[[Restored], list[Service]],
) -> tuple[Restored, list[Service]]:
    """The restore sequence (module doc), one named step after the other.

    Args:
        checkpointer: The run's checkpoints.
        request: What to restore into.
        build_services: Builds the run's services from what steps 1 to 3
            restored (a resumed run's services start where it stopped).

    Returns:
        What was restored, and the services, their state restored.

    Raises:
        ValueError: a checkpoint exists but the model is not built to take it.
        tftrain.checkpoint.CheckpointError: no checkpoint found can be used.
        tftrain.errors.RunChangedError: the call changed what the checkpoint
            cannot follow (nothing is restored).
    """
    _check_model_built(_find(checkpointer, request.options), request.model)  # 1. find
    found = _validate_and_restore_model(checkpointer, request)  # 2. validate, 3. model and optimizer
    _report(found, checkpointer, request)
    services = build_services(found)
    if found.progress is not None:
        _restore_services_state(services, checkpointer, request.built_in_names)  # 4. the services' state
        _restore_data_position(request.plan, checkpointer, found)  # 5. the data position
    return found, services


def _find(checkpointer: checkpoint_lib.Checkpointer, options: RunOptions) -> str | None:
    """The checkpoint to resume from: `model_dir`'s own newest wins over `resume_from`."""
    return checkpointer.latest or options.resume_from


def _check_model_built(source: str | None, model: Any) -> None:
    if source is not None and not model.built:
        raise ValueError(
            f"Cannot resume from {source}: the model is not built yet, so its variables "
            "do not exist to be restored. Expected a built model: call it once on a batch, or "
            "`model.build(input_shape)`, before `fit`."
        )


class _RecordCheck:
    """Step 2's check of a validated checkpoint against the call, and the data pipeline made ready for step 3.

    The checkpointer calls it once per checkpoint it tries (again for an
    older one where restoring a newer one failed): what it found is kept for
    the last one.
    """

    def __init__(self, request: RestoreRequest):
        self.request = request
        self.mode: str | None = None
        self.comparison = run_record.Comparison()
        self.saved_order: Any = None
        self.next_epoch = False
        self.called = False

    def __call__(self, validated: checkpoint_lib.ValidatedCheckpoint | None) -> Any:
        """Checks the call against the validated checkpoint's record, then makes the data pipeline keep its position as that checkpoint did.

        Returns the iterator whose saved state to restore, or None for
        arrays: their position is kept in examples, with the pass's order
        where shuffled (an iterator's state holds the position, not the
        order), and the resumed pass reads the rest of its examples in that
        order (step 5).
        """
        options, plan, record = self.request.options, self.request.plan, self.request.record
        self.called, self.comparison, self.saved_order, self.next_epoch = True, run_record.Comparison(), None, False
        states = validated.states if validated is not None else None
        if record is not None and validated is not None:
            progress = validated.progress
            comparison = run_record.compare(
                states.get(run_record.RECORD_KEY),
                record,
                mid_epoch=progress.step_in_epoch > 0 or progress.batches_in_pass > 0,
                convertible=plan.position is not None,
            )
            if comparison.data_only and options.on_data_change == "next_epoch":
                comparison, self.next_epoch = comparison.at_next_epoch(), True
            if comparison.refused:
                where = f"the checkpoint of step {progress.global_step} ({validated.path})"
                raise run_record.refusal(comparison, where, options.model_dir)
            self.comparison = comparison
        self.mode = None
        if plan.plain_iterators:
            self.mode, plan.dataset = data_position.prepare(plan.dataset, data_position.saved_mode(states))
        if self.next_epoch:
            return None  # the next epoch is a fresh pass of the new data
        if plan.position is None:
            return plan.next_iterator()
        if validated is not None and plan.order is not None:
            self.saved_order = validated.tensor(_ORDER_KEY)
        return None  # arrays: the position in examples (step 5), not the iterator


def _validate_and_restore_model(checkpointer: checkpoint_lib.Checkpointer, request: RestoreRequest) -> Restored:
    """Steps 2 and 3, in the checkpointer in that order; then the changes the record took, put in effect."""
    optimizers = request.optimizers or {"optimizer": getattr(request.model, "optimizer", None)}
    users_learning_rates = run_record.learning_rates(optimizers)  # before a restore assigns the checkpoint's
    check = _RecordCheck(request)
    progress = checkpointer.restore_latest(prepare=check)
    if progress is None and request.options.resume_from is not None:
        _, progress = checkpointer.restore_from(request.options.resume_from, prepare=check)
    if progress is None:  # nothing to resume: a new run, its pipeline made ready all the same
        if not check.called:
            check(None)
        return Restored(None, check.mode, run_record.Comparison())
    comparison = run_record.apply_taken(check.comparison, optimizers, users_learning_rates)
    if check.next_epoch:  # the rest of the checkpoint's epoch is not trained
        epoch = progress.epoch + (1 if progress.step_in_epoch else 0)  # at an epoch end mid-pass: that next epoch
        progress = dataclasses.replace(progress, epoch=epoch, step_in_epoch=0, batches_in_pass=0)
        return Restored(progress, check.mode, comparison, at_next_epoch=True)
    return Restored(progress, check.mode, comparison, check.saved_order)


def _report(found: Restored, checkpointer: checkpoint_lib.Checkpointer, request: RestoreRequest) -> None:
    """Says where the run resumed and each change taken; writes the record's readable copy."""
    restored = found.progress
    if restored is not None:
        report_resume(
            f"tftrain: resumed from {checkpointer.restored_path} at step {restored.global_step} "
            f"(epoch {restored.epoch + 1}, step {restored.step_in_epoch} of the epoch).",
            request.verbose,
        )
    if request.record is not None:
        run_record.log_taken(found.comparison, request.verbose)
        if request.writes_record_file:
            step = restored.global_step if restored is not None else 0
            run_record.write_file(request.options.model_dir, request.record, found.comparison, step)


def _restore_services_state(
    services: Iterable[Service], checkpointer: checkpoint_lib.Checkpointer, built_in_names: frozenset[str]
) -> None:
    """Each service's saved state, by name; a saved state no service takes is warned."""
    services = list(services)
    states = checkpointer.service_states
    for service in services:
        if service.name in states:
            service.load_state_dict(states[service.name])
    running = {service.name for service in services}
    unmatched = sorted(name for name in states if name not in running and name not in built_in_names)
    if unmatched:
        warnings.warn(
            f"The checkpoint {checkpointer.restored_path} holds the state of services this run does not have: "
            f"{unmatched} (the run's services: {sorted(running)}). Their state is not restored; it is dropped "
            "from the next checkpoint. Pass those services in `Trainer(services=[...])` to keep them.",
            stacklevel=5,
        )


def _restore_data_position(plan: EpochPlan, checkpointer: checkpoint_lib.Checkpointer, found: Restored) -> None:
    """Where the resumed epoch goes on: arrays at their next unread example, an iterator where it was saved.

    None to find where the run starts the next epoch on new data.
    """
    if found.at_next_epoch:
        return
    restored = found.progress
    if plan.position is not None:
        examples = _examples_read(checkpointer.service_states, restored, found.comparison, plan)
        plan.resume_at_example(examples, restored.batches_in_pass, restored.step_in_epoch, found.saved_order)
    else:
        plan.resume(restored.batches_in_pass, restored.step_in_epoch, checkpointer.iterator_restored)


def _examples_read(
    states: dict[str, Any], restored: checkpoint_lib.Progress, comparison: run_record.Comparison, plan: EpochPlan
) -> int:
    """Examples of the pass the checkpointed run had read: from its batches read, its batch size and where its iterator started."""
    offset = tuple(states.get("data", {}).get("pass_offset", (0, 0)))
    batch_size = next(
        (change.saved for change in comparison.taken if change.key == "data.global_batch_size"),
        plan.position.batch_size,
    )
    return plan.position.examples_read(restored.batches_in_pass, offset, int(batch_size))
