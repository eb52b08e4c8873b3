"""Services: what acts around the training steps, through one protocol.

`protocol` defines `Service` (next boundary step, before/after a host call,
epoch end, validation, state, close), `RunState` (what a service may read
and ask of the run) and `EveryNSteps` (the one "every N steps" condition).
Each other module is one service: the NaN guard, the step budget, periodic
validation, the profiler window, timing, TensorBoard summaries, in-step
summaries, HParams, checkpoints, the best checkpoint, preemption (one
process and several workers), the loss recovery and the writer lock.

May import: `tftrain.checkpoint`, `engine`, `fit_inputs`, `summaries`, `timing`,
`options`, `arguments`, `compat`, `errors`. Never the loops layer or the Trainer: a
service receives what it acts on through `RunState`.
"""

from tftrain.services.protocol import EveryNSteps, RunState, Service

__all__ = ["EveryNSteps", "RunState", "Service"]
