"""Engines: one training step under eager, `tf.function`, XLA, or k steps per host call.

- `step_runner`: `make_runner` (the one place that decides how a step runs) and
  `StepRunner`, whose `dispatch` starts a host call.
- `calls`: what a host call returns (`LoopResult`), read once from its
  `PendingCall`.
- `graph_loops`: the in-graph k-step loop and the single-step call, written
  as graph code (never converted by AutoGraph).
- `auto_steps`: `steps_per_loop="auto"`, k chosen from measured call times.
- `model_setup`, `strategy_checks`: what is checked and built on the model
  and strategy before the first trace.
- `flops`, `graph_flops`, `peak_flops`: one training step's FLOPs, counted on
  its traced graph, and the devices' peak FLOP/s (`Trainer(count_flops=True)`).

May import: `tftrain.fit_inputs`, `timing`, `distribute`, `model`, `precision`, `options`,
`arguments`, `compat`, `errors`. Never the checkpoint, services or loops layers.
"""
