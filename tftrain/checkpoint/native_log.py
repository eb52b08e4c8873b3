"""Keeps TensorFlow's per-save INFO line out of the log, and nothing else.

Each save of a `tf.data` iterator with symbolic checkpointing logs
"Saving symbolic checkpoint" at INFO level from TensorFlow's C++ code
(`iterator_ops.cc`). TensorFlow offers no way to lower its C++ log level
once it is loaded (`TF_CPP_MIN_LOG_LEVEL` is read once), so around a save
the process's stderr is captured and everything but that line is written
back: warnings and errors still show, in order, right after the save.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

_SAVE_INFO = b"Saving symbolic checkpoint"


def _info_shown() -> bool:
    """Whether TensorFlow's C++ INFO lines print at all (TF_CPP_MIN_LOG_LEVEL below 1)."""
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0")) < 1
    except ValueError:
        return True


@contextlib.contextmanager
def without_save_info() -> Iterator[None]:
    """Within the block, stderr lines naming the symbolic-checkpoint save at INFO level are dropped."""
    if not _info_shown():
        yield
        return
    stderr_fd = 2  # where TensorFlow's C++ logging writes, whatever `sys.stderr` is
    _flush_python_stderr()
    saved_fd = os.dup(stderr_fd)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), stderr_fd)
        try:
            yield
        finally:
            _flush_python_stderr()
            os.dup2(saved_fd, stderr_fd)
            os.close(saved_fd)
            captured.seek(0)
            kept = [line for line in captured.read().splitlines(keepends=True) if not _is_save_info(line)]
            if kept:
                os.write(stderr_fd, b"".join(kept))


def _flush_python_stderr() -> None:
    """Writes out what Python buffered for stderr, so it lands before (or inside) the capture, in order."""
    try:
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):
        pass


def _is_save_info(line: bytes) -> bool:
    """Whether a line is TensorFlow's INFO line of a symbolic-checkpoint save (glog/absl: `I...`)."""
    return line.startswith(b"I") and _SAVE_INFO in line
