"""Lint findings and their fixes on real architectures (random weights): what the QA of 2026-11-26 found wrong on
them, each checked where it was seen -- not only on a toy that imitates it."""

from __future__ import annotations

import pytest
import torch

import fxforge
from fxforge.graphs import node_kind
from fxforge.lint import lint
from fxforge.passes import apply_pass


def findings(target, code: str) -> list:
    return lint(target, select=[code]).findings


def test_in_place_dropout_of_a_torchvision_mobilenet_v3_is_found_and_removed_in_the_aten_dialect():
    """nn.Dropout(inplace=True) exports as aten.dropout_: FX004 found none and remove_dropout said 'changed: no'."""
    captured = fxforge.prepare("torchvision:mobilenet_v3_small", ["1x3x64x64"], method="export")
    assert captured.dialect == "aten"
    assert len(findings(captured, "FX004")) == 1
    result = apply_pass(captured.graph_module, "remove_dropout")
    assert result.changed and result.removed == 1
    assert not any(node_kind(result.graph_module, n) == "dropout" for n in result.graph_module.graph.nodes)
    x = torch.randn(1, 3, 64, 64)
    assert torch.equal(result.graph_module(x), captured.graph_module(x))  # an inactive dropout returns its input


def test_fx009_on_shufflenet_reports_only_what_lint_fix_can_merge():
    """After fold_bn, shufflenet's 19 conv pairs would all merge into larger layers, which merge_convs refuses by
    default: FX009 reported all 19 and lint --fix could clear none."""
    captured = fxforge.prepare("torchvision:shufflenet_v2_x0_5", ["1x3x64x64"], method="symbolic_trace")
    folded = apply_pass(captured.graph_module, "fold_bn").graph_module
    larger = apply_pass(folded, "merge_convs", {"allow_larger": True})
    assert larger.removed >= 10  # exact merges exist, but every one is larger than the pair
    assert findings(folded, "FX009") == []
    assert not apply_pass(folded, "merge_convs").changed


def test_fx011_is_quiet_on_a_timm_net_captured_in_eval_mode():
    """timm's BatchNormAct2d calls F.batch_norm(..., training=False) when the model is in eval mode: 49 warnings
    on efficientnet_b0 that no fix could clear; captured in training mode, the flag is flagged."""
    pytest.importorskip("timm")
    captured = fxforge.prepare("timm:efficientnet_b0", ["1x3x64x64"], method="symbolic_trace")
    assert findings(captured, "FX011") == []
    model = fxforge.load_model("timm:efficientnet_b0").module.train()
    trained = fxforge.capture(model, (torch.randn(2, 3, 64, 64),), method="symbolic_trace", check=False)
    assert len(findings(trained, "FX011")) > 10
