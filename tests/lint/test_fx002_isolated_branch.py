from __future__ import annotations

import pytest
import torch
from torch import fx, nn

from fxforge.lint import lint


class DeadChain(nn.Module):
    """sin -> cos -> (nothing): cos is FX001's dead node, sin the root of an FX002 isolated branch."""

    def forward(self, x):
        y = x.sin()
        y.cos()
        return x.relu()


class DeadTree(nn.Module):
    """A branch with fan-out (abs feeds mul and add, neg feeds mul) and two unused ends, plus a second branch."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        a = x.abs()
        b = x.neg()
        a * b
        a + 1
        self.lin(x).exp()
        return x.tanh()


class EffectfulEnd(nn.Module):
    """A temporary written in place: the in-place op is effectful, so the branch counts as live."""

    def forward(self, x):
        y = x.sin()
        y.add_(1)
        return x.relu()


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_chain_reported_once_at_its_root(capture_as, findings, dialect):
    captured = capture_as(DeadChain(), torch.randn(2, 3), dialect)
    found = findings(captured, "FX002")
    assert [f.node for f in found] == ["sin"]
    assert found[0].code == "FX002" and found[0].fix == "dead_code"
    assert "branch of 2 nodes" in found[0].message and "cos" in found[0].message
    # the unused end is FX001's, and only FX001's
    assert [f.node for f in findings(captured, "FX001")] == ["cos"]


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_one_finding_per_branch(capture_as, findings, dialect):
    captured = capture_as(DeadTree(), torch.randn(2, 4), dialect)
    found = findings(captured, "FX002")
    roots = {"torch": ["abs_1", "lin"], "aten": ["abs_1", "linear"]}[dialect]  # "abs" is a builtin: fx renames it
    assert [f.node for f in found] == roots
    assert "branch of 4 nodes" in found[0].message  # abs, neg, mul, add


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_branch_into_effectful_node_is_live(capture_as, findings, dialect):
    assert findings(capture_as(EffectfulEnd(), torch.randn(2, 3), dialect), "FX002") == []


def test_bare_graph_module():
    gm = fx.symbolic_trace(DeadChain())
    report = lint(gm, select=["FX002"])
    assert [(f.code, f.node) for f in report.findings] == [("FX002", "sin")]


def test_clean_models(capture_as, findings, resnet18_captured):
    assert findings(capture_as(nn.Sequential(nn.Linear(3, 3), nn.ReLU()), torch.randn(2, 3), "torch"), "FX002") == []
    assert findings(resnet18_captured, "FX002") == []
