"""Fixtures of the picture tests: resnet18 captured small (1x3x64x64) in both dialects, and its fold_bn rewrite."""

from __future__ import annotations

import pytest
import torch

import fxforge
from fxforge.passes import PASSES
from model_helpers import register_broken_scale_pass

X = torch.randn(1, 3, 64, 64)


@pytest.fixture(scope="module")
def resnet_captures():
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = torchvision.models.resnet18().eval()
    return {
        "torch": fxforge.capture(model, (X,), method="symbolic_trace"),
        "aten": fxforge.capture(model, (X,), method="export"),
    }


@pytest.fixture
def broken_pass():
    """Scales layer2.0.conv1's output by 1.01 and claims it still computes the conv (torch dialect)."""
    yield register_broken_scale_pass("test_visual_broken_scale")
    PASSES.pop("test_visual_broken_scale")
