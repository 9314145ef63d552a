from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model_helpers import InplaceDropout


class FunctionalDropout(nn.Module):
    def forward(self, x):
        return F.dropout(x, 0.5, training=self.training)


class FunctionalBatchNorm(nn.Module):
    def __init__(self, stats: bool = True):
        super().__init__()
        self.stats = stats
        self.register_buffer("mean", torch.zeros(4))
        self.register_buffer("var", torch.ones(4))

    def forward(self, x):
        if self.stats:
            return F.batch_norm(x, self.mean, self.var, training=self.training)
        return F.batch_norm(x, None, None, training=True)  # no running stats: batch statistics in both modes


class Modules(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        return self.drop(self.bn(x))


X = torch.randn(3, 4)


@pytest.mark.parametrize("model", [FunctionalDropout, FunctionalBatchNorm])
def test_torch_dialect_eval_trace_is_not_flagged(capture_as, findings, model):
    # training=self.training traced in eval mode records False: the model's inference behaviour, which is what an
    # inference graph should compute (timm's BatchNormAct2d calls F.batch_norm like this in every timm CNN)
    assert findings(capture_as(model().eval(), X, "torch"), "FX011") == []


def test_torch_dialect_train_trace_freezes_dropout(capture_as, findings):
    # the case the rule exists for: traced in training mode, the graph drops activations even after eval()
    found = findings(capture_as(FunctionalDropout().train(), X, "torch", check=False), "FX011")
    assert [(f.code, f.node, f.severity) for f in found] == [("FX011", "dropout", "warning")]
    assert "training=True baked in" in found[0].message and "even in eval()" in found[0].message


def test_torch_dialect_train_trace_freezes_batch_norm(capture_as, findings):
    found = findings(capture_as(FunctionalBatchNorm().train(), X, "torch", check=False), "FX011")
    assert [f.node for f in found] == ["batch_norm"] and "training=True baked in" in found[0].message


class HardCoded(nn.Module):
    """A submodule whose call ignores its own mode: ``training=False`` written in the code."""

    def forward(self, x):
        return F.dropout(x, 0.5, training=False)


class Parent(nn.Module):
    def __init__(self, child: nn.Module):
        super().__init__()
        self.child = child

    def forward(self, x):
        return self.child(x) + 1


def test_torch_dialect_false_in_a_module_captured_in_training_mode(capture_as, findings):
    # a graph captured for training: the call stays off after train(); the mode is the calling module's own
    parent = Parent(HardCoded()).eval()
    parent.child.train()
    found = findings(capture_as(parent, X, "torch"), "FX011")
    assert [f.node for f in found] == ["dropout"] and "training=False baked in" in found[0].message
    assert "even after train()" in found[0].message


def test_torch_dialect_false_from_a_submodule_in_eval_mode(capture_as, findings):
    # the model is in training mode, the submodule that made the call is not: False is that submodule's behaviour
    parent = Parent(FunctionalDropout()).train()
    parent.child.eval()
    assert findings(capture_as(parent, X, "torch"), "FX011") == []


def test_graph_module_linted_on_its_own_uses_its_mode(findings):
    # no Captured: the GraphModule's own mode (symbolic_trace copies the model's)
    assert findings(torch.fx.symbolic_trace(FunctionalBatchNorm().eval()), "FX011") == []
    assert [f.node for f in findings(torch.fx.symbolic_trace(Parent(HardCoded()).train()), "FX011")] == ["dropout"]


def test_batch_norm_without_running_stats(capture_as, findings):
    assert findings(capture_as(FunctionalBatchNorm(stats=False), X, "torch"), "FX011") == []


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_modules_are_not_flagged_in_eval(capture_as, findings, dialect):
    # call_module nodes read .training at run time; an eval export's training=False is expected
    assert findings(capture_as(Modules().eval(), X, dialect), "FX011") == []


def test_aten_eval_export_is_expected_to_bake_false(capture_as, findings):
    assert findings(capture_as(FunctionalDropout().eval(), X, "aten"), "FX011") == []


def test_aten_train_mode_export(capture_as, findings):
    found = findings(capture_as(Modules().train(), X, "aten", check=False), "FX011")
    assert [f.node for f in found] == ["batch_norm", "dropout"]
    assert "training=True baked in" in found[0].message and "train=True" in found[1].message


def test_aten_inplace_dropout(capture_as, findings):
    # nn.Dropout(inplace=True) exports as aten.dropout_: flagged in a train-mode export like aten.dropout
    captured = capture_as(InplaceDropout().train(), X, "aten", check=False)
    assert "aten.dropout_.default" in {str(n.target) for n in captured.graph_module.graph.nodes}
    found = findings(captured, "FX011")
    assert [f.node for f in found] == ["dropout_"] and "train=True baked in" in found[0].message
    assert findings(capture_as(InplaceDropout().eval(), X, "aten"), "FX011") == []


def test_torch_dialect_train_mode_modules(capture_as, findings):
    assert findings(capture_as(Modules().train(), X, "torch", check=False), "FX011") == []


def test_resnet18_has_none(findings, resnet18_captured):
    assert findings(resnet18_captured, "FX011") == []
