"""Loops: the fit loop, the epoch loop and the evaluation loop, over the engines and services.

- `run_setup`: starting one `fit` (restore, then the services in order).
- `training_run`: `TrainingRun`, the run's progress and its services
  (implements `tftrain.services.protocol.RunState`), and `run_pass`, one
  epoch (or evaluation, or prediction) of host calls.
- `inference`: `evaluate` and `predict`.
- `hooks`: Keras callback plumbing (batch hooks).
- `run_options`: the frozen options of what a `fit` writes and guards.

May import every lower layer (`services`, `checkpoint`, `engine`, `data`,
the public leaf modules, `options`, `compat`, `errors`); never the Trainer.
"""
