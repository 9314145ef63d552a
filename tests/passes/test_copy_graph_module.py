"""copy_graph_module: the private copy every pass runs on shares tensors but nothing a pass may change."""

from __future__ import annotations

import torch
from torch import fx, nn

from fxforge.passes import apply_pass, copy_graph_module


class Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.head = fx.symbolic_trace(nn.Sequential(nn.Conv2d(4, 4, 1), nn.Tanh()))
        self.tags = {"kind": "inner"}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.bn(self.conv(x)))


class Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Inner()
        self.shared = nn.ReLU()
        self.graph_child = fx.symbolic_trace(nn.Sequential(nn.Conv2d(4, 4, 1), nn.Sigmoid()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.shared(self.block(x))
        return self.shared(self.graph_child(y))


def traced() -> fx.GraphModule:
    # leaves keep block and graph_child as modules of the graph, so the copy has a tree to copy
    class Leaves(fx.Tracer):
        def is_leaf_module(self, m: nn.Module, name: str) -> bool:
            return name in ("block", "graph_child") or super().is_leaf_module(m, name)

    model = Outer().eval()
    return fx.GraphModule(model, Leaves().trace(model))


def test_the_copy_computes_the_same_and_shares_the_weights():
    gm = traced()
    copied = copy_graph_module(gm)
    x = torch.randn(2, 3, 8, 8)
    assert torch.equal(copied(x), gm(x))
    assert copied.block is not gm.block and copied.block.conv is not gm.block.conv
    assert copied.block.conv.weight is gm.block.conv.weight  # copy-on-write: the tensor is shared
    assert type(copied.block) is Inner and copied.block.tags == {"kind": "inner"}
    assert [n.name for n in copied.graph.nodes] == [n.name for n in gm.graph.nodes]


def test_changing_the_copy_leaves_the_original_alone():
    gm = traced()
    x = torch.randn(2, 3, 8, 8)
    want = gm(x)
    copied = copy_graph_module(gm)
    copied.block.conv = nn.Identity()  # replaced submodule
    copied.block.register_buffer("extra", torch.zeros(1))  # new buffer
    copied.block.conv2 = nn.Conv2d(1, 1, 1)  # new submodule
    copied.block.register_forward_hook(lambda *args: None)  # hooks live in per-module dicts
    copied.block.bn.weight = nn.Parameter(torch.zeros(4))  # replaced parameter
    copied.graph_child.get_submodule("0").bias = None
    assert isinstance(gm.block.conv, nn.Conv2d)
    assert "extra" not in dict(gm.block.named_buffers()) and not hasattr(gm.block, "conv2")
    assert not gm.block._forward_hooks and gm.block.bn.weight.abs().sum() > 0
    assert gm.graph_child.get_submodule("0").bias is not None
    assert torch.equal(gm(x), want)


def test_a_graph_module_inside_the_tree_keeps_its_code():
    # a GraphModule's forward lives on a class fx makes per instance: a shallow copy would lose it
    gm = traced()
    copied = copy_graph_module(gm)
    y = torch.randn(1, 4, 6, 6)
    for name in ("graph_child", "block.head"):  # a child of the root, and one deeper down
        original, duplicate = gm.get_submodule(name), copied.get_submodule(name)
        assert duplicate is not original and torch.equal(duplicate(y), original(y))


def test_a_module_used_twice_is_copied_once():
    gm = traced()
    gm.block.alias = gm.block.bn  # the same module under two names
    copied = copy_graph_module(gm)
    assert copied.block.alias is copied.block.bn and copied.block.bn is not gm.block.bn


def test_a_pass_on_the_copy_does_not_touch_the_model():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()
    model[1].running_mean.uniform_()
    gm = fx.symbolic_trace(model)
    before = {k: v.clone() for k, v in gm.state_dict().items()}
    result = apply_pass(gm, "fold_bn")
    assert result.changed and not any(n.target == "1" for n in result.graph_module.graph.nodes)
    assert any(n.target == "1" for n in gm.graph.nodes)
    assert all(torch.equal(v, before[k]) for k, v in gm.state_dict().items())
