"""A user's mistake is an ``IronError``: a command line catches that one type and prints its
one line, where any other exception is a bug with a traceback."""

import pytest

from iron import quant
from iron.errors import FormatError, IronError


def test_a_weight_format_that_does_not_fit_is_an_iron_error_naming_the_value():
    with pytest.raises(IronError, match=r"GEMV: weight_format='q9_0' is not one of bf16, "):
        quant.check_format("q9_0", 32, "GEMV")
    with pytest.raises(IronError, match="group_size=64 is not supported by weight_format"):
        quant.check_format("q4_0", 64, "GEMV")
    with pytest.raises(IronError, match="a q4_0 row of 7 bytes is not a whole number"):
        quant.k_of("q4_0", 7, 32)
    assert quant.FormatError is FormatError and issubclass(FormatError, ValueError)
