"""Modules that run hooks (a forward hook, a forward pre-hook: pruning's mask, the old weight_norm and
spectral_norm) compute more than their type says: every pass leaves them as they are. QA: fold_bn,
merge_convs, merge_parallel_linears and remove_redundant_activation dropped such hooks and wrote a model
0.07-0.35 off; fold_bn crashed on a pruned conv, and the TorchScript export of one was an internal error."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

from fxforge.capture import capture
from fxforge.lint import lint
from fxforge.passes import apply_pass
from fxforge.verify import verify
from model_helpers import ConvBnHead


class TwoLinears(nn.Module):
    def __init__(self, parallel: bool) -> None:
        super().__init__()
        self.parallel, self.a, self.b = parallel, nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.a(x) * self.b(x) if self.parallel else self.b(self.a(x))


class TwoRelus(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.r1, self.r2, self.l = nn.ReLU(), nn.ReLU(), nn.Linear(8, 8)

    def forward(self, x):
        return self.l(self.r2(self.r1(x)))


def _hooked(model: nn.Module, name: str) -> nn.Module:
    model.get_submodule(name).register_forward_hook(lambda module, args, out: out * 3 - 0.5)
    return model.eval()


def _pruned() -> nn.Module:
    model = ConvBnHead().eval()
    prune.l1_unstructured(model.conv, "weight", 0.5)
    return model


CASES = {
    "fold_bn, hook on the batch norm": (lambda: _hooked(ConvBnHead(), "bn"), "fold_bn", (2, 3, 8, 8)),
    "fold_bn, hook on the conv": (lambda: _hooked(ConvBnHead(), "conv"), "fold_bn", (2, 3, 8, 8)),
    "fold_bn, pruned conv (a pre-hook)": (_pruned, "fold_bn", (2, 3, 8, 8)),
    "merge_convs": (lambda: _hooked(TwoLinears(parallel=False), "a"), "merge_convs", (2, 8)),
    "merge_parallel_linears": (lambda: _hooked(TwoLinears(parallel=True), "b"), "merge_parallel_linears", (2, 8)),
    "remove_redundant_activation": (lambda: _hooked(TwoRelus(), "r2"), "remove_redundant_activation", (2, 8)),
}


@pytest.mark.parametrize("case", CASES)
def test_a_pass_leaves_a_module_that_runs_hooks_as_it_is(case):
    build, name, shape = CASES[case]
    torch.manual_seed(0)
    model = build()
    captured = capture(model, (torch.randn(*shape),))
    result = apply_pass(captured.graph_module, name)
    assert not result.changed, result.log
    assert verify(captured, result.graph_module).ok
    # the lint rule that shares the pass's detection finds nothing to fix there either
    assert not [f for f in lint(captured).findings if f.fix == name], lint(captured).findings


def test_the_same_model_without_the_hook_is_rewritten():
    """The refusal is the hook's: without it fold_bn folds (the cases above would otherwise prove nothing)."""
    torch.manual_seed(0)
    captured = capture(ConvBnHead().eval(), (torch.randn(2, 3, 8, 8),))
    result = apply_pass(captured.graph_module, "fold_bn")
    assert result.changed and verify(captured, result.graph_module).ok


def test_a_pruned_model_exports_to_torchscript(tmp_path):
    from fxforge.export import export_model

    torch.manual_seed(0)
    captured = capture(_pruned(), (torch.randn(2, 3, 8, 8),))
    assert export_model(captured, "torchscript", tmp_path / "m.pt").ok
