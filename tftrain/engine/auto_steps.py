"""`steps_per_loop="auto"`: how many steps a host call runs, chosen from measured call times.

A host call costs a fixed overhead (the Python loop, the `tf.function` call,
the callback hooks, reading the result) plus k times the step. The chooser
measures calls of 1 step and of `PROBE_STEPS` steps, fits
`call time = overhead + k * step time`, and takes the smallest k whose
overhead is at most `OVERHEAD_SHARE` of the call, raised where needed so that
a call runs at least `MIN_CALL_S` of steps, and capped so that a call stays
short (`MAX_CALL_S`, for progress bars and callbacks) and at `MAX_STEPS`.
tf.keras had an experimental version of this (`steps_per_execution="auto"`);
Keras 3 has none.
"""

from __future__ import annotations

import math
import statistics

PROBE_STEPS = 8
"""The second probe's steps per call (the first probe runs one step per call)."""

PROBE_CALLS = 3
"""Untraced calls measured at each probe size."""

OVERHEAD_SHARE = 0.02
"""The largest share of a host call the fixed overhead may take."""

MAX_STEPS = 200
"""The most steps per call."""

MAX_CALL_S = 0.5
"""The longest a call may be planned to last (callbacks and the progress bar run between calls)."""

MIN_CALL_S = 0.2
"""The shortest a call is planned to last, where one step is shorter.

The fitted overhead misses part of what a call boundary costs: on steps of
tens of milliseconds, one step per call measurably costs more than many steps
per call while the probes put the overhead near zero (docs/benchmarks.md).
Calls of at least this long run several such steps, where the measured cost is
close to the best fixed k.
"""


class StepsPerCall:
    """The steps each host call runs: a fixed k, or "auto" (measured, then fixed).

    Args:
        setting: An integer k, or `"auto"`.
    """

    def __init__(self, setting: int | str):
        self.auto = setting == "auto"
        self.chosen: int | None = None if self.auto else int(setting)
        self._times: dict[int, list[float]] = {1: [], PROBE_STEPS: []}

    def next(self) -> int:
        """The steps the next call should run (before the run's boundaries shorten it)."""
        if self.chosen is not None:
            return self.chosen
        return 1 if len(self._times[1]) < PROBE_CALLS else PROBE_STEPS

    def record(self, steps: int, seconds: float, traced: bool) -> None:
        """Files a call that ran `steps` steps in `seconds` (a traced call, or a cut-short one, is not a sample)."""
        if self.chosen is not None or traced or steps not in self._times:
            return
        self._times[steps].append(seconds)
        if len(self._times[PROBE_STEPS]) >= PROBE_CALLS:
            self.chosen = choose_steps(
                statistics.median(self._times[1]), statistics.median(self._times[PROBE_STEPS])
            )


def choose_steps(one_step_call_s: float, probe_call_s: float) -> int:
    """The steps per call for a measured call of 1 step and one of `PROBE_STEPS` steps.

    Args:
        one_step_call_s: Seconds of a host call that runs one step.
        probe_call_s: Seconds of a host call that runs `PROBE_STEPS` steps.

    Returns:
        The smallest k whose fixed overhead is at most `OVERHEAD_SHARE` of the
        call and whose call lasts at least `MIN_CALL_S`, within [1, `MAX_STEPS`]
        and a call of at most `MAX_CALL_S`.
    """
    step_s = max((probe_call_s - one_step_call_s) / (PROBE_STEPS - 1), 1e-7)
    overhead_s = max(one_step_call_s - step_s, 0.0)
    amortised = math.ceil(overhead_s * (1 - OVERHEAD_SHARE) / (OVERHEAD_SHARE * step_s))
    filled = math.ceil(MIN_CALL_S / step_s)
    longest = max(1, int(MAX_CALL_S / step_s))
    return max(1, min(max(amortised, filled), longest, MAX_STEPS))
