"""Every public exception of tftrain, in one place.

Each is also importable from the module that raises it (e.g.
`tftrain.checkpoint.CheckpointError`); this module imports nothing from
tftrain, so every layer can raise them.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CheckpointError",
    "CheckpointWriteError",
    "CorruptCheckpointError",
    "DatasetUnavailableError",
    "DryRunError",
    "EvaluationTimeoutError",
    "IncompatibleCheckpointError",
    "KerasInternalsError",
    "ModelDirError",
    "ModelDirInUseError",
    "NonFiniteLossError",
    "NonFiniteStateError",
    "PreemptedError",
    "RunChangedError",
    "StrategySetupError",
]


class NonFiniteLossError(FloatingPointError):
    """A training step produced a NaN or infinite loss; training stopped at that step."""


class PreemptedError(RuntimeError):
    """Training stopped on a preemption signal (e.g. SIGTERM) after saving a checkpoint at that step.

    Rerunning the same `fit` on the same `model_dir` resumes from that
    checkpoint exactly. A job script typically catches it and exits, so the
    scheduler restarts it.

    Attributes:
        signal_number: The signal that arrived (in a multi-worker run, the
            one that reached a worker first; every worker reports it), or
            None if it could not be learnt from the worker it reached.
        step: The global step at which the run stopped (the same on every worker).
        checkpoint: The checkpoint written for that step (in a multi-worker
            run, the chief's, in `model_dir/checkpoints`).
    """

    def __init__(self, message: str, *, signal_number: int | None, step: int, checkpoint: str | None):
        super().__init__(message)
        self.signal_number = signal_number
        self.step = step
        self.checkpoint = checkpoint


class CheckpointError(RuntimeError):
    """A checkpoint could not be used."""


class CorruptCheckpointError(CheckpointError):
    """No recorded checkpoint in a directory can be read."""


class IncompatibleCheckpointError(CheckpointError, ValueError):
    """A checkpoint does not fit the model (variables missing, extra, or of another shape)."""


class RunChangedError(IncompatibleCheckpointError):
    """A resume changed what its checkpoint cannot follow (the optimizer's class, the model, EMA, the data mid-epoch).

    Raised before anything is restored; the message names each change and the
    ways forward (a new `model_dir`, or the settings the checkpoint was written with).
    """


class NonFiniteStateError(CheckpointError, FloatingPointError):
    """Training state holds NaN or infinite values, so it is not checkpointed."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (a full disk, a denied permission, a quota, a lost directory).

    The error the write met is chained as `__cause__`. What was recorded
    before it is untouched: rerunning `fit` on the same `model_dir` resumes
    from `kept`.

    Attributes:
        checkpoint: The checkpoint (path prefix) that could not be written,
            or None where the write was refused before it had a name.
        kept: The newest recorded checkpoint still on disk, which a rerun
            resumes from, or None if there is none.
    """

    def __init__(self, message: str, *, checkpoint: str | None = None, kept: str | None = None):
        super().__init__(message)
        self.checkpoint = checkpoint
        self.kept = kept


class ModelDirError(CheckpointWriteError):
    """A run's `model_dir` was removed, or its writer lock removed or taken, while the run used it.

    The run stops before writing anything more: it never recreates a
    directory removed under it, nor writes beside another writer.

    Attributes:
        directory: The directory that changed: the `model_dir`, or a
            checkpoint directory in it.
        checkpoint: None (nothing was written).
        kept: The newest recorded checkpoint still on disk, or None.
    """

    def __init__(self, message: str, *, directory: str | None = None, kept: str | None = None):
        super().__init__(message, kept=kept)
        self.directory = directory


class ModelDirInUseError(RuntimeError):
    """Another live process is writing to the same `model_dir`."""


class DatasetUnavailableError(RuntimeError):
    """A tensorflow-datasets dataset is not prepared in its `data_dir` and could not be downloaded.

    Attributes:
        name: The dataset name.
        data_dir: The tensorflow-datasets data directory that was searched.
    """

    def __init__(self, message: str, *, name: str | None = None, data_dir: str | None = None):
        super().__init__(message)
        self.name = name
        self.data_dir = data_dir

    def __reduce__(self):
        return _unavailable_error, (str(self), self.name, self.data_dir)


class DryRunError(RuntimeError):
    """A stage of `Trainer.check`, the dry run before a long run, failed; everything was put back as it was.

    The message names the stage and the error in one line; the error itself
    is chained as `__cause__`, with its traceback.

    Attributes:
        stage: The stage that failed: `"prepare"`, `"train"`, `"validate"`,
            `"checkpoint"`, `"predict"` or `"export"`.
        report: The `tftrain.DryRunReport` of the run: the stages before it,
            with their times, and this one with its error.
    """

    def __init__(self, message: str, *, stage: str, report: Any = None):
        super().__init__(message)
        self.stage = stage
        self.report = report

    def __reduce__(self):
        return _dry_run_error, (str(self), self.stage, self.report)


class EvaluationTimeoutError(TimeoutError):
    """No new checkpoint arrived in a `model_dir` within the evaluator's timeout."""


class StrategySetupError(RuntimeError):
    """The requested strategy cannot be set up (no TPU found, devices already initialized)."""


class KerasInternalsError(RuntimeError):
    """The installed Keras or TensorFlow lacks a private API tftrain relies on."""


def _unavailable_error(message: str, name: str | None, data_dir: str | None) -> DatasetUnavailableError:
    return DatasetUnavailableError(message, name=name, data_dir=data_dir)


def _dry_run_error(message: str, stage: str, report: Any) -> DryRunError:
    return DryRunError(message, stage=stage, report=report)
