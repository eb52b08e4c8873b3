"""Runners that train through a `fit` call: the Trainer's and Keras's, one epoch per segment.

Each runner builds its model (from the workload's initial weights) and its
`Trainer` or compiled model once, then makes one `fit` call over the
workload's endless training stream with `epochs=lane.segments` and
`steps_per_epoch=lane.steps`: one long run, as users run it, whose epochs are
the measured segments (`segments.SegmentCallback`, epoch hooks only).
"""

from __future__ import annotations

import dataclasses
import tempfile
from typing import Any

import keras

from tftrain.bench.segments import Lane, SegmentCallback
from tftrain.bench.workloads import WorkloadData
from tftrain.callbacks import Timing
from tftrain.trainer import Trainer


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How the variants of one workload train.

    Attributes:
        steps_per_loop: `k` of the k-steps-per-call variants (`graph_loop`,
            `xla_loop`, `handwritten_loop`, `step_only`, `keras_fit_spe`).
        checkpoint_every_steps: How often `graph_checkpoint` saves; None
            means every `steps_per_epoch // 4` steps of the data (the
            Trainer also saves at each segment's end, between segments).
    """

    steps_per_loop: int = 20
    checkpoint_every_steps: int | None = None


@dataclasses.dataclass
class Outcome:
    """What a variant reports besides its segments' times.

    Attributes:
        final_loss: Mean training loss of the last segment (None for `data_only`).
        timing: `TimingReport.to_dict()` where the variant has one.
        notes: Facts about the run (e.g. Keras's resolved `jit_compile`).
        model: The trained model (for the untimed validation check).
    """

    final_loss: float | None = None
    timing: dict[str, Any] | None = None
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)
    model: keras.Model | None = None


def run_trainer(
    data: WorkloadData,
    options: RunOptions,
    lane: Lane,
    *,
    notes: dict[str, Any] | None = None,
    **trainer_options,
) -> Outcome:
    """`tftrain.Trainer(model, **trainer_options).fit(...)`, one epoch per segment.

    Args:
        data: The workload's data and initial weights.
        options: The workload's options.
        lane: The variant's lane.
        notes: Extra facts for the report.
        **trainer_options: `Trainer` keywords; `steps_per_loop` defaults to 1
            (every variant but `default` names its k).

    Returns:
        The outcome, with the Trainer's timing report.
    """
    trainer_options.setdefault("steps_per_loop", 1)
    model = data.fresh_model()
    compile_args = data.workload.compile_args()
    if data.workload.compiled_by_model:
        model.compile(**compile_args)
        trainer = Trainer(model, **trainer_options)
    else:
        trainer = Trainer(model, **compile_args, **trainer_options)
    callback = SegmentCallback(lane)
    trainer.fit(data.train, epochs=lane.segments, steps_per_epoch=lane.steps, callbacks=[callback], verbose=0)
    chosen = {"steps_per_loop_chosen": trainer.chosen_steps_per_loop} if trainer.options.auto else {}
    engine = {"engine": trainer.options.name, "measure_timing": trainer.measure_timing}
    return Outcome(
        final_loss=callback.last_logs.get("loss"),
        timing=trainer.timing.to_dict() if trainer.timing is not None else None,
        notes={**engine, **chosen, **(notes or {})},
        model=model,
    )


def checkpoint_every(data: WorkloadData, options: RunOptions) -> int:
    """Steps between the saves of `graph_checkpoint`: as asked, else a quarter pass (at least 1)."""
    return options.checkpoint_every_steps or max(1, data.steps_per_epoch // 4)


def run_graph_checkpoint(data: WorkloadData, options: RunOptions, lane: Lane) -> Outcome:
    """`tftrain.Trainer(model_dir=..., checkpoint_every_steps=N)` (otherwise as `graph`).

    A fresh temporary `model_dir` (removed afterwards). The Trainer also saves
    at each epoch's end, which falls between segments: the lane records it
    as the segment's `gap_s`, a direct measurement of one save.
    """
    every = checkpoint_every(data, options)
    with tempfile.TemporaryDirectory(prefix="tftrain-bench-") as model_dir:
        return run_trainer(
            data,
            options,
            lane,
            model_dir=model_dir,
            checkpoint_every_steps=every,
            notes={"checkpoint_every_steps": every},
        )


def run_keras_fit(
    data: WorkloadData, options: RunOptions, lane: Lane, *, steps_per_execution: int = 1, timing: bool = False
) -> Outcome:
    """`model.compile(steps_per_execution=...)`, then `model.fit`, one epoch per segment.

    Keras builds its train function once per compiled model and reuses it
    for every epoch of the call, so no segment after the first traces.

    Args:
        data: The workload's data and initial weights.
        options: The workload's options (unused: the keywords say what runs).
        lane: The variant's lane.
        steps_per_execution: Keras's steps per host call.
        timing: Add `tftrain.callbacks.Timing()`.

    Returns:
        The outcome.
    """
    del options
    model = data.fresh_model()
    compile_args = data.workload.compile_args()
    if steps_per_execution != 1:
        compile_args["steps_per_execution"] = steps_per_execution
    model.compile(**compile_args)
    callback = SegmentCallback(lane)
    timing_callback = Timing() if timing else None
    callbacks = [callback] if timing_callback is None else [callback, timing_callback]
    # shuffle=False only silences Keras's warning: a Dataset is never shuffled by fit.
    model.fit(
        data.train,
        epochs=lane.segments,
        steps_per_epoch=lane.steps,
        callbacks=callbacks,
        verbose=0,
        shuffle=False,
    )
    report = timing_callback.report if timing_callback is not None else None
    return Outcome(
        final_loss=callback.last_logs.get("loss"),
        timing=report.to_dict() if report is not None else None,
        notes={"jit_compile": bool(model.jit_compile), "steps_per_execution": int(model.steps_per_execution)},
        model=model,
    )
