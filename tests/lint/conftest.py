"""Fixtures for the lint rule tests: a rule runner and torchvision models captured once per session."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from fxforge.capture import Captured, capture
from fxforge.lint import Finding, lint
from model_helpers import CAPTURE_METHOD


def _findings(target, code: str) -> list[Finding]:
    report = lint(target, select=[code])
    assert report.rules_run == [code], f"{code} did not run on the {report.dialect} dialect"
    return report.findings


@pytest.fixture
def findings() -> Callable[..., list[Finding]]:
    """``findings(captured_or_gm, "FX002")``: that one rule's findings (and a check that it ran)."""
    return _findings


def _torchvision(name: str, **kwargs) -> nn.Module:
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    return getattr(torchvision.models, name)(**kwargs).eval()


@pytest.fixture(scope="session")
def resnet18_model() -> nn.Module:
    return _torchvision("resnet18")


@pytest.fixture(scope="session", params=["torch", "aten"])
def resnet18_captured(request, resnet18_model) -> Captured:
    """resnet18 (random weights, eval) on a 2x3x64x64 input, in each dialect; shared: rules must not mutate it."""
    return capture(resnet18_model, (torch.randn(2, 3, 64, 64),), method=CAPTURE_METHOD[request.param])


@pytest.fixture(scope="session", params=["torch", "aten"])
def mobilenet_v2_captured(request) -> Captured:
    return capture(_torchvision("mobilenet_v2"), (torch.randn(1, 3, 64, 64),), method=CAPTURE_METHOD[request.param])
