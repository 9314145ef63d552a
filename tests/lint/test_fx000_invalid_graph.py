"""FX000 invalid-graph: fires on a structurally broken graph, silent on a captured one."""

from __future__ import annotations

import torch
from torch import fx, nn


class Small(nn.Module):
    def forward(self, x):
        return torch.relu(x) + 1


def test_fires_when_a_node_uses_a_value_defined_after_it(findings):
    gm = fx.symbolic_trace(Small())
    relu, add = [n for n in gm.graph.nodes if n.op == "call_function"]
    relu.args = (add,)  # relu now reads add, which is defined after it: a use before definition
    found = findings(gm, "FX000")
    assert len(found) == 1 and found[0].severity == "error"
    assert "Graph.lint failed" in found[0].message


def test_silent_on_captured_models(findings, capture_as, resnet18_captured):
    assert findings(resnet18_captured, "FX000") == []
    assert findings(capture_as(Small(), torch.randn(2, 3), "aten"), "FX000") == []
