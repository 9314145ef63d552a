from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn


class ReluTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.fc2(self.relu(self.fc1(x))))


class LinearTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(self.fc(x).tanh())


class BlockTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), nn.Tanh())

    def forward(self, x):
        return self.block(self.block(x))


class TiedWeight(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(4, 4)

    def forward(self, x):
        return F.linear(self.enc(x), self.enc.weight)


class Plain(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))

    def forward(self, x):
        return self.seq(x)


class SamePadConv(nn.Conv2d):
    """timm's Conv2dSame: the padding is sized from the weight's shape, read in forward."""

    def forward(self, x):
        kh, kw = self.weight.shape[-2:]
        return F.conv2d(F.pad(x, [kw // 2, kw // 2, kh // 2, kh // 2]), self.weight, self.bias)


X = torch.randn(2, 4)


@pytest.mark.parametrize(("dialect", "node"), [("torch", "relu"), ("aten", "relu")])
def test_relu_module_used_twice(capture_as, findings, dialect, node):
    found = findings(capture_as(ReluTwice(), X, dialect), "FX012")
    assert [(f.code, f.node, f.severity) for f in found] == [("FX012", node, "info")]
    assert found[0].message == "module relu is called from 2 places; rewrites must treat it with care"


@pytest.mark.parametrize(("dialect", "node"), [("torch", "fc"), ("aten", "linear")])
def test_linear_applied_twice(capture_as, findings, dialect, node):
    found = findings(capture_as(LinearTwice(), X, dialect), "FX012")
    # one finding for the module, none more for its (shared) parameters
    assert [(f.node, f.message.split(";")[0]) for f in found] == [(node, "module fc is called from 2 places")]


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_shared_block_reported_once(capture_as, findings, dialect):
    found = findings(capture_as(BlockTwice(), X, dialect), "FX012")
    assert [f.message.split(";")[0] for f in found] == ["module block is called from 2 places"]


@pytest.mark.parametrize(("dialect", "node"), [("torch", "enc"), ("aten", "linear")])
def test_tied_parameter(capture_as, findings, dialect, node):
    found = findings(capture_as(TiedWeight(), X, dialect), "FX012")
    assert [(f.node, f.message.split(";")[0]) for f in found] == [(node, "parameter enc.weight is read by 2 nodes")]


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_nothing_shared(capture_as, findings, dialect):
    assert findings(capture_as(Plain(), X, dialect), "FX012") == []


def test_resnet18_blocks_reuse_their_relu(findings, resnet18_captured):
    found = findings(resnet18_captured, "FX012")
    modules = [f.message.split(" is called")[0] for f in found]
    expected = [f"module layer{i}.{j}.relu" for i in range(1, 5) for j in range(2)]
    assert modules == expected
    assert all("from 2 places" in f.message for f in found)


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_a_weight_read_for_its_shape_is_not_shared(capture_as, findings, dialect):
    """QA: every timm model with "same" padding had an FX012 per conv ("parameter conv.weight is read by 2 nodes"):
    one of the two reads its shape only."""
    model = nn.Sequential(SamePadConv(3, 4, 3), nn.ReLU())
    assert findings(capture_as(model, torch.randn(1, 3, 8, 8), dialect), "FX012") == []
