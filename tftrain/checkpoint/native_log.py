"""Keeps TensorFlow's per-save INFO lines out of the log, and nothing else.

TensorFlow's checkpoint code logs at INFO level through Python's logging at
each save (`functional_saver.py`'s "Sharding callback duration: 14
microseconds"; with `async_checkpoint`, `async_checkpoint_helper.py`'s
lines as its writer thread starts, syncs and ends), which a program under
absl prints (absl's handler shows INFO). From the first save on, a filter
on the `absl` and `tensorflow` loggers drops the records below WARNING
that come from TensorFlow's checkpoint modules (the package of
`tf.train.Checkpoint`) and its SavedModel modules (an export's "Assets
written to" and fingerprint lines); the program's own INFO lines, and TensorFlow's
warnings and errors, still show.

Each save of a `tf.data` iterator with symbolic checkpointing also logs
"Saving symbolic checkpoint" at INFO level from TensorFlow's C++ code
(`iterator_ops.cc`). TensorFlow offers no way to lower its C++ log level
once it is loaded (`TF_CPP_MIN_LOG_LEVEL` is read once), so during a save
the process's stderr goes through a pipe: a thread forwards every line but
that one to the real stderr as it arrives, so warnings and errors still show,
in order, and a crash inside the save loses nothing already written.

An asynchronous save (`async_checkpoint=True`) logs the line from
TensorFlow's writer thread after `save` returned: that line still shows.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator

import tensorflow as tf

# glog/absl's INFO prefix ("I1205 08:47:03.473787 ...", or TF 2.16's "2026-12-05 08:47:03.473787: I ...").
_SAVE_INFO = re.compile(rb"^(I\d|\d{4}-\d\d-\d\d [\d:.]+: I ).*Saving symbolic checkpoint")


def _info_shown() -> bool:
    """Whether TensorFlow's C++ INFO lines print at all (TF_CPP_MIN_LOG_LEVEL below 1)."""
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0")) < 1
    except ValueError:
        return True


class CheckpointInfoFilter(logging.Filter):
    """Drops the log records below WARNING that TensorFlow's checkpoint and SavedModel modules log (each save's bookkeeping).

    Args:
        directories: The directories of TensorFlow's checkpoint and SavedModel
            modules (their subdirectories too).
    """

    def __init__(self, *directories: str):
        super().__init__()
        self.directories = directories

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            return True
        return not any(
            record.pathname == directory or record.pathname.startswith(directory + os.sep)
            for directory in self.directories
        )


# absl's `logging.info` logs to the `absl` logger; TensorFlow's `tf_logging` to the `tensorflow` logger.
_TENSORFLOW_LOGGERS = ("absl", "tensorflow")


@functools.cache
def quiet_python_save_info() -> None:
    """Puts `CheckpointInfoFilter` on the loggers TensorFlow's checkpoint modules log to, once per process.

    Called at every save; it does its work at the first call only.
    """
    # A SavedModel export ("Assets written to", "Writing fingerprint") is a save too.
    directories = [os.path.dirname(inspect.getfile(item)) for item in (tf.train.Checkpoint, tf.saved_model.save)]
    for name in _TENSORFLOW_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(existing, CheckpointInfoFilter) for existing in logger.filters):
            logger.addFilter(CheckpointInfoFilter(*directories))


@contextlib.contextmanager
def without_save_info() -> Iterator[None]:
    """TensorFlow's INFO lines of a save kept out of the log: its Python records from now on, its C++ line in the block."""
    quiet_python_save_info()  # also for the lines an asynchronous save logs from its thread, after the block
    if not _info_shown():
        yield
        return
    stderr_fd = 2  # where TensorFlow's C++ logging writes, whatever `sys.stderr` is
    _flush_python_stderr()
    real_stderr = os.dup(stderr_fd)
    read_end, write_end = os.pipe()
    forwarder = threading.Thread(target=_forward, args=(read_end, real_stderr), daemon=True)
    forwarder.start()
    os.dup2(write_end, stderr_fd)
    os.close(write_end)
    try:
        yield
    finally:
        _flush_python_stderr()
        os.dup2(real_stderr, stderr_fd)  # the pipe's last writer is gone: the forwarder reads to its end
        forwarder.join(timeout=10.0)
        if not forwarder.is_alive():  # else a process started meanwhile holds the pipe: keep forwarding
            os.close(real_stderr)


def _forward(read_end: int, real_stderr: int) -> None:
    """Copies the pipe to the real stderr line by line, all but the save's INFO lines."""
    pending = b""
    with os.fdopen(read_end, "rb", buffering=0) as pipe:
        while chunk := pipe.read(65536):
            *lines, pending = (pending + chunk).split(b"\n")
            kept = [line + b"\n" for line in lines if not _SAVE_INFO.match(line)]
            if kept:
                os.write(real_stderr, b"".join(kept))
    if pending and not _SAVE_INFO.match(pending):
        os.write(real_stderr, pending)


def _flush_python_stderr() -> None:
    """Writes out what Python buffered for stderr, so it lands in order."""
    try:
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass
