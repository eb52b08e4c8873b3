"""The fit loop: one `fit` call, from its target to its History.

`run_fit` runs the call to its target (`checkpoint.state.CallTarget`:
`epochs`, or a step budget `total_steps`) and reads top-down: start the run
(restore the latest checkpoint and build the services,
`run_setup.start_run`), decide the epochs that reach the target from where
the run starts, then for each epoch: reset the metrics, run the epoch loop
(`epoch_loop.run_pass`), validate, call the epoch hooks and end the epoch
with the services. Keras's `fit` is the reference for every callback hook,
its order and its logs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tftrain import timing
from tftrain.checkpoint import run_record
from tftrain.compat import keras_internals
from tftrain.engine import flops
from tftrain.engine.step_runner import StepRunner
from tftrain.fit_inputs import fit_checks
from tftrain.loops import epoch_loop, hooks, inference, run_setup
from tftrain.loops.owner import StepOwner
from tftrain.loops.preparation import FitCall
from tftrain.loops.training_run import TrainingRun
from tftrain.services.periodic_validation import PeriodicValidation

__all__ = ["run_fit"]


def run_fit(owner: StepOwner, call: FitCall) -> tuple[keras.callbacks.History, timing.TimingReport]:
    """Runs one `fit` call to its target; returns the History and the call's timing report."""
    model, engines = owner.model, owner.engines
    callback_list = keras.callbacks.CallbackList(
        call.callbacks,
        add_history=True,
        add_progbar=call.verbose != 0,
        verbose=call.verbose,
        epochs=call.target.epochs,
        steps=call.plan.steps,
        model=model,
    )
    # After the callbacks' `set_model`, as `fit` makes its train function: a reset there rebuilds the step.
    # Where a `TerminateOnNaN` among the callbacks decides what a NaN does, no call stops at one.
    train_runner = engines.runner("train", call.nonfinite_policy)
    timer = timing.StepTimer()
    measured = timer if owner.measure_timing else None
    step_history: dict[str, list[Any]] = {}
    engine_name = None

    def validate() -> dict[str, Any]:  # a validation every N steps
        return inference.validate_mid_epoch(owner, call.validation.plan, callback_list)

    with_record = owner.run_options.model_dir is not None
    record_optimizers = run_record.optimizers_of(model, owner.checkpoint_state()) if with_record else None
    parts = run_setup.RunParts(
        timer=measured,
        trace_counter=train_runner.trace_counter,
        services=_call_services(call, validate, step_history) + tuple(owner.services),
        record=_run_record(owner, call, record_optimizers) if with_record else None,
        optimizers=record_optimizers,
    )
    run = run_setup.start_run(owner, call, parts)
    try:
        epochs = call.target.end_epoch(run.progress, call.plan.steps, resumed=run.resumed)
        if epochs != call.target.epochs:  # a resumed step budget: the epochs that reach it from here
            callback_list.set_params({**callback_list.params, "epochs": epochs})
        if run.resumed and run.progress.epoch >= epochs:
            _report_target_reached(call, run, owner.run_options.model_dir)
        model.history.step_history = step_history
        model.stop_training = False
        training_logs = None
        callback_list.on_train_begin()
        if not run.resumed:  # where to start, as fit reads it after on_train_begin (BackupAndRestore)
            run.progress.epoch = keras_internals.initial_epoch(model) or call.initial_epoch
        for epoch in range(run.progress.epoch, epochs):
            training_logs = _train_epoch(owner, call, run, callback_list, epoch, measured, train_runner)
            if model.stop_training or run.finished:
                break
        engine_name = engines.train_engine_name(callback_list)  # after "auto" chose
        optimizer = getattr(model, "optimizer", None)
        # E.g. EMA weights, as fit ends; with `ema_decay` the model keeps its raw weights.
        if isinstance(optimizer, keras.optimizers.Optimizer) and call.target.epochs > 0 and owner.ema_decay is None:
            optimizer.finalize_variable_values(model.trainable_weights)
        callback_list.on_train_end(logs=training_logs)
    finally:
        try:
            run.close()
        finally:
            call.plan.close()
            if call.validation is not None:
                call.validation.close()
    report = timer.report(run.trace_count(), engine=engine_name)
    if owner.run_options.count_flops:  # after the run, on the traced step: never timed, never retraced
        batch = flops.per_replica_batch_size(call.plan.data.adapter, measured, engines.strategy)
        report = flops.report_with_flops(
            report,
            train_runner.trace_counter,
            model=model,
            strategy=engines.strategy,
            per_replica_batch=batch,
            peak_flops=owner.run_options.peak_flops,
        )
    if call.verbosity and owner.measure_timing:
        print(f"tftrain timing:\n{report.summary()}")
    return model.history, report


def _train_epoch(
    owner: StepOwner,
    call: FitCall,
    run: TrainingRun,
    callback_list: keras.callbacks.CallbackList,
    epoch: int,
    timer: timing.StepTimer | None,
    train_runner: StepRunner,
) -> dict[str, Any]:
    """Trains one epoch (its hooks, the epoch loop, validation) with `train_runner`; returns the epoch's logs."""
    if run.progress.step_in_epoch == 0:  # else: resumed mid-epoch, metrics restored
        owner.reset_metrics()
    callback_list.on_epoch_begin(epoch)
    logs = epoch_loop.run_pass(
        call.plan,
        train_runner,
        *hooks.batch_hooks(callback_list, "train"),
        steps_per_loop=owner.engines.steps_per_call("train", callback_list),
        timer=timer,
        run=run,
        should_stop=lambda: owner.model.stop_training,
    )
    epoch_logs = run.kept_logs(inference.pass_logs(owner, logs, "train"))
    if call.validation is not None and fit_checks.should_validate(epoch, call.validation_freq):
        if run.cut_by_budget:  # the epoch goes on in a larger budget: its metrics must too
            val_logs = inference.validate_mid_epoch(owner, call.validation.plan, callback_list)
        else:
            # The validation's traced steps record no summaries (the default writer in fit is the
            # training step's); callbacks record as under fit (Keras's TensorBoard on_test_end).
            with tf.summary.record_if(lambda: not tf.inside_function()):
                val_logs = inference.run_evaluation(owner, call.validation.plan, callback_list)
        epoch_logs.update({f"val_{key}": value for key, value in val_logs.items()})
    callback_list.on_epoch_end(epoch, epoch_logs)
    run.end_epoch(keras_internals.pythonify_logs(epoch_logs))
    return epoch_logs


def _report_target_reached(call: FitCall, run: TrainingRun, model_dir: str | None) -> None:
    """Says once that a resumed run has nothing to train for this call, and how to train more.

    Printed as progress output and logged (`tftrain` logger, INFO); with
    `verbose=0` only logged, as a WARNING.
    """
    progress = run.progress
    target, larger = call.target.reached_message(progress)
    message = (
        f"tftrain: nothing to train: the run in {model_dir} resumed at step {progress.global_step} "
        f"({progress.epoch} epochs done), which already reaches this call's target ({target}). "
        f"To train it further, pass a larger target ({larger}); to start a new run, pass a new `model_dir`."
    )
    if call.verbosity:
        run_setup.report_resume(message, call.verbosity)
    else:
        logging.getLogger("tftrain").warning(message)


def _call_services(
    call: FitCall, validate: Callable[[], dict[str, Any]], step_history: dict[str, list[Any]]
) -> tuple[PeriodicValidation, ...]:
    """The services this call asks for: a validation every N steps."""
    if call.validation_every_steps is None:
        return ()
    return (PeriodicValidation(call.validation_every_steps, validate, step_history),)


def _run_record(owner: StepOwner, call: FitCall, optimizers: dict[str, Any] | None) -> dict[str, Any]:
    """The call's run record: what its results depend on (`tftrain.checkpoint.run_record`)."""
    options, policy = owner.engines.options, call.nonfinite_policy
    settings = {
        "ema_decay": owner.ema_decay,
        "on_nonfinite": policy.on_nonfinite,
        "loss_spike_threshold": policy.loss_spike_threshold,
        "max_rollbacks": policy.max_rollbacks,
        "rollback_lr_factor": policy.rollback_lr_factor,
        "use_tf_function": options.use_tf_function,
        "jit_compile": options.jit_compile,
        "steps_per_loop": options.steps_per_loop,
        **call.target.record(),
    }
    return run_record.build(
        model=owner.model,
        dataset=call.plan.dataset,
        adapter=call.plan.data.adapter,
        replicas=owner.engines.strategy.num_replicas_in_sync,
        shuffled=call.plan.order is not None if call.plan.position is not None else None,
        settings=settings,
        hparams=owner.run_options.hparams,
        optimizers=optimizers,
    )
