"""`EpochPlan`: which iterator each epoch reads and how many steps it runs, as `keras.Model.fit` decides.

Shaped like Keras's `EpochIterator`: it hides from the loops whether an
epoch is a fresh pass over the data or goes on where the last one stopped,
when a pass ends, and how a resumed run finds its data position.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from tftrain.fit_inputs.epoch_order import ArrayPosition, EpochOrder
from tftrain.fit_inputs.inputs import AdaptedInput

__all__ = ["EpochPlan"]


class EpochPlan:
    """Decides which iterator each epoch reads and how many steps it runs.

    Mirrors `keras.Model.fit`: without `steps_per_epoch` every epoch is one
    full pass on a fresh iterator; with it, one iterator continues across
    epochs, and a finite dataset starts a new pass once all its batches were
    seen (an epoch cut short by the end of the data warns, as in Keras).

    Args:
        data: The adapted input (or a batched `tf.data.Dataset`).
        make_iterator: Dataset -> iterator (plain, or distributed).

    `steps_per_epoch` past the end of a finite dataset is taken, as Keras
    takes it: the epoch ends where the data does, with a warning.

    Data that never ends without `steps_per_epoch` makes one endless epoch,
    as under `fit` (with a warning): it ends when a callback stops it.

    Raises:
        ValueError: an empty dataset.
    """

    def __init__(
        self,
        data: AdaptedInput | tf.data.Dataset,
        make_iterator: Callable[[tf.data.Dataset], Iterator[Any]] = iter,
    ):
        if isinstance(data, tf.data.Dataset):
            data = AdaptedInput(dataset=data, adapter=None, kind="dataset", steps=None)
        dataset, steps_per_epoch = data.dataset, data.steps
        argument, steps_argument = data.argument, data.steps_argument
        cardinality = int(dataset.cardinality())
        if cardinality == 0:
            raise ValueError(
                f"Invalid value for argument `{argument}`: the dataset is empty (cardinality 0). "
                "Expected at least one batch; check filters, `take`, or a batch size larger "
                "than the data with `drop_remainder=True`."
            )
        if cardinality == tf.data.INFINITE_CARDINALITY and steps_per_epoch is None:
            # As under `fit`: one epoch that ends only when a callback stops it.
            warnings.warn(
                f"`{argument}` never ends (an infinite dataset or a PyDataset without a length) and "
                f"{steps_argument}=None, so it is read until a callback stops the loop, as Keras reads it "
                "(`model.stop_training`, `stop_evaluating` or `stop_predicting` set to True). "
                f"Pass {steps_argument}=<number of steps> to end it.",
                stacklevel=4,
            )
        self.data = data
        self.dataset = dataset
        self.steps_per_epoch = steps_per_epoch
        self.argument = argument
        self.single_pass = data.kind == "generator"
        self._make_iterator = make_iterator
        # Batches per pass where the data says so up front. A length learned by reading
        # a whole pass does not end later calls: as with Keras's epoch iterator, the
        # loop keeps asking for the next batch and finds the end itself.
        self._batches_per_pass = cardinality if cardinality > 0 else None
        self._known_up_front = self._batches_per_pass is not None
        # Steps Keras reports for data whose length it miscounts (see `DistributedData.announced_steps`).
        announced = getattr(dataset, "announced_steps", None)
        self._announced_steps: int | None = announced() if announced is not None else None
        # Whether a pass may end where no count says so (a generator, a filtered
        # dataset): the loop then checks for a next batch before a batch hook.
        self.may_end_unannounced = cardinality == tf.data.UNKNOWN_CARDINALITY
        self._iterator: Iterator[Any] | None = None
        self._seen_in_pass = 0
        self._in_epoch = False
        # Arrays under checkpoints: the position in examples and each pass's order (`keep_array_position`).
        self.position: ArrayPosition | None = None
        self._pass_batches: int | None = None  # the resumed pass's batches, where its batch size changed

    def keep_array_position(self) -> bool:
        """Keeps the position of array inputs in examples, and each pass's order if shuffled (`tftrain.fit_inputs.epoch_order`).

        For checkpoints: a resumed pass reads the rest of its examples in
        its order, in the batch size of the new call. Only for Keras's array
        adapter read through plain iterators; the data and the orders drawn
        are unchanged.

        Returns:
            Whether the position is kept (`position` is set).
        """
        adapter = self.data.adapter
        if self.data.kind != "arrays" or not self.plain_iterators or getattr(adapter, "batch_size", None) is None:
            return False
        self.position = ArrayPosition(adapter)
        order = EpochOrder(adapter)
        dataset = order.recording_dataset()
        if dataset is not None:  # shuffled: each pass draws an order
            self.position.order, self.dataset = order, dataset
        return True

    @property
    def order(self) -> EpochOrder | None:
        """The recorded order of each pass of shuffled arrays (None: not kept, or read in index order)."""
        return self.position.order if self.position is not None else None

    def resume_at_example(
        self, examples: int, batches_in_pass: int, steps_in_epoch: int, saved_order: Any = None
    ) -> None:
        """Continues a checkpointed run of array inputs at its position in examples (`keep_array_position`).

        Args:
            examples: Examples of the pass the checkpointed run had read.
            batches_in_pass: Batches it had read from the pass (in its batch size).
            steps_in_epoch: Steps it had run in its current epoch.
            saved_order: The pass's order, as the checkpoint saved it (None: index order).

        Raises:
            ValueError: `saved_order` is not an order of this data's examples.
        """
        self._seen_in_pass = batches_in_pass - steps_in_epoch
        if examples <= 0:
            return
        source = self.order.replay_dataset(saved_order) if saved_order is not None else self.dataset
        source = source.with_options(self.dataset.options())  # e.g. symbolic checkpointing, as the pass's
        rest, count = self.position.rest_of_pass(source, examples, batches_in_pass)
        self._iterator = self._make_iterator(rest)
        self._pass_batches = batches_in_pass + count

    def _current_pass_batches(self) -> int | None:
        return self._pass_batches if self._pass_batches is not None else self._batches_per_pass

    @property
    def steps(self) -> int | None:
        """Steps in the coming epoch, or None while unknown."""
        if self.steps_per_epoch is not None:
            return self.steps_per_epoch
        return self._current_pass_batches() if self._known_up_front else self._announced_steps

    def batches_left(self, steps_this_epoch: int) -> int | None:
        """Batches left in the current pass (None while its length is unknown)."""
        if not self._known_up_front or self._iterator is None:
            return None
        return self._current_pass_batches() - self._seen_in_pass - steps_this_epoch

    @property
    def plain_iterators(self) -> bool:
        """Whether the iterators are `tf.data` iterators of `dataset` (not distributed ones)."""
        return self._make_iterator is iter

    def begin_epoch(self) -> Iterator[Any]:
        """Starts an epoch (a PyDataset's `on_epoch_begin`); returns the iterator it reads from."""
        if self.data.adapter is not None and not self._in_epoch:
            self._in_epoch = True  # first: `close` must end the epoch even if the hook raises
            self.data.adapter.on_epoch_begin()
        self._in_epoch = True
        return self.next_iterator()

    def reset(self) -> None:
        """Makes the next epoch a fresh pass from the first batch, as Keras's epoch iterator `reset()`.

        Keras resets before training and before each evaluation, which also runs
        the adapter's `on_epoch_end` (a PyDataset shuffling there reshuffles).
        """
        self.close()
        self._iterator = None
        self._seen_in_pass = 0
        if self.data.adapter is not None:
            self.data.adapter.on_epoch_end()

    def next_iterator(self) -> Iterator[Any]:
        """The iterator the next training step reads from (starting a new pass if due).

        A checkpoint saves this iterator: at an epoch end it is the next
        epoch's fresh iterator, whose creation advanced the dataset's
        reshuffling seeds exactly as an uninterrupted run's does.
        """
        if self._iterator is None:
            self._iterator = self._make_iterator(self.dataset)
            self._seen_in_pass = 0
            self._pass_batches = None
            if self.position is not None:
                self.position.start_pass()
        return self._iterator

    def batches_in_pass(self, steps_this_epoch: int) -> int:
        """Batches read from the current pass, given the steps run in the current epoch (all of them)."""
        return self._seen_in_pass + steps_this_epoch

    def resume(self, batches_in_pass: int, steps_in_epoch: int, iterator_restored: bool) -> None:
        """Continues a checkpointed run at its data position.

        Args:
            batches_in_pass: Batches the checkpointed run had read from its pass.
            steps_in_epoch: Steps it had run in its current epoch.
            iterator_restored: Whether `next_iterator()`'s state was restored
                from the checkpoint. If not, the pass restarts and skips
                `batches_in_pass` batches (`dataset.skip`).
        """
        if not iterator_restored and batches_in_pass > 0:
            self._iterator = self._make_iterator(self.dataset.skip(batches_in_pass))
        self._seen_in_pass = batches_in_pass - steps_in_epoch

    def end_epoch(self, steps_run: int, data_ended: bool, *, cut: bool = False) -> None:
        """Records how the epoch went (and runs a PyDataset's `on_epoch_end`).

        Args:
            steps_run: Steps the epoch ran (before a resume too).
            data_ended: Whether the iterator ran out of batches.
            cut: The epoch stopped short of its end and goes on later (a step
                budget reached mid-epoch): the pass and its iterator are kept.

        Raises:
            ValueError: the very first pass yielded no batch at all.
        """
        self.close()
        if cut:
            return
        known_pass = self._current_pass_batches()
        self._seen_in_pass += steps_run
        if data_ended:
            if self._seen_in_pass == 0:
                raise ValueError(
                    f"Invalid value for argument `{self.argument}`: the data yielded no "
                    "batches. Expected at least one batch; check filters or `take`."
                )
            if self._batches_per_pass is None:
                self._batches_per_pass = self._seen_in_pass
            expected = self.steps
            if expected is not None and steps_run < expected:
                warnings.warn(
                    f"`{self.argument}` ran out of data after {steps_run} of "
                    f"{expected} steps in this epoch; the next epoch starts a new "
                    "pass. Use `dataset.repeat()` to avoid short epochs.",
                    stacklevel=3,
                )
            self._iterator = None
        elif self.steps_per_epoch is None:
            self._iterator = None  # every epoch is a fresh pass
            if known_pass is not None and self._seen_in_pass >= known_pass:
                # Keras's epoch iterator starts the next pass's iterator when a pass
                # ends, and the next epoch starts another: made here too, a
                # reshuffling dataset's later epochs get the orders they get under fit.
                self._make_iterator(self.dataset)
        elif known_pass is not None and self._seen_in_pass >= known_pass:
            self._iterator = None

    def warn_single_pass(self, passes: int, argument: str, steps_argument: str, fix: str) -> None:
        """Warns when a call would read a Python generator more than once: later passes are not the data.

        A generator yields its batches once. `model.fit` (and so the Trainer, which
        behaves as `fit` does) reads it again for the next pass, and that pass gets
        only the batches Keras kept to learn the data's shapes. The run goes on as
        under `fit`; the warning says how to get whole passes.
        """
        if self.single_pass and self.steps_per_epoch is None and passes > 1:
            warnings.warn(
                f"`{argument}` is a Python generator, which yields its batches once, but this call reads it "
                f"{passes} times over ({fix}) with `{steps_argument}=None`: as under model.fit, every pass "
                "after the first reads only the batches kept to learn the data's shapes. For whole passes, "
                "use a keras.utils.PyDataset or tf.data.Dataset, or a generator that never ends with "
                f"`{steps_argument}=<steps>`.",
                stacklevel=4,
            )

    def close(self) -> None:
        """Ends the epoch for the adapter (a PyDataset's `on_epoch_end`, stopping its workers)."""
        if self._in_epoch and self.data.adapter is not None:
            self.data.adapter.on_epoch_end()
        self._in_epoch = False
