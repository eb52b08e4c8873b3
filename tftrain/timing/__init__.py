"""Built-in timing: the step timer, with the report and trace counting beside it.

Every `Trainer.fit` measures itself with these pieces, and
`tftrain.callbacks.Timing` gives the same report for `keras.Model.fit`.

- this module: `StepTimer`, which times host calls (each one or more
  training steps) and builds the report; `batch_size_of`.
- `report`: `TimingReport`, what one `fit` measured, and its table.
- `traces`: `TraceCounter`, which counts a step function's traces and warns
  on retracing, naming what changed; `describe_arguments`.

The clock is `time.perf_counter` (monotonic) and each host call is timed only
after its outputs are available on the host, so device work is not
under-counted on asynchronous devices.

A leaf layer: imports nothing else from tftrain.
"""

from __future__ import annotations

import importlib
import statistics
import time
import warnings
from typing import Any

import numpy as np
import tensorflow as tf

from tftrain.timing.report import TimingReport
from tftrain.timing.traces import RETRACE_WARNING_THRESHOLD, TraceCounter, describe_arguments

__all__ = [
    "MAX_SAVED_STEP_TIMES",
    "RETRACE_WARNING_THRESHOLD",
    "StepTimer",
    "TimingReport",
    "TraceCounter",
    "batch_size_of",
    "describe_arguments",
]

def __getattr__(name: str) -> Any:
    # `Timing`, the Keras callback, lives with the other callbacks, its documented home; this
    # name still finds it. Imported when asked for, so this leaf imports nothing above it.
    if name == "Timing":
        warnings.warn(
            "tftrain.timing.Timing is tftrain.callbacks.Timing: import it from tftrain.callbacks.",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module("tftrain.callbacks").Timing
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# Step times kept in a checkpoint's timing state (the median of a resumed run
# is taken over these).
MAX_SAVED_STEP_TIMES = 10_000


def batch_size_of(batch: Any) -> int | None:
    """The leading dimension of a batch's first tensor, if known on the host."""
    for value in tf.nest.flatten(batch):
        shape = getattr(value, "shape", None)
        if shape is not None and len(shape) > 0 and shape[0] is not None:
            return int(shape[0])
    return None


class StepTimer:
    """Times host calls; each call runs one or more training steps.

    Call `begin_call()` before a host call and `end_call(...)` once its
    outputs have been read on the host. Calls may overlap: a call started
    before the previous one's outputs were read (`Trainer.fit` reads a call's
    results after it has dispatched the next) is timed from that read, so
    each call's time is the interval between two reads, and the steady
    times add up to the wall time with no extra sync.
    """

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        """Forgets everything measured."""
        self.first_call_s: float | None = None
        self.step_times: list[float] = []
        self.steady_seconds = 0.0
        self.steady_examples = 0
        self.steady_examples_known = True
        self.steps = 0
        self.checkpoint_save_times: list[float] = []
        self._largest_batch: int | None = None  # the most examples a one-step call ran
        self._largest_mean_batch = 0.0  # the most examples per step of any call
        self._start: float | None = None
        self._in_flight = 0  # calls begun and not yet ended
        self._window = [0, 0, 0.0, True]  # steady steps, examples, seconds, examples known

    def begin_call(self) -> None:
        """Starts the clock for one host call (if another is in flight, its end starts this one's)."""
        if not self._in_flight:
            self._start = time.perf_counter()
        self._in_flight += 1

    def exclude(self, seconds: float) -> None:
        """Leaves `seconds` spent inside the current call out of its time (e.g. a callback hook)."""
        if self._start is not None:
            self._start += seconds

    def end_call(self, steps: int, examples: int | None, traced: bool) -> None:
        """Stops the clock and files the call.

        Args:
            steps: Training steps the call ran.
            examples: Examples those steps consumed, or None if unknown.
            traced: Whether the step function traced during the call; such
                calls are not steady state.
        """
        now = time.perf_counter()
        elapsed = now - self._start
        self._start = now  # a call still in flight is timed from here
        self._in_flight = max(self._in_flight - 1, 0)
        if steps <= 0:
            return
        self.steps += steps
        if examples is not None:
            if steps == 1:
                self._largest_batch = max(self._largest_batch or 0, examples)
            self._largest_mean_batch = max(self._largest_mean_batch, examples / steps)
        if self.first_call_s is None:
            self.first_call_s = elapsed
            return
        if traced:
            return
        self.step_times.append(elapsed / steps)
        self.steady_seconds += elapsed
        if examples is None:
            self.steady_examples_known = False
        else:
            self.steady_examples += examples
        self._window[0] += steps
        self._window[1] += examples or 0
        self._window[2] += elapsed
        self._window[3] = self._window[3] and examples is not None

    @property
    def full_batch_size(self) -> int | None:
        """The examples of a full training step, as this run's host calls showed them; None if unsure.

        The most examples a one-step call ran, provided no call averaged more
        examples per step (a k-step call says only its total). Calls whose
        examples were unknown are left out.
        """
        if self._largest_batch is None or self._largest_mean_batch > self._largest_batch:
            return None
        return self._largest_batch

    def record_checkpoint_save(self, seconds: float) -> None:
        """Files the wall time of one checkpoint save (kept apart from step times)."""
        self.checkpoint_save_times.append(seconds)

    def take_window(self) -> dict[str, float]:
        """Steady-state rates since the previous call (for periodic summaries).

        Returns:
            `steps_per_sec`, `examples_per_sec` (if the batch sizes were known)
            and `step_time_s` (mean seconds per step); empty if no steady-state
            call ran since the previous call.
        """
        steps, examples, seconds, examples_known = self._window
        self._window = [0, 0, 0.0, True]
        if steps == 0 or seconds <= 0:
            return {}
        rates = {"steps_per_sec": steps / seconds, "step_time_s": seconds / steps}
        if examples_known:
            rates["examples_per_sec"] = examples / seconds
        return rates

    def state_dict(self) -> dict[str, Any]:
        """What was measured, as JSON-serializable values (saved with checkpoints).

        At most the last `MAX_SAVED_STEP_TIMES` step times are kept.
        """
        return {
            "first_call_s": self.first_call_s,
            "step_times": self.step_times[-MAX_SAVED_STEP_TIMES:],
            "steady_seconds": self.steady_seconds,
            "steady_examples": self.steady_examples,
            "steady_examples_known": self.steady_examples_known,
            "steps": self.steps,
            "checkpoint_save_times": self.checkpoint_save_times[-MAX_SAVED_STEP_TIMES:],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from a `state_dict()` (a resumed run's report covers the whole run)."""
        self.reset()
        self.first_call_s = state["first_call_s"]
        self.step_times = list(state["step_times"])
        self.steady_seconds = float(state["steady_seconds"])
        self.steady_examples = int(state["steady_examples"])
        self.steady_examples_known = bool(state["steady_examples_known"])
        self.steps = int(state["steps"])
        # Absent in checkpoints written before save times were measured.
        self.checkpoint_save_times = list(state.get("checkpoint_save_times", []))

    def report(self, trace_count: int, engine: str | None = None) -> TimingReport:
        """Builds the report from what was measured.

        Args:
            trace_count: How many times the step function traced.
            engine: The name of the engine that ran (see `TimingReport.engine`).
        """
        median = p90 = throughput = None
        if self.step_times:
            median = statistics.median(self.step_times)
            p90 = float(np.percentile(self.step_times, 90))
            if self.steady_examples_known and self.steady_seconds > 0:
                throughput = self.steady_examples / self.steady_seconds
        return TimingReport(
            first_step_s=self.first_call_s,
            step_time_median_s=median,
            step_time_p90_s=p90,
            examples_per_sec=throughput,
            steps=self.steps,
            trace_count=trace_count,
            checkpoint_saves=len(self.checkpoint_save_times),
            checkpoint_save_median_s=(
                statistics.median(self.checkpoint_save_times) if self.checkpoint_save_times else None
            ),
            engine=engine,
        )
