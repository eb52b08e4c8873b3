"""Every path under a `model_dir`, built in one place, from a directory resolved once.

A run's directory holds:

- `checkpoints/`: the run's checkpoints;
- `best/`: the best epoch's checkpoint (`best_checkpoint_monitor`);
- `train/` and `validation/`: TensorBoard event files (the profiler's traces
  go under `train/`);
- `eval/`: a continuous evaluator's event files and `results.json`;
- `workers/<name>/`: a non-chief worker's own checkpoint copies, removed when
  its run ends;
- `writer.lock`: the process writing to the directory;
- `run_record.json`: the run record's readable copy;
- event files of the run itself: TensorBoard's HParams session (the run
  record as hyperparameters, the last epoch's logs; `tftrain.services.hparams`).

`resolve` turns the directory a user gives (`Trainer(model_dir=...)`,
`evaluate_continuously`, `tftrain.callbacks.standard_callbacks`) into the one
the run uses: a local path made absolute once, so a working directory changed
while a run goes on (`os.chdir` in a callback) does not move the run; a remote
path (`gs://bucket/run`, anything with `://`) as given. Paths are joined with
`os.path.join`, which also serves remote paths.
"""

from __future__ import annotations

import dataclasses
import os

__all__ = [
    "EVAL_RUN",
    "LOCK_NAME",
    "RECORD_FILE",
    "RESULTS_FILE",
    "TRAIN_RUN",
    "VALIDATION_RUN",
    "ModelDirLayout",
    "resolve",
]

LOCK_NAME = "writer.lock"
RECORD_FILE = "run_record.json"  # the run record's readable copy
RESULTS_FILE = "results.json"  # a continuous evaluator's results, under `eval/`
TRAIN_RUN = "train"  # TensorBoard's runs
VALIDATION_RUN = "validation"
EVAL_RUN = "eval"  # a continuous evaluator's TensorBoard run

# TensorFlow finds checkpoint files by pattern (`tf.io.gfile.glob` semantics): its checkpoint reader and
# `tf.train.latest_checkpoint` find nothing under a directory named `run[1]`, and `CheckpointManager`
# deletes what `*` or `?` match when it rotates old checkpoints, another run's among them (`run?` is also
# `run1`). A backslash escapes the next character in such a pattern (it is a separator on Windows).
_PATTERN_CHARACTERS = "*?[" + ("\\" if os.sep == "/" else "")


def resolve(path: str, argument: str = "model_dir") -> str:
    """The path a run uses for `path` (a directory, or a checkpoint): a local one made absolute, a remote one as given.

    Touches nothing on disk (`os.path.abspath` reads the working directory once).

    Args:
        path: A non-empty directory path (str).
        argument: The argument's name, for the error.

    Returns:
        The absolute path (or the remote path unchanged).

    Raises:
        ValueError: the path holds a character TensorFlow's checkpoints read
            as a file pattern (`*`, `?`, `[`, or a backslash).
    """
    resolved = path if "://" in path else os.path.abspath(path)
    found = [character for character in _PATTERN_CHARACTERS if character in resolved]
    if found:
        where = "" if resolved == path else f" (resolved to {resolved!r})"
        raise ValueError(
            f"Invalid value for argument `{argument}`. Received: {argument}={path!r}{where}, which holds "
            f"{found[0]!r}. Expected a path without {', '.join(map(repr, _PATTERN_CHARACTERS))}: "
            "TensorFlow finds checkpoint files by pattern, so under such a name a saved run could not "
            "be found to resume, and rotating old checkpoints could delete files of other directories "
            "the pattern matches. Rename the directory (e.g. with '_' in place of the character)."
        )
    return resolved


@dataclasses.dataclass(frozen=True)
class ModelDirLayout:
    """The paths under one `model_dir`.

    Args:
        root: The directory, as `resolve` returns it (`tftrain.arguments.check_directory_path`
            calls it).
    """

    root: str

    def events(self, run: str) -> str:
        """A TensorBoard run's event files (`train`, `validation`, `eval`)."""
        return os.path.join(self.root, run)

    @property
    def checkpoints(self) -> str:
        """The run's checkpoints."""
        return os.path.join(self.root, "checkpoints")

    @property
    def best(self) -> str:
        """The best epoch's checkpoint."""
        return os.path.join(self.root, "best")

    @property
    def train(self) -> str:
        """TensorBoard's training run (event files and profiler traces)."""
        return self.events(TRAIN_RUN)

    @property
    def validation(self) -> str:
        """TensorBoard's validation run."""
        return self.events(VALIDATION_RUN)

    @property
    def evaluation(self) -> str:
        """A continuous evaluator's event files and results."""
        return self.events(EVAL_RUN)

    @property
    def results(self) -> str:
        """A continuous evaluator's results file."""
        return os.path.join(self.evaluation, RESULTS_FILE)

    @property
    def lock(self) -> str:
        """The writer lock file."""
        return os.path.join(self.root, LOCK_NAME)

    @property
    def run_record(self) -> str:
        """The run record's readable copy."""
        return os.path.join(self.root, RECORD_FILE)

    def worker(self, name: str) -> str:
        """A non-chief worker's own directory."""
        return os.path.join(self.root, "workers", name)
