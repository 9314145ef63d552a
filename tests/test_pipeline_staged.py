"""Staged verification (docs/verified.md): each pass quick-checked as it runs, the final graph on every case, a
final failure traced to the pass that caused it; reference outputs computed once per model and case."""

from __future__ import annotations

import operator
import sys
from collections import Counter

import pytest
import torch
from torch import fx, nn

import fxforge
import fxforge.verify
from fxforge.passes import PASSES, PassResult, mark, register_pass
from fxforge.pipeline import QUICK_CASES, Pipeline
from fxforge.verify import DEFAULT_CASES, Verifier

X = (torch.randn(1, 3, 16, 16),)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.5)
        self.conv2 = nn.Conv2d(8, 4, 1)
        self.bn2 = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn2(self.conv2(self.drop(torch.relu(self.bn(self.conv(x))))))


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = Net().eval()
    for bn in (model.bn, model.bn2):
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    return model


@pytest.fixture
def batch_bug():
    """A pass that is exact at batch 1 and wrong at any other batch size (adds batch - 1 to the output): the quick
    check on the first case (the example's batch) cannot see it, the final check must, and must name the pass."""

    @register_pass("test_batch_bug", summary="test only", guarantees="none")
    def batch_bug(gm: fx.GraphModule, options) -> PassResult:
        result = PassResult("test_batch_bug", gm)
        out = next(n for n in gm.graph.nodes if n.op == "output")
        value = out.args[0]
        with gm.graph.inserting_before(out):
            size = gm.graph.call_method("size", (value, 0))
            extra = gm.graph.call_function(operator.sub, (size, 1))
            wrong = gm.graph.call_function(operator.add, (value, extra))
        out.args = (wrong,)
        for node in (size, extra):
            mark(node, "test_batch_bug")
        mark(wrong, "test_batch_bug", origin_of=value)
        gm.recompile()
        result.note("added batch - 1", inserted=3)
        return result

    try:
        yield "test_batch_bug"
    finally:
        PASSES.pop("test_batch_bug")


@pytest.fixture
def runs(monkeypatch):
    """Every model run the verifier makes, as (what ran, batch size)."""
    counted: Counter = Counter()
    real = sys.modules["fxforge.verify"].run_isolated

    def counting(module, args, kwargs, *others):
        kind = "graph" if isinstance(module, fx.GraphModule) else "model"
        counted[kind, args[0].shape[0]] += 1
        return real(module, args, kwargs, *others)

    monkeypatch.setattr(sys.modules["fxforge.verify"], "run_isolated", counting)
    return counted


def test_model_runs_per_pipeline(runs):
    captured = fxforge.capture(_model(), X)
    result = Pipeline(["remove_dropout", "fold_bn"], verify_each=True, lint_between=False).run(captured)
    assert result.ok and [s.result.changed for s in result.steps] == [True, True]
    assert all(s.verification.trials == len(QUICK_CASES) for s in result.steps)
    assert result.verification.trials == DEFAULT_CASES and result.verification.batch_sizes == [1, 2]
    half = DEFAULT_CASES // 2
    # The model: every case once (its batch-2 probe is the first batch-2 case), and the first case again (determinism).
    assert runs["model", 1] == half + 1 and runs["model", 2] == half
    # The graphs: the captured graph's batch-2 probe, each changed pass on the quick case, the final graph on all.
    assert runs["graph", 2] == 1 + half and runs["graph", 1] == 2 * len(QUICK_CASES) + half
    assert sum(runs.values()) == 2 * DEFAULT_CASES + 2 + 2 * len(QUICK_CASES)


def test_a_second_verification_of_the_same_model_reuses_its_outputs(runs):
    model = _model()
    captured = fxforge.capture(model, X)
    Verifier(captured)
    runs.clear()
    # A static export is verified at the example's batch only: its first half of cases are the batch-1 cases above.
    again = Verifier(captured, batch_sizes=[None])
    assert len(again.cases) == DEFAULT_CASES and {c.batch for c in again.cases} == {1}
    assert runs["model", 1] == DEFAULT_CASES // 2 + 1  # the new cases, and the determinism run
    runs.clear()
    with torch.no_grad():
        model.conv.weight.mul_(2)  # the model changed: nothing kept from before may be used
    Verifier(captured)
    assert runs["model", 1] + runs["model", 2] == DEFAULT_CASES + 1
    runs.clear()
    model.drop.p = 0.25  # a plain attribute counts too
    Verifier(captured)
    assert runs["model", 1] + runs["model", 2] == DEFAULT_CASES + 1


def test_a_pass_wrong_only_past_the_quick_case_is_named_and_rolled_back(batch_bug):
    captured = fxforge.capture(_model(), X)
    names = ["remove_dropout", batch_bug, "fold_bn"]
    result = Pipeline(names, verify_each=True, keep_going=True).run(captured)
    assert result.ok and result.failed_pass is None
    (bad,) = result.rolled_back
    assert bad.result.name == batch_bug and "batch 2" in " ".join(bad.verification.problems)
    assert bad.verification.divergence is not None and bad.verification.divergence.pass_name == batch_bug
    # The passes after it ran again on the graph without it, and the graph handed back is verified on every case.
    assert [s.result.name for s in result.steps] == names and result.steps[2].result.changed
    assert result.verification.ok and result.verification.trials == DEFAULT_CASES
    assert fxforge.verify(captured, result.graph_module).ok


def test_fail_fast_names_the_pass_the_final_check_blames(batch_bug):
    captured = fxforge.capture(_model(), X)
    result = Pipeline(["remove_dropout", batch_bug, "fold_bn"], verify_each=True).run(captured)
    assert not result.ok and result.failed_pass == batch_bug
    assert [s.result.name for s in result.steps] == ["remove_dropout", batch_bug]
    assert not result.verification.ok and result.verification.divergence.pass_name == batch_bug


def test_a_pass_wrong_on_the_quick_case_is_caught_as_it_runs():
    @register_pass("test_negate", summary="test only", guarantees="none")
    def negate(gm: fx.GraphModule, options) -> PassResult:
        result = PassResult("test_negate", gm)
        out = next(n for n in gm.graph.nodes if n.op == "output")
        value = out.args[0]
        with gm.graph.inserting_before(out):
            wrong = gm.graph.call_function(torch.neg, (value,))
        out.args = (wrong,)
        mark(wrong, "test_negate", origin_of=value)
        gm.recompile()
        result.note("negated", inserted=1)
        return result

    try:
        captured = fxforge.capture(_model(), X)
        result = Pipeline(["test_negate", "fold_bn"], verify_each=True, keep_going=True).run(captured)
    finally:
        PASSES.pop("test_negate")
    (bad,) = result.rolled_back
    assert bad.result.name == "test_negate" and bad.verification.trials == len(QUICK_CASES)
    assert bad.verification.divergence.pass_name == "test_negate"
    assert result.ok and result.verification.trials == DEFAULT_CASES


def test_an_option_value_the_pass_refuses_stops_the_run_before_any_work_even_under_keep_going():
    """QA: insert_after's epsilon: -1 was refused only while the pass ran, so keep_going rolled it back and the run
    said "verified", exit 0, having inserted nothing."""
    from fxforge.passes import PassError

    captured = fxforge.capture(_model(), X)
    options = {"select": "type:ReLU", "insert": "noise", "epsilon": -1, "delta": 1e-5, "sensitivity": 1.0}
    pipeline = Pipeline(["fold_bn", ("insert_after", options)], verify_each=True, keep_going=True)
    with pytest.raises(PassError, match="epsilon"):
        pipeline.run(captured)
