"""FX001 dead-node: an unused pure node is reported; unused side-effecting calls and used nodes are not."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fxforge.lint import lint


class DeadCode(nn.Module):
    def forward(self, x):
        unused = torch.sigmoid(x)  # noqa: F841 -- the dead node under test
        return x + 1


class InPlaceUnused(nn.Module):
    def forward(self, x):
        y = x.clone()
        y.mul_(2)  # its result is unused, but it writes into y, which is returned
        return y


def test_fires_on_an_unused_pure_node(findings, capture_as):
    found = findings(capture_as(DeadCode(), torch.randn(2, 3), "torch"), "FX001")
    assert [f.node for f in found] == ["sigmoid"]
    assert found[0].severity == "warning" and found[0].fix == "dead_code"


def test_silent_on_unused_in_place_write(findings, capture_as):
    assert findings(capture_as(InPlaceUnused(), torch.randn(2, 3), "torch"), "FX001") == []


def test_silent_on_resnet18(findings, resnet18_captured):
    assert findings(resnet18_captured, "FX001") == []


class TrainingBatchNormUnused(nn.Module):
    """The BN's output is unused, but in training mode the call updates the running statistics."""

    def __init__(self):
        super().__init__()
        self.register_buffer("mean", torch.zeros(3))
        self.register_buffer("var", torch.ones(3))

    def forward(self, x):
        torch.nn.functional.batch_norm(x, self.mean, self.var, training=True)
        return x * 2


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_silent_on_a_call_that_updates_state(findings, capture_as, dialect):
    # Agrees with the dead_code pass, which must keep it: a finding lint --fix could never clear would be noise.
    captured = capture_as(TrainingBatchNormUnused(), torch.randn(4, 3), dialect)
    assert findings(captured, "FX001") == []
    assert findings(captured, "FX002") == []


class DiscardsAnUnpackedItem(nn.Module):
    def forward(self, x):
        first, _ = x.chunk(2, dim=1)
        unused = torch.sigmoid(first)  # noqa: F841 -- a real dead node next to the discarded item
        return first * 2


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_silent_on_an_unpacked_item_the_code_discards(findings, capture_as, dialect):
    # `a, _ = x.chunk(2)` leaves an unused getitem of a live tuple: free, and what `_` means; no edit could clear it.
    found = findings(capture_as(DiscardsAnUnpackedItem(), torch.randn(2, 4), dialect), "FX001")
    assert [f.node for f in found] == ["sigmoid"]


class IndexesATensorAndDropsIt(nn.Module):
    def forward(self, x):
        y = x * 2
        unused = y[:, :2]  # noqa: F841 -- a dead slice of a tensor, not an unpacked item
        first = y[0]  # noqa: F841
        return y


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_fires_on_an_unused_index_of_a_tensor(findings, capture_as, dialect):
    # QA: the unpacked-item exemption hid every dead index of a live tensor
    found = findings(capture_as(IndexesATensorAndDropsIt(), torch.randn(2, 4), dialect), "FX001")
    assert len(found) == 2


def test_a_proven_export_assert_is_no_finding(capture_as):
    """QA: torch.export writes an ``_assert_tensor_metadata`` beside a ``.to(dtype)``, and again when an optimized
    model is exported to model.pt2: linting the optimized T5 warned of a node "computed but never used". It is a
    check, not a computation; dead_code still removes it where the recorded value proves it."""
    captured = capture_as(_CastsToItsOwnDtype(), torch.randn(2, 4), "aten")
    asserts = [n for n in captured.graph_module.graph.nodes if "_assert_tensor_metadata" in str(n.target)]
    assert asserts and not [f for f in lint(captured, select=["FX001"]).findings if f.node == asserts[0].name]


class _CastsToItsOwnDtype(torch.nn.Module):
    def forward(self, x):
        return x.softmax(-1).to(torch.float32) * 2
