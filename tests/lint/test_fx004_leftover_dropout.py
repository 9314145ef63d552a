from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxforge.passes import apply_pass
from model_helpers import InplaceDropout


class WithDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.drop = nn.Dropout(0.3)

    def forward(self, x):
        return self.drop(self.fc(x))


class AlwaysOnDropout(nn.Module):
    def forward(self, x):
        return F.dropout(x, 0.5, training=True)


class ZeroDropout(nn.Module):
    def forward(self, x):
        return F.dropout(x.relu(), 0.0, training=True)


X = torch.randn(2, 4)


@pytest.mark.parametrize(("dialect", "node"), [("torch", "drop"), ("aten", "dropout")])
def test_dropout_module_in_eval_mode(capture_as, findings, dialect, node):
    found = findings(capture_as(WithDropout().eval(), X, dialect), "FX004")
    assert [(f.code, f.node, f.fix) for f in found] == [("FX004", node, "remove_dropout")]
    assert "no-op at inference" in found[0].message


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_active_dropout(capture_as, findings, dialect):
    # outputs are random: no output check
    found = findings(capture_as(AlwaysOnDropout(), X, dialect, check=False), "FX004")
    assert [f.node for f in found] == ["dropout"]
    assert "active" in found[0].message and "at random" in found[0].message
    # remove_dropout keeps an active dropout: naming it as the fix sent lint --fix to a pass that changes nothing
    assert found[0].fix is None and "model.eval()" in found[0].message


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_zero_probability_is_a_no_op(capture_as, findings, dialect):
    found = findings(capture_as(ZeroDropout(), X, dialect), "FX004")
    assert [f.node for f in found] == ["dropout"] and "no-op" in found[0].message


@pytest.mark.parametrize(("dialect", "node"), [("torch", "drop"), ("aten", "dropout_")])
def test_inplace_dropout_in_eval_mode(capture_as, findings, dialect, node):
    # torch.export records nn.Dropout(inplace=True) as aten.dropout_, which remove_dropout removes too
    captured = capture_as(InplaceDropout().eval(), X, dialect)
    found = findings(captured, "FX004")
    assert [(f.node, f.fix) for f in found] == [(node, "remove_dropout")] and "no-op" in found[0].message
    # the fix clears it: the rule reports what its pass removes
    fixed = apply_pass(captured.graph_module, "remove_dropout").graph_module
    assert findings(fixed, "FX004") == []


def test_mobilenet_v2_classifier_dropout(findings, mobilenet_v2_captured):
    found = findings(mobilenet_v2_captured, "FX004")
    expected = "classifier_0" if mobilenet_v2_captured.dialect == "torch" else "dropout"
    assert [f.node for f in found] == [expected]
    assert found[0].module == "classifier.0"


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_no_dropout(capture_as, findings, dialect):
    assert findings(capture_as(nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval(), X, dialect), "FX004") == []


def test_resnet18_has_none(findings, resnet18_captured):
    assert findings(resnet18_captured, "FX004") == []
