"""cse: duplicates merged in one sweep; random, effectful, written, returned-twice and opaque calls kept apart."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tests.conftest import randomize_batchnorm
from torch import fx, nn

from fxforge.capture import capture
from fxforge.lint import lint
from fxforge.passes import PASS, apply_pass
from fxforge.passes.cse import call_key

X = torch.randn(2, 4)


def calls(gm: fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op.startswith("call")]


def count(gm: fx.GraphModule, name: str) -> int:
    return sum(1 for n in gm.graph.nodes if n.op.startswith("call") and name in str(n.target))


class Repeated(nn.Module):
    def forward(self, x):
        a = x.sin().cos()
        b = x.sin().cos()  # the whole chain repeats
        c = torch.clamp(x, min=0.0, max=1.0)
        d = torch.clamp(x, max=1.0, min=0.0)  # same kwargs, other order
        return a + b + c + d


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_duplicate_chain_merged_in_one_sweep(capture_as, run_verified, dialect):
    captured = capture_as(Repeated(), X, dialect)
    assert len(lint(captured, select=["FX007"]).findings) == 3
    before = len(captured.graph_module.graph.nodes)
    result = run_verified(captured, "cse")
    gm = result.graph_module
    assert result.removed == 3 and len(gm.graph.nodes) == before - 3
    assert count(gm, "sin") == 1 and count(gm, "cos") == 1 and count(gm, "clamp") == 1
    assert result.log[0].startswith("merged sin_1 into sin") and len(result.log) == 3
    assert lint(gm, select=["FX007"]).findings == []  # the rule proposes exactly what the pass merges
    # the readers of the removed nodes are what changed: verify would blame cse if they diverged
    assert {n.name for n in gm.graph.nodes if n.meta.get(PASS) == "cse"} == {"add", "add_2"}
    assert len(captured.graph_module.graph.nodes) == before  # input graph untouched


class LooksRepeated(nn.Module):
    def forward(self, x):
        noise = torch.rand_like(x) + torch.rand_like(x)  # random: two different values
        sums = torch.sum(x, dim=0) + torch.sum(x, dim=1).sum()  # other kwargs
        y = x * 2 + x * 2.0  # 2 and 2.0 differ for integer tensors
        z = (x + 0.0) * (x + -0.0)  # 0.0 and -0.0 are equal in Python, not in bits
        return noise, sums, y, z


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_random_ops_and_different_arguments_not_merged(capture_as, dialect):
    captured = capture_as(LooksRepeated(), X, dialect, check=False)
    result = apply_pass(captured.graph_module, "cse")
    assert result.removed == 0 and not result.changed
    assert count(result.graph_module, "rand_like") == 2
    assert any("rand_like" in s and "random op" in s for s in result.skipped), result.skipped


class TrainingDropoutTwice(nn.Module):
    def forward(self, x):
        return F.dropout(x, 0.5, self.training) + F.dropout(x, 0.5, self.training)


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_dropout_in_training_not_merged(capture_as, dialect):
    captured = capture_as(TrainingDropoutTwice().train(), X, dialect, check=False)
    result = apply_pass(captured.graph_module, "cse")
    assert result.removed == 0
    assert sum(1 for n in result.graph_module.graph.nodes if "dropout" in str(n.target)) == 2


class InPlace(nn.Module):
    def forward(self, x):
        y = x.clone()
        y.add_(1)
        y.add_(1)  # the same in-place call twice: both must run
        a = x * 2
        b = x * 2
        b.mul_(3)  # b is written later: a must keep its own value
        z = x.clone()
        before = z.sin()
        z.add_(1)
        after = z.sin()  # same call on an input written in between
        return y + a + b + before + after


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_in_place_ops_and_written_values_not_merged(capture_as, run_verified, dialect):
    captured = capture_as(InPlace(), X, dialect)
    result = run_verified(captured, "cse")
    gm = result.graph_module
    assert result.removed == 0
    assert count(gm, "add_") == 3 and count(gm, "sin") == 2
    assert sum(1 for n in gm.graph.nodes if n.op.startswith("call") and "mul" in str(n.target)) == 3
    reasons = " | ".join(result.skipped)
    assert "in-place op may write into its value" in reasons
    if dialect == "torch":  # torch.export makes later reads of z read the add_ node: no longer the same call
        assert "one of its inputs between the two calls" in reasons


class WrittenThroughEvalDropout(nn.Module):
    def forward(self, x):
        a = x.relu()
        b = x.relu()
        # torch.export records aten.dropout(a, 0.5, False): its schema promises a new tensor, but it returns a
        F.dropout(a, 0.5, training=False).add_(1)
        return a + b


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_value_written_through_a_no_op_dropout_not_merged(capture_as, run_verified, dialect):
    captured = capture_as(WrittenThroughEvalDropout().eval(), X, dialect)
    result = run_verified(captured, "cse")
    assert result.removed == 0 and count(result.graph_module, "relu") == 2
    assert "may write into the value of relu after it is computed" in result.skipped[0], result.skipped


class ReturnedTwice(nn.Module):
    def forward(self, x):
        return x.sin(), x.sin()


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_two_returned_values_stay_two_tensors(capture_as, dialect):
    captured = capture_as(ReturnedTwice(), X, dialect)
    result = apply_pass(captured.graph_module, "cse")
    assert result.removed == 0 and "returned" in result.skipped[0]
    first, second = result.graph_module(X)
    assert first is not second and torch.equal(first, second)


class Counter(nn.Module):
    """A user module with state: each call changes what it returns."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return x + self.calls


class ModulesTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = nn.GELU()
        self.fc = nn.Linear(4, 4)
        self.counter = Counter()
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        pure = self.fc(self.act(x)) + self.fc(self.act(x))
        shifted = x * 1.5  # the counter may write into what it is given: not into x, then
        stateful = self.counter(shifted) + self.counter(shifted)
        stats = self.bn(x) + self.bn(x)  # training mode: each call updates the running statistics
        return pure + stateful + stats


def test_modules_called_twice_pure_merged_stateful_kept(capture_as):
    model = ModulesTwice().train()
    captured = capture_as(model, X, "torch", leaf_modules=[Counter], check=False)
    gm = captured.graph_module
    assert [n.target for n in gm.graph.nodes if n.op == "call_module"].count("counter") == 2
    result = apply_pass(gm, "cse")
    modules = [n.target for n in result.graph_module.graph.nodes if n.op == "call_module"]
    assert modules.count("act") == 1 and modules.count("fc") == 1  # stateless and pure: merged
    assert modules.count("counter") == 2 and modules.count("bn") == 2
    reasons = " | ".join(result.skipped)
    assert "Counter is not on fxforge's list of pure modules" in reasons
    assert "BatchNorm1d in training mode updates its running statistics" in reasons
    # the merged graph behaves like the original, state updates included
    reference, candidate = ModulesTwice().train(), ModulesTwice().train()
    candidate.load_state_dict(reference.state_dict())
    graph_copy = apply_pass(capture(candidate, (X,), leaf_modules=[Counter], check=False).graph_module, "cse")
    for _ in range(2):
        torch.testing.assert_close(graph_copy.graph_module(X), reference(X), rtol=0, atol=0)
    assert torch.equal(graph_copy.graph_module.counter.calls, reference.counter.calls)


def test_batchnorm_in_eval_is_pure(capture_as, run_verified):
    model = randomize_batchnorm(ModulesTwice().eval())
    result = run_verified(capture_as(model, X, "torch", leaf_modules=[Counter]), "cse")
    modules = [n.target for n in result.graph_module.graph.nodes if n.op == "call_module"]
    assert modules.count("bn") == 1 and modules.count("counter") == 2


@torch.fx.wrap
def opaque_helper(x):
    return x * 2


class OpaqueTwice(nn.Module):
    def forward(self, x):
        return opaque_helper(x) + opaque_helper(x)


def test_functions_it_cannot_see_into_not_merged(capture_as):
    result = apply_pass(capture_as(OpaqueTwice(), X, "torch").graph_module, "cse")
    assert result.removed == 0 and "cannot see into" in result.skipped[0]


def test_no_merge_across_a_grad_mode_switch():
    graph = fx.Graph()
    x = graph.placeholder("x")
    before = graph.call_function(torch.sin, (x,))
    graph.call_function(torch._C._set_grad_enabled, (False,))
    after = graph.call_function(torch.sin, (x,))
    graph.call_function(torch._C._set_grad_enabled, (True,))
    graph.output((before, after))
    result = apply_pass(fx.GraphModule(nn.Module(), graph), "cse")
    assert result.removed == 0 and calls(result.graph_module).count("<built-in method sin of type object") == 0
    assert sum(1 for n in result.graph_module.graph.nodes if n.target is torch.sin) == 2


def test_keys_compare_literals_by_type_and_bits():
    graph = fx.Graph()
    x = graph.placeholder("x")
    nan = float("nan")
    nodes = [
        graph.call_function(torch.mul, (x, 2)),
        graph.call_function(torch.mul, (x, 2.0)),
        graph.call_function(torch.mul, (x, True)),
        graph.call_function(torch.add, (x, 0.0)),
        graph.call_function(torch.add, (x, -0.0)),
        graph.call_function(torch.mul, (x, nan)),
        graph.call_function(torch.mul, (x, float("nan"))),
        graph.call_function(torch.sum, (x,), {"dim": [0, 1]}),
        graph.call_function(torch.sum, (x,), {"dim": (0, 1)}),
        graph.call_function(torch.reshape, (x, torch.Size([8]))),
        graph.call_function(torch.reshape, (x, torch.Size([8]))),
        graph.call_function(torch.Tensor.__getitem__, (x, (slice(None, 1), Ellipsis))),
        graph.call_function(torch.Tensor.__getitem__, (x, (slice(None, 1), Ellipsis))),
        graph.call_function(torch.add, (x, torch.ones(1))),  # a constant tensor has no cheap equality
    ]
    keys = [call_key(n) for n in nodes]
    assert len({keys[0], keys[1], keys[2]}) == 3
    assert keys[3] != keys[4]
    assert keys[5] == keys[6]  # NaN is equal to itself here: same bits, same call
    assert keys[7] != keys[8]
    assert keys[9] == keys[10] and keys[11] == keys[12]
    assert keys[13] is None


class TwoHeads(nn.Module):
    """A real torchvision backbone feeding two heads that both pool and flatten the same features."""

    def __init__(self):
        super().__init__()
        torchvision = pytest.importorskip("torchvision")
        torch.manual_seed(0)
        resnet = randomize_batchnorm(torchvision.models.resnet18().eval())
        self.body = nn.Sequential(*list(resnet.children())[:-2])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classes = nn.Linear(512, 10)
        self.boxes = nn.Linear(512, 4)

    def forward(self, x):
        features = self.body(x)
        return self.classes(torch.flatten(self.pool(features), 1)), self.boxes(torch.flatten(self.pool(features), 1))


def test_torchvision_backbone_with_two_heads(capture_as, run_verified):
    captured = capture_as(TwoHeads().eval(), torch.randn(1, 3, 64, 64), "torch")
    result = run_verified(captured, "cse")
    assert [line.split(" (")[0] for line in result.log] == ["merged pool_1 into pool", "merged flatten_1 into flatten"]
    # resnet's ReLUs are in place: those calls and the values they write are never candidates
    assert count(result.graph_module, "relu") == count(captured.graph_module, "relu")


def test_swin_t_aten_duplicates(capture_as, run_verified):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    captured = capture_as(torchvision.models.swin_t().eval(), torch.randn(1, 3, 64, 64), "aten")
    result = run_verified(captured, "cse")
    assert result.removed >= 4 and all(line.startswith("merged slice_") for line in result.log)
    # the attention-mask slices are written in place (mask[h, w] = i): refused, with that reason
    assert result.skipped and all("in-place op" in line for line in result.skipped)
    assert lint(result.graph_module, select=["FX007"]).findings == []


def test_dynamic_batch_sym_sizes_merged(capture_as, run_verified):
    class Sizes(nn.Module):
        def forward(self, x):
            return x.reshape(x.size(0), -1) * x.size(0) + x.view(x.size(0), -1)

    captured = capture_as(Sizes(), torch.randn(3, 4, 2), "aten", check_batch=5)
    sizes = [n for n in captured.graph_module.graph.nodes if "sym_size" in str(n.target)]
    result = run_verified(captured, "cse")
    left = [n for n in result.graph_module.graph.nodes if "sym_size" in str(n.target)]
    assert len(left) <= 1 <= len(sizes)
    assert result.graph_module(torch.randn(5, 4, 2)).shape == (5, 8)


class EmbeddingWithMaxNormTwice(nn.Module):
    """F.embedding with max_norm renormalises the looked-up rows of its weight in place: not a pure lookup."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(10, 4))

    def forward(self, idx):
        return F.embedding(idx, self.weight, max_norm=1.0) + F.embedding(idx, self.weight, max_norm=1.0)


@pytest.mark.parametrize("dialect", ["torch", "aten"])
def test_embedding_with_max_norm_not_merged(capture_as, dialect):
    captured = capture_as(EmbeddingWithMaxNormTwice(), torch.tensor([1, 2, 3]), dialect)
    result = apply_pass(captured.graph_module, "cse")
    assert result.removed == 0
    assert count(result.graph_module, "embedding") == (2 if dialect == "torch" else 4)  # aten: 2 renorm_ + 2 lookups
    if dialect == "torch":
        assert any("writes its input in place" in s for s in result.skipped), result.skipped


class RankAroundAReshapingWrite(nn.Module):
    def forward(self, x):
        y = x.clone()
        a = y.dim()
        y.unsqueeze_(0)  # an in-place op that changes the rank: the two reads differ
        return y * a + y.dim()


def test_reads_of_a_tensors_rank_stay_apart_across_an_in_place_write():
    """A version of cse merged such reads ("a Python number: no in-place op writes into it") and optimize wrote a
    model off by one, exit 0: in-place ops can change a tensor's shape (unsqueeze_, t_, resize_)."""
    x = torch.randn(1, 3)
    captured = capture(RankAroundAReshapingWrite(), (x,), method="symbolic_trace")
    result = apply_pass(captured.graph_module, "cse")
    assert not result.changed and "in-place op" in result.skipped[0]
    assert torch.equal(result.graph_module(x.clone()), RankAroundAReshapingWrite()(x.clone()))
