"""The Python API refuses the combinations of arguments the CLI refuses, with the CLI's message in Python's terms:
a check made in a CLI command alone let ``fxforge.X(...)`` ignore the useless argument without a word."""

from __future__ import annotations

import pytest

import fxforge
from fxforge.errors import FxforgeError


def test_doctor_refuses_seconds_without_the_peak_it_would_time():
    with pytest.raises(FxforgeError, match=r"^seconds applies to the peak measurement, which peak=False skips"):
        fxforge.doctor(peak=False, seconds=5)
