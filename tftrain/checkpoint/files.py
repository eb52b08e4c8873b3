"""The files of a checkpoint directory: which checkpoints it records, what an interrupted save left, damaged ones set aside.

A checkpoint `ckpt-N` is its `ckpt-N.index` and `ckpt-N.data-*` files,
recorded in the directory's `checkpoint` state file once complete (an atomic
rename), so a save killed midway leaves the previous checkpoint the latest.
"""

from __future__ import annotations

import re
import warnings

import tensorflow as tf

__all__ = [
    "CHECKPOINT_NAME", "candidates", "clean_leftovers", "error_line", "last_kept", "recorded", "rerun_resumes", "set_aside",
]  # fmt: skip

CHECKPOINT_NAME = "ckpt"


def recorded(directory: str) -> list[str] | None:
    """The checkpoints the state file records (oldest first); None if it cannot be parsed (warned)."""
    try:
        state = tf.train.get_checkpoint_state(directory)
        # TensorFlow logs a state file it cannot parse and returns None, as for none at all.
        if state is None and tf.io.gfile.exists(tf.io.gfile.join(directory, "checkpoint")):
            raise ValueError("it does not parse as a checkpoint state")
    except Exception as error:  # a damaged state file: a protobuf parse error
        warnings.warn(
            f"The checkpoint state file in {directory} cannot be read ({error}); looking for "
            "checkpoint files directly.",
            stacklevel=4,
        )
        return None
    return list(state.all_model_checkpoint_paths) if state else []


# What a one-line error leaves out: a TensorFlow op prefix, ANSI styles (Keras sets a layer's message in bold).
_NOISE = re.compile(r"^\{\{[^}]*\}\}\s*|\x1b\[[0-9;]*m")
# First lines that only announce the message on the lines after them, and lines after them that are not it.
_PREAMBLES = ("Exception encountered when calling", "Graph execution error")
_NOT_THE_MESSAGE = ("Detected at node", "Arguments received by")


def error_line(error: BaseException) -> str:
    """An error in one line: its type and the first line of its message (no TensorFlow op prefix, no styles).

    Where that line only announces the message (a Keras layer's error, a
    graph's execution error), the first line of the message itself follows it.
    """
    message = error.message if isinstance(error, tf.errors.OpError) else str(error)
    lines = [line.rstrip() for line in _NOISE.sub("", message.strip()).splitlines() if line.strip()] or [""]
    rest = [line for line in lines[1:] if not line[0].isspace() and not line.startswith(_NOT_THE_MESSAGE)]
    text = f"{lines[0]} {rest[0]}" if lines[0].startswith(_PREAMBLES) and rest else lines[0]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def rerun_resumes(kept: str | None) -> str:
    """What a rerun on the same model_dir does after a failed write: resume from `kept`, or start over where it is None."""
    if kept is None:
        return "No checkpoint was written before it: a rerun on the same model_dir starts from the beginning."
    return f"The last checkpoint written, {kept}, is intact and kept: rerunning `fit` on the same model_dir resumes from it."


def last_kept(directory: str) -> str | None:
    """The newest checkpoint the state file records whose files are still on disk, or None (checked, never warned)."""
    try:
        state = tf.train.get_checkpoint_state(directory)
        listed = list(state.all_model_checkpoint_paths) if state else []
        return next((path for path in reversed(listed) if tf.io.gfile.exists(f"{path}.index")), None)
    except (tf.errors.OpError, OSError, ValueError):  # a state file one cannot read keeps nothing sure
        return None


def _found_on_disk(directory: str) -> list[str]:
    if not tf.io.gfile.isdir(directory):
        return []
    pattern = re.compile(rf"^{CHECKPOINT_NAME}-(\d+)\.index$")
    numbers = sorted(
        int(match.group(1)) for name in tf.io.gfile.listdir(directory) if (match := pattern.match(name))
    )
    return [tf.io.gfile.join(directory, f"{CHECKPOINT_NAME}-{n}") for n in numbers]


def candidates(directory: str) -> list[str]:
    """The checkpoints to restore from, oldest first: those recorded, or, if the state file is damaged, those on disk."""
    listed = recorded(directory)
    return _found_on_disk(directory) if listed is None else listed


def clean_leftovers(directory: str) -> list[str]:
    """Removes what an interrupted save left behind in `directory`; returns the removed paths.

    That is: temporary shard directories (`ckpt-N_temp`), temporary state
    files (`checkpoint.tmp...`), and checkpoint files that the state file
    does not record (a save killed before it was recorded). With a damaged
    state file, no checkpoint file is removed.
    """
    listed = recorded(directory)
    kept = None if listed is None else {tf.io.gfile.join(directory, p.split("/")[-1]) for p in listed}
    file_pattern = re.compile(rf"^({CHECKPOINT_NAME}-\d+)\.(index|data-\d+-of-\d+)$")
    removed = []
    for name in tf.io.gfile.listdir(directory):
        name = name.rstrip("/")
        full = tf.io.gfile.join(directory, name)
        if name.startswith(f"{CHECKPOINT_NAME}-") and "_temp" in name and tf.io.gfile.isdir(full):
            tf.io.gfile.rmtree(full)
        elif name.startswith("checkpoint.tmp"):
            tf.io.gfile.remove(full)
        elif (match := file_pattern.match(name)) and kept is not None:
            if tf.io.gfile.join(directory, match.group(1)) in kept:
                continue
            tf.io.gfile.remove(full)
        else:
            continue
        removed.append(full)
    return removed


def set_aside(directory: str, good: str, damaged: list[str]) -> None:
    """Makes `good` the latest checkpoint of `directory`; renames the damaged ones' files with a `.corrupt` suffix."""
    for prefix in damaged:
        for name in tf.io.gfile.glob(prefix + ".*"):
            if not name.endswith(".corrupt"):
                tf.io.gfile.rename(name, name + ".corrupt", overwrite=True)
    kept = [path for path in recorded(directory) or [] if path not in damaged]
    tf.compat.v1.train.update_checkpoint_state(
        directory, model_checkpoint_path=good, all_model_checkpoint_paths=kept
    )
