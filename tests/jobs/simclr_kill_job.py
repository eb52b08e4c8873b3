"""The SimCLR program, SIGKILLed after a training step: `python simclr_kill_job.py STEP [program flags]`.

Runs `python -m tftrain.examples.simclr` with the given flags, unchanged but
for one callback added to `Trainer.fit` that kills the process with SIGKILL
once the global step reaches STEP (after the step's checkpoint, if any).
"""

import functools
import os
import signal
import sys

import keras

import tftrain
from tftrain.examples.simclr import main


class KillAtStep(keras.callbacks.Callback):
    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations) >= self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def add_kill(fit, step):
    @functools.wraps(fit)  # its signature too: tftrain.flags reads fit's when the flags are parsed
    def fit_until_killed(self, *args, callbacks=None, **kwargs):
        return fit(self, *args, callbacks=[*(callbacks or []), KillAtStep(step)], **kwargs)

    return fit_until_killed


if __name__ == "__main__":
    tftrain.Trainer.fit = add_kill(tftrain.Trainer.fit, int(sys.argv[1]))
    sys.argv = [sys.argv[0], *sys.argv[2:]]
    main.run_main()
