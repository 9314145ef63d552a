"""dead_code: unused pure nodes go; nodes with effects stay, even where torch.fx's own pass deletes them."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from fxforge.passes import apply_pass
from fxforge.verify import compare_outputs

DIALECTS = ["torch", "aten"]


def names(gm) -> set[str]:
    return {n.name for n in gm.graph.nodes}


def stock_dce(gm):
    """torch.fx's own dead code elimination, on a copy."""
    gm = copy.deepcopy(gm)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


class UnusedPure(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)
        self.act = nn.ReLU()

    def forward(self, x):
        self.unused(x)
        (x.sin() * 2).sum()
        self.act(x)  # a torch.nn activation has no effect: its unused result can go
        return self.fc(x)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_removes_unused_pure_nodes_and_their_parameters(dialect, capture_as, run_verified):
    captured = capture_as(UnusedPure().eval(), torch.randn(2, 4), dialect)
    result = run_verified(captured, "dead_code")
    # torch: unused, sin, mul, sum, act; aten: also the unused linear's weight and bias fetches
    assert result.removed == (5 if dialect == "torch" else 7), result.log
    gm = result.graph_module
    assert "unused.weight" not in dict(gm.named_parameters())
    assert not hasattr(gm, "unused") and not hasattr(gm, "act")
    assert "fc.weight" in dict(gm.named_parameters())


class InPlaceOnCopy(nn.Module):
    def forward(self, x):
        y = x.clone()
        y.mul_(2)  # result unused, but y is read below
        return y + 1


@pytest.mark.parametrize("dialect", DIALECTS)
def test_keeps_in_place_op_with_unused_result(dialect, capture_as, run_verified):
    captured = capture_as(InPlaceOnCopy(), torch.randn(2, 3), dialect)
    result = run_verified(captured, "dead_code")
    assert not result.changed and names(result.graph_module) == names(captured.graph_module)


def test_stock_eliminate_dead_code_deletes_the_in_place_op(capture_as):
    # pytorch issue 68301, still present in torch 2.14.1 for torch-level graphs: fx decides liveness by
    # users alone and the unused-result mul_ goes. (On ATen graphs the stock pass reads the op schema and
    # keeps it.) Should torch fix it, this test fails and the comparison above is the one that matters.
    captured = capture_as(InPlaceOnCopy(), torch.randn(2, 3), "torch")
    x = torch.randn(2, 3)
    stock = stock_dce(captured.graph_module)
    assert "mul_" not in names(stock)
    assert not compare_outputs(captured.graph_module(x), stock(x)).ok
    ours = apply_pass(captured.graph_module, "dead_code").graph_module
    assert compare_outputs(captured.graph_module(x), ours(x)).ok


class CountsCalls(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        self.count.add_(1)
        return self.fc(x)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_keeps_buffer_write(dialect, capture_as, run_verified):
    captured = capture_as(CountsCalls().eval(), torch.randn(2, 4), dialect)
    result = run_verified(captured, "dead_code")
    assert any("add_" in str(n.target) for n in result.graph_module.graph.nodes)
    gm = result.graph_module
    before = float(gm.get_buffer("count"))
    gm(torch.randn(2, 4))
    assert float(gm.get_buffer("count")) == before + 1
    if dialect == "torch":  # the stock pass drops the write (and the buffer fetch)
        assert "add_" not in names(stock_dce(captured.graph_module))


class Recorder(nn.Module):
    """A user module with an effect fxforge cannot see from the call site: it writes a buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("seen", torch.zeros(4))

    def forward(self, x):
        self.seen.copy_(x[0])
        return x


class CallsUnknownModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.recorder = Recorder()
        self.act = nn.ReLU()

    def forward(self, x):
        self.recorder(x)
        self.act(x)
        return x * 2


def test_keeps_unused_call_of_unknown_module_and_removes_pure_one(capture_as, run_verified):
    captured = capture_as(CallsUnknownModule(), torch.randn(2, 4), "torch", leaf_modules=[Recorder])
    result = run_verified(captured, "dead_code")
    assert result.log[0] == "removed act (act)" and result.removed == 1
    assert "recorder" in names(result.graph_module)
    assert "recorder" not in names(stock_dce(captured.graph_module))  # stock calls it dead too


def test_keeps_the_inlined_write_of_a_module_in_aten(capture_as, run_verified):
    captured = capture_as(CallsUnknownModule(), torch.randn(2, 4), "aten")
    result = run_verified(captured, "dead_code")
    assert result.removed == 1 and "relu" in result.log[0]
    assert any("copy_" in str(n.target) for n in result.graph_module.graph.nodes)


class UnusedRandom(nn.Module):
    def forward(self, x):
        torch.randn_like(x)  # unused, but it advances the generator: later random calls see another state
        return x + 1


@pytest.mark.parametrize("dialect", DIALECTS)
def test_keeps_unused_random_op(dialect, capture_as, run_verified):
    captured = capture_as(UnusedRandom(), torch.randn(2, 3), dialect)
    result = run_verified(captured, "dead_code")
    assert any("randn" in str(n.target) for n in result.graph_module.graph.nodes)


class ReadsWeightOfUnusedLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.out = nn.Linear(4, 4)

    def forward(self, x):
        self.fc(x)
        self.fc.weight * 2
        return self.out(x)


def test_inplace_run_leaves_the_users_modules_whole(capture_as):
    # fx shares call_module targets with the user's model: deleting a dead parameter from such a module
    # would delete it from the user's model. It goes from the graph module as a whole module instead.
    model = ReadsWeightOfUnusedLayer()
    captured = capture_as(model, torch.randn(2, 4), "torch")
    result = apply_pass(captured.graph_module, "dead_code", inplace=True)
    assert result.removed == 3 and not hasattr(captured.graph_module, "fc")
    assert set(dict(model.fc.named_parameters())) == {"weight", "bias"}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_nothing_to_do(dialect, capture_as, run_verified):
    captured = capture_as(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.randn(2, 4), dialect)
    result = run_verified(captured, "dead_code")
    assert not result.changed and result.log == []
    assert result.graph_module.code == captured.graph_module.code


@pytest.mark.parametrize("dialect", DIALECTS)
def test_torchvision_resnet18(dialect, capture_as, run_verified):
    # torch.export fetches every BN's num_batches_tracked, which nothing reads in eval mode
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    captured = capture_as(torchvision.models.resnet18().eval(), torch.randn(1, 3, 64, 64), dialect)
    result = run_verified(captured, "dead_code", seeds=(0,))
    if dialect == "torch":
        assert not result.changed
        return
    removed = [line for line in result.log if line.startswith("removed ") and "dead node" not in line]
    assert len(removed) == result.removed == 20
    assert all("num_batches_tracked" in line for line in removed)
    assert "_guards_fn" in names(result.graph_module)  # torch.export's input check is an effect
