from __future__ import annotations

import pytest
import torch
from torch import nn


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


def test_export_specialises_the_batch_size(capture_as, findings):
    found = findings(capture_as(Flatten(), torch.randn(4, 3, 8, 8), "aten"), "FX010")
    assert [(f.code, f.node, f.severity) for f in found] == [("FX010", "view", "warning")]
    assert "literal size 4" in found[0].message and "(4, -1)" in found[0].message


def test_symbolic_trace_keeps_the_size_symbolic(capture_as, findings):
    assert findings(capture_as(Flatten(), torch.randn(4, 3, 8, 8), "torch"), "FX010") == []


def test_batch_of_one_is_not_checked(capture_as, findings):
    assert findings(capture_as(Flatten(), torch.randn(1, 3, 8, 8), "aten"), "FX010") == []


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_literal_written_in_the_model(capture_as, findings, dialect):
    found = findings(capture_as(LiteralBatch(), torch.randn(4, 6), dialect), "FX010")
    assert [f.node for f in found] == ["reshape", "new_zeros"]


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_other_literals(capture_as, findings, dialect):
    assert findings(capture_as(LiteralThatIsNotTheBatch(), torch.randn(4, 6), dialect), "FX010") == []


def test_resnet18_flattens_without_literal_batch(findings, resnet18_captured):
    assert resnet18_captured.example_inputs[0].shape[0] == 2
    assert findings(resnet18_captured, "FX010") == []


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
