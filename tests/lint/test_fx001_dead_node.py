"""FX001 dead-node: an unused pure node is reported; unused side-effecting calls and used nodes are not."""

from __future__ import annotations

import torch
from torch import nn


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
