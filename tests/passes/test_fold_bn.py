"""fold_bn: every conv/linear form it folds, in both dialects, and every refusal with its reason.

BatchNorm statistics and affine parameters are randomised throughout: with the defaults (mean 0, var 1,
gamma 1, beta 0) BN is the identity, and a pass that drops it instead of folding it would pass.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp

from fxforge.capture import Captured, placeholder_values
from fxforge.graphs import node_kind
from fxforge.passes import apply_pass, get_pass
from fxforge.passes.fold_bn import FoldPlan, fold_weights, plan_fold
from fxforge.passes.merge_convs import count_uses
from fxforge.verify import compare_outputs

DIALECTS = ["torch", "aten"]


def random_stats(model: nn.Module, seed: int = 0) -> nn.Module:
    """Random running statistics and affine parameters for every BN; returns the model in eval mode."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.running_mean is not None:
                n = module.num_features
                module.running_mean.copy_(torch.randn(n, generator=generator))
                module.running_var.copy_(torch.rand(n, generator=generator) + 0.25)
                if module.affine:
                    module.weight.copy_(torch.randn(n, generator=generator))
                    module.bias.copy_(torch.randn(n, generator=generator))
    return model.eval()


def with_shapes(captured: Captured) -> Captured:
    """Record tensor_meta on the torch-dialect graph (Pipeline does this; a bare apply_pass does not)."""
    if captured.dialect == "torch":
        gm = captured.graph_module
        ShapeProp(gm).propagate(*placeholder_values(gm, captured.example_inputs, {}))
    return captured


def batch_norms(gm) -> list[str]:
    return [n.name for n in gm.graph.nodes if node_kind(gm, n) == "batch_norm"]


def bn_leftovers(gm) -> list[str]:
    """Stored BN state still referenced or held by the graph module after folding."""
    fetched = [str(n.target) for n in gm.graph.nodes if n.op == "get_attr" and str(n.target).startswith("bn")]
    held = [name for name, _ in gm.named_buffers() if "running_" in name or "num_batches" in name]
    return fetched + held


class ConvBn(nn.Module):
    def __init__(self, conv: nn.Module, bn: nn.Module):
        super().__init__()
        self.conv = conv
        self.bn = bn

    def forward(self, x):
        return self.bn(self.conv(x))


# (conv, BN, input shape): every conv kind, with and without bias, grouped, dilated, strided
FOLDABLE = {
    "conv1d-nobias": (lambda: nn.Conv1d(4, 6, 3, bias=False), nn.BatchNorm1d, (2, 4, 9)),
    "conv1d-groups-dilation": (lambda: nn.Conv1d(4, 6, 3, groups=2, dilation=2), nn.BatchNorm1d, (2, 4, 11)),
    "conv2d": (lambda: nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d, (2, 3, 9, 9)),
    "conv2d-depthwise-nobias": (lambda: nn.Conv2d(6, 6, 3, groups=6, bias=False), nn.BatchNorm2d, (2, 6, 7, 7)),
    "conv3d-dilation": (lambda: nn.Conv3d(2, 4, 3, dilation=(1, 2, 1), padding=1), nn.BatchNorm3d, (1, 2, 5, 7, 5)),
    "convtranspose1d-nobias": (lambda: nn.ConvTranspose1d(4, 6, 3, stride=2, bias=False), nn.BatchNorm1d, (2, 4, 5)),
    "convtranspose2d-groups": (lambda: nn.ConvTranspose2d(4, 6, 3, groups=2, stride=2), nn.BatchNorm2d, (2, 4, 4, 4)),
    "convtranspose2d-groups3-dilation": (
        lambda: nn.ConvTranspose2d(6, 9, 2, groups=3, dilation=2, bias=False),
        nn.BatchNorm2d,
        (1, 6, 4, 4),
    ),
    "convtranspose3d": (lambda: nn.ConvTranspose3d(2, 4, 2, groups=2), nn.BatchNorm3d, (1, 2, 3, 3, 3)),
    "linear-2d": (lambda: nn.Linear(5, 7), nn.BatchNorm1d, (3, 5)),
    "linear-2d-nobias": (lambda: nn.Linear(5, 7, bias=False), nn.BatchNorm1d, (3, 5)),
}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("case", FOLDABLE)
def test_folds_every_conv_kind(case, dialect, capture_as, run_verified):
    make_conv, bn_type, shape = FOLDABLE[case]
    torch.manual_seed(0)
    conv = make_conv()
    channels = conv.out_features if isinstance(conv, nn.Linear) else conv.out_channels
    model = random_stats(ConvBn(conv, bn_type(channels)))
    captured = with_shapes(capture_as(model, torch.randn(shape), dialect))

    result = run_verified(captured, "fold_bn")

    assert result.changed and result.removed == 1, result.skipped
    assert result.folded_params == conv.weight.numel() + channels  # the new weight and the (new) bias
    assert batch_norms(result.graph_module) == []
    assert bn_leftovers(result.graph_module) == []
    assert batch_norms(captured.graph_module) != []


@pytest.mark.parametrize("dialect", DIALECTS)
def test_affine_false_folds_with_a_zero_shift(dialect, capture_as, run_verified):
    # without affine parameters BN is (z - mean) / sqrt(var + eps): gamma 1 and beta 0, not 1
    model = random_stats(ConvBn(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, affine=False)))
    result = run_verified(capture_as(model, torch.randn(2, 3, 8, 8), dialect), "fold_bn")
    assert result.changed and batch_norms(result.graph_module) == []


def test_fold_weights_matches_batchnorm_for_every_layout():
    # the folding arithmetic on its own, against eager BN, for a plain and a grouped transposed weight
    torch.manual_seed(0)
    for conv in (nn.Conv2d(4, 6, 3, groups=2), nn.ConvTranspose2d(4, 6, 3, groups=2)):
        bn = random_stats(nn.BatchNorm2d(6, eps=1e-3), seed=3)
        transposed = isinstance(conv, nn.ConvTranspose2d)
        weight, bias = fold_weights(
            conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias, transposed, 2
        )
        x = torch.randn(1, 4, 6, 6)
        folded = (F.conv_transpose2d if transposed else F.conv2d)(x, weight, bias, groups=2)
        assert compare_outputs(bn(conv(x)), folded).ok


class FunctionalBn(nn.Module):
    """F.batch_norm after an nn.Conv2d and after an F.conv2d with a stored weight and no bias."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 3, 3, 3))
        self.conv = nn.Conv2d(4, 5, 1, bias=False)
        for name, n in (("a", 4), ("b", 5)):
            self.register_buffer(f"mean_{name}", torch.randn(n))
            self.register_buffer(f"var_{name}", torch.rand(n) + 0.25)
        self.gamma = nn.Parameter(torch.randn(4))
        self.beta = nn.Parameter(torch.randn(4))

    def forward(self, x):
        y = F.conv2d(x, self.weight, stride=2)
        y = F.batch_norm(y, self.mean_a, self.var_a, self.gamma, self.beta, False, 0.1, 1e-3)
        return F.batch_norm(self.conv(y), self.mean_b, self.var_b, training=self.training, eps=1e-4)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_folds_functional_batch_norm(dialect, capture_as, run_verified):
    torch.manual_seed(0)
    captured = capture_as(FunctionalBn().eval(), torch.randn(2, 3, 9, 9), dialect)
    result = run_verified(captured, "fold_bn")
    assert result.removed == 2 and batch_norms(result.graph_module) == []
    # the statistics were only read by the folded BNs: they are gone from the graph module too
    stored = {name for name, _ in result.graph_module.named_buffers()} | {
        name for name, _ in result.graph_module.named_parameters()
    }
    assert not any(name.endswith(("mean_a", "var_b", "gamma", "beta")) for name in stored), stored


def test_folds_decomposed_aten_batch_norm():
    # after run_decompositions BN is _native_batch_norm_legit_no_training (a tuple and a getitem) after aten.convolution
    torch.manual_seed(0)
    model = random_stats(ConvBn(nn.ConvTranspose2d(4, 6, 3, groups=2), nn.BatchNorm2d(6)))
    x = torch.randn(2, 4, 5, 5)
    gm = torch.export.export(model, (x,)).run_decompositions().module()
    before = gm.code
    result = apply_pass(gm, "fold_bn")
    assert result.changed and gm.code == before
    assert not any("batch_norm" in str(n.target) for n in result.graph_module.graph.nodes)
    assert compare_outputs(model(x), result.graph_module(x)).ok


class BiasFreeFunctionalConv(nn.Module):
    """F.conv_transpose2d / F.conv2d without a bias, the weight given by position or by keyword: the fold
    must add the bias argument in the same style (fold_bn once dropped it for conv_transpose)."""

    def __init__(self, function, by_keyword: bool):
        super().__init__()
        transposed = function is F.conv_transpose2d
        self.weight = nn.Parameter(torch.randn(4, 6, 3, 3) if transposed else torch.randn(6, 4, 3, 3))
        self.function, self.by_keyword = function, by_keyword
        self.bn = nn.BatchNorm2d(6)

    def forward(self, x):
        y = self.function(x, weight=self.weight) if self.by_keyword else self.function(x, self.weight, None, 2)
        return self.bn(y)


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("by_keyword", [False, True], ids=["positional", "keyword"])
@pytest.mark.parametrize("function", [F.conv_transpose2d, F.conv2d], ids=["conv_transpose2d", "conv2d"])
def test_folds_into_a_bias_free_functional_conv(function, by_keyword, dialect, capture_as, run_verified):
    torch.manual_seed(0)
    model = random_stats(BiasFreeFunctionalConv(function, by_keyword))
    result = run_verified(capture_as(model, torch.randn(1, 4, 5, 5), dialect), "fold_bn")
    assert result.removed == 1 and batch_norms(result.graph_module) == []


class ConvBnBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn1 = nn.BatchNorm2d(4)
        self.bn2 = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn2(self.bn1(self.conv(x)))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_folds_a_chain_of_batch_norms(dialect, capture_as, run_verified):
    # once bn1 is folded, the conv feeds bn2 alone: the same sweep folds it too
    captured = capture_as(random_stats(ConvBnBn()), torch.randn(2, 3, 8, 8), dialect)
    result = run_verified(captured, "fold_bn")
    assert result.removed == 2 and batch_norms(result.graph_module) == []


@pytest.mark.parametrize("dialect", DIALECTS)
def test_postcondition_finds_nothing_left_to_fold(dialect, capture_as):
    # the ensures check is plan_fold (FX008's detection too): it flags the BN before the pass, nothing after
    ensures = get_pass("fold_bn").ensures
    assert ensures is not None
    captured = capture_as(random_stats(ConvBn(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))), torch.randn(1, 3, 8, 8), dialect)
    assert "can still be folded" in ensures(captured.graph_module, None)
    result = apply_pass(captured.graph_module, "fold_bn")
    assert result.removed == 1 and ensures(result.graph_module, result) is None


def test_plan_fold_names_the_reason_or_the_plan(capture_as):
    captured = capture_as(random_stats(ConvWeightRead()), torch.randn(1, 3, 8, 8), "torch")
    gm = captured.graph_module
    uses = count_uses(gm.graph)
    plans = {n.name: plan_fold(gm, n, uses) for n in gm.graph.nodes}
    assert "parameters read" in plans["bn"]
    assert all(plan is None for name, plan in plans.items() if name != "bn")  # only BNs after a layer
    plain = capture_as(random_stats(ConvBn(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4))), torch.randn(1, 3, 8, 8), "torch")
    plan = plan_fold(plain.graph_module, next(n for n in plain.graph_module.graph.nodes if n.name == "bn"), Counter())
    assert isinstance(plan, FoldPlan) and plan.producer.name == "conv" and plan.kind == "conv"


# --------------------------------------------------------------------------------------------------
# refusals: each leaves the graph alone and says why


class ConvOutputReused(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y


class SharedConv(nn.Module):
    """The conv module is called twice; only one call feeds the BN (pytorch issue 104593)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x)) + self.conv(x * 2)


class ConvWeightRead(nn.Module):
    """The conv's weight is also read directly: folding would change what that read sees."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x)) + self.conv.weight.sum()


class ConvBiasRead(nn.Module):
    """The conv's bias is read directly: the fold rewrites the bias too."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv(x)) * self.conv.bias.mean()


class LinearBn(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 6)
        self.bn = nn.BatchNorm1d(6)

    def forward(self, x):
        return self.bn(self.fc(x))


class MixedConvBn(nn.Module):
    """timm's MixedConv2d (mixnet): convs of several kernel sizes over channel groups, concatenated, one BN."""

    def __init__(self):
        super().__init__()
        self.small, self.large = nn.Conv2d(2, 3, 3, padding=1), nn.Conv2d(2, 5, 5, padding=2)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        a, b = x.split(2, dim=1)
        return self.bn(torch.cat([self.small(a), self.large(b)], dim=1))


class MixedConvBnBn(MixedConvBn):
    """Each conv with its own batch norm first, then the concatenation's: both levels fold."""

    def __init__(self):
        super().__init__()
        self.bn_small, self.bn_large = nn.BatchNorm2d(3), nn.BatchNorm2d(5)

    def forward(self, x):
        a, b = x.split(2, dim=1)
        return self.bn(torch.cat([self.bn_small(self.small(a)), self.bn_large(self.large(b))], dim=1))


class MixedConvBnNegativeDim(MixedConvBn):
    def forward(self, x):
        a, b = x.split(2, dim=1)
        return self.bn(torch.cat([self.small(a), self.large(b)], dim=-3))


class MixedConvBnConvReadElsewhere(MixedConvBn):
    def forward(self, x):
        a, b = x.split(2, dim=1)
        small = self.small(a)
        return self.bn(torch.cat([small, self.large(b)], dim=1)), small.sum()


class MixedConvBnSameConvTwice(MixedConvBn):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(6)

    def forward(self, x):
        small = self.small(x[:, :2])
        return self.bn(torch.cat([small, small], dim=1))


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("model_type, folds", [(MixedConvBn, 1), (MixedConvBnBn, 3), (MixedConvBnNegativeDim, 1)])
def test_folds_a_batch_norm_after_a_concatenation_of_convs(model_type, folds, dialect, capture_as, run_verified):
    """QA: timm's MixedConv2d (mixnet) left 34 batch norms after torch.cat of convs; each conv takes its slice of
    the channels now, and FX008 reports them as foldable (the rule's detection is the pass's)."""
    from fxforge.lint import lint

    torch.manual_seed(0)
    captured = with_shapes(capture_as(random_stats(model_type()), torch.randn(2, 4, 8, 8), dialect))
    foldable = [f for f in lint(captured.graph_module).findings if f.code == "FX008"]
    assert any("concatenation of 2 convs" in f.message for f in foldable), [f.message for f in foldable]
    result = run_verified(captured, "fold_bn")
    assert result.removed == folds and not result.skipped, result.skipped
    assert batch_norms(result.graph_module) == [] and bn_leftovers(result.graph_module) == []
    assert any("each its slice of the channels" in line for line in result.log)
    assert not [f for f in lint(result.graph_module).findings if f.code == "FX008"]


REFUSALS = {
    # a conv of the concatenation read elsewhere too, or concatenated twice: no slice of its own to take
    "cat-of-convs-one-read-elsewhere": (MixedConvBnConvReadElsewhere, (1, 4, 8, 8), ("2 users", "2 users")),
    "cat-of-the-same-conv-twice": (MixedConvBnSameConvTwice, (1, 4, 8, 8), ("twice", "twice")),
    # name: (model, input shape, reason fragment per dialect (torch, aten))
    "conv-output-has-other-users": (ConvOutputReused, (1, 3, 8, 8), ("2 users", "2 users")),
    "conv-module-called-twice": (SharedConv, (1, 4, 8, 8), ("more than one place", "used elsewhere")),
    "conv-weight-read-directly": (ConvWeightRead, (1, 3, 8, 8), ("parameters read", "used elsewhere")),
    "conv-bias-read-directly": (ConvBiasRead, (1, 3, 8, 8), ("parameters read", "used elsewhere")),
    # BN1d on (N, C, L) normalises C, the Linear's L-sized last axis is not the channel axis
    "linear-on-3d-input": (LinearBn, (3, 6, 4), ("2-D", "2-D")),
    # an unbatched conv output: BN1d reads (C, L) as (N, C) and normalises L (QA: folded, relative error 0.63)
    "conv2d-on-unbatched-input": (
        lambda: ConvBn(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm1d(8)),
        (3, 8, 8),
        ("batched", "batched"),
    ),
    "conv1d-on-unbatched-input": (
        lambda: ConvBn(nn.Conv1d(3, 8, 3), nn.BatchNorm1d(8)),
        (3, 10),
        ("batched", "batched"),
    ),
    "no-running-stats": (
        lambda: ConvBn(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, track_running_stats=False)),
        (2, 3, 8, 8),
        ("no running statistics", "no running statistics"),
    ),
}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("case", REFUSALS)
def test_refuses_with_reason(case, dialect, capture_as, run_verified):
    make, shape, reasons = REFUSALS[case]
    torch.manual_seed(0)
    captured = with_shapes(capture_as(random_stats(make()), torch.randn(shape), dialect))
    result = run_verified(captured, "fold_bn")
    assert not result.changed
    assert len(result.skipped) == 1 and reasons[DIALECTS.index(dialect)] in result.skipped[0], result.skipped
    assert len(batch_norms(result.graph_module)) == 1


def test_peer_fuser_gets_the_shared_conv_wrong():
    # torch.fx.experimental.optimization.fuse folds BN into a conv that another call also uses (pytorch issue
    # 104593); fold_bn refuses (test_refuses_with_reason). If torch ever fixes fuse, this test says so.
    from torch.fx.experimental.optimization import fuse

    torch.manual_seed(0)
    model = random_stats(SharedConv())
    x = torch.randn(1, 4, 8, 8)
    with torch.no_grad():
        assert not compare_outputs(model(x), fuse(model)(x)).ok


@pytest.mark.parametrize("dialect", DIALECTS)
def test_refuses_batch_norm_in_training_mode(dialect, capture_as):
    model = random_stats(ConvBn(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)))
    model.bn.train()
    captured = capture_as(model, torch.randn(2, 3, 8, 8), dialect)
    result = apply_pass(captured.graph_module, "fold_bn")
    assert not result.changed and result.graph_module.code == captured.graph_module.code
    assert "training mode" in result.skipped[0]


# --------------------------------------------------------------------------------------------------
# real models


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2", "efficientnet_b0"])
def test_no_batch_norm_left_in_torchvision_models(name, dialect, capture_as, run_verified):
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = random_stats(getattr(torchvision.models, name)(), seed=1)
    conv_weight = next(m for m in model.modules() if isinstance(m, nn.Conv2d)).weight.detach().clone()
    captured = capture_as(model, torch.randn(1, 3, 64, 64), dialect)
    had = len(batch_norms(captured.graph_module))

    result = run_verified(captured, "fold_bn", seeds=(0,))

    assert had > 0 and result.removed == had and result.skipped == []
    assert batch_norms(result.graph_module) == []
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in result.graph_module.modules())
    # the user's model keeps its own weights
    assert torch.equal(next(m for m in model.modules() if isinstance(m, nn.Conv2d)).weight, conv_weight)


# --------------------------------------------------------------------------------------------------
# shape reads, BatchNorm subclasses and batch norms inside module calls


class ShapeChecked(nn.Module):
    """timm's norm layers assert the input rank first: reads of the conv output's metadata, not its value."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.conv(x)
        torch._assert(y.ndim == 4, "expected 4-D")
        return self.bn(y) * y.shape[1]


def test_shape_reads_of_the_conv_output_do_not_block_folding(capture_as, run_verified):
    captured = capture_as(random_stats(ShapeChecked()), torch.randn(2, 3, 8, 8), "torch")
    assert len(captured.graph_module.graph.find_nodes(op="call_module", target="conv")[0].users) == 3
    result = run_verified(captured, "fold_bn")
    assert result.removed == 1 and batch_norms(result.graph_module) == []


class SubclassBn(nn.BatchNorm2d):
    """A BatchNorm subclass that keeps BatchNorm's forward: a BatchNorm module."""


class NormAct(nn.BatchNorm2d):
    """timm's BatchNormAct2d in miniature: a BatchNorm subclass whose forward is batch norm, then an act."""

    def __init__(self, channels: int):
        super().__init__(channels)
        self.act = nn.ReLU()

    def forward(self, x):
        x = F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.training, 0.1, self.eps)
        return self.act(x)


class Branchy(nn.Module):
    """A norm layer whose forward branches on its input's values: fx cannot trace it."""

    def __init__(self, channels: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return self.bn(x) if x.sum() > 0 else x


class ConvThen(nn.Module):
    def __init__(self, norm: nn.Module, twice: bool = False):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.norm = norm
        self.twice = twice

    def forward(self, x):
        y = self.norm(self.conv(x))
        return self.norm(y) if self.twice else y


def test_batch_norm_subclass_folds_as_a_module(capture_as, run_verified):
    captured = capture_as(random_stats(ConvThen(SubclassBn(4))), torch.randn(2, 3, 8, 8), "torch")
    result = run_verified(captured, "fold_bn")
    assert result.log == ["folded norm into conv"]


def test_norm_act_called_as_one_node_is_inlined_and_folded(capture_as, run_verified):
    captured = capture_as(random_stats(ConvThen(NormAct(4))), torch.randn(2, 3, 8, 8), "torch", leaf_modules=[NormAct])
    assert [n.op for n in captured.graph_module.graph.nodes].count("call_module") == 2
    result = run_verified(captured, "fold_bn")
    assert result.log == ["folded norm into conv"]
    gm = result.graph_module
    assert [str(n.target) for n in gm.graph.nodes if n.op == "call_module"] == ["conv", "norm.act"]
    assert type(gm.norm) is nn.Module and not hasattr(gm.norm, "running_mean")  # a container of act now
    assert type(captured.graph_module.norm) is NormAct  # the captured graph is untouched


COMPOSITE_REFUSALS = {
    # name: (model, leaf type, reason fragment)
    "called twice": (lambda: ConvThen(NormAct(4), twice=True), NormAct, "more than one place"),
    "untraceable": (lambda: ConvThen(Branchy(4)), Branchy, "cannot be traced"),
}


@pytest.mark.parametrize("case", COMPOSITE_REFUSALS)
def test_module_call_that_cannot_be_inlined_is_refused(case, capture_as, run_verified):
    make, leaf, reason = COMPOSITE_REFUSALS[case]
    captured = capture_as(random_stats(make()), torch.randn(2, 3, 8, 8), "torch", leaf_modules=[leaf])
    result = run_verified(captured, "fold_bn")
    assert not result.changed and result.graph_module.code == captured.graph_module.code
    assert len(result.skipped) >= 1 and reason in result.skipped[0], result.skipped


def test_norm_act_in_training_mode_is_refused_with_the_fix(capture_as):
    model = random_stats(ConvThen(NormAct(4)))
    model.norm.train()
    captured = capture_as(model, torch.randn(2, 3, 8, 8), "torch", leaf_modules=[NormAct], check=False)
    result = apply_pass(captured.graph_module, "fold_bn")
    assert not result.changed and result.skipped == [
        "norm after conv: the BatchNorm runs in training mode (training=True): call model.eval() before capture"
    ]


class Block(nn.Module):
    """A user block kept as a leaf, holding a conv and a SyncBatchNorm (a torch.nn BatchNorm with its own
    forward): traced through to the end, or refused, but never half inlined."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.SyncBatchNorm(4)

    def forward(self, x):
        return self.bn(self.conv(x)).relu()


def test_nested_module_calls_are_inlined_or_refused_whole(capture_as, run_verified):
    model = random_stats(nn.Sequential(Block()))
    captured = capture_as(model, torch.randn(2, 3, 8, 8), "torch", leaf_modules=[Block])
    assert [n.target for n in captured.graph_module.graph.nodes if n.op == "call_module"] == ["0"]
    result = run_verified(captured, "fold_bn")  # the postcondition would fail on a half-inlined block
    # SyncBatchNorm's forward checks its input's rank in Python: fx cannot trace through it
    assert not result.changed and result.skipped[0].startswith("_0 (a Block call): it cannot be traced")


class ConvAffine(nn.Module):
    """A frozen batch norm written as literals: conv(x) * scale + shift."""

    def __init__(self, scale: float, shift: float):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.scale, self.shift = scale, shift

    def forward(self, x):
        return self.conv(x) * self.scale + self.shift


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_literal_scale_that_is_not_finite_is_not_folded(dialect, capture_as, run_verified):
    """conv(x) * inf gives +-inf; inf folded into the weights sums +inf and -inf products into NaN."""
    torch.manual_seed(0)
    captured = with_shapes(capture_as(ConvAffine(float("inf"), 1.0), torch.randn(1, 3, 8, 8), dialect))
    result = apply_pass(captured.graph_module, "fold_bn")
    assert not result.changed and "not a finite number" in result.skipped[0]
    assert run_verified(capture_as(ConvAffine(0.5, 0.25), torch.randn(1, 3, 8, 8), dialect), "fold_bn").changed


def test_a_literal_scale_folds_into_weights_on_another_device():
    """The literal's per-channel vector was made on the CPU: with the weights on meta (or a GPU) the fold raised
    'Tensor on device cpu is not on the expected device meta'."""
    from fxforge.capture import capture

    with torch.device("meta"):
        model = ConvAffine(0.5, 0.25)
    captured = capture(model, (torch.empty(1, 3, 8, 8, device="meta"),), method="symbolic_trace", check=False)
    result = apply_pass(captured.graph_module, "fold_bn")
    assert result.changed and result.graph_module.get_submodule("conv").weight.device.type == "meta"


class _LinearNorm(nn.Module):
    """timm LeViT's LinearNorm: a linear on (N, L, C), a BatchNorm1d over its flattened (N * L, C) output, and the
    result reshaped like the linear's output (which reads only its shape). ``flatten_to`` other than 1 flattens
    the features into the rows too, where the batch norm's channels are no longer the linear's features."""

    def __init__(self, flatten_to: int = 1, shared: bool = False) -> None:
        super().__init__()
        self.linear, self.bn = nn.Linear(8, 16), nn.BatchNorm1d(16 if flatten_to == 1 else 5 * 16)
        self.flatten_to, self.shared = flatten_to, shared

    def forward(self, x):
        x = self.linear(x)
        flat = x.flatten(0, 1) if self.flatten_to == 1 else x.flatten(1)
        out = self.bn(flat)
        return (out.reshape_as(x), flat) if self.shared else out


@pytest.mark.parametrize("dialect", DIALECTS)
def test_folds_a_batch_norm_over_a_linears_flattened_rows(dialect, capture_as, run_verified):
    """QA: LeViT's 48 Linear -> flatten(0, 1) -> BatchNorm1d pairs stayed, with no reason given. Flattening the
    leading dimensions keeps the features last, so the fold is exact."""
    captured = capture_as(random_stats(_LinearNorm()), torch.randn(2, 5, 8), dialect)
    result = run_verified(captured, "fold_bn")
    assert result.changed and not result.skipped
    assert not any(node_kind(result.graph_module, n) == "batch_norm" for n in result.graph_module.graph.nodes)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_keeps_a_batch_norm_whose_channels_are_not_the_linears_features(dialect, capture_as, run_verified):
    # flatten(1) of (N, L, C): the norm's 80 channels mix positions and features
    captured = capture_as(random_stats(_LinearNorm(flatten_to=2)), torch.randn(2, 5, 8), dialect)
    assert not run_verified(captured, "fold_bn").changed
    # the flattened rows are an output too: folding would change them
    captured = capture_as(random_stats(_LinearNorm(shared=True)), torch.randn(2, 5, 8), dialect)
    result = run_verified(captured, "fold_bn")
    assert not result.changed and any("read by more than the batch norm" in s for s in result.skipped)


class _LayerScaleResidual(nn.Module):
    """ConvNeXt's block end: ``shortcut + gamma * fc(x)``, the form of a frozen norm with a residual as its shift."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.gamma = nn.Parameter(torch.full((8,), 0.5))

    def forward(self, x):
        return x + self.fc(x) * self.gamma


def test_a_residual_after_a_scaled_layer_is_no_norm_and_is_not_reported():
    """QA (timm's convnext_atto): every block printed "fold_bn skipped: add after ...mlp_fc2: its scale or shift is
    computed from graph inputs", on a model without a batch norm."""
    gm = torch.fx.symbolic_trace(_LayerScaleResidual())
    result = apply_pass(gm, "fold_bn")
    assert not result.changed and result.skipped == []


def test_timm_mixnet_keeps_no_batch_norm_after_its_mixed_convs(run_verified):
    """The real MixedConv2d: timm's mixnet_s normalises 34 concatenations of mixed-kernel convs (49 batch norms in
    all); every one folds, in both dialects, verified against the model."""
    pytest.importorskip("timm")
    import fxforge

    for method in ("symbolic_trace", "export"):
        captured = fxforge.prepare("timm:mixnet_s", ["1x3x32x32"], method=method)
        result = run_verified(captured, "fold_bn")
        assert sum("each its slice of the channels" in line for line in result.log) == 34, method
        assert result.removed == 49 and not result.skipped and batch_norms(result.graph_module) == []


class ConvBnStack(nn.Module):
    """A bias-free conv, a conv with a bias and a Linear + BatchNorm1d: every layer a fold gives a bias."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8))
        self.head = nn.Linear(8, 4)
        self.head_norm = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.head_norm(self.head(self.block(self.stem(x)).mean((2, 3))))


def test_an_aten_fold_keeps_the_models_module_paths_in_its_state_dict(capture_as, run_verified):
    """The ATen dialect stored folded pairs as conv2d_12_folded_weight, losing the model's layout (QA); now the
    same keys as the torch dialect's folded modules (each layer's weight and a new bias at its own path)."""
    torch.manual_seed(0)
    model = random_stats(ConvBnStack())
    x = torch.randn(2, 3, 9, 9)
    keys = {}
    for dialect in DIALECTS:
        result = run_verified(capture_as(model, x, dialect), "fold_bn")
        assert result.removed == 3
        keys[dialect] = set(result.graph_module.state_dict())
    assert (
        keys["aten"]
        == keys["torch"]
        == {"stem.0.weight", "stem.0.bias", "block.0.weight", "block.0.bias", "head.weight", "head.bias"}
    )
    assert model.stem[0].bias is None and "stem.1.running_mean" in model.state_dict()  # the user's model as it was


class KernelConv(nn.Module):
    """A functional conv whose weight is not called ``weight``: there is no ``bias`` path that goes with it."""

    def __init__(self):
        super().__init__()
        self.kernel = nn.Parameter(torch.randn(4, 4, 3, 3))
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(F.conv2d(x, self.kernel, padding=1))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_folded_pair_keeps_its_own_names_where_the_weight_is_not_a_layers_weight(dialect, capture_as):
    torch.manual_seed(0)
    model = random_stats(KernelConv())
    x = torch.randn(1, 4, 6, 6)
    result = apply_pass(capture_as(model, x, dialect).graph_module, "fold_bn")
    assert result.removed == 1
    keys = set(result.graph_module.state_dict())
    assert len(keys) == 2 and all(key.endswith(("_folded_weight", "_folded_bias")) for key in keys), keys
    assert compare_outputs(model(x), result.graph_module(x)).ok


def test_resnet18_folded_in_either_dialect_has_the_same_state_dict_keys(capture_as):
    """On a real net: every conv of torchvision's resnet18 keeps its path and gains a bias, in both dialects."""
    import torchvision

    torch.manual_seed(0)
    model = random_stats(torchvision.models.resnet18(num_classes=10))
    x = torch.randn(1, 3, 32, 32)
    keys = {}
    for dialect in DIALECTS:
        result = apply_pass(capture_as(model, x, dialect).graph_module, "fold_bn")
        assert result.removed == 20
        keys[dialect] = set(result.graph_module.state_dict())
    assert keys["aten"] == keys["torch"]
    assert "layer1.0.conv1.bias" in keys["aten"] and not any("bn" in key for key in keys["aten"])
