from __future__ import annotations

import pytest
import torch
from torch import nn

from fxforge.errors import FxforgeError
from fxforge.lint import lint


class Flatten(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 2, 3)

    def forward(self, x):
        return self.conv(x).view(x.size(0), -1)


class LiteralBatch(nn.Module):
    def forward(self, x):
        return x.reshape(4, -1) + x.new_zeros(4, 1)


class LiteralThatIsNotTheBatch(nn.Module):
    def forward(self, x):
        return x.view(2, 3, -1)  # batch is 4: fine


def test_a_static_aten_graph_is_skipped_with_the_reason(capture_as):
    """torch.export writes the example's batch into every shape, whether the code wrote x.size(0) or 4: the rule
    warned on correct code (QA: seven warnings on a BertModel, advising x.size(0), which the code used). It is listed
    as not run, with what would run it; selected alone, lint refuses instead of saying "All checks passed!"."""
    captured = capture_as(Flatten(), torch.randn(4, 3, 8, 8), "aten")
    report = lint(captured)
    assert "FX010" not in report.rules_run and not [f for f in report.findings if f.code == "FX010"]
    assert any(s.startswith("FX010 ") and "check_batch=N" in s for s in report.rules_skipped), report.rules_skipped
    with pytest.raises(FxforgeError, match="no selected rule runs on this graph: FX010"):
        lint(captured, select=["FX010"])


def test_an_aten_graph_with_a_symbolic_batch_is_judged(capture_as, findings):
    captured = capture_as(Flatten(), torch.randn(4, 3, 8, 8), "aten", check_batch=3)
    assert findings(captured, "FX010") == []


def test_symbolic_trace_keeps_the_size_symbolic(capture_as, findings):
    assert findings(capture_as(Flatten(), torch.randn(4, 3, 8, 8), "torch"), "FX010") == []


def test_batch_of_one_is_not_checked(capture_as, findings):
    assert findings(capture_as(Flatten(), torch.randn(1, 3, 8, 8), "aten"), "FX010") == []


def test_literal_written_in_the_model(capture_as, findings):
    found = findings(capture_as(LiteralBatch(), torch.randn(4, 6), "torch"), "FX010")
    assert [f.node for f in found] == ["reshape", "new_zeros"]


def test_other_literals(capture_as, findings):
    assert findings(capture_as(LiteralThatIsNotTheBatch(), torch.randn(4, 6), "torch"), "FX010") == []


def test_resnet18_flattens_without_literal_batch(findings, resnet18_captured):
    assert resnet18_captured.example_inputs[0].shape[0] == 2
    if resnet18_captured.dialect == "torch":
        assert findings(resnet18_captured, "FX010") == []
    else:  # exported with a static batch: not judged (above)
        assert any(s.startswith("FX010 ") for s in lint(resnet18_captured).rules_skipped)


class ComputedBatchThenLiterals(nn.Module):
    def forward(self, x):
        return x.reshape(x.shape[0], 2, 2, 2)  # at batch 2, the literal 2s are not the batch


def test_literals_after_a_computed_batch_are_not_the_batch(capture_as, findings):
    """QA: at batch 2, x.reshape(x.shape[0], 2, 2, 2) was flagged for its literal 2s."""
    assert findings(capture_as(ComputedBatchThenLiterals(), torch.randn(2, 8), "torch"), "FX010") == []


class InferredBatchThenLiterals(nn.Module):
    def forward(self, x):
        return x.view(-1, 2, 4)  # at batch 2: -1 is the batch, the literal 2 is not


def test_literals_after_an_inferred_batch_are_not_the_batch(capture_as, findings):
    assert findings(capture_as(InferredBatchThenLiterals(), torch.randn(2, 8), "torch"), "FX010") == []
