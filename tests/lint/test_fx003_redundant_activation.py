from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn


class ReluRelu(nn.Module):
    def forward(self, x):
        return F.relu(F.relu(x))


class ReluAfterSigmoid(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x).relu()


class Relu6AfterRelu(nn.Module):
    def __init__(self, share: bool = False):
        super().__init__()
        self.act = nn.ReLU6()
        self.share = share

    def forward(self, x):
        y = F.relu(x)
        z = self.act(y)
        return z + y if self.share else z


class ReluAfterHardtanh(nn.Module):
    """hardtanh(-1, 1) can be negative: the relu after it does something."""

    def forward(self, x):
        return F.relu(F.hardtanh(x, -1.0, 1.0))


class ReluAfterSoftmaxAndRelu6(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.ReLU6()

    def forward(self, x):
        return F.relu(self.act(x)) + F.relu(x.softmax(-1))


X = torch.randn(2, 5)


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_relu_of_relu(capture_as, findings, dialect):
    found = findings(capture_as(ReluRelu(), X, dialect), "FX003")
    assert [(f.code, f.node) for f in found] == [("FX003", "relu_1")]
    assert "relu_1 (relu) is redundant" in found[0].message and "from relu (relu)" in found[0].message


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_relu_after_sigmoid(capture_as, findings, dialect):
    found = findings(capture_as(ReluAfterSigmoid(), X, dialect), "FX003")
    assert [f.node for f in found] == ["relu"]
    assert "[0, 1]" in found[0].message


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_relu_after_relu6_and_softmax(capture_as, findings, dialect):
    found = findings(capture_as(ReluAfterSoftmaxAndRelu6(), X, dialect), "FX003")
    assert [f.node for f in found] == ["relu", "relu_1"]
    assert "[0, 6]" in found[0].message and "[0, 1]" in found[1].message


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_inner_relu_before_relu6_is_redundant(capture_as, findings, dialect):
    found = findings(capture_as(Relu6AfterRelu(), X, dialect), "FX003")
    # the inner relu is the redundant one; in aten relu6 is hardtanh(0, 6)
    assert [f.node for f in found] == ["relu"]
    assert found[0].message.startswith("relu (relu) is redundant: its only user")
    assert "[0, 6]" in found[0].message


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_inner_relu_with_other_users_is_kept(capture_as, findings, dialect):
    assert findings(capture_as(Relu6AfterRelu(share=True), X, dialect), "FX003") == []


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_relu_after_hardtanh_with_negative_range(capture_as, findings, dialect):
    assert findings(capture_as(ReluAfterHardtanh(), X, dialect), "FX003") == []


def test_clean_torchvision_models(findings, resnet18_captured, mobilenet_v2_captured):
    assert findings(resnet18_captured, "FX003") == []
    assert findings(mobilenet_v2_captured, "FX003") == []


# --------------------------------------------------------------------------------------------------
# the rule shares its detection with remove_redundant_activation, which lint --fix runs


class TanhThenHardtanh(nn.Module):
    def forward(self, x):
        return F.hardtanh(torch.tanh(x), -1.0, 1.0) + torch.clamp(torch.sigmoid(x), 0.0, 1.0)


class WrittenAfter(nn.Module):
    """relu of relu, but the inner relu's value is written in place afterwards: not removable, not reported."""

    def forward(self, x):
        y = F.relu(x)
        z = F.relu(y)
        y.add_(1)
        return z + y


MODELS = [ReluRelu, ReluAfterSigmoid, Relu6AfterRelu, ReluAfterSoftmaxAndRelu6, TanhThenHardtanh, WrittenAfter]


def test_the_rule_names_its_fix():
    from fxforge.lint import all_rules

    (rule,) = [r for r in all_rules() if r.code == "FX003"]
    assert rule.fix == "remove_redundant_activation" and rule.severity == "warning"


@pytest.mark.parametrize("dialect", ["torch", "aten"])
@pytest.mark.parametrize("make", MODELS, ids=lambda m: m.__name__)
def test_reports_exactly_what_the_pass_removes(capture_as, findings, dialect, make):
    from fxforge.passes import apply_pass

    captured = capture_as(make(), X, dialect)
    found = findings(captured, "FX003")
    result = apply_pass(captured.graph_module, "remove_redundant_activation")
    removed = {line.split()[1] for line in result.log}
    assert {f.node for f in found} == removed and len(found) == result.removed
    assert findings(result.graph_module, "FX003") == []  # lint --fix clears what it reported


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_tanh_and_clamp_ranges(capture_as, findings, dialect):
    found = findings(capture_as(TanhThenHardtanh(), X, dialect), "FX003")
    assert len(found) == 2
    assert "(hardtanh(-1, 1)) is redundant: its input from tanh (tanh) already lies in [-1, 1]" in found[0].message
    assert "(clamp(0, 1)) is redundant: its input from sigmoid (sigmoid) already lies in [0, 1]" in found[1].message


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_a_redundant_relu_the_pass_must_keep_is_not_reported(capture_as, findings, dialect):
    from fxforge.passes import apply_pass

    captured = capture_as(WrittenAfter(), X, dialect)
    assert findings(captured, "FX003") == []
    result = apply_pass(captured.graph_module, "remove_redundant_activation")
    assert "an in-place op writes its input after it" in result.skipped[0]
