"""Restoring a run: `restore_run`, one named call per step, in the order they run.

With a `model_dir`, a `fit` resumes in this order; each part of the run's
state loads itself, under the key it saves under:

1. find and validate: the newest checkpoint of `model_dir` (else
   `resume_from`'s), every tensor of it read and its services' states parsed
   (a damaged one is skipped, warned, for the one before); nothing of a
   checkpoint is used before it validates
   (`tftrain.checkpoint.Checkpointer.find`);
2. the run record: the new call is compared with the checkpoint's
   (`tftrain.checkpoint.run_record`), and a change it cannot follow is
   refused, naming it, before anything is assigned;
3. the data position makes the pipeline keep its position as the checkpoint
   did (`tftrain.checkpoint.data_position.DataPosition.load`);
4. the progress, the model and optimizer (and the data iterator first),
   checked compatible before anything is assigned
   (`tftrain.checkpoint.Checkpointer.restore`); then the changes taken from
   the record are put in effect (the user's new learning rate over the
   checkpoint's), said one line each, and written to `model_dir/run_record.json`;
5. the services' state (each service's `load_state_dict`, by its name);
6. the data position (`DataPosition.resume`: arrays at their next unread
   example, in their pass's saved order; an iterator where it was saved).
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from typing import Any

from tftrain import checkpoint as checkpoint_lib
from tftrain.checkpoint import run_record
from tftrain.checkpoint.data_position import DataPosition
from tftrain.checkpoint.state import check_built
from tftrain.options import RunOptions
from tftrain.services.protocol import Service

__all__ = ["RestoreRequest", "report_resume", "restore_run"]


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
        data: The training data's position (its plan, pipeline and saved state).
        services: The run's services, each given its saved state by name.
        record: The call's run record (saved with every checkpoint, compared at a resume), or None (none kept).
        verbose: 0 logs the resume; otherwise it is printed too.
        writes_record_file: Whether this process writes `model_dir/run_record.json` (the chief).
        built_in_names: The built-in services' names: a checkpoint's state of
            one the run does not have is dropped without a word (a user's is warned).
    """

    options: RunOptions
    model: Any
    data: DataPosition
    services: tuple[Service, ...]
    record: run_record.RunRecord | None
    verbose: int
    writes_record_file: bool
    built_in_names: frozenset[str] = frozenset()


def restore_run(
    checkpointer: checkpoint_lib.Checkpointer, request: RestoreRequest
) -> checkpoint_lib.Progress | None:
    """The restore sequence (module doc), one named step after the other.

    Args:
        checkpointer: The run's checkpoints.
        request: What to restore into.

    Returns:
        Where the run resumes, or None: nothing to resume (its pipeline is made ready all the same).

    Raises:
        ValueError: a checkpoint exists but the model is not built to take it.
        tftrain.checkpoint.CheckpointError: no checkpoint found can be used.
        tftrain.errors.RunChangedError: the call changed what the checkpoint
            cannot follow (nothing is restored).
    """
    validated = checkpointer.find(request.options.resume_from)  # 1. find, validate
    if validated is None:
        request.data.load(None)
        _report(None, run_record.Comparison(), request)
        return None
    check_built(request.model, f"resume from {validated.path}", " before `fit`")
    comparison, next_epoch = _compare_record(validated, request)  # 2. the run record
    record = request.record  # the run's optimizers by their place in it (the model's alone where it names none)
    optimizers = dict(record.optimizers or {"optimizer": request.model.optimizer}) if record is not None else {}
    learning_rates = run_record.learning_rates(optimizers)  # the user's, before the restore
    iterator = request.data.load(validated, fresh_pass=next_epoch)  # 3. the data pipeline
    progress = checkpointer.restore(validated, iterator)  # 4. progress, model, optimizer (the iterator first)
    if progress is None:  # damaged where only a restore reads it: the checkpoint before it
        return restore_run(checkpointer, request)
    comparison = run_record.apply_taken(comparison, optimizers, learning_rates)
    resumed = _at_next_epoch(progress) if next_epoch else progress  # the rest of its epoch not trained
    _report(validated.path, comparison, request, resumed)
    _load_services_state(request, validated)  # 5. the services' state
    request.data.resume(progress, checkpointer.iterator_restored, comparison.saved_batch_size)  # 6. data position
    return resumed


def _compare_record(
    validated: checkpoint_lib.ValidatedCheckpoint, request: RestoreRequest
) -> tuple[run_record.Comparison, bool]:
    """The call against the checkpoint's run record; raises if a change is refused.

    Returns the comparison and whether the run goes on at the next epoch
    (`on_data_change="next_epoch"` took a data change made mid-epoch).
    """
    if request.record is None:
        return run_record.Comparison(), False
    progress, options = validated.progress, request.options
    comparison = request.record.compare(
        validated.states,
        mid_epoch=progress.step_in_epoch > 0 or progress.batches_in_pass > 0,
        convertible=request.data.plan.position is not None,
    )
    next_epoch = comparison.data_only and options.on_data_change == "next_epoch"
    if next_epoch:
        comparison = comparison.at_next_epoch()
    if comparison.refused:
        where = f"the checkpoint of step {progress.global_step} ({validated.path})"
        raise run_record.refusal(comparison, where, options.model_dir)
    return comparison, next_epoch


def _report(
    path: str | None,
    comparison: run_record.Comparison,
    request: RestoreRequest,
    restored: checkpoint_lib.Progress | None = None,
) -> None:
    """Says where the run resumed and each change taken; writes the record's readable copy."""
    if restored is not None:
        report_resume(
            f"tftrain: resumed from {path} at step {restored.global_step} "
            f"(epoch {restored.epoch + 1}, step {restored.step_in_epoch} of the epoch).",
            request.verbose,
        )
    if request.record is not None:
        run_record.log_taken(comparison, request.verbose)
        if request.writes_record_file:
            step = restored.global_step if restored is not None else 0
            run_record.write_file(request.options.model_dir, request.record.record, comparison, step)


def _load_services_state(request: RestoreRequest, validated: checkpoint_lib.ValidatedCheckpoint) -> None:
    """Each service's saved state, by name; a saved state no service takes is warned."""
    states = validated.states
    for service in request.services:
        if service.name in states:
            service.load_state_dict(states[service.name])
    running = {service.name for service in request.services}
    unmatched = sorted(name for name in states if name not in running and name not in request.built_in_names)
    if unmatched:
        warnings.warn(
            f"The checkpoint {validated.path} holds the state of services this run does not have: "
            f"{unmatched} (the run's services: {sorted(running)}). Their state is not restored; it is dropped "
            "from the next checkpoint. Pass those services in `Trainer(services=[...])` to keep them.",
            stacklevel=5,
        )


def _at_next_epoch(progress: checkpoint_lib.Progress) -> checkpoint_lib.Progress:
    """Where a run resumes that does not train the rest of the checkpoint's epoch: the start of the next."""
    epoch = progress.epoch + (1 if progress.step_in_epoch else 0)  # at an epoch end mid-pass: that next epoch
    return dataclasses.replace(progress, epoch=epoch, step_in_epoch=0, batches_in_pass=0)
