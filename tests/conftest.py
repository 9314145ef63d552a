"""Suite-wide settings: one intra-op thread per pytest-xdist worker (the CI machine has 2 cores), Ctrl-C
reaching the processes tests start, and fixtures shared by many test files (plain helpers live in
model_helpers.py: test files import that by name, never ``conftest``, which is ambiguous once subfolders have
conftests of their own)."""

from __future__ import annotations

import os
import signal
import sys

# pytest-xdist's workers run with COLUMNS=80, which fxforge's piped output honours (docs/commands/index.md): the
# tests read the CLI's output at its default piped width, so the setting is dropped before fxforge is imported.
os.environ.pop("COLUMNS", None)

import pytest
import torch

import fxforge.bench  # noqa: F401  (loads the module whose setting is changed below)
from fxforge.capture import Captured, capture
from model_helpers import CAPTURE_METHOD, randomize_batchnorm

torch.set_num_threads(1)

# bench settles every backend for SETTLE_SECONDS (20 ms) before each timed call, for fair timings in a real run;
# the tests check what bench and --auto report, not how fast: they settle one call (SETTLE_CALLS), which the tests
# counting calls expect (test_bench checks the 20 ms itself)
sys.modules["fxforge.bench"].SETTLE_SECONDS = 0.0  # the module: the name fxforge.bench is the function

# A shell starts a background job (`bash scripts/test.sh &`, nohup) with SIGINT ignored, and processes inherit
# that: the Ctrl-C tests' fxforge processes would never see their SIGINT and run to the end. Python's own handler
# here is reset to the default in every process started from this one.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def resnet18():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    return randomize_batchnorm(torchvision.models.resnet18().eval())


@pytest.fixture
def capture_as():
    """``capture_as(model, inputs, dialect)`` with ``dialect`` "torch" (symbolic_trace) or "aten" (export)."""

    def run(model: torch.nn.Module, inputs, dialect: str, **kwargs) -> Captured:
        if isinstance(inputs, torch.Tensor):
            inputs = (inputs,)
        captured = capture(model, inputs, method=CAPTURE_METHOD[dialect], **kwargs)
        assert captured.dialect == dialect
        return captured

    return run
