"""Fixtures for the per-pass tests: a run-and-verify helper (capture_as comes from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fxforge.capture import Captured
from fxforge.passes import PassResult, apply_pass
from fxforge.verify import verify


@pytest.fixture
def run_verified() -> Callable[..., PassResult]:
    """``run_verified(captured, "pass_name", options)``: apply the pass to a copy, assert the captured graph is
    untouched and the result verifies equal (per-dtype tolerances of fxforge.verify), return the PassResult."""

    def run(captured: Captured, name: str, options=None, **verify_kwargs) -> PassResult:
        before = captured.graph_module.code
        result = apply_pass(captured.graph_module, name, options)
        assert captured.graph_module.code == before, f"{name} modified its input graph"
        check = verify(captured, result.graph_module, **verify_kwargs)
        assert check.ok, check.divergence.describe() if check.divergence else check.problems
        return result

    return run
