"""Fixtures for the per-pass tests: capture in either dialect, and a run-verify helper."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from fxforge.capture import Captured, capture
from fxforge.passes import PassResult, apply_pass
from fxforge.verify import verify

DIALECTS = {"torch": "symbolic_trace", "aten": "export"}


@pytest.fixture
def capture_as() -> Callable[..., Captured]:
    """``capture_as(model, inputs, dialect)`` with ``dialect`` "torch" (symbolic_trace) or "aten" (export)."""

    def run(model: nn.Module, inputs, dialect: str, **kwargs) -> Captured:
        if isinstance(inputs, torch.Tensor):
            inputs = (inputs,)
        captured = capture(model, inputs, method=DIALECTS[dialect], **kwargs)
        assert captured.dialect == dialect
        return captured

    return run


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
