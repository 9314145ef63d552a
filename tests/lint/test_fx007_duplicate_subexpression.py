from __future__ import annotations

import pytest
import torch
from torch import nn


class Repeated(nn.Module):
    def forward(self, x):
        a = x.sin().cos()
        b = x.sin().cos()  # both sin and cos repeat the ones above
        return a + b


class LooksRepeated(nn.Module):
    def forward(self, x):
        noise = torch.rand_like(x) + torch.rand_like(x)  # random: two different values
        y = x * 2
        z = x * 2.0  # 2 and 2.0 differ for integer tensors: not the same call
        return noise + y + z


class StatelessModuleTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(x) * self.act(x)


X = torch.randn(2, 4)


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_repeated_chain(capture_as, findings, dialect):
    found = findings(capture_as(Repeated(), X, dialect), "FX007")
    assert [(f.code, f.node, f.fix) for f in found] == [("FX007", "sin_1", "cse"), ("FX007", "cos_1", "cse")]
    assert "same value as sin;" in found[0].message and "same value as cos;" in found[1].message


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_random_ops_and_different_literals(capture_as, findings, dialect):
    assert findings(capture_as(LooksRepeated(), X, dialect, check=False), "FX007") == []


@pytest.mark.parametrize(("dialect", "node"), [("torch", "act_1"), ("aten", "gelu_1")])
def test_stateless_module_applied_twice(capture_as, findings, dialect, node):
    assert [f.node for f in findings(capture_as(StatelessModuleTwice(), X, dialect), "FX007")] == [node]


def test_resnet18_has_none(findings, resnet18_captured):
    assert findings(resnet18_captured, "FX007") == []
