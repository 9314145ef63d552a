"""merge_convs: back-to-back conv/linear pairs become one layer exactly; inexact or shared pairs are skipped."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fxforge.capture import capture
from fxforge.graphs import node_kind
from fxforge.lint import lint
from fxforge.passes import ORIGIN, PASS, apply_pass
from fxforge.passes.merge_convs import MergeConvsOptions, MergePlan, count_uses, merged_parameters, plan_merge
from fxforge.verify import verify

NAME = "merge_convs"
DIALECTS = ["torch", "aten"]


class Pair(nn.Module):
    """``second(first(x))``, optionally also returning the intermediate (a second user)."""

    def __init__(self, first: nn.Module, second: nn.Module, return_intermediate: bool = False):
        super().__init__()
        self.first, self.second = first, second
        self.return_intermediate = return_intermediate

    def forward(self, x):
        y = self.first(x)
        z = self.second(y)
        return (z, y) if self.return_intermediate else z


def seeded(build):
    torch.manual_seed(0)
    return build()


def layers(gm) -> list:
    return [n for n in gm.graph.nodes if node_kind(gm, n) in ("conv", "linear")]


def fx009(target) -> list:
    return lint(target, select=["FX009"]).findings


def mergeable(target) -> list[MergePlan]:
    """Every pair one layer computes exactly, whatever the merged layer's size (the pass with allow_larger)."""
    gm = getattr(target, "graph_module", target)
    uses = count_uses(gm.graph)
    return [plan for node in gm.graph.nodes if isinstance(plan := plan_merge(gm, node, uses), MergePlan)]


def merged_by_default(plans: list[MergePlan]) -> int:
    """How many of ``plans`` the pass merges with its default options: what FX009 reports (lint --fix's options)."""
    return sum(plan.refused(MergeConvsOptions()) is None for plan in plans)


def merged_module(result):
    (node,) = layers(result.graph_module)
    return result.graph_module.get_submodule(str(node.target))


X2 = (1, 4, 11, 11)

# name: (first, second, input shape); every case merges into one conv/linear and verifies equal
MERGEABLE = {
    "3x3 stride 2 pad 1 then 1x1": (lambda: nn.Conv2d(4, 8, 3, stride=2, padding=1), lambda: nn.Conv2d(8, 3, 1), X2),
    "3x3 dilation 2 then 1x1": (lambda: nn.Conv2d(4, 8, 3, padding=2, dilation=2), lambda: nn.Conv2d(8, 3, 1), X2),
    "grouped 3x3 then 1x1": (lambda: nn.Conv2d(4, 8, 3, groups=2), lambda: nn.Conv2d(8, 3, 1), X2),
    "depthwise 3x3 then depthwise 1x1": (
        lambda: nn.Conv2d(4, 4, 3, padding=1, groups=4),
        lambda: nn.Conv2d(4, 4, 1, groups=4),
        X2,
    ),
    "grouped 3x3 then same-grouped 1x1": (
        lambda: nn.Conv2d(4, 8, 3, groups=2),
        lambda: nn.Conv2d(8, 6, 1, groups=2),
        X2,
    ),
    "circular-padded 3x3 then 1x1": (
        lambda: nn.Conv2d(4, 8, 3, padding=1, padding_mode="circular"),
        lambda: nn.Conv2d(8, 3, 1),
        X2,
    ),
    "bias-free 3x3 then bias-free 1x1": (
        lambda: nn.Conv2d(4, 8, 3, bias=False),
        lambda: nn.Conv2d(8, 3, 1, bias=False),
        X2,
    ),
    "1x1 then unpadded strided 3x3": (lambda: nn.Conv2d(4, 8, 1), lambda: nn.Conv2d(8, 3, 3, stride=2), X2),
    "bias-free 1x1 then zero-padded 3x3": (
        lambda: nn.Conv2d(4, 8, 1, bias=False),
        lambda: nn.Conv2d(8, 3, 3, padding=1),
        X2,
    ),
    "bias-free 1x1 then same-padded 3x3": (
        lambda: nn.Conv2d(4, 8, 1, bias=False),
        lambda: nn.Conv2d(8, 3, 3, padding="same", dilation=2, bias=False),
        X2,
    ),
    "1x1 then grouped 3x3": (lambda: nn.Conv2d(4, 8, 1), lambda: nn.Conv2d(8, 4, 3, groups=2), X2),
    "1x1 then 1x1": (lambda: nn.Conv2d(4, 16, 1), lambda: nn.Conv2d(16, 2, 1), X2),
    # the second conv does not pad: whatever the first conv is, one conv of the input computes both
    "strided 1x1 after 3x3": (lambda: nn.Conv2d(4, 8, 3, padding=1), lambda: nn.Conv2d(8, 3, 1, stride=2), X2),
    "strided 1x1 after same-padded 3x3": (
        lambda: nn.Conv2d(4, 8, 3, padding="same"),
        lambda: nn.Conv2d(8, 3, 1, stride=(2, 3)),
        X2,
    ),
    "3x3 after 3x3": (lambda: nn.Conv2d(4, 8, 3), lambda: nn.Conv2d(8, 3, 3), X2),
    "3x3 stride 2 then dilated 3x3": (
        lambda: nn.Conv2d(4, 8, 3, stride=2, padding=1, padding_mode="reflect"),
        lambda: nn.Conv2d(8, 3, 3, dilation=2, bias=False),
        (1, 4, 19, 19),
    ),
    "dilation-2 3x3 then dilation-3 3x3": (
        lambda: nn.Conv2d(4, 8, 3, dilation=2),
        lambda: nn.Conv2d(8, 3, 3, dilation=3),
        (1, 4, 17, 17),
    ),
    "depthwise 3x3 then depthwise 3x3": (
        lambda: nn.Conv2d(4, 4, 3, groups=4, padding=1),
        lambda: nn.Conv2d(4, 4, 3, groups=4),
        X2,
    ),
    "padded 1x1 then 3x3": (lambda: nn.Conv2d(4, 8, 1, padding=1), lambda: nn.Conv2d(8, 3, 3), X2),
    "strided 1x1 then 3x3": (lambda: nn.Conv2d(4, 8, 1, stride=2), lambda: nn.Conv2d(8, 3, 3), X2),
    "grouped 1x1 after ungrouped 3x3": (lambda: nn.Conv2d(4, 8, 3), lambda: nn.Conv2d(8, 4, 1, groups=2), X2),
    "groups-2 3x3 then groups-4 1x1": (
        lambda: nn.Conv2d(4, 8, 3, groups=2),
        lambda: nn.Conv2d(8, 4, 1, groups=4),
        X2,
    ),
    "conv1d size-3 then size-5": (lambda: nn.Conv1d(3, 6, 3, stride=2), lambda: nn.Conv1d(6, 2, 5), (2, 3, 30)),
    "conv1d size-5 then 1x1": (
        lambda: nn.Conv1d(3, 6, 5, padding=2),
        lambda: nn.Conv1d(6, 2, 1, bias=False),
        (2, 3, 20),
    ),
    "conv3d 1x1 then 3x3x3": (
        lambda: nn.Conv3d(3, 6, 1, bias=False),
        lambda: nn.Conv3d(6, 2, 3, padding=1),
        (1, 3, 5, 5, 5),
    ),
    "linear then linear": (lambda: nn.Linear(6, 12), lambda: nn.Linear(12, 3), (2, 5, 6)),
    "bias-free linear then linear": (lambda: nn.Linear(6, 12, bias=False), lambda: nn.Linear(12, 3), (4, 6)),
    "linear then bias-free linear": (lambda: nn.Linear(6, 12), lambda: nn.Linear(12, 3, bias=False), (4, 6)),
}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("case", list(MERGEABLE))
def test_merges_into_one_layer(capture_as, run_verified, dialect, case):
    first, second, shape = MERGEABLE[case]
    model = seeded(lambda: Pair(first(), second()).eval())
    captured = capture_as(model, torch.randn(*shape), dialect)
    plans = mergeable(captured)
    assert len(plans) == 1 and len(fx009(captured)) == merged_by_default(plans)

    # exact whatever the sizes: a merge that grows the layer (3x3 then 3x3 is a 5x5) is allowed here
    result = run_verified(captured, NAME, {"allow_larger": True})

    assert result.changed and result.removed == 1, result.skipped
    (merged,) = layers(result.graph_module)
    assert merged.meta[PASS] == NAME
    assert merged.meta[ORIGIN] == layers(captured.graph_module)[1].name  # it computes the second's value
    assert fx009(result.graph_module) == []


def test_merged_module_keeps_the_geometry_of_the_kxk_conv(capture_as, run_verified):
    model = seeded(lambda: Pair(nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=2), nn.Conv2d(8, 3, 1)).eval())
    result = run_verified(capture_as(model, torch.randn(*X2), "torch"), NAME)
    merged = merged_module(result)
    assert (merged.in_channels, merged.out_channels, merged.kernel_size) == (4, 3, (3, 3))
    assert (merged.stride, merged.padding, merged.groups) == ((2, 2), (1, 1), 1)
    assert merged.weight.dtype == torch.float32 and merged.bias is not None
    # the old modules are not reused: the user's model shares them
    assert merged is not model.second and not any(merged.weight is p for p in model.parameters())

    model = seeded(lambda: Pair(nn.Conv2d(4, 8, 1, bias=False), nn.Conv2d(8, 3, 3, padding=1, dilation=1)).eval())
    merged = merged_module(run_verified(capture_as(model, torch.randn(*X2), "torch"), NAME))
    assert (merged.kernel_size, merged.padding, merged.groups) == ((3, 3), (1, 1), 1)


def test_merged_weights_are_computed_in_float64():
    """W2 @ W1 in float64, then cast: identical to the float64 product rounded once."""
    torch.manual_seed(0)
    first, second = nn.Linear(64, 64), nn.Linear(64, 8)
    captured = capture(Pair(first, second), (torch.randn(2, 64),), method="symbolic_trace")
    gm = captured.graph_module
    plan = plan_merge(gm, layers(gm)[1], count_uses(gm.graph))
    weight, bias = merged_parameters(plan)
    expected = (second.weight.double() @ first.weight.double()).float()
    assert weight.dtype == torch.float32 and torch.equal(weight, expected)
    assert torch.equal(bias, (second.weight.double() @ first.bias.double() + second.bias.double()).float())


@pytest.mark.parametrize("dialect", DIALECTS)
def test_biased_1x1_then_zero_padded_conv_is_skipped(capture_as, run_verified, dialect):
    """Zero padding of a biased 1x1's output is zeros, not the bias the merged conv would give there."""
    for second in (nn.Conv2d(8, 3, 3, padding=1), nn.Conv2d(8, 3, 3, padding="same")):
        torch.manual_seed(0)
        model = Pair(nn.Conv2d(4, 8, 1), second).eval()
        captured = capture_as(model, torch.randn(*X2), dialect)
        result = run_verified(captured, NAME)
        assert not result.changed
        assert len(result.skipped) == 1 and "bias would then show where the padding was" in result.skipped[0]
        assert fx009(captured) == []


def test_reflect_padding_commutes_with_a_biased_1x1(capture_as, run_verified):
    """Reflect/replicate padding copies pixels, so it commutes with the per-pixel 1x1, bias included."""
    for mode in ("reflect", "replicate", "circular"):
        torch.manual_seed(0)
        model = Pair(nn.Conv2d(4, 8, 1), nn.Conv2d(8, 3, 3, padding=1, padding_mode=mode)).eval()
        result = run_verified(capture_as(model, torch.randn(*X2), "torch"), NAME)
        assert result.changed and merged_module(result).padding_mode == mode


PADS_THE_OUTPUT = "no conv of the input computes what that padding holds"
NOT_MERGED = {
    # the second conv pads the first's *output*: zeros (or reflected pixels) there are no conv of the input
    "3x3 then padded 3x3": (nn.Conv2d(4, 8, 3), nn.Conv2d(8, 3, 3, padding=1), PADS_THE_OUTPUT),
    "3x3 then reflect-padded 3x3": (
        nn.Conv2d(4, 8, 3),
        nn.Conv2d(8, 3, 3, padding=1, padding_mode="reflect"),
        PADS_THE_OUTPUT,
    ),
    "3x3 then padded 1x1": (nn.Conv2d(4, 8, 3), nn.Conv2d(8, 3, 1, padding=1), PADS_THE_OUTPUT),
    "strided 1x1 then padded 3x3": (
        nn.Conv2d(4, 8, 1, stride=2, bias=False),
        nn.Conv2d(8, 3, 3, padding=1),
        PADS_THE_OUTPUT,
    ),
    # "same" with an even kernel pads one more pixel on one side, which a strided conv cannot express
    "same-padded 2x2 then strided 1x1": (
        nn.Conv2d(4, 8, 2, padding="same"),
        nn.Conv2d(8, 3, 1, stride=2),
        "pads asymmetrically",
    ),
}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("case", list(NOT_MERGED))
def test_inexact_geometry_is_skipped_with_a_reason(capture_as, run_verified, dialect, case):
    first, second, reason = NOT_MERGED[case]
    captured = capture_as(Pair(first, second).eval(), torch.randn(*X2), dialect)
    result = run_verified(captured, NAME)
    if dialect == "aten" and second.padding_mode != "zeros":
        assert result.skipped == []  # torch.export writes the reflect pad as its own node: no pair at all
    else:
        assert len(result.skipped) == 1 and reason in result.skipped[0], result.skipped
    assert not result.changed and fx009(captured) == []


def test_composed_kernel_geometry():
    """3x3 stride 2 then 3x3 dilation 2: the second's tap t and the first's tap a read input offset
    2 * 2 * t + a, so one 11x11 conv with stride 2 and the first conv's padding."""
    model = seeded(lambda: Pair(nn.Conv2d(4, 8, 3, stride=2, padding=1), nn.Conv2d(8, 3, 3, dilation=2)).eval())
    captured = capture(model, (torch.randn(1, 4, 19, 19),), method="symbolic_trace")
    result = apply_pass(captured.graph_module, NAME, {"allow_larger": True})
    merged = merged_module(result)
    assert (merged.kernel_size, merged.stride, merged.padding, merged.dilation) == ((11, 11), (2, 2), (1, 1), (1, 1))
    assert verify(captured, result.graph_module).ok
    # dilation 2 twice: offsets 2t + 2a, a 5x5 kernel of dilation 2
    model = seeded(lambda: Pair(nn.Conv2d(4, 8, 3, dilation=2), nn.Conv2d(8, 3, 3, dilation=2)).eval())
    captured = capture(model, (torch.randn(1, 4, 17, 17),), method="symbolic_trace")
    merged = merged_module(apply_pass(captured.graph_module, NAME, {"allow_larger": True}))
    assert (merged.kernel_size, merged.dilation) == ((5, 5), (2, 2))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_intermediate_with_another_user_is_skipped(capture_as, run_verified, dialect):
    model = seeded(lambda: Pair(nn.Conv2d(4, 8, 3), nn.Conv2d(8, 3, 1), return_intermediate=True).eval())
    captured = capture_as(model, torch.randn(*X2), dialect)
    result = run_verified(captured, NAME)
    assert not result.changed
    assert len(result.skipped) == 1 and "output has 2 users" in result.skipped[0]
    assert fx009(captured) == []


class RankAsserted(nn.Module):
    """timm's BatchNormAct2d asserts ``x.ndim == 4`` between two convs: a read of the rank, not of the values."""

    def __init__(self, read: str):
        super().__init__()
        self.first, self.second, self.read = nn.Conv2d(4, 8, 1), nn.Conv2d(8, 3, 1), read

    def forward(self, x):
        y = self.first(x)
        if self.read == "ndim":
            torch._assert(y.ndim == 4, "expected a 4-D input")
        else:  # the shape: the merged output's channels are the second conv's, so this read blocks the merge
            torch._assert(y.shape[1] == 8, "expected 8 channels")
        return self.second(y)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_rank_assert_between_the_convs_does_not_block_the_merge(capture_as, run_verified, dialect):
    """The torch dialect refused timm mobilenetv3's conv_pw pair that the ATen dialect merged: the rank assert
    counted as a second user (QA finding). A shape read still blocks."""
    captured = capture_as(seeded(lambda: RankAsserted("ndim").eval()), torch.randn(*X2), dialect)
    result = run_verified(captured, NAME)
    assert result.changed, result.skipped
    captured = capture_as(seeded(lambda: RankAsserted("shape").eval()), torch.randn(*X2), "torch")
    result = run_verified(captured, NAME)
    assert not result.changed and "users" in result.skipped[0]


class CalledTwice(nn.Module):
    """``second`` is called on two branches; merging ``first`` into it would change the other call."""

    def __init__(self):
        super().__init__()
        self.first, self.second, self.other = nn.Conv2d(4, 8, 3), nn.Conv2d(8, 3, 1), nn.Conv2d(4, 8, 3)

    def forward(self, x):
        return self.second(self.first(x)) + self.second(self.other(x))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_module_called_from_two_places_is_skipped(capture_as, run_verified, dialect):
    captured = capture_as(seeded(lambda: CalledTwice().eval()), torch.randn(*X2), dialect)
    result = run_verified(captured, NAME)
    assert not result.changed and len(result.skipped) == 2
    assert all("is used from more than one place" in reason for reason in result.skipped)
    assert fx009(captured) == []


class ReadsWeightDirectly(nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Conv2d(4, 8, 3), nn.Conv2d(8, 3, 1)

    def forward(self, x):
        return self.second(self.first(x)) * self.second.weight.sum()


def test_module_whose_weight_is_read_directly_is_skipped(capture_as, run_verified):
    """Replacing ``second`` would change what the direct ``second.weight`` read sees."""
    captured = capture_as(seeded(lambda: ReadsWeightDirectly().eval()), torch.randn(*X2), "torch")
    result = run_verified(captured, NAME)
    assert not result.changed and "module second is used from more than one place" in result.skipped[0]


def test_larger_merge_is_skipped_unless_allowed(capture_as, run_verified):
    """A low-rank bottleneck (16 -> 2 -> 16) has fewer weights than its product: exact, but bigger."""
    captured = capture_as(seeded(lambda: Pair(nn.Linear(16, 2), nn.Linear(2, 16))), torch.randn(3, 16), "torch")
    result = run_verified(captured, NAME)
    assert not result.changed
    assert result.skipped == [
        "first -> second: the merged layer would have 256 weights, the two together have 64 "
        "(set allow_larger to merge anyway)"
    ]
    # exact, but lint --fix (default options) would not merge it: the rule does not report it
    assert len(mergeable(captured)) == 1 and fx009(captured) == []
    result = run_verified(captured, NAME, {"allow_larger": True})
    assert result.changed and len(layers(result.graph_module)) == 1


class Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (
            nn.Conv2d(4, 8, 1),
            nn.Conv2d(8, 8, 3, padding=1, padding_mode="reflect"),
            nn.Conv2d(8, 2, 1),
        )

    def forward(self, x):
        return self.c(self.b(self.a(x)))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_chain_collapses(capture_as, run_verified, dialect):
    captured = capture_as(seeded(lambda: Chain().eval()), torch.randn(*X2), dialect)
    result = run_verified(captured, NAME, {"allow_larger": True})
    # the torch dialect merges all three; in the ATen dialect the reflect pad is its own node between a and b
    assert len(layers(result.graph_module)) == {"torch": 1, "aten": 2}[dialect]
    assert fx009(result.graph_module) == []


class Functional(nn.Module):
    def __init__(self, linear: bool = False):
        super().__init__()
        self.linear = linear
        if linear:
            self.w1, self.b1 = nn.Parameter(torch.randn(12, 6)), nn.Parameter(torch.randn(12))
            self.w2 = nn.Parameter(torch.randn(3, 12))
        else:
            self.w1, self.b1 = nn.Parameter(torch.randn(8, 2, 3, 3)), nn.Parameter(torch.randn(8))
            self.w2 = nn.Parameter(torch.randn(3, 8, 1, 1))

    def forward(self, x):
        if self.linear:
            return F.linear(F.linear(x, self.w1, self.b1), self.w2)
        return F.conv2d(F.conv2d(x, self.w1, self.b1, stride=2, padding=1, groups=2), self.w2)


@pytest.mark.parametrize("linear", [False, True])
def test_functional_calls_with_stored_weights(capture_as, run_verified, linear):
    inputs = torch.randn(3, 6) if linear else torch.randn(*X2)
    captured = capture_as(seeded(lambda: Functional(linear)), inputs, "torch")
    result = run_verified(captured, NAME)
    assert result.changed
    (merged,) = layers(result.graph_module)
    assert merged.target is (F.linear if linear else F.conv2d)
    if not linear:
        assert merged.args[3:] == ([2, 2], [1, 1], [1, 1], 1)  # the first conv's geometry, merged groups 1
    # the old weights are gone from the merged graph module, not from the captured one
    assert not hasattr(result.graph_module, "w1") and not hasattr(result.graph_module, "w2")
    assert hasattr(captured.graph_module, "w1") and hasattr(captured.graph_module, "w2")


def test_module_then_function_is_skipped(capture_as, run_verified):
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.w = nn.Conv2d(4, 8, 3), nn.Parameter(torch.randn(3, 8, 1, 1))

        def forward(self, x):
            return F.conv2d(self.first(x), self.w)

    result = run_verified(capture_as(seeded(Mixed), torch.randn(*X2), "torch"), NAME)
    assert not result.changed and "one is a module call and the other a function call" in result.skipped[0]


def test_aten_convolution_form(run_verified):
    """Decomposed export graphs call aten.convolution (with transposed/output_padding arguments)."""
    model = seeded(lambda: Pair(nn.Conv2d(4, 8, 3, stride=2, dilation=2), nn.Conv2d(8, 3, 1)).eval())
    inputs = (torch.randn(*X2),)
    gm = torch.export.export(model, inputs).run_decompositions().module()
    captured = capture(gm, inputs)
    assert [str(n.target) for n in layers(gm)] == ["aten.convolution.default"] * 2
    result = run_verified(captured, NAME)
    (merged,) = layers(result.graph_module)
    assert merged.args[3:] == ([2, 2], [0, 0], [2, 2], False, [0, 0], 1)


@pytest.mark.parametrize("dialect", DIALECTS)
def test_input_graph_and_model_untouched(capture_as, dialect):
    model = seeded(lambda: Pair(nn.Conv2d(4, 8, 3), nn.Conv2d(8, 3, 1)).eval())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    captured = capture_as(model, torch.randn(*X2), dialect)
    code, gm_state = captured.graph_module.code, {k: v.clone() for k, v in captured.graph_module.state_dict().items()}
    result = apply_pass(captured.graph_module, NAME)
    assert result.changed and captured.graph_module.code == code
    for before, after in ((state, model.state_dict()), (gm_state, captured.graph_module.state_dict())):
        assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def random_batchnorm_stats(model: nn.Module) -> nn.Module:
    """Default BN statistics make fold_bn's biases zero, which would hide bias bugs in the merge."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.normal_(0, 0.5)
                module.running_var.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.5)
    return model


def _resnet18_with_head(resnet18: nn.Module, head: list[nn.Module]) -> nn.Module:
    return nn.Sequential(*list(resnet18.children())[:-2], *head).eval()


HEADS = {
    # an FCN-style segmentation head on the resnet18 trunk: 3x3 conv straight into a 1x1 classifier
    "3x3 then 1x1 conv head": lambda: [nn.Conv2d(512, 64, 3, padding=1), nn.Conv2d(64, 5, 1)],
    # a projection + classifier fine-tuning head with no activation between
    "linear projection then classifier": lambda: [
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(512, 128),
        nn.Linear(128, 10),
    ],
}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("head", list(HEADS))
def test_torchvision_trunk_with_mergeable_head(capture_as, run_verified, resnet18, dialect, head):
    captured = capture_as(_resnet18_with_head(resnet18, HEADS[head]()), torch.randn(1, 3, 64, 64), dialect)
    assert len(fx009(captured)) == 1
    result = run_verified(captured, NAME)
    assert result.changed and result.removed == 1 and fx009(result.graph_module) == []
    # nothing else in resnet18 is a conv -> conv pair: BN and ReLU sit between all its convs
    assert result.skipped == []


@pytest.mark.parametrize("dialect", DIALECTS)
def test_mobilenet_v2_bottleneck_pairs_after_fold_bn(capture_as, run_verified, dialect):
    """After fold_bn, mobilenet_v2 has real conv -> conv pairs: a block's 1x1 projection straight into the
    next block's 1x1 expansion. They are low-rank (merged is larger): skipped by default, exact when allowed."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(0)
    model = random_batchnorm_stats(torchvision.models.mobilenet_v2()).eval()
    captured = capture_as(model, torch.randn(1, 3, 64, 64), dialect)
    folded = apply_pass(captured.graph_module, "fold_bn").graph_module
    after_fold_bn = dataclasses.replace(captured, graph_module=folded)

    default = run_verified(after_fold_bn, NAME)
    larger = [reason for reason in default.skipped if "set allow_larger" in reason]
    assert not default.changed and len(larger) == 2
    assert len(default.skipped) > 2 and all("users" in r for r in default.skipped if r not in larger)
    assert len(mergeable(folded)) == 2 and fx009(folded) == []  # larger: not reported

    allowed = run_verified(after_fold_bn, NAME, {"allow_larger": True})
    assert allowed.changed and allowed.removed == 2 and fx009(allowed.graph_module) == []
    assert verify(captured, allowed.graph_module).ok  # and against the graph before fold_bn


def _pick(rng: torch.Generator, options: list):
    return options[int(torch.randint(len(options), (1,), generator=rng))]


def _random_conv(rng: torch.Generator, cin: int, cout: int, dims: int, padding_modes: list[str]) -> nn.Module:
    """A random conv: kernel, stride, padding (ints, "same", "valid"), dilation, groups, bias, padding mode."""
    kernel, stride, dilation = _pick(rng, [1, 1, 2, 3]), _pick(rng, [1, 1, 2]), _pick(rng, [1, 1, 2])
    padding = _pick(rng, [0, 0, 1, "valid"] + (["same"] if stride == 1 else []))
    mode = _pick(rng, padding_modes) if padding not in (0, "valid") else "zeros"
    groups = _pick(rng, [g for g in (1, 2, 4) if cin % g == 0 and cout % g == 0])
    conv = (nn.Conv1d, nn.Conv2d)[dims - 1]
    bias = _pick(rng, [True, False])
    return conv(cin, cout, kernel, stride, padding, dilation, groups, bias, padding_mode=mode)


def _pads(conv: nn.Module) -> bool:
    if isinstance(conv.padding, str):
        return conv.padding == "same" and any(d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size))
    return any(conv.padding)


def _exactly_one_conv(first: nn.Module, second: nn.Module) -> bool:
    """The oracle, from the geometry alone: is there one conv of the input that computes the pair?

    An unpadded second conv reads the first's padded input through both kernels: yes, unless the first pads
    asymmetrically ("same", even kernel) and the merged stride or kernel differs from its own. A padded
    second conv pads the first's output: only a 1x1 stride-1 unpadded first conv commutes with that, and
    with zero padding only when it has no bias.
    """
    if not _pads(second):
        totals = [d * (k - 1) for d, k in zip(first.dilation, first.kernel_size)]
        asymmetric = first.padding == "same" and any(t % 2 for t in totals)
        keeps_first = all(k == 1 for k in second.kernel_size) and all(s == 1 for s in second.stride)
        return not asymmetric or keeps_first
    pointwise = all(k == 1 for k in first.kernel_size) and all(s == 1 for s in first.stride) and not _pads(first)
    return pointwise and (second.padding_mode != "zeros" or first.bias is None)


def _random_pairs(seed: int, count: int, dims_options: list[int], padding_modes: list[str]):
    """``count`` random conv pairs that run on their input, with that input."""
    rng = torch.Generator().manual_seed(seed)
    made = 0
    while made < count:
        dims = _pick(rng, dims_options)
        torch.manual_seed(int(torch.randint(1 << 30, (1,), generator=rng)))
        first = _random_conv(rng, 4, 8, dims, padding_modes)
        model = Pair(first, _random_conv(rng, 8, 4, dims, padding_modes)).eval()
        inputs = torch.randn(1, 4, *([13] * dims))
        try:
            with torch.no_grad():
                model(inputs)
        except RuntimeError:  # the pair does not fit the input (kernel larger than the image, reflect too wide)
            continue
        made += 1
        yield model, inputs


def test_every_merge_of_random_geometries_is_exact(capture_as, run_verified):
    """Random conv pairs (kernel, stride, padding, dilation, groups, bias, padding mode, 1-D and 2-D): the pass
    merges exactly the pairs one conv computes (the oracle above), every merge verifies equal, and it merges
    exactly the pairs FX009 reports."""
    merged = refused = 0
    for model, inputs in _random_pairs(0, 150, [1, 2, 2], ["zeros", "zeros", "reflect", "circular"]):
        captured = capture_as(model, inputs, "torch")
        plans = mergeable(captured)
        assert len(fx009(captured)) == merged_by_default(plans)
        result = run_verified(captured, NAME, {"allow_larger": True}, seeds=(0,))
        assert result.removed == len(plans) == _exactly_one_conv(model.first, model.second), (model, result.skipped)
        merged += result.removed
        refused += len(result.skipped)
    assert merged >= 60 and refused >= 20  # the sample exercises both the merges and the refusals


def test_every_merge_of_random_geometries_is_exact_in_the_aten_dialect(capture_as, run_verified):
    # zero padding only: torch.export writes reflect/circular padding as a node of its own between the convs
    for model, inputs in _random_pairs(1, 25, [2], ["zeros"]):
        captured = capture_as(model, inputs, "aten")
        plans = mergeable(captured)
        assert len(fx009(captured)) == merged_by_default(plans)
        result = run_verified(captured, NAME, {"allow_larger": True}, seeds=(0,))
        assert result.removed == len(plans) == _exactly_one_conv(model.first, model.second), (model, result.skipped)


def test_merged_larger_by_default_only_when_allowed(capture_as):
    """Without allow_larger the pass merges exactly FX009's pairs, whose merged layer is no larger."""
    larger = 0
    for model, inputs in _random_pairs(2, 40, [2], ["zeros"]):
        captured = capture_as(model, inputs, "torch")
        reported = fx009(captured)
        assert all(_weights(f.message)[1] <= _weights(f.message)[0] for f in reported)
        result = apply_pass(captured.graph_module, NAME)
        assert result.removed == len(reported), (model, result.skipped)
        larger += len(mergeable(captured)) - len(reported)
    assert larger > 0  # the sample has pairs FX009 leaves out as larger


def _weights(message: str) -> tuple[int, int]:
    """(weights now, merged) from an FX009 message ending "(1,234 weights now, 567 merged)"."""
    now, merged = message.rsplit("(", 1)[1].split(" weights now, ")
    return int(now.replace(",", "")), int(merged.split()[0].replace(",", ""))


# --------------------------------------------------------------------------------------------------
# transformer MLPs: linear -> activation -> linear is not one linear map


@pytest.mark.parametrize("dialect", DIALECTS)
def test_no_merge_across_an_activation(capture_as, run_verified, dialect):
    mlp = seeded(lambda: nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8)).eval())
    captured = capture_as(mlp, torch.randn(2, 5, 8), dialect)
    result = run_verified(captured, NAME, {"allow_larger": True})
    assert not result.changed and result.skipped == [] and fx009(captured) == []


def test_no_false_merge_in_a_bert_model(capture_as, run_verified):
    """BERT's MLP (dense -> GELU -> dense), attention projections and output denses: no two linears are
    back to back, with or without dropout removed first. FX009 finds nothing; merge_convs changes nothing."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=100
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    input_ids = torch.randint(0, 100, (2, 8))
    captured = capture(model, (input_ids,), method="export")
    assert sum(node_kind(captured.graph_module, n) == "linear" for n in captured.graph_module.graph.nodes) >= 13
    for graph in (captured.graph_module, apply_pass(captured.graph_module, "remove_dropout").graph_module):
        assert fx009(graph) == []
        result = apply_pass(graph, NAME)
        assert not result.changed and result.skipped == []


@pytest.mark.parametrize("value", ["ture", "maybe", 2])
def test_a_boolean_option_refuses_a_value_that_is_no_boolean(value):
    """QA: ``--option merge_convs.allow_larger=ture`` ran with allow_larger=False, silently."""
    from fxforge.passes import PassError, get_pass, parse_options

    with pytest.raises(PassError, match=r"option merge_convs\.allow_larger must be true or false"):
        parse_options(get_pass("merge_convs"), {"allow_larger": value})
    assert parse_options(get_pass("merge_convs"), {"allow_larger": "off"}).allow_larger is False
    assert parse_options(get_pass("merge_convs"), {"allow_larger": "yes"}).allow_larger is True


def test_layers_with_tied_weights_are_not_merged():
    """QA: ``c.weight = a.weight`` (one tensor under two modules) and ``b(a(x))`` merged a into b, untying the weight
    the docs promise a merge never touches (the outputs stayed right: c kept the original). Refused, with the reason,
    and lint FX009 does not report the pair."""

    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 6)
            self.c.weight = self.a.weight

        def forward(self, x):
            return self.b(self.a(x)) + self.c(x)

    captured = capture(Tied().eval(), (torch.randn(2, 6),))
    result = apply_pass(captured.graph_module, "merge_convs")
    assert not result.changed and "weights are tied" in result.skipped[0]
    assert lint(captured, select=["FX009"]).findings == []
