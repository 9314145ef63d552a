"""fold_constants: parameter/literal-only subgraphs become one stored buffer (or a literal), bit-identically;
random, written, returned, oversized, meta and input-dependent values are left alone with a reason."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from fxforge.passes import PASS, PassError, apply_pass
from fxforge.pipeline import Pipeline
from fxforge.verify import verify

X = torch.randn(2, 4)


def calls(gm: fx.GraphModule) -> list[str]:
    """What the graph calls, without torch.export's input guard."""
    return [str(n.target) for n in gm.graph.nodes if n.op.startswith("call") and n.target != "_guards_fn"]


def new_buffers(before: fx.GraphModule, after: fx.GraphModule) -> dict[str, torch.Tensor]:
    old = dict(before.named_buffers())
    return {name: value for name, value in after.named_buffers() if name not in old}


class WeightT(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return x @ self.w.t()


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_weight_transpose_folded(capture_as, run_verified, dialect):
    model = WeightT()
    captured = capture_as(model, X, dialect)
    result = run_verified(captured, "fold_constants", rtol=0, atol=0)
    gm = result.graph_module
    assert result.log[0].startswith("folded t (") and "into buffer t_folded (4x4 float32)" in result.log[0]
    assert not any(c.split(".")[-1] == "t" or c.endswith(".t.default") for c in calls(gm))
    folded = gm.t_folded
    assert torch.equal(folded, model.w.t()) and folded.stride() == model.w.t().stride()
    # a view of the weight stays a view: no new memory, and the weight only it read is gone
    assert "w" not in dict(gm.named_parameters()) and not folded.requires_grad
    assert torch.equal(gm(X), captured.graph_module(X))  # bit-identical
    assert "w" in dict(captured.graph_module.named_parameters()) and not hasattr(captured.graph_module, "t_folded")


class Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))
        self.b = nn.Parameter(torch.randn(4))

    def forward(self, x):
        bias = (self.w.t() * 2 + self.b).relu().sum(0)  # five calls on parameters only
        return x * bias + torch.ones(self.w.shape[0])  # the ones(...) call depends only on a shape


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_chain_folded_into_one_buffer(capture_as, run_verified, dialect):
    model = Chain()
    captured = capture_as(model, X, dialect)
    result = run_verified(captured, "fold_constants", rtol=0, atol=0)
    gm = result.graph_module
    added = new_buffers(captured.graph_module, gm)
    assert len(added) == 2, result.log  # the chain, and the ones(...) tensor
    with torch.no_grad():
        expected = (model.w.t() * 2 + model.b).relu().sum(0)
    assert any(torch.equal(value, expected) for value in added.values())
    assert any(torch.equal(value, torch.ones(4)) for value in added.values())
    assert len(calls(gm)) == 2  # x * bias + ones
    assert not dict(gm.named_parameters())  # nothing reads w or b any more
    reads = [n for n in gm.graph.nodes if n.op == "get_attr"]
    assert all(n.meta.get(PASS) == "fold_constants" for n in reads)
    assert all(u.meta.get(PASS) == "fold_constants" for n in reads for u in n.users)


class RandomFromWeights(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(2, 4))

    def forward(self, x):
        return x + torch.rand(self.w.shape) + torch.randn_like(self.w) * self.w


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_random_ops_not_folded(capture_as, dialect):
    captured = capture_as(RandomFromWeights(), X, dialect, check=False)
    result = apply_pass(captured.graph_module, "fold_constants")
    random = [c for c in calls(captured.graph_module) if "rand" in c]
    assert len(random) == 2 and [c for c in calls(result.graph_module) if "rand" in c] == random
    # the shape rand() is given may become a literal (torch dialect); nothing random is evaluated
    assert not new_buffers(captured.graph_module, result.graph_module)
    assert len(result.skipped) == 2 and all("random op" in line for line in result.skipped), result.skipped


class InputDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return x * self.w + x.sum() + torch.ones_like(x)


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_input_dependent_nodes_untouched(capture_as, dialect):
    captured = capture_as(InputDependent(), X, dialect)
    result = apply_pass(captured.graph_module, "fold_constants")
    assert not result.changed and result.skipped == []
    assert result.graph_module.code == captured.graph_module.code


class Expands(nn.Module):
    def __init__(self):
        super().__init__()
        self.b = nn.Parameter(torch.randn(4))

    def forward(self, x):
        return x + self.b.repeat(64, 1).sum(0) + self.b.expand(64, 4)[0]


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_size_cap(capture_as, run_verified, dialect):
    captured = capture_as(Expands(), X, dialect)
    capped = run_verified(captured, "fold_constants", {"max_bytes": 512}, rtol=0, atol=0)
    # repeat makes 64x4 floats (1 KiB): over the cap, so neither it nor the sum after it runs; the
    # expand is a view of b (no new memory) and folds
    assert any("repeat" in line and "max_bytes (0.0 MiB)" in line for line in capped.skipped), capped.skipped
    assert [c for c in calls(capped.graph_module) if "repeat" in c]
    assert not [c for c in calls(capped.graph_module) if "expand" in c]
    default = run_verified(captured, "fold_constants", rtol=0, atol=0)
    assert not [c for c in calls(default.graph_module) if "repeat" in c or "expand" in c] and not default.skipped
    with pytest.raises(PassError, match="max_bytes must be >= 0"):
        apply_pass(captured.graph_module, "fold_constants", {"max_bytes": -1})


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_meta_device_weights_skipped_with_reason(capture_as, dialect):
    model = WeightT().to("meta")
    captured = capture_as(model, torch.randn(2, 4, device="meta"), dialect, check=False)
    result = apply_pass(captured.graph_module, "fold_constants")
    assert not result.changed
    assert result.skipped == [
        "t (" + ("t" if dialect == "torch" else "aten.t.default") + "): depends on w, is on the "
        "meta device (weights not materialised)"
    ]


class WrittenWeight(nn.Module):
    """The graph itself updates a (frozen) parameter: a value computed from it must be recomputed each call."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(4), requires_grad=False)

    def forward(self, x):
        self.w.add_(1)
        return x + self.w * 2


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_value_of_a_written_tensor_not_folded(capture_as, dialect):
    captured = capture_as(WrittenWeight(), X, dialect, check=False)
    result = apply_pass(captured.graph_module, "fold_constants")
    assert not result.changed
    assert "may be written in place" in result.skipped[0]
    gm = result.graph_module
    assert torch.equal(gm(X), X + 2) and torch.equal(gm(X), X + 4)  # still counts up


class SharedStorageBuffers(nn.Module):
    """Two buffers on one memory: the graph writes one, so a value computed from the other changes too."""

    def __init__(self):
        super().__init__()
        table = torch.zeros(2, 4)
        self.register_buffer("table", table)
        self.register_buffer("first_row", table[0])

    def forward(self, x):
        doubled = self.table * 2
        self.first_row.add_(1)
        return x + doubled


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_value_of_a_buffer_sharing_memory_with_a_written_one_not_folded(capture_as, dialect):
    captured = capture_as(SharedStorageBuffers(), X, dialect, check=False)
    result = apply_pass(captured.graph_module, "fold_constants")
    assert not result.changed and "table, may be written in place" in result.skipped[0], result.skipped
    gm = result.graph_module
    assert torch.equal(gm(X)[0], X[0]) and torch.equal(gm(X)[0], X[0] + 2)  # still counts up


class WritesThroughEvalDropout(nn.Module):
    """torch.export records eval-mode dropout as aten.dropout(x, p, False), whose schema promises a new
    tensor although it returns x itself: the add_ writes the constant w * 2."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        scaled = self.w * 2
        F.dropout(scaled, 0.5, training=False).add_(x.sum(0))
        return x + scaled


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_constant_written_through_a_no_op_dropout_not_folded(capture_as, run_verified, dialect):
    captured = capture_as(WritesThroughEvalDropout().eval(), X, dialect)
    result = run_verified(captured, "fold_constants")
    assert not new_buffers(captured.graph_module, result.graph_module), result.log
    gm = result.graph_module
    assert torch.equal(gm(X), gm(X))  # a folded w * 2 would grow by x.sum(0) on every call


class ExpandedConstants(nn.Module):
    """A class token expanded over the batch (ViT, CLIP) and an expanded fresh constant: stride-0 views."""

    def __init__(self):
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, 4))

    def forward(self, x):
        tokens = torch.cat([self.cls.expand(2, -1, -1), x.unsqueeze(1)], 1)
        # arange of a traced size: symbolic_trace would store a literal torch.arange(4.0) as a tensor constant
        return tokens.sum(1) + torch.arange(self.cls.shape[-1], dtype=torch.float32).expand(2, -1)


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_expanded_constants_stay_views_in_the_graph(capture_as, run_verified, dialect):
    captured = capture_as(ExpandedConstants(), X, dialect)
    result = run_verified(captured, "fold_constants", rtol=0, atol=0)
    gm = result.graph_module
    # stored, a stride-0 tensor breaks every write into it: load_state_dict, the buffer restore after a check run
    assert [s.split(" (")[0] for s in result.skipped] == ["expand", "expand_1"], result.skipped
    assert all("kept as a view" in line for line in result.skipped)
    assert len([c for c in calls(gm) if "expand" in c]) == 2
    (folded,) = new_buffers(captured.graph_module, gm).values()  # the arange, which the expand now reads
    assert torch.equal(folded, torch.arange(4.0)) and folded.stride() == (1,)
    gm.load_state_dict(gm.state_dict())
    assert torch.equal(gm(X), captured.graph_module(X))


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.steps = nn.Parameter(torch.zeros(()), requires_grad=False)

    def forward(self, x):
        self.steps.add_(1)
        return x


class ReadsModuleState(nn.Module):
    def __init__(self):
        super().__init__()
        self.counter = Counter()

    def forward(self, x):
        return self.counter(x) * self.counter.steps.exp()


def test_tensor_of_a_stateful_leaf_module_not_folded(capture_as):
    captured = capture_as(ReadsModuleState(), X, "torch", leaf_modules=[Counter], check=False)
    result = apply_pass(captured.graph_module, "fold_constants")
    assert not result.changed
    assert result.skipped == [
        "exp (exp): depends on counter_steps, belongs to counter, which may update it "
        "(module Counter is not on fxforge's list of pure modules)"
    ]


class TrainingBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.bn(x) + self.bn.running_mean * 2


def test_running_statistics_in_training_not_folded(capture_as):
    # aten.batch_norm(training=True) updates running_mean though its schema does not say so
    captured = capture_as(TrainingBatchNorm().train(), X, "aten", check=False)
    result = apply_pass(captured.graph_module, "fold_constants")
    assert not result.changed and "bn_running_mean, may be written in place" in result.skipped[0]


class ReturnsConstants(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))

    def forward(self, x):
        return x + 1, self.w * 2, self.w.t()


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_fresh_returned_value_not_folded(capture_as, run_verified, dialect):
    captured = capture_as(ReturnsConstants(), X, dialect)
    result = run_verified(captured, "fold_constants")
    # a stored buffer returned to the caller could be changed by them; a view of w already is w's storage
    assert [line.split(" (")[0] for line in result.log[:1]] == ["folded t"]
    assert result.skipped[0].startswith("mul (") and "returns this fresh value" in result.skipped[0]
    first, second = result.graph_module(X)[1], result.graph_module(X)[1]
    assert first is not second


class ShapeAndIdentity(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 2))

    def forward(self, x):
        return x.reshape(self.w.shape[0], -1) + self.w.contiguous()


def test_literals_and_calls_returning_a_stored_tensor(capture_as, run_verified):
    captured = capture_as(ShapeAndIdentity(), torch.randn(8), "torch")
    result = run_verified(captured, "fold_constants", rtol=0, atol=0)
    assert "replaced getitem (operator.getitem) by the literal 4" in result.log
    assert "replaced contiguous (contiguous) by a read of w, the stored tensor it returns" in result.log
    reshape = next(n for n in result.graph_module.graph.nodes if n.target == "reshape")
    assert reshape.args[1:] == (4, -1)


def test_parameter_reads_alone_are_already_folded(capture_as):
    captured = capture_as(InputDependent(), X, "torch")
    result = apply_pass(captured.graph_module, "fold_constants")
    assert not result.changed and not new_buffers(captured.graph_module, result.graph_module)


def test_nothing_after_a_mode_switch():
    root = nn.Module()
    root.w = nn.Parameter(torch.randn(4))
    graph = fx.Graph()
    x = graph.placeholder("x")
    w = graph.get_attr("w")
    early = graph.call_function(torch.exp, (w,))
    graph.call_function(torch._C._set_grad_enabled, (True,))
    late = graph.call_function(torch.sin, (w,))
    graph.output(graph.call_function(torch.add, (graph.call_function(torch.add, (x, early)), late)))
    result = apply_pass(fx.GraphModule(root, graph), "fold_constants")
    assert [line.split(" (")[0] for line in result.log[:1]] == ["folded exp"]
    assert any(n.target is torch.sin for n in result.graph_module.graph.nodes)
    assert "nothing after _set_grad_enabled" in result.skipped[0]


@pytest.mark.slow
def test_swin_t_aten_relative_position_bias_in_a_verified_pipeline(capture_as):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    captured = capture_as(torchvision.models.swin_t().eval(), torch.randn(1, 3, 64, 64), "aten")
    before = captured.graph_module.code
    result = Pipeline(["cse", "fold_constants", "dead_code"], lint_between=False).run(captured)
    fold = result.steps[1].result
    # each block's bias table[index] -> view -> permute -> contiguous -> unsqueeze became one buffer
    assert sum("unsqueeze" in line and line.startswith("folded") for line in fold.log) == 12
    assert not [n for n in result.graph_module.graph.nodes if "relative_position_index" in str(n.target)]
    assert captured.graph_module.code == before
    check = verify(captured, result.graph_module, rtol=0, atol=0, seeds=(3,))  # bit-identical
    assert check.ok, check.problems


def test_torchvision_resnet18_unchanged_in_a_pipeline(resnet18):
    from fxforge.capture import capture

    captured = capture(resnet18, (torch.randn(1, 3, 64, 64),))
    result = Pipeline(["fold_bn", "cse", "fold_constants", "dead_code"], verify_each=True, lint_between=False).run(
        captured
    )
    assert result.ok and not result.steps[2].result.changed
