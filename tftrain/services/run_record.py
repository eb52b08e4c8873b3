"""The run record, saved with every checkpoint (a resume compares the new call with it: `tftrain.checkpoint.run_record`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tftrain.checkpoint.run_record import RECORD_KEY, built_fields
from tftrain.services.protocol import Service


class RunRecordService(Service):
    """Saves the run's record (what its results depend on) with every checkpoint.

    Args:
        record: The record of the call (`tftrain.checkpoint.run_record.build`),
            with the changes a resume took already in it.
        model: The model trained: its layers and optimizer variables are
            read again at each save (a model may be built in its first step).
        optimizers: The run's optimizers by their place in the record
            (`tftrain.checkpoint.run_record.optimizers_of`); None: the model's alone.
    """

    name = RECORD_KEY

    def __init__(self, record: Mapping[str, Any], model: Any, optimizers: Mapping[str, Any] | None = None):
        self.record = dict(record)
        self.model = model
        self.optimizers = optimizers

    def state_dict(self) -> dict[str, Any]:
        self.record.update(built_fields(self.model, self.optimizers))
        return self.record
