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
WORKLOAD_NAMES = ("mlp", "cnn", "linear", "simclr")
VARIANT_NAMES = (
    "handwritten",
    "graph",
    "default",
    "trainer_no_timing",
    "graph_no_sync",
    "graph_checkpoint",
    "handwritten_xla",
    "xla",
    "handwritten_loop",
    "graph_loop",
    "graph_loop_k1",
    "graph_loop_k5",
    "graph_loop_k20",
    "graph_loop_k100",
    "xla_loop",
    "keras_fit",
    "keras_fit_spe",
    "keras_fit_timing",
    "handwritten_eager",
    "eager",
    "torch_eager",
    "step_only",
    "data_only",
)
# The linear workload's XLA loop and PyTorch variants do not apply to the classifiers.
_CLASSIFIER_VARIANTS = tuple(name for name in VARIANT_NAMES if name not in ("xla_loop", "torch_eager"))
# The variants each workload runs, in their run (and table) order.
WORKLOAD_VARIANTS = {
    "mlp": _CLASSIFIER_VARIANTS,
    "cnn": _CLASSIFIER_VARIANTS,
    # The TF-vs-PyTorch comparison: eager, graph and XLA, k = 10 steps per call.
    # ... and "auto" against the fixed k in {1, 5, 20, 100}.
    "linear": (
        "default",
        "graph_loop",
        "graph_loop_k1",
        "graph_loop_k5",
        "graph_loop_k20",
        "graph_loop_k100",
        "xla_loop",
        "eager",
        "torch_eager",
        "data_only",
    ),
    "simclr": ("graph", "keras_fit"),
}
# Variants that need an optional package: name -> (module, how to install it).
OPTIONAL_VARIANTS = {"torch_eager": ("torch", "pip install torch")}
# Default batch size of the classifier workloads (the others set their own).
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


def check_int(name: str, value: Any, minimum: int, allow_none: bool = False, hint: str = "") -> None:
    """Raises in Keras's form unless `value` is an integer >= `minimum` (or None, if `allow_none`)."""
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
        variants: Variant names; None means every variant of each chosen
            workload (`WORKLOAD_VARIANTS`). Each workload runs the named
            variants it has; a name that no chosen workload has is an error.
        quick: A short run: the workloads' small quick-mode sizes and
            segments, and the quick defaults of `rounds` and `eager_steps`.
        rounds: Measured rounds; in each, every variant runs one segment, in
            a rotated order. None means 20, or 5 in quick mode.
        warmup_segments: Segments each variant runs before the measured
            rounds (tracing, the first calls, `"auto"`'s probing); not compared.
        segment_steps: Steps per segment of every non-eager variant; None
            means each workload's own (see `workloads.Workload.segment_steps`).
            A k-step variant's calls are cut at a segment's end, so a segment
            should be a multiple of every k compared.
        steps_per_loop: `k` of the k-steps-per-call variants (`graph_loop`,
            `xla_loop`, `handwritten_loop`, `keras_fit_spe`); None means each
            workload's own (20 for the classifiers, 10 for `linear`).
        eager_steps: Steps per segment of the eager variants (they are
            slow); None means 20, or 5 in quick mode.
        num_train: Training examples, overriding the workloads' defaults.
        num_val: Validation examples, overriding the workloads' defaults.
        batch_size: Batch size; None means each workload's own (128 for the
            classifiers, 1024 for `linear`, 64 pairs of views for `simclr`).
        checkpoint_every_steps: How often `graph_checkpoint` saves; None
            means every `steps_per_epoch // 4` steps (the Trainer also saves
            at each epoch end).
        simclr_width: Width multiplier of the SimCLR ResNet-18 (1.0 is the
            standard network; smaller only to make tests fast).
        seed: Seed for data and initial weights.
        validate: Evaluate each trained model on the validation data (untimed,
            first repetition only).
        autotune: Prefetch with tf.data autotuning instead of a fixed buffer
            (see `workloads.make_dataset`).
        shuffle_buffer: Train on examples reshuffled each pass through a
            buffer of this size (no cache) instead of the cached batches.
        confidence: Confidence level of every interval (0.95 by default).
        agreement: Run the whole suite twice, back to back, and report
            whether each goal's two ratios lie within each other's intervals.

    Raises:
        ValueError: an unknown name or a bad number.
    """

    workloads: Sequence[str] | str = WORKLOAD_NAMES
    variants: Sequence[str] | str | None = None
    quick: bool = False
    rounds: int | None = None
    warmup_segments: int = 1
    segment_steps: int | None = None
    steps_per_loop: int | None = None
    eager_steps: int | None = None
    num_train: int | None = None
    num_val: int | None = None
    batch_size: int | None = None
    checkpoint_every_steps: int | None = None
    simclr_width: float = 1.0
    seed: int = 0
    validate: bool = True
    autotune: bool = False
    shuffle_buffer: int | None = None
    confidence: float = 0.95
    agreement: bool = False

    def __post_init__(self):
        workloads = parse_names(self.workloads, WORKLOAD_NAMES, "workload")
        object.__setattr__(self, "workloads", tuple(workloads))
        if self.variants is not None:
            variants = parse_names(self.variants, VARIANT_NAMES, "variants")
            available = {name for workload in workloads for name in WORKLOAD_VARIANTS[workload]}
            missing = [name for name in variants if name not in available]
            if missing:
                raise ValueError(
                    f"Invalid value for argument `variants`. Received: variants={','.join(missing)}, which "
                    f"no chosen workload ({', '.join(workloads)}) runs. Their variants: "
                    + "; ".join(f"{w}: {', '.join(WORKLOAD_VARIANTS[w])}" for w in workloads)
                    + "."
                )
            object.__setattr__(self, "variants", tuple(variants))
        if self.rounds is None:
            object.__setattr__(self, "rounds", 5 if self.quick else 20)
        if self.eager_steps is None:
            object.__setattr__(self, "eager_steps", 5 if self.quick else 20)
        check_int("rounds", self.rounds, 1, hint=" (2 or more give an interval)")
        check_int("warmup_segments", self.warmup_segments, 0)
        check_int("segment_steps", self.segment_steps, 1, allow_none=True)
        check_int("steps_per_loop", self.steps_per_loop, 1, allow_none=True)
        check_int("eager_steps", self.eager_steps, 1)
        check_int("num_train", self.num_train, 1, allow_none=True)
        check_int("num_val", self.num_val, 1, allow_none=True)
        check_int("batch_size", self.batch_size, 1, allow_none=True)
        check_int("checkpoint_every_steps", self.checkpoint_every_steps, 1, allow_none=True)
        check_int("seed", self.seed, 0)
        check_int("shuffle_buffer", self.shuffle_buffer, 1, allow_none=True)
        confidence, width = self.confidence, self.simclr_width
        if isinstance(confidence, bool) or not isinstance(confidence, float) or not 0.5 <= confidence < 1:
            raise ValueError(
                f"Invalid value for argument `confidence`. Received: confidence={confidence!r}. "
                "Expected a number in [0.5, 1), e.g. 0.95."
            )
        if isinstance(width, bool) or not isinstance(width, (int, float)) or not width > 0:
            raise ValueError(
                f"Invalid value for argument `simclr_width`. Received: simclr_width={width!r}. "
                "Expected a number > 0 (1.0 is the standard ResNet-18)."
            )

    def variants_for(self, workload: str) -> tuple[str, ...]:
        """The variants `workload` runs under this config, in run order."""
        own = WORKLOAD_VARIANTS[workload]
        return own if self.variants is None else tuple(name for name in own if name in self.variants)
