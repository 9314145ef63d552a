"""FX014 parallel-linears reports exactly the groups merge_parallel_linears merges."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fxforge.capture import capture
from fxforge.passes import apply_pass


class Projections(nn.Module):
    def __init__(self, returned: bool = False):
        super().__init__()
        self.returned = returned
        self.q, self.k, self.v = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        if self.returned:  # the results' strides would be visible: nothing to merge
            return q, k, v
        return (q * k).sum(-1, keepdim=True) * v


@pytest.mark.parametrize("method", ["symbolic_trace", "export"])
def test_reported_where_the_pass_merges_and_gone_after_it(findings, method):
    captured = capture(Projections().eval(), (torch.randn(3, 8),), method=method)
    (found,) = findings(captured, "FX014")
    assert "one linear of 20 outputs" in found.message and found.fix == "merge_parallel_linears"
    merged = apply_pass(captured.graph_module, "merge_parallel_linears")
    assert merged.changed and findings(merged.graph_module, "FX014") == []


def test_not_reported_where_the_pass_refuses(findings):
    captured = capture(Projections(returned=True).eval(), (torch.randn(3, 8),), method="symbolic_trace")
    assert findings(captured, "FX014") == []
    assert not apply_pass(captured.graph_module, "merge_parallel_linears").changed
