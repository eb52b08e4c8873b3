"""The run record, saved with every checkpoint (a resume compares the new call with it: `tftrain.checkpoint.run_record`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tftrain.checkpoint.run_record import RECORD_KEY
from tftrain.services.protocol import Service


class RunRecordService(Service):
    """Saves the run's record (what its results depend on) with every checkpoint.

    Args:
        record: The record of the call (`tftrain.checkpoint.run_record.build`),
            with the changes a resume took already in it.
    """

    name = RECORD_KEY

    def __init__(self, record: Mapping[str, Any]):
        self.record = dict(record)

    def state_dict(self) -> dict[str, Any]:
        return self.record
