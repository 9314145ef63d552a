"""merge_parallel_linears: linears reading one input become one wider linear, split back; unsafe uses are refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fxforge.capture import capture
from fxforge.graphs import node_kind
from fxforge.lint import lint
from fxforge.passes import ORIGIN, PASS, apply_pass, exact_passes
from fxforge.pipeline import Pipeline
from fxforge.verify import verify

NAME = "merge_parallel_linears"
METHODS = {"torch": "symbolic_trace", "aten": "export"}


class Attention(nn.Module):
    """Query, key and value (value narrower) and a skip projection, all reading ``x``."""

    def __init__(self, bias: bool = True) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(16, 16, bias=bias), nn.Linear(16, 16, bias=bias)
        self.v, self.skip = nn.Linear(16, 8, bias=bias), nn.Linear(16, 4, bias=bias)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q(x).view(b, n, 4, 4).transpose(1, 2)
        k = self.k(x).view(b, n, 4, 4).transpose(1, 2)
        scores = torch.softmax(q @ k.transpose(-1, -2), dim=-1).mean(1)
        return (scores @ self.v(x)).sum(-1, keepdim=True) + self.skip(x)


def linears(gm) -> list:
    return [n for n in gm.graph.nodes if node_kind(gm, n) == "linear"]


def captured(model: nn.Module, dialect: str, shape=(2, 5, 16)):
    torch.manual_seed(0)
    return capture(model.eval(), (torch.randn(*shape),), method=METHODS[dialect])


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dialect", METHODS)
def test_query_key_value_and_skip_become_one_linear(dialect, bias):
    torch.manual_seed(0)
    cap = captured(Attention(bias), dialect)
    before = cap.graph_module.code
    result = apply_pass(cap.graph_module, NAME)
    assert cap.graph_module.code == before  # the captured graph is untouched
    # four linears, each replaced by a slice of the wide one; the wide linear and its split inserted
    assert result.changed and (result.replaced, result.inserted, result.removed) == (4, 2, 0), result.log
    (merged,) = linears(result.graph_module)
    assert merged.meta[PASS] == NAME
    if dialect == "torch":
        module = result.graph_module.get_submodule(str(merged.target))
        assert str(merged.target) == "q_k_v_skip" and module.out_features == 44
        assert not hasattr(result.graph_module, "q")  # the old modules are gone with their last use
    # each slice stands for the linear it replaced, so verify can name it
    origins = {n.meta.get(ORIGIN) for n in result.graph_module.graph.nodes if n.meta.get(PASS) == NAME}
    assert {n.name for n in linears(cap.graph_module)} <= origins
    check = verify(cap, result.graph_module)
    assert check.ok and check.max_abs_err < 1e-5, check


class Uses(nn.Module):
    """Two linears on ``x``; ``how`` says what happens to the first one's result."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 6)

    def forward(self, x):
        a, b = self.a(x), self.b(x) * 2
        if self.how == "returned":
            return a, b
        if self.how == "returned_view":
            return a.transpose(0, 1), b
        if self.how == "flattened_view":  # merges the sliced last dimension with another: needs the old strides
            return a.view(-1).sum() + b
        if self.how == "view_after_transpose":
            return a.transpose(0, 1).view(6, -1).sum() + b
        if self.how == "written":
            a.add_(1)
            return a * b
        raise AssertionError(self.how)


@pytest.mark.parametrize("dialect", METHODS)
@pytest.mark.parametrize(
    "how, reason",
    [
        ("returned", " is returned (its strides"),
        ("returned_view", "a view of"),
        ("flattened_view", "may depend on the layout"),
        ("view_after_transpose", "may depend on the layout"),
        ("written", "in place"),
    ],
)
def test_results_whose_strides_matter_keep_their_linear(dialect, how, reason):
    if dialect == "aten" and how == "written":
        pytest.skip("torch.export functionalizes the in-place add")
    cap = captured(Uses(how), dialect, shape=(3, 6))
    result = apply_pass(cap.graph_module, NAME)
    assert not result.changed
    assert any(reason in line for line in result.skipped), result.skipped


@pytest.mark.parametrize("dialect", METHODS)
def test_a_view_that_only_splits_the_last_dimension_is_allowed(dialect):
    class Heads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            return self.a(x).view(3, 2, 4).sum(-1) + self.b(x).reshape(6, 4).sum()

    cap = captured(Heads(), dialect, shape=(3, 8))
    result = apply_pass(cap.graph_module, NAME)
    assert result.changed and len(linears(result.graph_module)) == 1
    assert verify(cap, result.graph_module).ok


def test_a_module_called_twice_is_not_merged():
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 6)

        def forward(self, x):
            return self.a(x) + self.b(x) + self.a(x * 2)

    result = apply_pass(captured(Shared(), "torch", shape=(3, 6)).graph_module, NAME)
    assert not result.changed
    assert any("also used elsewhere" in line for line in result.skipped), result.skipped


def test_linears_of_different_dtypes_or_bias_stay_apart():
    class Mixed(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 6, bias=False)

        def forward(self, x):
            return self.a(x) + self.b(x)

    assert not apply_pass(captured(Mixed(), "torch", shape=(3, 6)).graph_module, NAME).changed


SMALL = {"num_hidden_layers": 2, "num_attention_heads": 2, "hidden_size": 32, "intermediate_size": 64}


def _eager(config):
    config._attn_implementation = "eager"
    config.use_cache = False
    return config


REAL = {
    # query, key, value per layer
    "bert": (lambda t: t.BertModel(_eager(t.BertConfig(**SMALL, vocab_size=100))), "ids", 2),
    "vit": (lambda t: t.ViTModel(_eager(t.ViTConfig(**SMALL, image_size=32, patch_size=8))), "pixels", 2),
    # q/k/v without bias and the MLP's gate and up projections, per layer
    "llama": (
        lambda t: t.LlamaModel(_eager(t.LlamaConfig(**SMALL, num_key_value_heads=1, vocab_size=100))),
        "ids",
        4,
    ),
    # GPT-2 already computes q, k and v as one Conv1D: nothing to merge
    "gpt2": (lambda t: t.GPT2Model(_eager(t.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100))), "ids", 0),
}


@pytest.mark.parametrize("family", REAL)
def test_transformers_attention_projections_merge_and_verify(family):
    transformers = pytest.importorskip("transformers")
    build, kind, groups = REAL[family]
    torch.manual_seed(0)
    generator = torch.Generator().manual_seed(0)
    example = (
        torch.randint(0, 100, (2, 16), generator=generator)
        if kind == "ids"
        else torch.randn(2, 3, 32, 32, generator=generator)
    )
    cap = capture(build(transformers).eval(), (example,), method="export")
    # lint rule FX014 reports the groups the pass merges (before the exact passes too: none of them touch a linear)
    assert len(lint(cap, select=["FX014"]).findings) == groups
    result = Pipeline([*exact_passes(), NAME], verify_each=True, lint_between=False).run(cap)
    assert result.ok, (result.failed_pass, result.verification)
    merged = next(step.result for step in result.steps if step.result.name == NAME)
    assert len(merged.log) == groups, (merged.log, merged.skipped)
    assert len(linears(result.graph_module)) == len(linears(cap.graph_module)) - merged.replaced + len(merged.log)


def test_the_wide_linear_goes_before_the_earliest_even_when_uses_are_listed_out_of_order():
    # a pass that rewires uses (cse, replace_all_uses_with) leaves node.users in the order uses were added, not
    # graph order; the merged linear must still come before every result's first reader
    cap = captured(Attention(), "torch")
    gm = cap.graph_module
    (source,) = [n for n in gm.graph.nodes if n.op == "placeholder"]
    source.users = dict(reversed(list(source.users.items())))
    result = apply_pass(gm, NAME)  # lints the graph: a slice read before it is computed fails here
    assert result.changed and len(linears(result.graph_module)) == 1
    assert verify(cap, result.graph_module).ok


@pytest.mark.parametrize("dialect", METHODS)
def test_a_group_reading_the_result_of_another_group(dialect):
    # q and k read x; a and b read q: merging q and k first replaces q by a slice, which a and b must then read
    class Chained(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k = nn.Linear(6, 6), nn.Linear(6, 6)
            self.a, self.b = nn.Linear(6, 3), nn.Linear(6, 3)

        def forward(self, x):
            q = self.q(x)
            return (self.a(q) * self.b(q)).sum(-1) + self.k(x).sum(-1)

    model = Chained()
    cap = captured(model, dialect, shape=(4, 6))
    result = apply_pass(cap.graph_module, NAME)
    assert len(result.log) == 2 and len(linears(result.graph_module)) == 2, result.log
    assert verify(cap, result.graph_module).ok
    assert not hasattr(model, "q_k") and not hasattr(model, "a_b")  # the user's model is not touched


def test_linears_with_tied_weights_are_not_merged():
    """QA: q and k sharing one weight (``k.weight = q.weight``) were merged into one wide linear, untying them."""

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k = nn.Linear(6, 6), nn.Linear(6, 6)
            self.k.weight = self.q.weight

        def forward(self, x):
            return self.q(x) * self.k(x)

    captured = capture(Tied().eval(), (torch.randn(2, 6),))
    result = apply_pass(captured.graph_module, "merge_parallel_linears")
    assert not result.changed and any("weights are tied" in line for line in result.skipped)
