"""The Trainer's options: frozen dataclasses that check themselves on construction.

`EngineOptions` says how a step runs, `RunOptions` what a `fit` writes and
guards around its steps; `check_engine_options` checks one against the other.
`NonFinitePolicy` says what a loss blow-up does: the engine, the NaN guard and
the loss recovery read it. Each validates itself on construction, without
touching the filesystem, and raises in Keras's form: "Invalid value for
argument `x`. Received: x=... Expected ...". The checks of single arguments
that other layers share live in `tftrain.arguments`; they are importable from
here too.

A bottom layer: imports only `tftrain.arguments`, `tftrain.compat` and `tftrain.errors`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import types
from collections.abc import Mapping
from typing import Any

import numpy as np

from tftrain import layout
from tftrain.arguments import (
    check_directory_path,
    check_every_steps,
    check_int,
    check_jit_compile,
    check_left_at_default,
    check_lr_sweep,
    check_path_not_empty,
    check_port,
    check_profile_steps,
    check_validation_every_steps,
    check_validation_freq,
    check_validation_split,
    check_verbose,
)
from tftrain.compat import tf_internals

__all__ = [
    "UNTESTED",
    "EngineOptions",
    "NonFinitePolicy",
    "RunOptions",
    "check_engine_options",
    "check_hparams",
    "check_peak_flops",
    # The argument checks, defined in `tftrain.arguments`.
    "check_directory_path",
    "check_every_steps",
    "check_int",
    "check_jit_compile",
    "check_left_at_default",
    "check_lr_sweep",
    "check_path_not_empty",
    "check_port",
    "check_profile_steps",
    "check_validation_every_steps",
    "check_validation_freq",
    "check_validation_split",
    "check_verbose",
]


def check_peak_flops(count_flops: Any, peak_flops: Any) -> None:
    """`Trainer(count_flops=..., peak_flops=...)`: a bool, and None or a finite number > 0 with `count_flops=True`.

    Raises:
        TypeError: `count_flops` is not a bool.
        ValueError: `peak_flops` is not a finite number > 0, or is given without `count_flops`.
    """
    if not isinstance(count_flops, bool):
        raise TypeError(
            f"Invalid value for argument `count_flops`. Received: count_flops={count_flops!r}. Expected True or False."
        )
    if peak_flops is None:
        return
    numeric = isinstance(peak_flops, int | float | np.integer | np.floating)
    if isinstance(peak_flops, bool) or not numeric or not 0 < peak_flops < float("inf"):
        raise ValueError(
            f"Invalid value for argument `peak_flops`. Received: peak_flops={peak_flops!r}. Expected the peak "
            "FLOP/s of all the devices the run uses, a finite number > 0 (e.g. 312e12 for one A100 in "
            "bfloat16), or None to look it up."
        )
    if not count_flops:
        raise ValueError(
            f"Invalid combination of arguments. Received: peak_flops={peak_flops!r} with count_flops=False. "
            "Expected count_flops=True: the peak serves the utilisation of counted FLOPs."
        )


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """How a step runs.

    Attributes:
        use_tf_function: Wrap the step in `tf.function` (graph). False runs it
            eagerly: slow, but `print` and debuggers work inside the step.
        jit_compile: Compile the step with XLA. Needs `use_tf_function`. A
            resolved bool: the `Trainer` resolves its `jit_compile="auto"`
            against the model before making these options.
        steps_per_loop: Steps per host call. Above 1 (with `use_tf_function`),
            a `tf.while_loop` inside one `tf.function` pulls batches from the
            iterator, so the host is visited once per `steps_per_loop` steps.
            `"auto"`: the same loop, with k chosen from measured call times
            (`tftrain.engine.auto_steps`).
    """

    use_tf_function: bool = True
    jit_compile: bool = False
    steps_per_loop: int | str = 1

    def __post_init__(self):
        for name in ("use_tf_function", "jit_compile"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(
                    f"Invalid value for argument `{name}`. Received: {name}={value!r} "
                    f"(type {type(value).__name__}). Expected True or False."
                )
        if self.steps_per_loop != "auto":
            check_int(
                "steps_per_loop",
                self.steps_per_loop,
                meaning='(1 = one step per host call; e.g. 20 runs 20 steps per call inside one tf.function), or "auto"',
            )
        if self.jit_compile and not self.use_tf_function:
            raise ValueError(
                "Invalid combination of arguments. Received: jit_compile=True with "
                "use_tf_function=False. Expected use_tf_function=True for XLA; pass "
                "jit_compile=False to run eagerly."
            )

    @property
    def name(self) -> str:
        """A short name of the engine, e.g. `"graph"` or `"xla+loop20"`."""
        if not self.use_tf_function:
            base = "eager"
        else:
            base = "xla" if self.jit_compile else "graph"
        if self.auto:
            base += "+auto"
        elif self.fixed_steps > 1:
            base += f"+loop{self.steps_per_loop}"
        return base

    def ran_name(self, steps_per_call: int | None) -> str:
        """The name of the engine that ran: `name`, with the k that `"auto"` chose.

        Args:
            steps_per_call: The steps per host call that `steps_per_loop="auto"`
                ran once it chose (1 where callbacks implement batch hooks), or
                None where it had not chosen yet. Ignored without `"auto"`.

        Returns:
            `name` without `"auto"`; with it, e.g. `"graph+loop20 (auto)"`,
            `"xla (auto)"` (one step per call), or `"graph+auto"` before a choice.
        """
        if not self.auto or steps_per_call is None:
            return self.name
        return dataclasses.replace(self, steps_per_loop=steps_per_call).name + " (auto)"

    @property
    def auto(self) -> bool:
        """Whether k is chosen from measured call times (`steps_per_loop="auto"` under `tf.function`)."""
        return self.steps_per_loop == "auto" and self.use_tf_function

    @property
    def fixed_steps(self) -> int:
        """k where it is fixed: `steps_per_loop`, or 1 for `"auto"` without `tf.function` (eager)."""
        return 1 if self.steps_per_loop == "auto" else self.steps_per_loop

    @property
    def in_graph_loop(self) -> bool:
        """Whether a host call runs its steps in one `tf.function` (a `tf.while_loop` over the iterator)."""
        return self.use_tf_function and (self.auto or self.fixed_steps > 1)


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What a `Trainer.fit` writes and guards around its steps (the `Trainer` arguments of the same names).

    Validated on construction, without touching the filesystem: `model_dir`
    must not be a file and must be creatable; it is created when a run starts.

    Attributes:
        model_dir: A directory for checkpoints (`model_dir/checkpoints`) and
            TensorBoard event files (`model_dir/train`, `model_dir/validation`).
            `fit` on a `model_dir` that holds a checkpoint resumes from it and
            trains up to the same target, so rerunning a killed command
            finishes the job. A local path is made absolute here, once (a
            later `os.chdir` does not move the run); a path holding `*`, `?`,
            `[` or a backslash is refused (`tftrain.layout.resolve`).
        checkpoint_every_steps: Also save every this many training steps
            (None: only at epoch ends). Needs `model_dir`.
        max_to_keep: Checkpoints kept in `model_dir` (another value than 5 needs `model_dir`).
        summary_every_steps: Also write training summaries every this many
            steps (None: only at epoch ends). Needs `model_dir`.
        profile_steps: `(start, stop)`: run the TensorFlow profiler over these
            training steps (1-based, both included); the trace goes to
            `model_dir/train` for TensorBoard's profile tab. Needs `model_dir`.
        preemption_signals: With `model_dir`: signals (numbers or names) on
            which `fit` finishes the host call in flight, saves a checkpoint
            at that step and raises `tftrain.PreemptedError`; rerunning
            resumes exactly there. Under several workers, a signal reaching
            any worker stops them all at one agreed step (one host call
            later), each saving (see docs/distribution.md). `()` keeps the
            process's default handlers (SIGTERM then kills it). Installed
            only while `fit` runs. Signals other than the default need `model_dir`.
        best_checkpoint_monitor: With `model_dir`: also keep the checkpoint of
            the best epoch by this log (e.g. `"val_loss"`) in `model_dir/best`,
            apart from the rotating ones (load it with
            `tftrain.checkpoint.restore_model`).
        best_checkpoint_mode: `"min"`, `"max"` or `"auto"` (max for
            accuracy-like names); another than `"auto"` needs
            `best_checkpoint_monitor`.
        resume_from: With `model_dir`: a checkpoint (path prefix such as
            `"run1/checkpoints/ckpt-3000"`, or a directory: its latest) to
            continue from when `model_dir` holds no checkpoint yet: weights,
            optimizer, global step, epoch and data position, validated as a
            resume is. Once `model_dir` has checkpoints of its own, they win,
            so rerunning the command resumes the new run.
        async_checkpoint: With `model_dir`: write checkpoints in a background
            thread (TensorFlow's asynchronous checkpointing): a save copies the
            state to host memory and training goes on while the files are
            written. A checkpoint becomes the latest only once complete, so a
            crash mid-write resumes from the one before; the next save, the
            end of `fit` and a preemption wait for a pending write, and its
            error (e.g. a full disk) is raised there. Costs a host copy of the
            saved state. See docs/checkpoints.md.
        count_flops: Count the FLOPs of one training step on its traced graph
            after each `fit` (nothing is retraced, and nothing changes while
            training): `trainer.timing` then reports `flops_per_step`,
            `flops_per_sec` and, where the devices' peak is known,
            `utilization` (`tftrain.engine.flops`; docs/beyond_fit.md).
        peak_flops: With `count_flops`: the peak FLOP/s of all the devices the
            run uses, for the utilisation; None looks one device up in
            `tftrain.engine.peak_flops`'s table (by device name and the
            model's compute dtype) and multiplies by the strategy's replicas.
        on_data_change: With `model_dir`: what a resume does where the data
            changed mid-epoch in a way its saved position cannot follow (a
            dataset's batch size or length, the examples of arrays, the
            element spec; a new batch size of arrays alone is converted):
            `"refuse"` raises `tftrain.errors.RunChangedError` before
            anything is restored; `"next_epoch"` restores the checkpoint and
            starts the next epoch on the new data (the rest of the
            checkpoint's epoch is not trained; said in one line).
        hparams: With `model_dir`: values of your own to record with the run
            (e.g. a program's flags), by name: each a bool, int, float, str or
            None. They are kept in the run record as `hparams.<name>` (a
            resume that changes one says so) and shown in TensorBoard's
            HParams tab beside the record (`tftrain.services.hparams`).
        slurm_requeue: With `model_dir`, in a SLURM job: after a preemption's
            checkpoint, the chief puts the job back in the queue
            (`scontrol requeue $SLURM_JOB_ID`, `tftrain.slurm.requeue`) once
            the run's services are closed; `fit` raises
            `tftrain.PreemptedError` as for any preemption, and the requeued
            job resumes from that checkpoint. SIGUSR1 (the time-limit warning
            of `#SBATCH --signal=USR1@90`) joins `preemption_signals`. A
            failed requeue is warned of in one line (docs/distribution.md).

    Raises:
        TypeError, ValueError: a bad value, or an option that needs `model_dir`
            (or `best_checkpoint_monitor`) without it.
    """

    model_dir: str | None = None
    checkpoint_every_steps: int | None = None
    max_to_keep: int = 5
    summary_every_steps: int | None = None
    profile_steps: tuple[int, int] | None = None
    preemption_signals: tuple[int, ...] = (signal.SIGTERM,)
    best_checkpoint_monitor: str | None = None
    best_checkpoint_mode: str = "auto"
    resume_from: str | None = None
    async_checkpoint: bool = False
    count_flops: bool = False
    peak_flops: float | None = None
    on_data_change: str = "refuse"
    hparams: Mapping[str, bool | int | float | str | None] | None = None
    slurm_requeue: bool = False

    def __post_init__(self):
        check_peak_flops(self.count_flops, self.peak_flops)
        if self.hparams is not None:
            object.__setattr__(self, "hparams", check_hparams(self.hparams))
        if self.on_data_change not in ("refuse", "next_epoch"):
            raise ValueError(
                "Invalid value for argument `on_data_change`. Received: "
                f"on_data_change={self.on_data_change!r}. Expected 'refuse' (a resume whose data changed "
                "mid-epoch raises RunChangedError) or 'next_epoch' (it starts the next epoch on the new data)."
            )
        check_every_steps(self.checkpoint_every_steps, "checkpoint_every_steps")
        check_every_steps(self.summary_every_steps, "summary_every_steps")
        check_int("max_to_keep", self.max_to_keep)
        object.__setattr__(self, "profile_steps", check_profile_steps(self.profile_steps))
        object.__setattr__(self, "preemption_signals", _check_signals(self.preemption_signals))
        if not isinstance(self.slurm_requeue, bool):
            raise TypeError(
                "Invalid value for argument `slurm_requeue`. Received: "
                f"slurm_requeue={self.slurm_requeue!r}. Expected True or False."
            )
        if self.slurm_requeue and not self.preemption_signals:
            raise ValueError(
                "Invalid combination of arguments. Received: slurm_requeue=True with preemption_signals=(). "
                "Expected preemption signals (the default, SIGTERM): the job is requeued after a preemption's "
                "checkpoint."
            )
        if self.slurm_requeue and signal.SIGUSR1 not in self.preemption_signals:  # SLURM's time-limit warning
            object.__setattr__(self, "preemption_signals", (*self.preemption_signals, int(signal.SIGUSR1)))
        monitor = self.best_checkpoint_monitor
        if monitor is not None and (not isinstance(monitor, str) or not monitor):
            raise ValueError(
                f"Invalid value for argument `best_checkpoint_monitor`. Received: best_checkpoint_monitor="
                f"{monitor!r}. Expected the name of a log, e.g. 'val_loss', or None."
            )
        if self.best_checkpoint_mode not in ("auto", "min", "max"):
            raise ValueError(
                "Invalid value for argument `best_checkpoint_mode`. Received: best_checkpoint_mode="
                f"{self.best_checkpoint_mode!r}. Expected 'auto', 'min' or 'max'."
            )
        if monitor is None:
            check_left_at_default(
                self,
                ("best_checkpoint_mode",),
                received="best_checkpoint_monitor=None",
                expected="a `best_checkpoint_monitor`",
            )
        if not isinstance(self.async_checkpoint, bool):
            raise TypeError(
                "Invalid value for argument `async_checkpoint`. Received: "
                f"async_checkpoint={self.async_checkpoint!r}. Expected True or False."
            )
        if self.async_checkpoint and self.model_dir is None:
            raise ValueError(
                "Invalid combination of arguments. Received: async_checkpoint=True with model_dir=None. "
                "Expected a `model_dir` to write checkpoints to (or async_checkpoint=False)."
            )
        if self.async_checkpoint:
            tf_internals.check_async_checkpoint_support()
        if self.model_dir is None:
            for name in (
                "checkpoint_every_steps",
                "summary_every_steps",
                "profile_steps",
                "best_checkpoint_monitor",
                "resume_from",
                "hparams",
            ):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"Invalid combination of arguments. Received: {name}={getattr(self, name)!r} with "
                        "model_dir=None. Expected a `model_dir` to write checkpoints, summaries and "
                        "profiles to."
                    )
            check_left_at_default(
                self,
                ("slurm_requeue", "max_to_keep", "preemption_signals", "on_data_change"),
                received="model_dir=None",
                expected="a `model_dir`",
            )
        else:
            directory = check_directory_path(self.model_dir, "model_dir")
            object.__setattr__(self, "model_dir", directory)
        if self.resume_from is not None:
            if not isinstance(self.resume_from, (str, os.PathLike)) or not str(self.resume_from):
                raise ValueError(
                    f"Invalid value for argument `resume_from`. Received: resume_from={self.resume_from!r}. "
                    "Expected a checkpoint path (e.g. 'run1/checkpoints/ckpt-3000') or a directory of "
                    "checkpoints."
                )
            resume_from = layout.resolve(os.fspath(self.resume_from), "resume_from")  # a checkpoint or a directory
            object.__setattr__(self, "resume_from", resume_from)


@dataclasses.dataclass(frozen=True)
class NonFinitePolicy:
    """What a loss blow-up does in a `fit` call: the one object the engine and the services read.

    A blow-up is a training step whose loss (`loss` or `*_loss`) is NaN or
    infinite, or above `loss_spike_threshold`. The `Trainer` makes one from
    its options (`terminate_on_nan`, `on_nonfinite`, `loss_spike_threshold`,
    `max_rollbacks`, `rollback_lr_factor`); each `fit` call takes it with its
    callbacks (`with_callbacks`).

    Attributes:
        terminate_on_nan: Test each training step's loss: stop with
            `NonFiniteLossError` at the first step whose loss (a `loss` or
            `*_loss` log) is NaN or infinite; no checkpoint is written for it. A `fit` call whose `callbacks` hold
            Keras's `keras.callbacks.TerminateOnNaN` (or a subclass) leaves the
            policy to that callback, as under `model.fit`: no error here, no
            host call cut short, and the callback stops training or raises;
            with `model_dir`, no checkpoint (periodic, epoch end, preemption,
            best) is written from the first non-finite step of the call on
            (warned once). False: nothing is checked, and training goes on.
        on_nonfinite: `"stop"`: raise `NonFiniteLossError` at the first
            blow-up (the NaN guard). `"rollback"`: restore the newest good
            state kept in memory and go on past the batches that caused it
            (needs `model_dir`, whose checkpoints record the rollbacks).
        loss_spike_threshold: A loss log above this is a blow-up too (None:
            NaN and infinity only). It is tested on the step's logs, as
            `fit` reports them: for a compiled Keras model the `loss` log is
            the epoch's running mean, a custom `train_step` reports what it
            returns.
        max_rollbacks: Rollbacks allowed in a run (the count is saved in
            checkpoints); the next blow-up raises `NonFiniteLossError`.
        rollback_lr_factor: After each rollback, multiply the optimizer's
            learning rate by this (1.0: leave it). Needs a float learning
            rate, not a schedule. The scaled rate is saved with the next
            checkpoint, so a resume continues with it.
        keep_every_steps: Global steps between the states kept in memory for
            a rollback (a blow-up throws away at most this many steps). The
            `Trainer` derives it from `steps_per_loop`
            (`tftrain.services.loss_recovery.keep_every_steps_for`).
        callbacks_decide: The call's callbacks hold Keras's `TerminateOnNaN`,
            which decides (as under `model.fit`): training calls run past a
            non-finite loss and flag it, the NaN guard raises nothing, and no
            checkpoint is written from the first non-finite step on.

    Raises:
        ValueError, TypeError: a bad value, or a combination that cannot work
            (`max_rollbacks` or `rollback_lr_factor` other than the default
            with `"stop"`; `"rollback"` or a spike threshold with
            `terminate_on_nan=False` or with callbacks that decide).
    """

    terminate_on_nan: bool = True
    on_nonfinite: str = "stop"
    loss_spike_threshold: float | None = None
    max_rollbacks: int = 3
    rollback_lr_factor: float = 1.0
    keep_every_steps: int = 1
    callbacks_decide: bool = False

    def __post_init__(self):
        if not isinstance(self.terminate_on_nan, bool):
            raise TypeError(
                "Invalid value for argument `terminate_on_nan`. Received: "
                f"terminate_on_nan={self.terminate_on_nan!r}. Expected True or False."
            )
        if self.on_nonfinite not in ("stop", "rollback"):
            raise ValueError(
                f"Invalid value for argument `on_nonfinite`. Received: on_nonfinite={self.on_nonfinite!r}. "
                "Expected 'stop' (raise NonFiniteLossError) or 'rollback' (restore the last good "
                "state and go on)."
            )
        threshold = self.loss_spike_threshold
        if threshold is not None and (
            isinstance(threshold, bool) or not isinstance(threshold, int | float) or not math.isfinite(threshold)
        ):
            raise ValueError(
                "Invalid value for argument `loss_spike_threshold`. Received: "
                f"loss_spike_threshold={threshold!r}. Expected a finite number (a loss above it is a "
                "blow-up), or None."
            )
        check_int("max_rollbacks", self.max_rollbacks, minimum=0)
        factor = self.rollback_lr_factor
        if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor <= 1:
            raise ValueError(
                "Invalid value for argument `rollback_lr_factor`. Received: "
                f"rollback_lr_factor={factor!r}. Expected a number in (0, 1]: the learning rate is "
                "multiplied by it after each rollback (1.0 leaves it)."
            )
        check_int("keep_every_steps", self.keep_every_steps)
        if not self.rollback:
            check_left_at_default(
                self,
                ("max_rollbacks", "rollback_lr_factor"),
                received=f"on_nonfinite={self.on_nonfinite!r}",
                expected="on_nonfinite='rollback' (they act at each rollback)",
            )
        received = f"on_nonfinite={self.on_nonfinite!r}, loss_spike_threshold={threshold!r}"
        if (self.rollback or threshold is not None) and not self.terminate_on_nan:
            raise ValueError(
                f"Invalid combination of arguments. Received: terminate_on_nan=False with {received}. "
                "Expected terminate_on_nan=True: with it off no step's loss is tested."
            )
        if (self.rollback or threshold is not None) and self.callbacks_decide:
            raise ValueError(
                "Invalid combination of arguments. Received: a keras.callbacks.TerminateOnNaN in `callbacks` "
                f"with {received}. Expected one policy for a loss blow-up: remove the callback (the Trainer's "
                "policy decides), or pass on_nonfinite='stop' and loss_spike_threshold=None (the callback decides)."
            )

    @property
    def rollback(self) -> bool:
        """Whether a blow-up rolls back (else it stops)."""
        return self.on_nonfinite == "rollback"

    @property
    def stops(self) -> bool:
        """Whether a training call stops right after a blow-up (an in-graph test of each step's loss)."""
        return self.terminate_on_nan and not self.callbacks_decide

    @property
    def flags(self) -> bool:
        """Whether a training call runs past a non-finite loss and flags it (the callbacks decide)."""
        return self.callbacks_decide

    @property
    def loss_limit(self) -> float | None:
        """The loss above which a step blows up, where calls stop at blow-ups (`stops`); else None."""
        return self.loss_spike_threshold if self.stops else None

    def with_callbacks(self, terminate_on_nan_callback: bool) -> NonFinitePolicy:
        """This policy for a `fit` call whose callbacks hold Keras's `TerminateOnNaN` (True) or not.

        Raises:
            ValueError: such a callback beside `"rollback"` or a spike threshold.
        """
        decide = self.terminate_on_nan and terminate_on_nan_callback
        return self if decide == self.callbacks_decide else dataclasses.replace(self, callbacks_decide=decide)

    def check(self, *, model_dir: str | None) -> None:
        """Checks the policy against the run's `model_dir`.

        Raises:
            ValueError: `"rollback"` without `model_dir`.
        """
        if self.rollback and model_dir is None:
            raise ValueError(
                "Invalid combination of arguments. Received: on_nonfinite='rollback' with model_dir=None. "
                "Expected a `model_dir`: its checkpoints record the rollbacks, so a rerun resumes them exactly."
            )


UNTESTED = NonFinitePolicy(terminate_on_nan=False)
"""The policy of an engine whose calls test no loss (evaluation, prediction, `terminate_on_nan=False`)."""


def check_hparams(hparams: Any) -> types.MappingProxyType:
    """`hparams` as a read-only mapping of names to plain values (NumPy scalars converted).

    Raises:
        TypeError: not a mapping, a name that is no non-empty string, or a
            value that is not a bool, int, float, str or None.
    """
    if not isinstance(hparams, Mapping):
        raise TypeError(
            f"Invalid value for argument `hparams`. Received: an object of type {type(hparams).__name__}. "
            "Expected a mapping of names to values, e.g. {'temperature': 0.1, 'augment': 'strong'}."
        )
    checked: dict[str, bool | int | float | str | None] = {}
    for name, value in hparams.items():
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"Invalid value for argument `hparams`. Received: the name {name!r}. Expected non-empty strings."
            )
        if isinstance(value, np.generic):
            value = value.item()
        if value is not None and not isinstance(value, bool | int | float | str):
            raise TypeError(
                f"Invalid value for argument `hparams`. Received: hparams[{name!r}] of type "
                f"{type(value).__name__}. Expected a bool, int, float, str or None (what TensorBoard's "
                "HParams tab shows); record a list or object as a string, e.g. with json.dumps."
            )
        checked[name] = value
    return types.MappingProxyType(checked)


def check_engine_options(run: RunOptions, engine: EngineOptions) -> None:
    """Checks the run options against the engine: `count_flops` needs a traced step (`use_tf_function=True`).

    Raises:
        ValueError: `count_flops=True` with the eager engine.
    """
    if run.count_flops and not engine.use_tf_function:
        raise ValueError(
            "Invalid combination of arguments. Received: count_flops=True with use_tf_function=False. "
            "Expected use_tf_function=True: FLOPs are counted on the traced step's graph, and the eager "
            "engine traces none (the math is the same under both), or count_flops=False."
        )


def _check_signals(value: Any) -> tuple[int, ...]:
    """`preemption_signals` as a tuple of signal numbers (names like "SIGUSR1" accepted)."""
    if value is None:
        return ()
    items = (value,) if isinstance(value, (str, int)) else tuple(value)
    numbers = []
    uncatchable = {signal.SIGKILL, signal.SIGSTOP}
    for item in items:
        try:
            number = signal.Signals[item] if isinstance(item, str) else signal.Signals(item)
            if number in uncatchable:
                raise ValueError(number.name)
            numbers.append(int(number))
        except (KeyError, ValueError, TypeError):
            valid = ", ".join(
                sorted(s.name for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2))
            )
            raise ValueError(
                f"Invalid value for argument `preemption_signals`. Received: preemption_signals={value!r}. "
                f"Expected signals a handler can catch (numbers or names such as {valid}; not SIGKILL or "
                "SIGSTOP), or () to keep the default handlers."
            ) from None
    return tuple(numbers)
