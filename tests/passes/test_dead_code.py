"""dead_code: unused pure nodes go; nodes with effects stay, even where torch.fx's own pass deletes them."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

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


# --------------------------------------------------------------------------------------------------
# writes that neither the call's name nor its schema shows (fxforge.effects.written_args)


class UnusedTrainingBatchNorm(nn.Module):
    """A training-mode batch norm whose output nothing reads: it still updates the running statistics."""

    def __init__(self, functional: bool):
        super().__init__()
        self.functional = functional
        self.bn = nn.BatchNorm2d(3)
        self.register_buffer("mean", torch.zeros(3))
        self.register_buffer("var", torch.ones(3))

    def forward(self, x):
        if self.functional:
            F.batch_norm(x, self.mean, self.var, training=True, momentum=0.5)
        else:
            self.bn(x)
        return x * 2


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("functional", [True, False], ids=["F.batch_norm", "module"])
def test_keeps_unused_training_batch_norm(functional, dialect, capture_as):
    captured = capture_as(UnusedTrainingBatchNorm(functional).train(), torch.randn(2, 3, 4, 4), dialect)
    result = apply_pass(captured.graph_module, "dead_code")
    gm = result.graph_module
    assert any("batch_norm" in str(n.target) or n.target == "bn" for n in gm.graph.nodes), gm.code
    stats = "mean" if functional else "bn.running_mean"
    before = gm.get_buffer(stats).clone()
    gm(torch.randn(2, 3, 4, 4) + 5)  # a batch mean near 5 moves the running mean (from 0) by momentum * 5
    assert not torch.equal(gm.get_buffer(stats), before)
    assert float(gm.get_buffer(stats).min()) > 0.4


class UnusedModuleOutput(nn.Module):
    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        self.inner(x)
        return x + 1


def test_keeps_unused_training_instance_norm_with_running_stats(capture_as):
    # torch dialect: the module call hides the write to its own running statistics
    model = UnusedModuleOutput(nn.InstanceNorm2d(3, track_running_stats=True)).train()
    gm = apply_pass(capture_as(model, torch.randn(2, 3, 4, 4), "torch").graph_module, "dead_code").graph_module
    assert "inner" in names(gm)
    gm(torch.randn(2, 3, 4, 4) + 5)
    assert float(gm.get_buffer("inner.running_mean").min()) > 0.4


def test_keeps_relu_with_inplace_given_by_position():
    # symbolic_trace records F.relu(y, True) as inplace=True; a graph built by hand (or by another tool)
    # passes it by position, and only the signature says the call writes y
    graph = fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_method("clone", (x,))
    graph.call_function(F.relu, (y, True))
    graph.output(y)
    gm = fx.GraphModule(nn.Module(), graph)
    result = apply_pass(gm, "dead_code")
    assert not result.changed and any(n.target is F.relu for n in result.graph_module.graph.nodes)
    x = torch.randn(4, 4)
    assert torch.equal(result.graph_module(x), x.relu())


class UnusedRenormalisingEmbedding(nn.Module):
    """An embedding lookup with max_norm whose result is unused: it still shrinks the looked-up rows."""

    def __init__(self, functional: bool):
        super().__init__()
        self.functional = functional
        self.embedding = nn.Embedding(10, 4, max_norm=1.0)

    def forward(self, idx):
        if self.functional:
            F.embedding(idx, self.embedding.weight, max_norm=1.0)
        else:
            self.embedding(idx)
        return self.embedding.weight.norm(dim=1)


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("functional", [True, False], ids=["F.embedding", "module"])
def test_keeps_unused_embedding_with_max_norm(functional, dialect, capture_as):
    idx = torch.tensor([1, 2, 3])
    captured = capture_as(UnusedRenormalisingEmbedding(functional), idx, dialect)
    result = apply_pass(captured.graph_module, "dead_code")
    with torch.no_grad():  # capture ran the model, which renormalised rows 1-3 already: lengthen every row again
        weight = result.graph_module.get_parameter("embedding.weight")
        weight.copy_(F.normalize(weight, dim=1) * 5)
    norms = result.graph_module(idx).detach()
    assert float(norms[1:4].max()) <= 1.0 + 1e-5  # renormalised in place before the read
    assert float(norms[4:].min()) > 1.0  # rows not looked up keep their length


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


def test_a_metadata_assert_goes_only_when_the_recorded_value_proves_it():
    """torch.export records ``_assert_tensor_metadata`` for each ``.to(dtype)``; once the no-op cast is gone the
    assert is the only other user of its input (Inductor's attention fusion wants one). It cannot fail when the
    input's recorded dtype, device and layout are the asserted ones; one that could fail stays."""

    class Cast(nn.Module):
        def forward(self, x):
            return x.softmax(-1).to(torch.float32) * 2

    gm = torch.export.export(Cast(), (torch.randn(2, 3),)).module()
    asserts = [n for n in gm.graph.nodes if "_assert_tensor_metadata" in str(n.target)]
    assert len(asserts) == 1
    softmax = asserts[0].args[0]
    with gm.graph.inserting_after(asserts[0]):  # the same check, but for float64: it would fail, so it stays
        gm.graph.call_function(torch.ops.aten._assert_tensor_metadata.default, (softmax,), {"dtype": torch.float64})
        # a size check is not proven from the recorded value (the batch may be symbolic): stays too
        gm.graph.call_function(torch.ops.aten._assert_tensor_metadata.default, (softmax, [2, 3]), {})
    gm.recompile()
    result = apply_pass(gm, "dead_code")
    left = [n for n in result.graph_module.graph.nodes if "_assert_tensor_metadata" in str(n.target)]
    assert len(left) == 2 and {n.kwargs.get("dtype") for n in left} == {torch.float64, None}
    assert "removed _assert_tensor_metadata" in " ".join(result.log)


class _OptionalMask(nn.Module):
    def forward(self, x, mask=None):
        return x if mask is None else x * mask


def test_keeps_the_guard_on_an_argument_traced_as_none():
    """QA: symbolic_trace fixes ``mask=None`` and guards it with ``_assert_is_none``; dead_code removed the guard
    (and lint called it dead), so the rewritten graph ran a passed mask as if it were None: timm's ViT ignored its
    attn_mask, silently. The guard stays, and the graph refuses the mask as the captured one does."""
    import fxforge

    captured = fxforge.prepare(_OptionalMask().eval(), "2x4", method="symbolic_trace")
    assert not [f for f in fxforge.lint(captured).findings if f.code == "FX001"]
    result = apply_pass(captured.graph_module, "dead_code")
    assert any("_assert_is_none" in str(n.target) for n in result.graph_module.graph.nodes)
    with pytest.raises(AssertionError, match="specialized to have value None"):
        result.graph_module(torch.ones(2, 4), torch.zeros(2, 4))
