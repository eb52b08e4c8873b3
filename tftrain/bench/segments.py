"""Interleaved segments: every compared variant trains in one process, one short segment at a time.

Each variant runs its whole training (one `fit`, or one hand-written loop) in
its own thread, built once. A `Lane` hands the machine to exactly one variant
at a time: the variant's thread waits for its turn at the start of each
segment, runs `steps` steps, stops its clocks after a host sync, and keeps
the turn through whatever it does between segments (a `fit`'s epoch-end
work, e.g. the Trainer's epoch-end checkpoint) until it starts its next
segment. `interleave` gives the turns: a few warmup segments (tracing, the
first calls; not compared), then rounds of `A B C ...`, each round in a
rotated order, so every pair of variants is measured seconds apart.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import keras


@dataclasses.dataclass
class Segment:
    """One measured segment.

    Attributes:
        wall_s: Wall seconds (`time.perf_counter`), after a host sync.
        cpu_s: Process CPU seconds (all threads, `time.process_time`).
        gap_s: Wall seconds the variant worked between its previous
            segment's end and this segment's start (e.g. an epoch-end
            checkpoint save); None for the first segment.
    """

    wall_s: float
    cpu_s: float
    gap_s: float | None = None


class Lane:
    """One variant's turns and clocks; its runner calls `start()` and `stop()` around each segment.

    Args:
        name: The variant.
        steps: Training steps per segment.
        segments: Segments the runner must run (warmup included).
    """

    def __init__(self, name: str, steps: int, segments: int):
        self.name = name
        self.steps = steps
        self.segments = segments
        self.measured: list[Segment] = []
        self.result: Any = None
        self.error: BaseException | None = None
        self.finished = False
        self._go = threading.Event()
        self._done = threading.Event()
        self._clock: tuple[float, float] | None = None
        self._stopped_at: float | None = None
        self._pending_gap: float | None = None
        self._abort = False

    def start(self) -> None:
        """Starts a segment: ends the previous turn, waits for the next one, starts the clocks."""
        gap = None
        if self._stopped_at is not None:
            gap = time.perf_counter() - self._stopped_at
            self._hand_back()
            self._wait_turn()
        self._pending_gap = gap
        self._clock = (time.perf_counter(), time.process_time())

    def stop(self) -> None:
        """Ends a segment; call it after the segment's results were read on the host."""
        if self._clock is None:
            raise RuntimeError(f"{self.name}: Lane.stop() without Lane.start().")
        wall, cpu = self._clock
        self._stopped_at = time.perf_counter()
        self.measured.append(Segment(self._stopped_at - wall, time.process_time() - cpu, self._pending_gap))
        self._clock = None

    def _wait_turn(self) -> None:
        self._go.wait()
        self._go.clear()
        if self._abort:
            raise RuntimeError(f"{self.name}: stopped because another variant failed.")

    def _hand_back(self) -> None:
        self._done.set()

    def _run(self, runner: Callable[[Lane], Any]) -> None:
        try:
            # Inside the try: a lane stopped before its first turn must still hand the turn back.
            self._wait_turn()
            self.result = runner(self)
        except BaseException as error:  # reported by `interleave` in the main thread
            self.error = error
        finally:
            self.finished = True
            self._hand_back()

    def _give_turn(self) -> None:
        """Lets the variant run until it hands the turn back (main thread)."""
        self._go.set()
        self._done.wait()
        self._done.clear()


def round_order(names: Sequence[str], index: int) -> list[str]:
    """The order of segment `index`: `names` rotated left by `index`, so no variant always runs first.

    Args:
        names: The variants in their canonical order.
        index: The segment's index (warmup segments count).

    Returns:
        The names in the order to run them.
    """
    names = list(names)
    if not names:
        return names
    shift = index % len(names)
    return names[shift:] + names[:shift]


def interleave(
    runners: dict[str, Callable[[Lane], Any]],
    steps: dict[str, int],
    segments: int,
    on_round: Callable[[int, list[str]], None] | None = None,
) -> dict[str, Lane]:
    """Runs every runner in its own thread, one segment at a time, in rotated rounds.

    Args:
        runners: Variant name -> `runner(lane)`; the runner builds the
            variant (in its first turn), then runs `lane.segments` segments,
            each between `lane.start()` and `lane.stop()`, and returns what
            the variant reports (loss, model, notes).
        steps: Variant name -> steps per segment.
        segments: Segments per variant (warmup included).
        on_round: Called after each round with its index and order (progress).

    Returns:
        The lanes, by name, with their measured segments and results.

    Raises:
        RuntimeError: a runner ran fewer or more segments than asked for.
        Exception: whatever a runner raised (re-raised here).
    """
    lanes = {name: Lane(name, steps[name], segments) for name in runners}
    threads = {
        name: threading.Thread(target=lanes[name]._run, args=(runner,), name=f"bench-{name}", daemon=True)
        for name, runner in runners.items()
    }
    with warnings.catch_warnings():
        # The Trainer warns that it cannot install preemption handlers outside the main thread.
        warnings.filterwarnings("ignore", message="fit runs outside the main thread")
        for thread in threads.values():
            thread.start()
        for index in range(segments + 1):  # the last turn lets each runner finish
            order = round_order(list(runners), index)
            for name in order:
                lane = lanes[name]
                if lane.finished:
                    continue
                lane._give_turn()
                if lane.error is not None:
                    _stop_others(lanes, threads)
                    raise lane.error
            if on_round is not None and index < segments:
                on_round(index, order)
    for name, lane in lanes.items():
        threads[name].join()
        if len(lane.measured) != segments:
            raise RuntimeError(f"{name} ran {len(lane.measured)} segments; expected {segments}.")
    return lanes


def _stop_others(lanes: dict[str, Lane], threads: dict[str, threading.Thread]) -> None:
    """After a failure, stops the other runners at their next turn, so no thread is left waiting."""
    for name, lane in lanes.items():
        lane._abort = True
        while not lane.finished:
            lane._give_turn()
        threads[name].join()


class SegmentCallback(keras.callbacks.Callback):
    """Drives a `Lane` from a `fit` call: one epoch is one segment.

    Only epoch hooks are overridden, so batch dispatch (and the Trainer's
    `steps_per_loop`, and Keras's `steps_per_execution`) is as without it.
    `on_epoch_end` receives the epoch's logs as Python floats, so the clock
    stops after the epoch's work has reached the host.
    """

    def __init__(self, lane: Lane):
        super().__init__()
        self.lane = lane
        self.last_logs: dict[str, Any] = {}

    def on_epoch_begin(self, epoch, logs=None):
        self.lane.start()

    def on_epoch_end(self, epoch, logs=None):
        self.lane.stop()
        self.last_logs = dict(logs or {})
