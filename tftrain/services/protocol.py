"""The services' protocol: `Service`, what it may read and ask of the run (`RunState`), and `EveryNSteps`.

A fit loop (`tftrain.loops`) owns one run and calls its services in order:
each service says at which global step the loop must stop next (so a k-step
host call never jumps its boundary), acts before and after each host call,
when a call's results are read, at each epoch end and after a periodic
validation; it may keep state saved with every checkpoint, and releases what
it holds at `close`. A service receives what it acts on through `RunState`
(and its constructor's arguments), never by reaching into the loop; a
service that drives another is given it (a preemption saves through the
checkpoint service's `save`).

The built-in services (`tftrain.services.*`) use this protocol and nothing
else; `Trainer(services=[...])` adds a user's own, and
`tftrain.callbacks` drives services from `keras.Model.fit`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

import numpy as np

from tftrain.arguments import check_int

if TYPE_CHECKING:
    from tftrain.checkpoint import Progress
    from tftrain.checkpoint.memory_snapshot import Rollback
    from tftrain.engine.calls import LoopResult

__all__ = ["EveryNSteps", "RunState", "Service", "check_services", "json_ready_state"]


class RunState(Protocol):
    """What a service may read and ask of the run it serves.

    Attributes:
        progress: Where the run is (`epoch`, `step_in_epoch`, `global_step`);
            after a host call it already counts that call's steps.
        epoch_steps: Steps in the current epoch, if known.
        total_steps: The run's step budget (`fit(total_steps=...)`), or None.
        nonfinite_step: The last step of the first host call in this `fit`
            whose loss was NaN or infinite (set when its results are read),
            or None. A run goes on past one only where the call's callbacks
            hold Keras's `TerminateOnNaN`; a service that writes the run's
            state (a checkpoint) writes nothing once it is set.
        steps_kept_in_epoch: Steps of the current epoch whose training the
            model holds: `progress.step_in_epoch`, less the steps rollbacks
            threw away.
    """

    progress: Progress
    epoch_steps: int | None
    total_steps: int | None
    nonfinite_step: int | None
    steps_kept_in_epoch: int

    @property
    def epoch_ending(self) -> bool:
        """Whether the epoch ends after the call just filed (its last step, or the step budget's).

        An action due "at the end of a call" waits for the epoch end then
        (which comes next), as a checkpoint does.
        """

    def settle(self) -> None:
        """Reads a host call whose results were left unread (a checkpoint must hold only checked steps)."""

    def data_position(self) -> tuple[Any, int]:
        """The training iterator the next step reads from, and the batches read in its pass so far."""

    def service_states(self) -> dict[str, Any]:
        """Every service's `state_dict`, by name (what a checkpoint saves)."""

    def latest_checkpoint(self) -> str | None:
        """The run's newest checkpoint, or None."""

    def report_validation(self, logs: dict[str, Any]) -> None:
        """Tells every service (`Service.validated`) of a validation taken at the current step."""

    def keep_state(self, *, steps_kept_in_epoch: int | None = None) -> bool:
        """Keeps the training state in memory (model, optimizer, metrics, the owner's state, seeds), replacing the last.

        Args:
            steps_kept_in_epoch: The epoch's steps the state holds, where the
                run cannot count them (a resume); None: the run's count.

        Returns:
            Whether it was kept: not where a model or optimizer variable is
            NaN or infinite (the state kept before stays).
        """

    @property
    def kept_progress(self) -> Progress | None:
        """Where the state `roll_back` returns to was kept, or None."""

    def roll_back(self) -> Rollback:
        """Restores the state `keep_state` kept; the run goes on from where it is.

        The model, its optimizer, the metrics, the seeds and the owner's own
        state take the kept values; the global step, the data position and
        the services' states do not (the batches read since are not read
        again). Clears `nonfinite_step`, so checkpoints are written again.

        Returns:
            The kept state's progress and the steps thrown away.

        Raises:
            ValueError: no state is kept.
        """


class Service:
    """A service of a training run; every method has a do-nothing default.

    Subclass it and override what the service needs. The methods are called
    in the order of the run's services (the NaN guard first, the writers of
    summaries and checkpoints last).

    Attributes:
        name: The key of the service's state in a checkpoint (unique in a run).
        reads_every_call: The service must act on each host call's results
            before the next call is dispatched (a rollback); otherwise a
            call's results may be read one call late.

    Example:
        ```python
        class ExportEvery(tftrain.services.Service):
            name = "export"

            def __init__(self, model, directory, every_steps):
                self.model, self.directory = model, directory
                self.when = tftrain.services.EveryNSteps(every_steps)

            def next_stop(self, step):
                return self.when.next_stop(step)  # a k-step call ends at each export

            def after_call(self, run, result):
                step = run.progress.global_step
                if self.when.reached(step - result.steps, step):
                    self.model.export(f"{self.directory}/{step}")
        ```
    """

    name = "service"
    reads_every_call = False

    def next_stop(self, step: int) -> int | None:
        """The next global step after `step` at which a host call must end, or None."""
        del step
        return None

    def before_call(self, run: RunState) -> None:
        """Runs before a host call, at `run.progress`."""

    def after_call(self, run: RunState, result: LoopResult) -> None:
        """Runs after a host call; `run.progress` already counts its steps.

        `result.steps` is what the call ran. Its logs may not be read yet
        (a call whose results are read one call late); `results_read` says
        when they are.
        """

    def results_read(self, run: RunState, result: LoopResult) -> None:
        """Runs when a host call's device results are read: at once, or one call late."""

    def end_epoch(self, run: RunState, logs: dict[str, Any]) -> None:
        """Runs at an epoch end, after the epoch's callbacks, with its (Python) logs."""

    def validated(self, run: RunState, logs: dict[str, Any]) -> None:
        """Runs after a validation every N steps, with its logs (no `val_` prefix)."""

    def state_dict(self) -> dict[str, Any] | None:
        """JSON-serializable state saved with each checkpoint, or None.

        NumPy scalars and arrays in it are saved as Python numbers and lists
        (`json_ready_state`), and come back as such in `load_state_dict`.
        """
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continues from a state saved by `state_dict` (on resume)."""

    def close(self) -> None:
        """Releases what the service holds (writers, the profiler, scratch files)."""


class EveryNSteps:
    """The "every N global steps" condition: when a service acts, apart from what it does.

    Args:
        every_steps: The cadence; None or 0 never acts.
    """

    def __init__(self, every_steps: int | None):
        self.every_steps = check_int("every_steps", every_steps, optional=True)

    def next_stop(self, step: int) -> int | None:
        """The first multiple of N after `step` (a host call must end there), or None."""
        if self.every_steps is None:
            return None
        return (step // self.every_steps + 1) * self.every_steps

    def reached(self, before: int, step: int) -> bool:
        """Whether the steps `before + 1` to `step` reached a multiple of N."""
        if self.every_steps is None:
            return False
        return step // self.every_steps > before // self.every_steps


def json_ready_state(name: str, state: Any) -> Any:
    """A service's state as a checkpoint saves it (JSON): NumPy scalars and arrays converted, the rest checked.

    NumPy scalars become Python numbers (`.item()`) and arrays nested lists
    (`.tolist()`); tuples become lists, as JSON keeps them. Everything else
    must already be JSON-ready: dicts with string keys, lists, strings,
    numbers, booleans and None.

    Args:
        name: The service's name, for the error.
        state: What its `state_dict()` returned.

    Returns:
        The state, converted (a new structure where anything was converted).

    Raises:
        TypeError: a value or key is not JSON-ready; the error names the
            service, the value's key path and its type.
    """
    return _json_ready(name, state, "state")


def _json_ready(name: str, value: Any, path: str) -> Any:
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, np.generic | np.ndarray):
        return _json_ready(name, value.item() if isinstance(value, np.generic) else value.tolist(), path)
    if isinstance(value, list | tuple):
        return [_json_ready(name, item, f"{path}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                _refuse(name, f"{path} has the key {key!r}, of type {type(key).__name__}")
        return {key: _json_ready(name, item, f"{path}[{key!r}]") for key, item in value.items()}
    _refuse(name, f"{path} is of type {type(value).__name__}")


def _refuse(name: str, what: str) -> NoReturn:
    raise TypeError(
        f"Invalid state of the service {name!r}: its `state_dict()` cannot be saved with a checkpoint "
        f"(JSON). Received: {what}. Expected dicts with string keys, lists, strings, numbers, booleans and "
        "None (NumPy scalars and arrays are converted to Python numbers and lists); convert other values "
        "yourself, e.g. a tensor with `.numpy()`."
    )


def check_services(services: Any, reserved: frozenset[str] = frozenset()) -> tuple[Service, ...]:
    """`Trainer(services=...)` as a tuple of `Service` instances with distinct names, none of them `reserved`.

    Each service's state, as it is now, is checked JSON-ready (`json_ready_state`);
    a `state_dict()` that fails before a run starts is checked at the run's first save.
    One service alone is taken as a list of one, as Keras takes one callback.
    """
    if isinstance(services, Service):
        services = (services,)
    elif services is not None and not isinstance(services, Iterable):
        raise TypeError(
            f"Invalid value for argument `services`. Received: services={services!r} of type "
            f"{type(services).__name__}. Expected a tftrain.services.Service or a list of them."
        )
    services = tuple(services or ())
    for service in services:
        if not isinstance(service, Service):
            raise TypeError(
                f"Invalid value for argument `services`. Received: an object of type {type(service).__name__}. "
                "Expected instances of tftrain.services.Service (subclass it and override its methods)."
            )
    names = [service.name for service in services]
    taken = sorted(set(names) & reserved)
    if taken:
        raise ValueError(
            f"Invalid value for argument `services`. Received: services named {taken}, a name of a built-in "
            f"service (those are {sorted(reserved)}). Expected another `name`: it names the service's state "
            "in a checkpoint."
        )
    if len(set(names)) != len(names):
        raise ValueError(
            f"Invalid value for argument `services`. Received: services named {names}. Expected distinct "
            "`name`s: each names the service's state in a checkpoint."
        )
    for service in services:
        try:
            state = service.state_dict()
        except Exception:  # a state that exists only once a run starts: checked at the run's first save
            continue
        json_ready_state(service.name, state)
    return services
