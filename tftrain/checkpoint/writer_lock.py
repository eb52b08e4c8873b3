"""One writer per `model_dir`: a lock file naming the live writer, taken over when stale.

The same command launched twice on one `model_dir` would interleave two runs'
checkpoints in one directory. The writer holds `model_dir/writer.lock` (host,
process id, its start time, since when, last heartbeat) while `fit` runs; a
second writer is refused with those facts, whether it is another process,
another `Trainer` of the same process or another thread (a process keeps a
table of the locks it holds: a lock file naming the process itself is live
while that table holds it). A lock whose process is gone is stale and taken
over, so rerunning a killed job keeps working: on the same host the process is
checked directly (its id and start time, which tell a reused id apart); from
another host only the heartbeat can tell, and a lock not refreshed for
`stale_after_s` is stale.

Taking the lock is atomic on a local filesystem (or one with POSIX links, as
NFS): of processes taking it at once, exactly one holds it and the others are
refused, leaving nothing in the directory. The lock file appears
whole (written under a temporary name, then linked into place: a link never
replaces an existing file), and a stale lock is taken over by one process
only (it first claims `writer.lock.takeover` the same way; the others wait
for the takeover to end and are refused by the new lock). A remote
filesystem (`gs://`, `s3://`) has no such step: the lock is written only
where none exists, then read back, which refuses a second writer started
after the first but not one started within the same moment.

A held lock also tells its writer that the directory is still its own
(`WriterLock.check`, before each checkpoint): a `model_dir` removed, or a lock
file removed or taken over by another writer, stops the run with
`tftrain.errors.ModelDirError` rather than recreating the directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
import warnings
import weakref
from typing import Any

import tensorflow as tf

from tftrain.checkpoint import files
from tftrain.checkpoint.layout import LOCK_NAME, ModelDirLayout
from tftrain.errors import ModelDirError, ModelDirInUseError

__all__ = [
    "HEARTBEAT_S",
    "LOCK_NAME",
    "STALE_AFTER_S",
    "TAKEOVER_SUFFIX",
    "WriterLock",
    "check_writer",
    "live_writer",
    "lost_directory_error",
    "write_json",
]

HEARTBEAT_S = 30.0
STALE_AFTER_S = 600.0
TAKEOVER_SUFFIX = ".takeover"  # `writer.lock.takeover`: the one process taking over a stale lock
_TAKEOVER_WAIT_S = 5.0  # how long a process waits for another's takeover to end (it takes milliseconds)
_UNREADABLE_GRACE_S = 10.0  # an unreadable lock younger than this may still be being written: live


def _process_start(pid: int) -> str | None:
    """The process's start time from /proc (Linux), which tells a reused process id apart; else None."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return fields[19]  # field 22 of stat: start time in clock ticks after boot
    except (OSError, IndexError):
        return None


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    return start is None or _process_start(pid) in (None, start)


def _read_text(path: str) -> str | None:
    """The file's text; None if there is no such file."""
    try:
        with tf.io.gfile.GFile(path) as handle:
            return handle.read()
    except tf.errors.NotFoundError:
        return None


def _parse(text: str | None) -> dict[str, Any] | None:
    """A lock record from its text; None if there is no lock, `{}` if it cannot be read."""
    if text is None:
        return None
    try:
        record = json.loads(text or "{}")
    except ValueError:
        return {}  # unreadable: a writer killed while writing it
    return record if isinstance(record, dict) else {}


def _read_lock(path: str) -> dict[str, Any] | None:
    """The lock's record; None if there is no lock, `{}` if it cannot be read."""
    try:
        return _parse(_read_text(path))
    except tf.errors.OpError:
        return {}


def _age(path: str) -> float | None:
    """Seconds since `path` was last written; None if it is gone."""
    try:
        if "://" in path:
            return time.time() - tf.io.gfile.stat(path).mtime_nsec / 1e9
        return time.time() - os.stat(path).st_mtime
    except (OSError, tf.errors.NotFoundError):
        return None


def _holder_alive(holder: dict[str, Any], stale_after_s: float) -> bool:
    """Whether the process a lock record names still runs (from another host: a recent heartbeat)."""
    if holder.get("host") == socket.gethostname():
        return _alive(int(holder["pid"]), holder.get("process_start"))
    return time.time() - float(holder.get("heartbeat", 0)) <= stale_after_s


def live_writer(model_dir: str, stale_after_s: float = STALE_AFTER_S) -> dict[str, Any] | None:
    """The record (host, pid, since) of the live process writing to `model_dir`, or None.

    Only reads the lock: a reader (a continuous evaluator) uses it to tell
    whether training still runs. A stale or unreadable lock counts as no writer.
    """
    holder = _read_lock(ModelDirLayout(model_dir).lock)
    return holder if holder and _holder_alive(holder, stale_after_s) else None


# The locks this process holds, by lock file: a lock file naming this process is
# live while its `WriterLock` is here (another Trainer or thread must not take it over).
_HELD: weakref.WeakValueDictionary[str, WriterLock] = weakref.WeakValueDictionary()
_HELD_CHANGE = threading.Lock()


def _key(path: str) -> str:
    return path if "://" in path else os.path.realpath(path)


def check_writer(model_dir: str) -> None:
    """Raises `ModelDirError` unless this process holds `model_dir`'s writer lock, in place.

    Args:
        model_dir: A run's directory.

    Raises:
        ModelDirError: `model_dir` or its lock file was removed, or another
            writer holds the lock now.
    """
    lock = _HELD.get(_key(ModelDirLayout(model_dir).lock))
    if lock is None:
        raise _lost(ModelDirLayout(model_dir), "this process does not hold its writer lock")
    lock.check()


def _lost(layout: ModelDirLayout, what: str) -> ModelDirError:
    return lost_directory_error(layout.root, what, files.last_kept(layout.checkpoints))


def lost_directory_error(directory: str, what: str, kept: str | None) -> ModelDirError:
    """The error that stops a run whose directory changed under it.

    Args:
        directory: The run's `model_dir` (or a checkpoint directory in it).
        what: What happened to it, e.g. "the directory was removed".
        kept: The newest recorded checkpoint still on disk, or None.
    """
    resume = (
        f"The last checkpoint that is safe is {kept}: a rerun on the same model_dir resumes from it "
        "(once no other process writes there)."
        if kept is not None
        else "No checkpoint of this run is left: a rerun starts from the beginning."
    )
    return ModelDirError(
        f"The run stopped writing to {directory}: {what} while it ran. A run never recreates a "
        f"directory removed under it, nor writes beside another writer. {resume} Expected the "
        "model_dir, and its writer.lock, to stay in place while `fit` runs.",
        directory=directory,
        kept=kept,
    )


def unwritable_error(layout: ModelDirLayout, what: str, error: Exception) -> ModelDirError:
    """The error that stops a run whose `model_dir` can no longer be written (read-only, full), as a failed save says it.

    Args:
        layout: The run's directory.
        what: What failed, e.g. "refreshing its writer lock ...".
        error: The error it met.
    """
    kept = files.last_kept(layout.checkpoints)
    return ModelDirError(
        f"Could not write to {layout.root}: {what} failed: {files.error_line(error)}. {files.rerun_resumes(kept)} Expected write "
        f"permission and room in {layout.root}: make it writable again (or free space), then rerun.",
        directory=layout.root,
        kept=kept,
    )


class WriterLock:
    """Holds `model_dir/writer.lock` until `close` (a run holds it while it lasts; `refresh` keeps it live).

    Args:
        model_dir: The run's directory (it exists).
        stale_after_s: A lock from another host not refreshed for this long is stale.

    Raises:
        ModelDirInUseError: a live process holds the lock, or another `Trainer`
            or thread of this process does.
    """

    def __init__(self, model_dir: str, stale_after_s: float = STALE_AFTER_S):
        self.layout = ModelDirLayout(model_dir)
        self.path = self.layout.lock
        self.stale_after_s = stale_after_s
        self._last_heartbeat = 0.0
        self._owned = False
        self._token = uuid.uuid4().hex  # tells this lock's file from any other's, in any process
        self._key = _key(self.path)
        with _HELD_CHANGE:
            self._acquire()
            _HELD[self._key] = self

    def _record(self, since: float) -> dict[str, Any]:
        pid = os.getpid()
        return {
            "host": socket.gethostname(),
            "pid": pid,
            "process_start": _process_start(pid),
            "thread": threading.current_thread().name,
            "since": since,
            "heartbeat": time.time(),
            "token": self._token,
        }

    def _stale(self, holder: dict[str, Any]) -> bool:
        # A lock of this process that is no longer held (never closed): none is live.
        return _ours(holder) or not _holder_alive(holder, self.stale_after_s)

    def _read(self) -> dict[str, Any] | None:
        return _read_lock(self.path)

    def _acquire(self) -> None:
        other = _HELD.get(self._key)
        if other is not None:  # another Trainer or thread of this process writes there
            raise self._in_use(other._read() or {"since": other._since}, this_process=True)
        deadline = time.monotonic() + _TAKEOVER_WAIT_S
        while True:  # another process may create or take over the lock between our steps: judge it anew
            text = _read_text(self.path)
            holder = _parse(text)
            if holder is None:
                if self._create():
                    return
                waiting = False
            elif not holder and (_age(self.path) or 0.0) < _UNREADABLE_GRACE_S:
                raise self._in_use({})  # being written, or its writer was killed a moment ago
            elif holder and not self._stale(holder):
                raise self._in_use(holder)
            else:
                taken = self._take_over(text or "")
                if taken:
                    writer = (
                        "its writer could not be read"
                        if not holder
                        else "an earlier run of this process left it, never released"
                        if _ours(holder)
                        else f"its writer ({holder.get('host')} process {holder.get('pid')}) is gone"
                    )
                    warnings.warn(f"Taking over {self.path}: {writer}.", stacklevel=5)
                    return
                waiting = taken is None  # another process is taking it over: its lock will refuse us
            if time.monotonic() > deadline:
                raise self._in_use(
                    (_read_lock(self.path + TAKEOVER_SUFFIX) if waiting else self._read()) or {}
                )
            if waiting:
                time.sleep(0.001)

    def _take_over(self, stale: str) -> bool | None:
        """Replaces the stale lock whose text is `stale`, if this process is the one to.

        Only the process holding the claim `writer.lock.takeover` (created as
        the lock is) removes a stale lock, and only the lock it read.

        Returns:
            True: the lock is this one's now. False: the lock changed, or
            another process created one: judge it anew. None: another
            process is taking it over now.
        """
        claim = self.path + TAKEOVER_SUFFIX
        if not self._place(claim, json.dumps(self._record(time.time()))):
            self._clear_abandoned(claim)
            return None
        try:
            if _read_text(self.path) != stale:
                return False  # replaced since it was read (or removed): not the stale lock
            with contextlib.suppress(tf.errors.NotFoundError):
                tf.io.gfile.remove(self.path)
            return self._create()
        finally:
            if (_read_lock(claim) or {}).get("token") == self._token:
                tf.io.gfile.remove(claim)

    def _clear_abandoned(self, claim: str) -> None:
        """Removes a takeover claim whose process is gone (killed while taking over), and only that one."""
        text = _read_text(claim)
        record = _parse(text)
        if record is None or (not record and (_age(claim) or 0.0) < _UNREADABLE_GRACE_S):
            return
        if record and not _ours(record):
            if record.get("host") == socket.gethostname():
                if _alive(int(record.get("pid", -1)), record.get("process_start")):
                    return
            elif time.time() - float(record.get("since", 0)) <= HEARTBEAT_S:
                return
        if "://" in claim:  # no atomic step: the claim is only ever seconds old when two processes meet here
            with contextlib.suppress(tf.errors.NotFoundError):
                tf.io.gfile.remove(claim)
            return
        aside = f"{claim}.{self._token}"
        try:
            os.rename(claim, aside)
        except FileNotFoundError:
            return
        if _read_text(aside) != text:  # another process's new claim: put it back
            with contextlib.suppress(FileExistsError):
                os.link(aside, claim)
        os.remove(aside)

    def _in_use(self, holder: dict[str, Any], *, this_process: bool = False) -> ModelDirInUseError:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("since", 0))))
        if this_process:
            return ModelDirInUseError(
                "Another Trainer or thread of this process is writing to this model_dir: thread "
                f"{holder.get('thread')!r}, since {since} (its lock: {self.path}). Two runs on one "
                "model_dir would interleave their checkpoints. Expected one writer: let that `fit` "
                "end first, or use another model_dir."
            )
        if not holder:
            return ModelDirInUseError(
                f"Another process is writing to this model_dir: its lock {self.path} is being written "
                "(or its writer was killed a moment ago). Two runs on one model_dir would interleave "
                "their checkpoints. Expected one writer: wait for it to end, stop it, or use another "
                f"model_dir. A lock that cannot be read is taken over once it is {_UNREADABLE_GRACE_S:.0f} s old."
            )
        return ModelDirInUseError(
            f"Another process is writing to this model_dir: {holder.get('host')} process "
            f"{holder.get('pid')}, since {since} (its lock: {self.path}). Two runs on one model_dir "
            "would interleave their checkpoints. Expected one writer: wait for it to end, stop it, or "
            "use another model_dir. If that process is gone (another host cannot check), delete the "
            f"lock file; a lock not refreshed for {self.stale_after_s:.0f} s is taken over."
        )

    def _create(self) -> bool:
        """Creates the lock, whole, unless one exists; whether it did."""
        since = time.time()
        created = self._place(self.path, json.dumps(self._record(since)))
        if created:
            self._since = since
            self._last_heartbeat = time.monotonic()
            self._owned = True
        return created

    def _place(self, path: str, text: str) -> bool:
        """Writes `text` to `path` in one step unless `path` exists; whether it did."""
        if "://" in path:  # remote filesystems have no exclusive create: write where none is, read back
            if tf.io.gfile.exists(path):
                return False
            with tf.io.gfile.GFile(path, "w") as handle:
                handle.write(text)
            return _read_text(path) == text
        temporary = f"{path}.{self._token}.tmp"
        with open(temporary, "x") as handle:
            handle.write(text)
        try:
            os.link(temporary, path)  # whole, and never over an existing file
            return True
        except FileExistsError:
            return False
        except OSError:  # a filesystem without hard links: create exclusively, then write
            try:
                descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(descriptor, "w") as handle:
                handle.write(text)
            return True
        finally:
            os.remove(temporary)

    def _write(self, since: float) -> None:
        write_json(self.path, self._record(since))
        self._last_heartbeat = time.monotonic()

    def check(self) -> None:
        """Raises `ModelDirError` unless the lock file is still this lock's (a read of one small file).

        Raises:
            ModelDirError: the `model_dir` or the lock file was removed, or
                another writer holds the lock now.
        """
        holder = self._read()
        if holder is not None and holder.get("token") == self._token:
            return
        if not tf.io.gfile.isdir(self.layout.root):
            reason = "the directory was removed"
        elif holder is None:
            reason = f"its writer lock {self.path} was removed"
        elif not holder:
            reason = f"its writer lock {self.path} was overwritten"
        else:
            reason = (
                f"its writer lock {self.path} was taken over by {holder.get('host')} process "
                f"{holder.get('pid')}"
            )
        raise _lost(self.layout, reason)

    def refresh(self) -> None:
        """Rewrites the lock's heartbeat if it is due (at most every `HEARTBEAT_S` seconds).

        Raises:
            ModelDirError: the lock is no longer this one's (`check`); nothing is rewritten.
        """
        if time.monotonic() - self._last_heartbeat > HEARTBEAT_S:
            self.check()
            try:
                self._write(self._since)
            except (tf.errors.OpError, OSError) as error:  # e.g. the directory made read-only under the run
                raise unwritable_error(self.layout, f"refreshing its writer lock {self.path}", error) from error

    def close(self) -> None:
        """Releases the lock: removes the file if it is still this lock's (never another writer's).

        A lock that cannot be removed (the directory made read-only) is
        warned of and left: it names this process, so once the process has
        ended the next run takes it over as stale.
        """
        with _HELD_CHANGE:
            try:
                if self._owned and (self._read() or {}).get("token") == self._token:
                    tf.io.gfile.remove(self.path)
            except (tf.errors.OpError, OSError) as error:
                warnings.warn(
                    f"Could not remove the writer lock {self.path} ({files.error_line(error)}). It names this "
                    "process: once the process has ended, the next run on this model_dir takes it over as stale.",
                    stacklevel=2,
                )
            finally:
                self._owned = False
                if _HELD.get(self._key) is self:
                    del _HELD[self._key]


def write_json(path: str, value: Any, **options: Any) -> None:
    """Writes `value` as JSON (`json.dumps` `options`) to `path` whole: a reader sees the old file or the new one.

    Written to a temporary file beside it, then renamed over it.
    """
    temporary = f"{path}.tmp.{os.getpid()}"
    with tf.io.gfile.GFile(temporary, "w") as handle:
        handle.write(json.dumps(value, **options))
    tf.io.gfile.rename(temporary, path, overwrite=True)


def _ours(holder: dict[str, Any]) -> bool:
    """Whether a lock record names this process."""
    return holder.get("host") == socket.gethostname() and holder.get("pid") == os.getpid()
