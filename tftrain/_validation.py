"""The one check of integer arguments, with Keras's error form.

"Invalid value for argument `x`. Received: x=... Expected ...": every
integer option of tftrain (counts, cadences, sizes) is checked here.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def check_int(
    argument: str, value: Any, minimum: int = 1, *, optional: bool = False, meaning: str = ""
) -> Any:
    """Returns `value` if it is an integer >= `minimum` (or None, if `optional`); else raises.

    Args:
        argument: The argument's name, for the message.
        value: What was received. A bool is not an integer here.
        minimum: The smallest valid value.
        optional: Whether None is valid.
        meaning: What the value means, appended to the message (e.g. "(1 = one
            step per host call)").

    Returns:
        `value`, unchanged.

    Raises:
        ValueError: `value` is not valid.
    """
    if value is None and optional:
        return value
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        expected = f"{'None or ' if optional else ''}an integer >= {minimum}"
        raise ValueError(
            f"Invalid value for argument `{argument}`. Received: {argument}={value!r}. "
            f"Expected {expected}{' ' + meaning if meaning else ''}."
        )
    return value
