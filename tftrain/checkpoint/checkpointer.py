"""Checkpoints for exact resume: what is saved, crash-safe saving, validated restore.

A `Checkpointer` keeps the checkpoints of one training run in a directory,
through `tf.train.Checkpoint` and `tf.train.CheckpointManager`. A checkpoint
holds the model, its optimizer (slots and iteration count), the state of every
Keras `SeedGenerator` the model uses (Dropout, random augmentation layers: not
part of a model's weights, so a plain weights checkpoint loses them), metric
states, the run's progress (epoch, step), the timing state, and the training
data iterator where `tf.data` can save it.

Saving is crash-safe because TensorFlow writes a checkpoint's files first and
only then records it in the `checkpoint` state file (an atomic rename): a kill
during a save leaves the previous checkpoint as the latest one. What such a
kill leaves behind (temporary directories, unrecorded files) is removed when a
`Checkpointer` restores. Restoring reads every tensor of a checkpoint before
assigning anything, so a corrupt checkpoint is found before it can half-restore
the model, and an older good one is used instead.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import tensorflow as tf

from tftrain.arguments import check_int
from tftrain.checkpoint import data_position, files, native_log
from tftrain.checkpoint.files import CHECKPOINT_NAME
from tftrain.checkpoint.state import SERVICE_STATES, Progress, saved_service_states
from tftrain.checkpoint.validation import (
    VARIABLE_SUFFIX,
    CorruptCheckpointError,
    IncompatibleCheckpointError,
    check_compatible,
    ensure_writable_directory,
    open_checkpoint,
    read_all_tensors,
)
from tftrain.checkpoint.writer_lock import lost_directory_error
from tftrain.compat import tf_internals
from tftrain.errors import CheckpointWriteError, ModelDirError, NonFiniteStateError


class ValidatedCheckpoint(NamedTuple):
    """A checkpoint read whole and found sound, before anything of it is restored (`Checkpointer.find`)."""

    path: str
    states: dict[str, Any]
    """The services' states, by name."""
    progress: Progress
    """Where the run was (read, not assigned)."""
    reader: tf.train.CheckpointReader
    own: bool = True
    """Whether it is the checkpoint directory's own (a damaged one falls back to the one before), not `resume_from`'s."""

    def tensor(self, key: str) -> Any:
        """A saved tensor by its key (e.g. `data/epoch_order/.ATTRIBUTES/VARIABLE_VALUE`), or None if absent."""
        return self.reader.get_tensor(key) if self.reader.has_tensor(key) else None


# What a checkpoint holds of the run besides the training state, the data and the services' states.
_RUN_STATE_KEYS = (Progress.name, "iterator_saved", "save_counter")


def _is_checkpointable_iterator(iterator: Any) -> bool:
    # tf.data iterators are trackable; distributed iterators are not.
    return isinstance(iterator, tf.data.Iterator)


class Checkpointer:
    """Saves and restores a training run's state in one directory.

    Args:
        directory: Where checkpoints go (created if needed).
        state: Name -> trackable (see `training_state`), or a function that
            returns it. A function is called at every save and restore, so
            state that appears late (a model built in its first step, with
            its Dropout seeds and metrics) is saved too.
        max_to_keep: Checkpoints kept; older ones are deleted.
        restore_directory: Where `restore_latest` reads from, if not
            `directory`; read-only (nothing there is cleaned or renamed).
            A non-chief worker of a multi-worker run restores the chief's
            checkpoints and saves its own copies to a scratch directory.
        global_step: The run's global step variable (the one the training
            step increments), saved and restored in place as the progress's
            `global_step`. None: a variable of the checkpointer's own, set
            from `Progress.global_step` at each save.
        async_write: Write checkpoints in a background thread
            (`tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)`):
            `save` copies the state to host memory and returns; the files are
            written while training goes on, and recorded as the latest
            checkpoint only once complete, so a crash mid-write leaves the
            previous one. The next `save`, `sync` and every restore wait for
            a pending write (and raise its error, if it failed).
        writer_check: Called before each write; raises `ModelDirError` to
            stop it (`tftrain.checkpoint.writer_lock.check_writer`: the
            `model_dir` is still there, its writer lock still this run's).
            `directory` itself is checked either way: a directory removed
            under the run is never recreated.

    Raises:
        ValueError: `directory` is a file or not writable, or `max_to_keep` < 1.
        TypeError: `async_write` is not a bool.
        tftrain.errors.KerasInternalsError: `async_write` where the
            installed TensorFlow cannot save asynchronously.
    """

    def __init__(
        self,
        directory: str,
        state: Mapping[str, Any] | Callable[[], Mapping[str, Any]],
        *,
        max_to_keep: int = 5,
        restore_directory: str | None = None,
        global_step: tf.Variable | None = None,
        async_write: bool = False,
        writer_check: Callable[[], None] | None = None,
    ):
        check_int("max_to_keep", max_to_keep)
        if not isinstance(async_write, bool):
            raise TypeError(
                f"Invalid value for argument `async_write`. Received: async_write={async_write!r}. "
                "Expected True or False."
            )
        if async_write:
            tf_internals.check_async_checkpoint_support()
        self.async_write = async_write
        # What the asynchronous writer copies to host memory: fixed at its first save.
        self._async_objects: list[int] | None = None
        self.directory = ensure_writable_directory(directory, "model_dir")
        self.max_to_keep = max_to_keep
        self.restore_directory = restore_directory or self.directory
        self.writer_check = writer_check
        self._pending: str | None = None  # an asynchronous write not known to be complete
        self._progress = Progress.variables(global_step)
        with tf.init_scope():
            self._iterator_saved = tf.Variable(False, trainable=False, name="iterator_saved")
            # The services' states, as JSON, under `tftrain.checkpoint.state.SERVICE_STATES`.
            self._service_states = tf.Variable("", dtype=tf.string, trainable=False, name=SERVICE_STATES)
        self._shared_step = global_step
        self._state_fn = state if callable(state) else (lambda: dict(state))
        self._data = tf.Module(name=data_position.KEY)
        self._iterator_unsaveable_reason: str | None = None
        self._root = self._new_root()
        self._manager: tf.train.CheckpointManager | None = None
        self.service_states: dict[str, Any] = {}
        self.iterator_restored = False
        self.restored_path: str | None = None
        self._failures: list[tuple[str, Exception]] = []  # damaged checkpoints met since the last restore

    def _new_root(self) -> tf.train.Checkpoint:
        return tf.train.Checkpoint(
            **self._state_fn(),
            **{Progress.name: self._progress},
            iterator_saved=self._iterator_saved,
            **{SERVICE_STATES: self._service_states},
            **{data_position.KEY: self._data},
        )

    # ------------------------------------------------------------------ paths

    @property
    def manager(self) -> tf.train.CheckpointManager:
        if self._manager is None:
            self._manager = tf.train.CheckpointManager(
                self._root, self.directory, max_to_keep=self.max_to_keep, checkpoint_name=CHECKPOINT_NAME
            )
        return self._manager

    @property
    def latest(self) -> str | None:
        """The newest recorded checkpoint (in `restore_directory`), or None; waits for a pending asynchronous save."""
        self.sync()
        if self.restore_directory != self.directory:
            return tf.train.latest_checkpoint(self.restore_directory)
        return self.manager.latest_checkpoint

    @property
    def _read_only(self) -> bool:
        return self.restore_directory != self.directory

    def clean_leftovers(self) -> list[str]:
        """Removes what an interrupted save left in `directory` (`tftrain.checkpoint.files.clean_leftovers`)."""
        return files.clean_leftovers(self.directory)

    # ---------------------------------------------------------------- restore

    def find(self, resume_from: str | None = None) -> ValidatedCheckpoint | None:
        """The checkpoint to restore, validated: nothing of it is assigned yet.

        The newest of `restore_directory` that reads whole (every tensor read,
        its services' states parsed); one that cannot be read is skipped with
        a warning naming it, for the one before (it is set aside, renamed
        with a `.corrupt` suffix, once an older one is restored). Leftovers of
        interrupted saves are cleaned first. With none there, `resume_from`'s
        (a damaged one is an error: no fallback).

        Args:
            resume_from: A checkpoint path prefix, or a directory (its
                latest), used where this directory holds none.

        Returns:
            The checkpoint, validated; None if there is none.

        Raises:
            CorruptCheckpointError: checkpoints exist but none can be read.
            CheckpointError: no checkpoint at `resume_from`.
        """
        self.sync()  # a pending write's files are not leftovers
        if not self._read_only:
            self.clean_leftovers()
        failed = {path for path, _ in self._failures}
        for path in reversed(files.candidates(self.restore_directory)):
            if path in failed:
                continue
            try:
                return self._validate(path)
            except Exception as error:  # any read error means this checkpoint is damaged
                self._damaged(path, error)
        if self._failures:
            listed = "\n".join(f"  {path}: {type(error).__name__}: {error}" for path, error in self._failures)
            raise CorruptCheckpointError(
                f"Every checkpoint in {self.restore_directory} is damaged, so training cannot resume:\n{listed}\n"
                "Expected at least one readable checkpoint. Move the directory away (or pass another "
                "`model_dir`) to train from scratch."
            )
        return None if resume_from is None else self._chosen(open_checkpoint(resume_from, "resume_from")[0])

    def restore(self, validated: ValidatedCheckpoint, iterator: Any = None) -> Progress | None:
        """Restores a validated checkpoint (`find`): the model, optimizer, progress, and the iterator first.

        Everything is checked compatible before anything is assigned.

        Args:
            validated: What `find` returned.
            iterator: The training iterator the run will read from; its state
                is restored where the checkpoint saved one.

        Returns:
            The restored progress; None where this directory's checkpoint is
            found damaged as it is restored (a data iterator's state is read
            only then): it is warned, and the next `find` returns the one
            before it. `iterator_restored` then says whether the iterator's
            state was restored (else resume by skipping `batches_in_pass`),
            `service_states` holds the services' states and `restored_path`
            the checkpoint.

        Raises:
            IncompatibleCheckpointError: the checkpoint does not fit the model
                (nothing is restored).
            CorruptCheckpointError: `resume_from`'s checkpoint is damaged.
        """
        self.sync()
        try:
            progress = self._restore_from(validated.path, validated.reader, iterator)
        except IncompatibleCheckpointError:
            raise
        except Exception as error:  # e.g. a damaged data iterator state (read only when restored)
            if not validated.own:
                raise CorruptCheckpointError(f"The checkpoint {validated.path} cannot be read: {error}") from error
            self._damaged(validated.path, error)
            return None
        if self._failures and not self._read_only:
            files.set_aside(self.directory, validated.path, [failed for failed, _ in self._failures])
            self._manager = None  # re-read the corrected state file
        self._failures = []
        return progress

    def _damaged(self, path: str, error: Exception) -> None:
        self._failures.append((path, error))
        warnings.warn(
            f"The checkpoint {path} cannot be read ({type(error).__name__}: {error}); "
            "falling back to the previous checkpoint.",
            stacklevel=4,
        )

    def restore_latest(self, iterator: Any = None) -> Progress | None:
        """Restores the newest good checkpoint, if any: `find`, then `restore`, for the one before where it is damaged.

        Args:
            iterator: The training iterator the run will read from; its state
                is restored where the checkpoint saved one.

        Returns:
            The restored progress, or None if the directory holds no checkpoint.

        Raises:
            IncompatibleCheckpointError: the checkpoint does not fit the model
                (nothing is restored).
            CorruptCheckpointError: checkpoints exist but none can be read.
        """
        while (validated := self.find()) is not None:
            progress = self.restore(validated, iterator)
            if progress is not None:
                return progress
        return None

    def restore_from(self, path: str, iterator: Any = None) -> tuple[str, Progress]:
        """Restores a chosen checkpoint (e.g. another run's) instead of the latest of this directory.

        Validated as `find` validates (nothing partly restored); a damaged
        checkpoint is an error, with no fallback to another one.

        Args:
            path: A checkpoint path prefix, or a directory (its latest checkpoint).
            iterator: The training iterator, restored where the checkpoint saved one.

        Returns:
            The checkpoint path restored, and its progress.

        Raises:
            CheckpointError: no checkpoint at `path`, or it cannot be read.
            IncompatibleCheckpointError: it does not fit the model.
        """
        self.sync()
        validated = self._chosen(open_checkpoint(path, "resume_from")[0])
        return validated.path, self.restore(validated, iterator)

    def _validate(self, path: str, *, own: bool = True) -> ValidatedCheckpoint:
        """Reads every tensor of a checkpoint, its services' states and progress; raises if it is damaged."""
        reader = tf.train.load_checkpoint(path)
        read_all_tensors(reader)
        return ValidatedCheckpoint(path, saved_service_states(reader), Progress.read(reader), reader, own)

    def _chosen(self, path: str) -> ValidatedCheckpoint:
        """A checkpoint chosen by path, validated: a damaged one is a `CorruptCheckpointError` (no fallback)."""
        try:
            return self._validate(path, own=False)
        except Exception as error:
            raise CorruptCheckpointError(f"The checkpoint {path} cannot be read: {error}") from error

    def _restore_from(self, path: str, reader: tf.train.CheckpointReader, iterator: Any) -> Progress:
        # Separate roots for reading: TF keeps a pending ("deferred") restore for any
        # saved object missing from the root it reads into, and would apply it to
        # the next iterator attached to `self._root` at a later save. The services'
        # states are read from the reader (`saved_service_states`), not restored.
        state_root = tf.train.Checkpoint(
            **self._state_fn(),
            **{Progress.name: self._progress},
            iterator_saved=self._iterator_saved,
        )
        state_root.save_counter  # noqa: B018 (created on first use; every checkpoint has one)
        # The data's own state (the iterator, a pass's order) is the pipeline's to match, not the model's.
        check_compatible(path, reader, state_root, only=(*self._state_fn(), *_RUN_STATE_KEYS))
        iterator_in_checkpoint = bool(reader.get_tensor("iterator_saved" + VARIABLE_SUFFIX))
        restore_iterator = iterator_in_checkpoint and _is_checkpointable_iterator(iterator)
        if restore_iterator:
            # The data first: if the input pipeline changed, fail before any variable is assigned.
            holder = tf.Module(name=data_position.KEY)
            holder.iterator = iterator
            try:
                tf.train.Checkpoint(**{data_position.KEY: holder}).read(path).expect_partial()
            except tf.errors.DataLossError:
                raise  # a damaged file: the caller falls back to an older checkpoint
            except Exception as error:
                raise IncompatibleCheckpointError(
                    f"The training data iterator saved in {path} cannot be restored into this run's "
                    f"input pipeline ({type(error).__name__}: {error}). Expected the same `tf.data` "
                    "pipeline as the run that wrote the checkpoint; nothing was restored."
                ) from error
        state_root.read(path).expect_partial().assert_existing_objects_matched()
        self._root.save_counter.assign(state_root.save_counter)
        progress = Progress.load(self._progress)
        self.iterator_restored = restore_iterator
        self.service_states = saved_service_states(reader)
        self.restored_path = path
        return progress

    def training_state(self) -> dict[str, Any]:
        """The training state's trackables by name (model, optimizer, metrics, seeds, extra state), as saved now.

        What `restore_training_state` restores; the run's progress, data
        iterator and services' states are not in it.
        """
        return dict(self._state_fn())

    def restore_training_state(self, path: str) -> Progress:
        """Restores a checkpoint's training state only: the model, optimizer, metrics and extra state.

        The run's global step, its data iterator and the services' states are
        left as they are (a rollback after a loss blow-up goes on from where
        the run is). Validated first, as a resume is: nothing is assigned
        from a checkpoint that cannot be read or does not fit.

        Args:
            path: A checkpoint path prefix of this run.

        Returns:
            The checkpoint's progress (read, not assigned).

        Raises:
            CorruptCheckpointError: the checkpoint cannot be read.
            IncompatibleCheckpointError: it does not fit the model.
        """
        self.sync()
        reader = self._chosen(path).reader
        progress = Progress.variables()
        state_root = tf.train.Checkpoint(**self._state_fn(), **{Progress.name: progress})
        check_compatible(path, reader, state_root, only=tuple(self._state_fn()))
        state_root.read(path).expect_partial().assert_existing_objects_matched()
        return Progress.load(progress)

    # ------------------------------------------------------------------- save

    def check_finite(self) -> None:
        """Raises `NonFiniteStateError` if a model or optimizer variable holds NaN/Inf."""
        state = self._state_fn()
        variables = list(state["model"].variables)
        optimizer = state.get("optimizer")
        if optimizer is not None:
            variables += list(optimizer.variables)
        floating = [v for v in variables if tf.as_dtype(v.dtype).is_floating]
        if not floating:
            return
        finite = tf.stack([tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(v))) for v in floating])
        if bool(tf.reduce_all(finite)):
            return
        bad = floating[int(tf.argmin(tf.cast(finite, tf.int32)))]
        raise NonFiniteStateError(
            f"Not writing a checkpoint: variable `{getattr(bad, 'path', bad.name)}` holds NaN or "
            f"infinite values. The last good checkpoint ({self.latest}) is kept."
        )

    def _warn_iterator_unsaveable(self, reason: str) -> None:
        self._iterator_unsaveable_reason = reason
        warnings.warn(
            f"The training data iterator cannot be checkpointed ({reason}); resuming will skip "
            "the batches already seen instead (the same batches only if the input order is "
            "deterministic).",
            stacklevel=3,
        )

    def save(
        self,
        progress: Progress,
        iterator: Any = None,
        service_states: dict[str, Any] | None = None,
        *,
        number: int | None = None,
        data_state: Mapping[str, Any] | None = None,
    ) -> str:
        """Writes a checkpoint of the current state.

        Args:
            progress: Where the run is.
            iterator: The iterator the next training step reads from; saved
                if `tf.data` can save it, else the run resumes by skipping
                `progress.batches_in_pass` batches.
            service_states: The run's services' states by name
                (JSON-serializable), read back as `service_states` on restore.
            number: The checkpoint's number (`ckpt-<number>`); the Trainer
                numbers them by global step. None: one more than the last save.
            data_state: More of the data position, name -> variable, saved
                under `data/<name>` (`tftrain.checkpoint.data_position.DataPosition.variables`).

        Returns:
            The checkpoint's path prefix.

        Raises:
            NonFiniteStateError: a model or optimizer variable is not finite.
            ModelDirError: the directory (or the run's `model_dir`) was
                removed, or another writer took its lock: nothing is written.
            CheckpointWriteError: the files could not be written (this one's,
                or a pending asynchronous write's); the error met is chained,
                and the last recorded checkpoint is kept.
        """
        self.check_finite()
        # A pending write reads the object graph from its thread: wait before changing it
        # (TensorFlow's next save would wait for it anyway).
        self.sync()
        self._check_directory()
        progress.save_to(self._progress, self._shared_step)
        self._service_states.assign(json.dumps(service_states) if service_states else "")
        for name, value in self._state_fn().items():
            setattr(self._root, name, value)
        for name, variable in (data_state or {}).items():
            setattr(self._data, name, variable)
        if (
            iterator is not None
            and self._iterator_unsaveable_reason is None
            and not _is_checkpointable_iterator(iterator)
        ):
            self._warn_iterator_unsaveable(f"a {type(iterator).__name__} is not a tf.data iterator")
        with_iterator = self._iterator_unsaveable_reason is None and _is_checkpointable_iterator(iterator)
        if with_iterator:
            self._data.iterator = iterator
            self._iterator_saved.assign(True)
            unsaveable = (tf.errors.FailedPreconditionError, tf.errors.UnimplementedError)
            try:
                return self._write(number, passing=unsaveable, iterator=True)
            except unsaveable as error:
                # e.g. a pipeline with a Python generator or stateful op: tf.data cannot save it.
                self._warn_iterator_unsaveable(str(error).splitlines()[0])
                self.clean_leftovers()
        if hasattr(self._data, "iterator"):
            del self._data.iterator
        self._iterator_saved.assign(False)
        return self._write(number)

    def _write(self, number: int | None, passing: tuple[type[Exception], ...] = (), *, iterator: bool = False) -> str:
        """Writes the files (with a data `iterator`: without TensorFlow's INFO line); an error (but `passing`) raises `CheckpointWriteError`."""
        shown = number if number is not None else int(self._root.save_counter.numpy()) + 1
        path = tf.io.gfile.join(self.directory, f"{CHECKPOINT_NAME}-{shown}")
        try:
            with native_log.without_save_info() if iterator else contextlib.nullcontext():
                path = self._save_files(number)
        except passing:
            raise
        except (tf.errors.OpError, OSError) as error:
            raise self._write_failed(path, error) from error
        self._pending = path if self.async_write else None
        return path

    def _check_directory(self) -> None:
        """Raises `ModelDirError` where the next write would go to a directory removed or taken under the run."""
        if self.writer_check is not None:
            self.writer_check()
        if not tf.io.gfile.isdir(self.directory):
            kept = files.last_kept(self.restore_directory)
            raise lost_directory_error(self.directory, "the directory was removed", kept)

    def _write_failed(self, path: str, error: Exception) -> CheckpointWriteError:
        """The error to raise for a write of `path` that failed with `error` (its partial files removed, if possible)."""
        self._manager = None  # the manager's own record may count the failed save: read the disk's again
        try:
            self._check_directory()
        except ModelDirError as lost:  # the directory went while the files were written
            return lost
        try:
            self.clean_leftovers()
            cleanup = ""
        except Exception as cleanup_error:  # the write's error is the one to report
            cleanup = f" Removing its partial files failed too ({files.error_line(cleanup_error)})."
        kept = files.last_kept(self.restore_directory)
        return CheckpointWriteError(
            f"Could not write the checkpoint {path}: {files.error_line(error)}.{cleanup} {files.rerun_resumes(kept)} Expected "
            f"room and write permission in {self.directory}: free space (or raise the quota, fix the "
            "permissions), then rerun.",
            checkpoint=path,
            kept=kept,
        )

    def _save_files(self, number: int | None) -> str:
        if not self.async_write:
            return self.manager.save(checkpoint_number=number)
        # TensorFlow's writer copies only the objects it found at its first save; state
        # that appeared since (a new pass's iterator, a late-built layer) would be read
        # live from the writer thread, while training changes it. A fresh root copies it.
        objects = [id(node) for node in tf.train.TrackableView(self._root).descendants()]
        if self._async_objects is not None and objects != self._async_objects:
            self._replace_root()
            objects = [id(node) for node in tf.train.TrackableView(self._root).descendants()]
        self._async_objects = objects
        options = tf_internals.async_checkpoint_options(self._root)
        return self.manager.save(checkpoint_number=number, options=options)

    def sync(self) -> None:
        """Waits until a pending asynchronous save is written and recorded.

        Raises:
            CheckpointWriteError: the pending write failed (e.g. a full disk);
                the checkpoint before it is still the latest. The error met
                is chained.
        """
        if not self.async_write:
            return
        pending, self._pending = self._pending, None
        try:
            tf_internals.wait_for_async_checkpoint(self._root)
        except (tf.errors.OpError, OSError) as error:
            raise self._write_failed(pending or self.directory, error) from error

    def close(self) -> None:
        """Waits for a pending asynchronous save and stops the writer thread (a no-op otherwise).

        Raises:
            CheckpointWriteError: the pending write failed (the thread is stopped either way).
        """
        if self.async_write and self._async_objects is not None:
            try:
                self.sync()
            finally:
                self._replace_root()

    def _replace_root(self) -> None:
        """Stops the asynchronous writer (after its pending save) and starts over with a fresh root."""
        counter = int(self._root.save_counter.numpy())
        tf_internals.stop_async_checkpoint(self._root)
        self._root = self._new_root()
        self._root.save_counter.assign(counter)
        self._manager = None
        self._async_objects = None
