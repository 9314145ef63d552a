from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn


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


def test_torch_dialect_eval_trace_freezes_dropout(capture_as, findings):
    found = findings(capture_as(FunctionalDropout().eval(), X, "torch"), "FX011")
    assert [(f.code, f.node) for f in found] == [("FX011", "dropout")]
    assert "training=False baked in" in found[0].message and "even after train()" in found[0].message


def test_torch_dialect_frozen_batch_norm(capture_as, findings):
    found = findings(capture_as(FunctionalBatchNorm().eval(), X, "torch"), "FX011")
    assert [f.node for f in found] == ["batch_norm"]


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


def test_torch_dialect_train_mode_modules(capture_as, findings):
    assert findings(capture_as(Modules().train(), X, "torch", check=False), "FX011") == []


def test_resnet18_has_none(findings, resnet18_captured):
    assert findings(resnet18_captured, "FX011") == []
