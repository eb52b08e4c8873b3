"""One writer per `model_dir`: a lock file naming the live writer, taken over when stale.

The same command launched twice on one `model_dir` would interleave two runs'
checkpoints in one directory. The writer holds `model_dir/writer.lock` (host,
process id, its start time, since when, last heartbeat) while `fit` runs; a
second writer is refused with those facts. A lock whose process is gone is
stale and taken over, so rerunning a killed job keeps working: on the same
host the process is checked directly (its id and start time, which tell a
reused id apart); from another host only the heartbeat can tell, and a lock not
refreshed for `stale_after_s` is stale.
"""

from __future__ import annotations

import json
import os
import socket
import time
import warnings
from typing import Any

import tensorflow as tf

from tftrain.errors import ModelDirInUseError

LOCK_NAME = "writer.lock"
HEARTBEAT_S = 30.0
STALE_AFTER_S = 600.0


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


def _read_lock(path: str) -> dict[str, Any] | None:
    """The lock's record; None if there is no lock, `{}` if it cannot be read."""
    try:
        with tf.io.gfile.GFile(path) as handle:
            return json.loads(handle.read() or "{}")
    except tf.errors.NotFoundError:
        return None
    except (ValueError, tf.errors.OpError):
        return {}  # unreadable: a writer killed while writing it


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
    holder = _read_lock(os.path.join(model_dir, LOCK_NAME))
    return holder if holder and _holder_alive(holder, stale_after_s) else None


class WriterLock:
    """Holds `model_dir/writer.lock` until `close` (a run holds it while it lasts; `refresh` keeps it live).

    Args:
        model_dir: The run's directory (it exists).
        stale_after_s: A lock from another host not refreshed for this long is stale.

    Raises:
        ModelDirInUseError: a live process holds the lock.
    """

    def __init__(self, model_dir: str, stale_after_s: float = STALE_AFTER_S):
        self.path = os.path.join(model_dir, LOCK_NAME)
        self.stale_after_s = stale_after_s
        self._last_heartbeat = 0.0
        self._owned = False
        self._acquire()

    def _record(self, since: float) -> dict[str, Any]:
        pid = os.getpid()
        return {
            "host": socket.gethostname(),
            "pid": pid,
            "process_start": _process_start(pid),
            "since": since,
            "heartbeat": time.time(),
        }

    def _stale(self, holder: dict[str, Any]) -> bool:
        if holder.get("host") == socket.gethostname() and holder.get("pid") == os.getpid():
            return True  # an earlier run of this process that did not close (e.g. an exception)
        return not _holder_alive(holder, self.stale_after_s)

    def _read(self) -> dict[str, Any] | None:
        return _read_lock(self.path)

    def _acquire(self) -> None:
        for _ in range(3):  # another process may create or take over the lock between our steps
            holder = self._read()
            if holder is not None:
                if holder and not self._stale(holder):
                    raise self._in_use(holder)
                if holder:
                    warnings.warn(
                        f"Taking over {self.path}: its writer ({holder.get('host')} process "
                        f"{holder.get('pid')}) is gone.",
                        stacklevel=4,
                    )
                try:
                    tf.io.gfile.remove(self.path)
                except tf.errors.NotFoundError:
                    pass
            if self._create():
                self._owned = True
                return
        raise self._in_use(self._read() or {})

    def _in_use(self, holder: dict[str, Any]) -> ModelDirInUseError:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("since", 0))))
        return ModelDirInUseError(
            f"Another process is writing to this model_dir: {holder.get('host')} process "
            f"{holder.get('pid')}, since {since} (its lock: {self.path}). Two runs on one model_dir "
            "would interleave their checkpoints. Expected one writer: wait for it to end, stop it, or "
            "use another model_dir. If that process is gone (another host cannot check), delete the "
            f"lock file; a lock not refreshed for {self.stale_after_s:.0f} s is taken over."
        )

    def _create(self) -> bool:
        """Creates the lock if it does not exist (atomically on a local filesystem); whether we did."""
        since = time.time()
        text = json.dumps(self._record(since))
        if "://" in self.path:  # remote filesystems have no exclusive create: write and read back
            with tf.io.gfile.GFile(self.path, "w") as handle:
                handle.write(text)
            created = self._read() == json.loads(text)
        else:
            try:
                descriptor = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(descriptor, "w") as handle:
                handle.write(text)
            created = True
        self._since = since
        self._last_heartbeat = time.monotonic()
        return created

    def _write(self, since: float) -> None:
        temporary = f"{self.path}.tmp.{os.getpid()}"
        with tf.io.gfile.GFile(temporary, "w") as handle:
            handle.write(json.dumps(self._record(since)))
        tf.io.gfile.rename(temporary, self.path, overwrite=True)
        self._last_heartbeat = time.monotonic()

    def refresh(self) -> None:
        """Rewrites the lock's heartbeat if it is due (at most every `HEARTBEAT_S` seconds)."""
        if time.monotonic() - self._last_heartbeat > HEARTBEAT_S:
            self._write(self._since)

    def close(self) -> None:
        """Releases the lock (removes the file, if this process holds it)."""
        if self._owned and tf.io.gfile.exists(self.path):
            tf.io.gfile.remove(self.path)
        self._owned = False
