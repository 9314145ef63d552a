"""remove_dropout: inactive dropout goes in both dialects; active dropout stays, with the reason."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxforge.graphs import node_kind
from fxforge.passes import apply_pass
from fxforge.verify import verify

DIALECTS = ["torch", "aten"]


def dropouts(gm) -> list[str]:
    return [n.name for n in gm.graph.nodes if node_kind(gm, n) == "dropout"]


class DropoutModules(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)
        self.drop2d = nn.Dropout2d(0.3)
        self.alpha = nn.AlphaDropout(0.2)

    def forward(self, x):
        y = self.drop(self.fc(x))
        return self.alpha(self.drop2d(y[:, :, None, None]).relu())


class FunctionalFollowsMode(nn.Module):
    def forward(self, x):
        return F.dropout(x, 0.5, training=self.training).relu() + F.dropout2d(x, 0.1, self.training)


class FunctionalFrozenTrue(nn.Module):
    def forward(self, x):
        return F.dropout(x, 0.5).relu()  # training defaults to True, whatever the module's mode


@pytest.mark.parametrize("dialect", DIALECTS)
def test_removes_eval_mode_modules(dialect, capture_as, run_verified):
    captured = capture_as(DropoutModules().eval(), torch.randn(4, 8), dialect)
    assert len(dropouts(captured.graph_module)) == 3
    result = run_verified(captured, "remove_dropout")
    assert result.changed and result.removed == 3 and result.skipped == []
    assert dropouts(result.graph_module) == []
    if dialect == "torch":  # the modules nothing calls any more are gone from the graph module too
        kinds = (nn.Dropout, nn.Dropout2d, nn.AlphaDropout)
        assert not any(isinstance(m, kinds) for m in result.graph_module.modules())


@pytest.mark.parametrize("dialect", DIALECTS)
def test_removes_functional_dropout_following_the_module_mode(dialect, capture_as, run_verified):
    captured = capture_as(FunctionalFollowsMode().eval(), torch.randn(2, 3, 4, 4), dialect)
    result = run_verified(captured, "remove_dropout")
    assert result.removed == 2 and dropouts(result.graph_module) == []


@pytest.mark.parametrize("dialect", DIALECTS)
def test_refuses_functional_dropout_with_training_frozen_true(dialect, capture_as):
    # still active after model.eval(): removing it would change the model, so it stays and the reason says why
    captured = capture_as(FunctionalFrozenTrue().eval(), torch.randn(2, 6), dialect, check=False)
    result = apply_pass(captured.graph_module, "remove_dropout")
    assert not result.changed and result.graph_module.code == captured.graph_module.code
    assert len(result.skipped) == 1
    assert "training=True frozen" in result.skipped[0] and "training=self.training" in result.skipped[0]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_refuses_module_in_training_mode(dialect, capture_as):
    model = DropoutModules().eval()
    model.drop.train()
    captured = capture_as(model, torch.randn(4, 8), dialect, check=False)
    result = apply_pass(captured.graph_module, "remove_dropout")
    assert result.removed == 2
    (reason,) = result.skipped
    # a module needs model.eval(), not the functional training=self.training advice
    assert "module drop" in reason and "model.eval()" in reason and "self.training" not in reason


class ZeroProbabilityInTraining(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        return self.drop(F.dropout(self.fc(x), 0.0, training=True)).relu()


@pytest.mark.parametrize("dialect", DIALECTS)
def test_removes_a_zero_probability_dropout_whatever_its_training_flag(dialect, capture_as, run_verified):
    """QA: FX004 called F.dropout(x, 0.0, training=True) a no-op to remove, and remove_dropout refused it as
    "training=True frozen into the graph": lint --fix could never clear the finding. p=0 drops nothing."""
    model = ZeroProbabilityInTraining().eval()
    model.drop.train()  # a module in training mode with p=0 drops nothing either
    captured = capture_as(model, torch.randn(2, 8), dialect)
    assert len(dropouts(captured.graph_module)) == 2
    result = run_verified(captured, "remove_dropout")
    assert result.removed == 2 and result.skipped == [] and dropouts(result.graph_module) == []


class InPlaceDropouts(nn.Module):
    # nn.Dropout(inplace=True), as in torchvision's EfficientNets and MobileNetV3: aten.dropout_ in the ATen dialect
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.2, inplace=True)

    def forward(self, x):
        return F.dropout(self.drop(self.fc(x)).relu(), 0.1, self.training, inplace=True) * 2


@pytest.mark.parametrize("dialect", DIALECTS)
def test_removes_in_place_dropout(dialect, capture_as, run_verified):
    captured = capture_as(InPlaceDropouts().eval(), torch.randn(2, 8), dialect)
    if dialect == "aten":
        assert sum("dropout_" in str(n.target) for n in captured.graph_module.graph.nodes) == 2
    result = run_verified(captured, "remove_dropout")
    assert result.removed == 2 and result.skipped == []
    assert not any("dropout" in str(n.target) for n in result.graph_module.graph.nodes)


class NativeDropout(nn.Module):
    def forward(self, x):
        return torch.native_dropout(x, 0.5, False)[0] * 2


def test_removes_aten_native_dropout_with_train_false(capture_as, run_verified):
    # torch.export unpacks both outputs, the mask into a getitem nothing reads: that is no use of the mask
    captured = capture_as(NativeDropout().eval(), torch.randn(2, 3), "aten")
    result = run_verified(captured, "remove_dropout")
    assert result.removed == 1
    assert not any("native_dropout" in str(n.target) for n in result.graph_module.graph.nodes)
    assert not any(n.target is operator.getitem for n in result.graph_module.graph.nodes)


class NativeDropoutMaskUsed(nn.Module):
    def forward(self, x):
        out, mask = torch.native_dropout(x, 0.5, False)
        return out * mask


def test_keeps_native_dropout_whose_mask_is_used(capture_as, run_verified):
    result = run_verified(capture_as(NativeDropoutMaskUsed().eval(), torch.randn(2, 3), "aten"), "remove_dropout")
    assert not result.changed and "mask is used" in result.skipped[0]


class NativeDropoutThenInPlace(nn.Module):
    def forward(self, x):
        y = x.relu()
        z = torch.native_dropout(y, 0.5, False)[0]
        z.add_(1)  # writes the copy: removing it would write y, which is returned too
        return y, z


def test_keeps_native_dropout_copy_written_in_place(capture_as):
    captured = capture_as(NativeDropoutThenInPlace().eval(), torch.randn(2, 3), "aten")
    # torch.export (2.14.1) mis-captures this model -- its graph returns the written copy twice -- and verify says
    # so rather than blaming a pass; the pass itself must still leave the graph's own semantics alone.
    assert not captured.record.ok
    result = apply_pass(captured.graph_module, "remove_dropout")
    assert not result.changed and "in-place" in result.skipped[0]
    check = verify(captured, result.graph_module)
    assert not check.ok and check.capture_differs


@pytest.mark.parametrize("dialect", DIALECTS)
def test_nothing_to_do(dialect, capture_as, run_verified):
    captured = capture_as(nn.Sequential(nn.Linear(4, 4), nn.ReLU()).eval(), torch.randn(2, 4), dialect)
    result = run_verified(captured, "remove_dropout")
    assert not result.changed and result.removed == 0 and result.log == [] and result.skipped == []
    assert result.graph_module.code == captured.graph_module.code


@pytest.mark.parametrize("dialect", DIALECTS)
def test_torchvision_classifier_head(dialect, capture_as, run_verified):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    captured = capture_as(torchvision.models.mobilenet_v2().eval(), torch.randn(1, 3, 64, 64), dialect)
    assert len(dropouts(captured.graph_module)) == 1
    result = run_verified(captured, "remove_dropout", seeds=(0,))
    assert result.removed == 1 and dropouts(result.graph_module) == []
