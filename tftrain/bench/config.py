"""What a benchmark run does: names and options, validated before anything runs.

This module does not load TensorFlow, so the command line can reject a bad
flag at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

# The registries live in `workloads.WORKLOADS` and `runners.VARIANTS` (tests
# check that they match these names and this order).
WORKLOAD_NAMES = ("mlp", "cnn")
VARIANT_NAMES = (
    "handwritten",
    "graph",
    "trainer_no_timing",
    "xla",
    "graph_loop",
    "keras_fit",
    "keras_fit_spe",
    "keras_fit_timing",
    "handwritten_eager",
    "eager",
    "data_only",
)
BATCH_SIZE = 128


def parse_names(names: str | Sequence[str], known: Sequence[str], argument: str) -> list[str]:
    """Parses and checks a comma-separated list of names, keeping their order.

    Args:
        names: `"mlp,cnn"` or a sequence of names. Blanks are ignored,
            duplicates are dropped.
        known: The valid names, in their canonical order.
        argument: The argument's name, for the error message.

    Returns:
        The names as a list.

    Raises:
        ValueError: a name is unknown, or there is no name at all.
    """
    if isinstance(names, str):
        names = names.split(",")
    result: list[str] = []
    for name in (part.strip() for part in names):
        if name and name not in result:
            result.append(name)
    unknown = [name for name in result if name not in known]
    if unknown or not result:
        received = ",".join(unknown) if unknown else repr(",".join(result))
        raise ValueError(
            f"Invalid value for argument `{argument}`. Received: {argument}={received}"
            f"{' (unknown)' if unknown else ''}. Expected a comma-separated list of: "
            f"{', '.join(known)}."
        )
    return result


def _check_int(name: str, value: Any, minimum: int, allow_none: bool = False, hint: str = "") -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        expected = f"an integer >= {minimum}" + (" or None" if allow_none else "")
        raise ValueError(
            f"Invalid value for argument `{name}`. Received: {name}={value!r}. Expected {expected}{hint}."
        )


@dataclasses.dataclass(frozen=True)
class BenchmarkConfig:
    """What to run. Validated on creation, before anything runs.

    Attributes:
        workloads: Workload names (`"mlp,cnn"` or a sequence).
        variants: Variant names; None means all, in their canonical order.
        quick: A short run: the workloads' small quick-mode sizes, and the
            quick defaults of `repeats` and `eager_steps`.
        repeats: Repetitions; each runs every variant once, in turn. None
            means 3, or 1 in quick mode.
        epochs: Epochs per run (>= 2: the first includes tracing and is
            reported separately from the steady-state epochs).
        steps_per_loop: `k` for `graph_loop` and `keras_fit_spe`.
        eager_steps: Steps per epoch for eager variants (capped at a full
            epoch); 0 means full epochs; None means 100, or 10 in quick mode.
        num_train: Training examples, overriding the workloads' defaults.
        num_val: Validation examples, overriding the workloads' defaults.
        batch_size: Batch size.
        seed: Seed for data and initial weights.
        validate: Evaluate each trained model on the validation data (untimed,
            first repetition only).
        autotune: Prefetch with tf.data autotuning instead of a fixed buffer
            (see `workloads.make_dataset`).

    Raises:
        ValueError: an unknown name or a bad number.
    """

    workloads: Sequence[str] | str = WORKLOAD_NAMES
    variants: Sequence[str] | str | None = None
    quick: bool = False
    repeats: int | None = None
    epochs: int = 2
    steps_per_loop: int = 20
    eager_steps: int | None = None
    num_train: int | None = None
    num_val: int | None = None
    batch_size: int = BATCH_SIZE
    seed: int = 0
    validate: bool = True
    autotune: bool = False

    def __post_init__(self):
        workloads = parse_names(self.workloads, WORKLOAD_NAMES, "workload")
        object.__setattr__(self, "workloads", tuple(workloads))
        variants = VARIANT_NAMES if self.variants is None else self.variants
        object.__setattr__(self, "variants", tuple(parse_names(variants, VARIANT_NAMES, "variants")))
        if self.repeats is None:
            object.__setattr__(self, "repeats", 1 if self.quick else 3)
        if self.eager_steps is None:
            object.__setattr__(self, "eager_steps", 10 if self.quick else 100)
        _check_int("repeats", self.repeats, 1)
        _check_int(
            "epochs", self.epochs, 2, hint=" (the first epoch includes tracing and is reported separately)"
        )
        _check_int("steps_per_loop", self.steps_per_loop, 1)
        _check_int("eager_steps", self.eager_steps, 0)
        _check_int("num_train", self.num_train, 1, allow_none=True)
        _check_int("num_val", self.num_val, 1, allow_none=True)
        _check_int("batch_size", self.batch_size, 1)
        _check_int("seed", self.seed, 0)
