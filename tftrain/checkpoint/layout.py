"""Every path under a `model_dir`, built in one place.

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

Paths are joined with `os.path.join`, which also serves remote paths such as
`gs://bucket/run`.
"""

from __future__ import annotations

import dataclasses
import os

from tftrain import summaries

__all__ = ["EVAL_RUN", "LOCK_NAME", "ModelDirLayout"]

LOCK_NAME = "writer.lock"
EVAL_RUN = "eval"  # a continuous evaluator's TensorBoard run


@dataclasses.dataclass(frozen=True)
class ModelDirLayout:
    """The paths under one `model_dir`.

    Args:
        root: The directory, as checked by `tftrain.arguments.check_directory_path`
            (never empty).
    """

    root: str

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
        return os.path.join(self.root, summaries.TRAIN_RUN)

    @property
    def validation(self) -> str:
        """TensorBoard's validation run."""
        return os.path.join(self.root, summaries.VALIDATION_RUN)

    @property
    def evaluation(self) -> str:
        """A continuous evaluator's event files and results."""
        return os.path.join(self.root, EVAL_RUN)

    @property
    def lock(self) -> str:
        """The writer lock file."""
        return os.path.join(self.root, LOCK_NAME)

    def worker(self, name: str) -> str:
        """A non-chief worker's own directory."""
        return os.path.join(self.root, "workers", name)
