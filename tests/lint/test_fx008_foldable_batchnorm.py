from __future__ import annotations

import pytest
import torch
from torch import nn


class ConvBn(nn.Module):
    def __init__(self, residual: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)
        self.residual = residual

    def forward(self, x):
        y = self.conv(x)
        out = self.bn(y).relu()
        return out + y if self.residual else out  # residual: the conv output has a second user


class SharedConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x):
        return self.bn(self.conv(x)) + self.conv(x * 2)


class LinearBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 6)
        self.bn = nn.BatchNorm1d(6)

    def forward(self, x):
        return self.bn(self.fc(x))


X = torch.randn(2, 3, 8, 8)


@pytest.mark.parametrize(("dialect", "bn", "conv"), [("torch", "bn", "conv"), ("aten", "batch_norm", "conv2d")])
def test_conv_then_eval_bn(capture_as, findings, dialect, bn, conv):
    found = findings(capture_as(ConvBn().eval(), X, dialect), "FX008")
    assert [(f.code, f.node, f.fix) for f in found] == [("FX008", bn, "fold_bn")]
    assert f"folded into {conv} (conv)" in found[0].message


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_conv_output_with_other_users(capture_as, findings, dialect):
    assert findings(capture_as(ConvBn(residual=True).eval(), X, dialect), "FX008") == []


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_training_mode_bn(capture_as, findings, dialect):
    assert findings(capture_as(ConvBn().train(), X, dialect), "FX008") == []


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_shared_conv(capture_as, findings, dialect):
    # folding into a conv used twice would change the other use
    assert findings(capture_as(SharedConv().eval(), X, dialect), "FX008") == []


def test_linear_bn_needs_a_known_rank(capture_as, findings):
    inputs = torch.randn(5, 4)
    # torch.export records the linear output's shape (2-D): foldable
    assert [f.node for f in findings(capture_as(LinearBn().eval(), inputs, "aten"), "FX008")] == ["batch_norm"]
    # a symbolic trace does not: BatchNorm1d on 3-D input normalises another dim, so not reported
    assert findings(capture_as(LinearBn().eval(), inputs, "torch"), "FX008") == []


def test_resnet18_every_bn(findings, resnet18_captured):
    found = findings(resnet18_captured, "FX008")
    assert len(found) == 20  # every BatchNorm follows its conv directly
    first = "bn1" if resnet18_captured.dialect == "torch" else "batch_norm"
    assert found[0].node == first and found[0].module == "bn1"
