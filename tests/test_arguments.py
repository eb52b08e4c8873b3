"""Tests for `tftrain.arguments`: the shared argument checks, and their names in `tftrain.options`."""

import dataclasses

import numpy as np
import pytest

from tftrain import arguments, options


def test_every_check_is_importable_from_options_as_the_same_function():
    assert arguments.__all__, "no checks"
    for name in arguments.__all__:
        assert getattr(options, name) is getattr(arguments, name), name
        assert name in options.__all__, name


def test_check_int_returns_the_value_or_raises_in_keras_form():
    assert arguments.check_int("steps", 3) == 3
    assert arguments.check_int("steps", np.int64(2)) == 2
    assert arguments.check_int("steps", None, optional=True) is None
    assert arguments.check_int("steps", 0, minimum=0) == 0
    for bad in (0, True, 1.5, None, "2"):
        with pytest.raises(ValueError, match=r"Invalid value for argument `steps`\. Received: steps="):
            arguments.check_int("steps", bad)
    with pytest.raises(ValueError, match=r"Expected None or an integer >= 2 \(per call\)\."):
        arguments.check_int("steps", 1, 2, optional=True, meaning="(per call)")


def test_check_port_takes_a_port_number_or_an_environment_variables_text_of_one():
    assert arguments.check_port("port", 65535) == 65535
    assert arguments.check_port("port", None, optional=True) is None
    assert arguments.check_port("PORT", " 8888 ", variable=True) == 8888
    for bad in (0, 65536, True, "8888", None):
        with pytest.raises(ValueError, match=r"Invalid value for argument `port`\. Received: port=.*Expected a port"):
            arguments.check_port("port", bad)
    with pytest.raises(ValueError, match=r"environment variable `PORT`\. Received: PORT='x'\. Expected a port number in"):
        arguments.check_port("PORT", "x", variable=True)


@pytest.mark.parametrize("verbose, level", [("auto", 1), (0, 0), (1, 1), (2, 2)])
def test_check_verbose_takes_keras_levels(verbose, level):
    assert arguments.check_verbose(verbose) == level


@pytest.mark.parametrize("verbose", [3, -1, True, "1", None])
def test_check_verbose_refuses_other_values(verbose):
    with pytest.raises(ValueError, match="Invalid value for argument `verbose`"):
        arguments.check_verbose(verbose)


@dataclasses.dataclass(frozen=True)
class _Options:
    cadence: int = 5
    signals: tuple = (15,)


def test_check_left_at_default_names_the_field_and_what_it_needs():
    arguments.check_left_at_default(_Options(), ("cadence", "signals"), received="x=None", expected="an x")
    arguments.check_left_at_default(_Options(signals=()), ("signals",), received="x=None", expected="an x")
    with pytest.raises(ValueError, match=r"Received: cadence=6 with x=None\. Expected an x for it to act on"):
        arguments.check_left_at_default(_Options(cadence=6), ("cadence",), received="x=None", expected="an x")
