from __future__ import annotations

import pytest
import torch
from torch import nn

from fxforge.passes import apply_pass


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


class ConvWeightRead(nn.Module):
    """The conv's weight is also read directly: folding would change what that read sees."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x):
        return self.bn(self.conv(x)) + self.conv.weight.sum()


class Mixed(nn.Module):
    """Two foldable BNs and three that fold_bn refuses, each for another reason."""

    def __init__(self):
        super().__init__()
        names = ("good", "read", "shared", "updating", "last")
        self.convs = nn.ModuleDict({name: nn.Conv2d(3, 3, 1) for name in names})
        self.bns = nn.ModuleDict({name: nn.BatchNorm2d(3) for name in names})

    def forward(self, x):
        a = self.bns["good"](self.convs["good"](x))
        b = self.bns["read"](self.convs["read"](a)) * self.convs["read"].bias.mean()  # a direct parameter read
        c = self.bns["shared"](self.convs["shared"](b)) + self.convs["shared"](x)  # the conv is called twice
        d = self.bns["updating"](self.convs["updating"](c))
        return self.bns["last"](self.convs["last"](d))


def mixed() -> Mixed:
    torch.manual_seed(0)
    model = Mixed().eval()
    model.bns["updating"].train()
    return model


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
def test_training_mode_bn_is_reported_with_the_fix(capture_as, findings, dialect):
    # not foldable, but model.eval() would make it so: the rule says how, as fold_bn's skip reason does
    captured = capture_as(ConvBn().train(), X, dialect)
    (found,) = findings(captured, "FX008")
    assert "cannot be folded" in found.message and "call model.eval() before capture" in found.message
    result = apply_pass(captured.graph_module, "fold_bn")
    assert not result.changed and "call model.eval() before capture" in result.skipped[0]


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_shared_conv(capture_as, findings, dialect):
    # folding into a conv used twice would change the other use
    assert findings(capture_as(SharedConv().eval(), X, dialect), "FX008") == []


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_conv_weight_read_directly(capture_as, findings, dialect):
    # fold_bn refuses (the direct read would see the folded weight), so the rule must stay silent too,
    # or `lint --fix` could never clear the finding
    captured = capture_as(ConvWeightRead().eval(), X, dialect)
    assert findings(captured, "FX008") == []
    result = apply_pass(captured.graph_module, "fold_bn")
    assert not result.changed and len(result.skipped) == 1


def test_linear_bn_needs_a_known_rank(capture_as, findings):
    inputs = torch.randn(5, 4)
    # torch.export records the linear output's shape (2-D), and capture records it for a symbolic trace: foldable
    assert [f.node for f in findings(capture_as(LinearBn().eval(), inputs, "aten"), "FX008")] == ["batch_norm"]
    assert [f.node for f in findings(capture_as(LinearBn().eval(), inputs, "torch"), "FX008")] == ["bn"]
    # a bare traced graph has no shapes: BatchNorm1d on 3-D input normalises another dim, so not reported
    assert findings(torch.fx.symbolic_trace(LinearBn().eval()), "FX008") == []


def test_resnet18_every_bn(findings, resnet18_captured):
    found = findings(resnet18_captured, "FX008")
    assert len(found) == 20  # every BatchNorm follows its conv directly
    first = "bn1" if resnet18_captured.dialect == "torch" else "batch_norm"
    assert found[0].node == first and found[0].module == "bn1"


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_rule_reports_exactly_what_fold_bn_folds(capture_as, findings, dialect):
    captured = capture_as(mixed(), X, dialect)
    found = findings(captured, "FX008")
    result = apply_pass(captured.graph_module, "fold_bn")
    folded = [line.split()[1] for line in result.log if line.startswith("folded ")]
    foldable = [f.node for f in found if "can be folded" in f.message]
    assert foldable == folded and len(folded) == 2
    assert len(result.skipped) == 3, result.skipped
    # the training-mode BN is reported with its fix (model.eval()), which fold_bn cannot apply
    (training,) = [f for f in found if "can be folded" not in f.message]
    assert "call model.eval() before capture" in training.message
    assert [f.node for f in findings(result.graph_module, "FX008")] == [training.node]


@pytest.mark.parametrize("dialect", ["torch", "aten"])
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_rule_and_pass_agree_on_torchvision(capture_as, findings, name, dialect):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    captured = capture_as(getattr(torchvision.models, name)().eval(), torch.randn(1, 3, 64, 64), dialect)
    found = findings(captured, "FX008")
    result = apply_pass(captured.graph_module, "fold_bn")
    assert len(found) == result.removed > 0, result.skipped
    assert findings(result.graph_module, "FX008") == []
