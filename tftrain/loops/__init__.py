"""Loops: the fit loop, the epoch loop and the evaluation loop, over the engines and services.

A `fit` call goes `tftrain.trainer` -> `fit_loop` -> `epoch_loop` ->
`tftrain.engine.step_runner`.

- `preparation`: a call's arguments checked and its inputs adapted into
  plans (`FitCall`), before any step.
- `fit_loop`: `run_fit`, one `fit` call to its target (epochs or a step budget).
- `epoch_loop`: `run_pass`, one epoch (or evaluation, or prediction) of host calls.
- `step_plan`: `StepPlan`, the steps of each host call of a pass and the
  indices its batch hooks get.
- `inference`: the evaluation loop (`evaluate`, `predict`, `fit`'s validation).
- `run_setup`: starting a run: the writer lock, the restore, the services in order.
- `restore`: `restore_run`, the restore sequence, one named step after the other.
- `training_run`: `TrainingRun`, the run's progress and its services
  (the services' `RunState`).
- `trainer_engines`: `Engines`, a Trainer's step runners, one per kind of step,
  built once and cached.
- `dry_run`, `lr_sweep`: `Trainer.check` and `find_learning_rate`, the fit
  loop run with a budget in a `state_copy.Sandbox` (the training state and
  the engines' cache put back, a temporary directory, no user callbacks).
- `owner`: `StepOwner`, what the loops need of the Trainer (they never import it).
- `hooks`: Keras callback plumbing (batch hooks).

May import every lower layer (`services`, `checkpoint`, `engine`, `fit_inputs`,
the public leaf modules, `options`, `arguments`, `compat`, `errors`); never the Trainer.
"""
