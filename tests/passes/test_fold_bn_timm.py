"""fold_bn on real-world layer forms: timm norm-act layers, frozen batch norms, decomposed ATen linears.

timm builds most of its CNNs from ``BatchNormAct2d`` (a ``BatchNorm2d`` subclass whose forward is batch norm,
drop, activation) inside ``ConvNormAct``; torchvision's detection backbones use ``FrozenBatchNorm2d``
(``x * scale + shift`` from buffers). On each model, in each dialect it captures in: every batch norm that
directly follows a conv/linear is folded (none is left after the pass, none is refused), lint FX008 reports
exactly the batch norms the pass folds, and the result verifies equal to the captured graph. BatchNorm
statistics are randomised first: the defaults make BN the identity and would hide a dropped fold.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torch.fx.passes.shape_prop import ShapeProp

from fxforge.capture import Captured, capture, placeholder_values
from fxforge.graphs import node_kind
from fxforge.lint import lint
from fxforge.passes import ORIGIN, apply_pass
from fxforge.passes.fold_bn import INLINED
from fxforge.passes.merge_convs import value_users
from fxforge.verify import verify
from model_helpers import CAPTURE_METHOD, randomize_batchnorm

timm = pytest.importorskip("timm")

DIALECTS = ["torch", "aten"]
_BN_TARGETS = ("batch_norm",)  # F.batch_norm and every ATen batch norm have it in their name
_LAYERS = ("conv", "conv_transpose", "linear")


def batch_norm_nodes(gm) -> list:
    """Batch norms in any form: F.batch_norm, ATen ops, and module calls once per BatchNorm the module is or
    holds (timm's BatchNormAct2d is one, a ConvNormAct holds one)."""
    found = []
    for node in gm.graph.nodes:
        if node.op == "call_module":
            modules = gm.get_submodule(str(node.target)).modules()
            found += [node] * sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in modules)
        elif node.op == "call_function" and any(t in getattr(node.target, "__name__", "") for t in _BN_TARGETS):
            found.append(node)
    return found


def after_a_layer(gm) -> list[str]:
    """Batch norms whose input is a conv/linear output that nothing else reads: what fold_bn must fold."""
    left = []
    for node in batch_norm_nodes(gm):
        source = node.args[0]
        if node_kind(gm, source) in _LAYERS and len(value_users(source)) == 1:
            left.append(node.name)
    return left


def fx008(target) -> list:
    return lint(target, select=["FX008"]).findings


def folded_names(result) -> list[str]:
    return [line.split()[1] for line in result.log if line.startswith("folded ")]


def timm_model(name: str, seed: int = 1) -> nn.Module:
    torch.manual_seed(0)
    return randomize_batchnorm(timm.create_model(name, pretrained=False), seed=seed).eval()


def check_fold(captured: Captured, *, frozen: bool = False):
    """fold_bn on ``captured``: rule and pass agree one for one, nothing foldable is left, outputs verify."""
    found = fx008(captured)
    before = batch_norm_nodes(captured.graph_module)
    result = apply_pass(captured.graph_module, "fold_bn")
    gm = result.graph_module

    assert [f.node for f in found] == folded_names(result), result.skipped
    assert after_a_layer(gm) == [], result.skipped
    if not frozen:  # frozen batch norms are arithmetic, not batch norm calls: their tests count them
        assert len(batch_norm_nodes(gm)) == len(before) - result.removed
    assert result.skipped == []
    assert fx008(gm) == []  # `lint --fix` clears every finding
    check = verify(captured, gm, seeds=(0,))
    assert check.ok, check.divergence.describe() if check.divergence else check.problems
    return result


# --------------------------------------------------------------------------------------------------
# timm models, as timm builds them


# name -> batch norms that do not follow a conv (pre-activation blocks, identity branches, BN after an add)
TIMM = {
    "mobilenetv2_050": 0,
    "tinynet_e": 0,
    "resnetv2_18": 9,  # pre-activation: BN after the stem's max pool and after each residual add
    "repvgg_a0": 17,  # the identity branch of a RepVGG block is a BN on the block input
    "regnetz_005": 0,
    "fastvit_t8": 24,  # MobileOne identity branches and BNs after adds
    "efficientnet_b0": 0,
    "rexnet_100": 0,
}


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("name", list(TIMM))
def test_timm_batch_norms_after_convs_all_fold(name, dialect):
    captured = capture(timm_model(name), (torch.randn(1, 3, 64, 64),), method=CAPTURE_METHOD[dialect])
    had = len(batch_norm_nodes(captured.graph_module))
    assert len(after_a_layer(captured.graph_module)) == had - TIMM[name] > 0

    result = check_fold(captured)

    assert result.removed == had - TIMM[name]
    assert len(batch_norm_nodes(result.graph_module)) == TIMM[name]


@pytest.mark.parametrize("name", ["mobilenetv2_050", "repvgg_a0"])
def test_timm_norm_act_layers_called_as_one_node(name):
    """``BatchNormAct2d`` and ``ConvNormAct`` kept as leaves (one call_module each): fold_bn inlines the call
    (timm's batch norm, drop, act), folds the batch norm into the conv before it or inside it, and keeps
    drop and act as the modules they were."""
    from timm.layers import BatchNormAct2d, ConvNormAct

    model = timm_model(name)
    x = torch.randn(1, 3, 64, 64)
    captured = capture(model, (x,), method="symbolic_trace", leaf_modules=[BatchNormAct2d, ConvNormAct])
    gm = captured.graph_module
    calls = [n for n in gm.graph.nodes if n.op == "call_module"]
    assert any(isinstance(gm.get_submodule(str(n.target)), BatchNormAct2d) for n in calls)
    assert not any(n.op == "call_function" and "batch_norm" in str(n.target) for n in gm.graph.nodes)

    result = check_fold(captured)

    folded = result.graph_module
    assert result.removed == {"mobilenetv2_050": 52, "repvgg_a0": 44}[name]
    # inlined nodes keep qualified targets and provenance; the module calls' values keep their origin
    targets = {str(n.target) for n in folded.graph.nodes if n.op == "call_module"}
    assert all(folded.get_submodule(target) is not None for target in targets)
    inlined = [n for n in folded.graph.nodes if INLINED in n.meta]
    assert inlined and all(ORIGIN in n.meta for n in inlined)
    original_names = {n.name for n in gm.graph.nodes}
    assert {n.meta[ORIGIN] for n in inlined} & original_names  # the act computes the call's value
    # what replaced the folded composites is no BatchNorm any more, and its statistics are gone
    left_bn_calls = {str(n.target) for n in batch_norm_nodes(folded)}
    for path, module in folded.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            assert path in left_bn_calls, path
    assert not any(key.startswith("bn1.running") for key in folded.state_dict())


@pytest.mark.parametrize("dialect", DIALECTS)
def test_timm_in_training_mode_is_refused_with_the_fix(dialect):
    model = timm_model("tinynet_e").train()
    captured = capture(model, (torch.randn(2, 3, 64, 64),), method=CAPTURE_METHOD[dialect], check=False)
    result = apply_pass(captured.graph_module, "fold_bn")
    assert not result.changed and len(result.skipped) == 31
    assert all("call model.eval() before capture" in reason for reason in result.skipped)
    found = fx008(captured)
    assert len(found) == 31 and all("call model.eval() before capture" in f.message for f in found)


# --------------------------------------------------------------------------------------------------
# frozen batch norms (torchvision detection backbones)


def randomize_frozen(model: nn.Module, seed: int = 0) -> nn.Module:
    from torchvision.ops.misc import FrozenBatchNorm2d

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, FrozenBatchNorm2d):
                n = module.weight.numel()
                module.weight.copy_(torch.randn(n, generator=generator))
                module.bias.copy_(torch.randn(n, generator=generator))
                module.running_mean.copy_(torch.randn(n, generator=generator) * 0.5)
                module.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
    return model.eval()


def with_shapes(captured: Captured) -> Captured:
    """Record tensor_meta on a torch-dialect graph, as Pipeline does: a (1, C, 1, 1) scale keeps the conv
    output's shape only when that output is known to be batched."""
    if captured.dialect == "torch":
        gm = captured.graph_module
        ShapeProp(gm).propagate(*placeholder_values(gm, captured.example_inputs, {}))
    return captured


@pytest.mark.parametrize("dialect", DIALECTS)
def test_frozen_batch_norm_backbone(dialect):
    """resnet18 with FrozenBatchNorm2d, as torchvision's Faster R-CNN builds its backbone."""
    torchvision = pytest.importorskip("torchvision")
    from torchvision.ops.misc import FrozenBatchNorm2d

    torch.manual_seed(0)
    model = randomize_frozen(torchvision.models.resnet18(norm_layer=FrozenBatchNorm2d))
    captured = with_shapes(capture(model, (torch.randn(1, 3, 64, 64),), method=CAPTURE_METHOD[dialect]))
    result = check_fold(captured, frozen=True)
    assert result.removed == 20 and all("frozen batch norm" in line for line in result.log if "folded" in line)
    # the scale/shift arithmetic is gone with the fold
    assert not any(node_kind(result.graph_module, n) == "mul" for n in result.graph_module.graph.nodes)


class ConvFrozen(nn.Module):
    def __init__(self, out: int = 4):
        from torchvision.ops.misc import FrozenBatchNorm2d

        super().__init__()
        self.conv = nn.Conv2d(3, out, 3)
        self.bn = FrozenBatchNorm2d(out)

    def forward(self, x):
        return self.bn(self.conv(x))


def test_frozen_batch_norm_as_a_leaf():
    """A FrozenBatchNorm2d kept as one call: inlined (it holds running statistics), then folded."""
    pytest.importorskip("torchvision")
    from torchvision.ops.misc import FrozenBatchNorm2d

    captured = capture(randomize_frozen(ConvFrozen()), (torch.randn(2, 3, 8, 8),), leaf_modules=[FrozenBatchNorm2d])
    assert [n.op for n in captured.graph_module.graph.nodes].count("call_module") == 2
    result = check_fold(with_shapes(captured), frozen=True)
    assert result.removed == 1 and [n.op for n in result.graph_module.graph.nodes] == [
        "placeholder",
        "call_module",
        "output",
    ]


def test_frozen_batch_norm_needs_a_known_rank_in_the_torch_dialect():
    # without shapes, (1, C, 1, 1) * conv(x) could be an unbatched (C, H, W) conv output grown to 4-D
    pytest.importorskip("torchvision")
    model = randomize_frozen(ConvFrozen())
    bare = torch.fx.symbolic_trace(model)  # a graph with no shape facts
    result = apply_pass(bare, "fold_bn")
    assert not result.changed and "keeps the shape of the layer output" in result.skipped[0]
    assert fx008(bare) == []
    # capture records the shapes, so the same graph folds there
    captured = capture(model, (torch.randn(2, 3, 8, 8),), method="symbolic_trace")
    assert apply_pass(captured.graph_module, "fold_bn").changed and len(fx008(captured)) == 1


class Affine(nn.Module):
    """conv, then x * scale + shift from parameters, in a shape or dtype that is not per-channel."""

    def __init__(self, scale_shape, dtype=torch.float32):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.scale = nn.Parameter(torch.randn(scale_shape, dtype=dtype))
        self.shift = nn.Parameter(torch.randn(4, 1, 1))

    def forward(self, x):
        return self.conv(x) * self.scale + self.shift


@pytest.mark.parametrize(
    ("scale_shape", "dtype", "reason"),
    [
        ((4, 1, 1), torch.float32, None),  # per channel: folds
        ((), torch.float32, None),  # one number: folds
        ((4, 6, 6), torch.float32, "not one value per output channel"),
        ((4, 1, 1), torch.float64, "type promotion"),
    ],
)
def test_per_channel_affine_after_a_conv(scale_shape, dtype, reason):
    torch.manual_seed(0)
    captured = capture(Affine(scale_shape, dtype).eval(), (torch.randn(2, 3, 8, 8),), method="export")
    result = apply_pass(captured.graph_module, "fold_bn")
    assert verify(captured, result.graph_module).ok
    if reason is None:
        assert result.removed == 1 and len(fx008(captured)) == 1
    else:
        assert not result.changed and reason in result.skipped[0] and fx008(captured) == []


# --------------------------------------------------------------------------------------------------
# Linear + BatchNorm1d in the ATen dialect, as export writes it and after decomposition


class LinearBn(nn.Module):
    def __init__(self, bias: bool = True):
        super().__init__()
        self.fc = nn.Linear(5, 7, bias=bias)
        self.bn = nn.BatchNorm1d(7)

    def forward(self, x):
        return self.bn(self.fc(x))


class MatmulBn(nn.Module):
    """``x @ W.t() + b`` written out: mm then add after decomposition."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(7, 5))
        self.bias = nn.Parameter(torch.randn(7))
        self.bn = nn.BatchNorm1d(7)

    def forward(self, x):
        return self.bn(torch.matmul(x, self.weight.t()) + self.bias)


LINEARS = {
    "linear": (lambda: LinearBn(), False, "aten.linear"),
    "addmm": (lambda: LinearBn(), True, "aten.addmm"),
    "mm": (lambda: LinearBn(bias=False), True, "aten.mm"),
    "mm+add": (lambda: MatmulBn(), True, "aten.mm"),
}


@pytest.mark.parametrize("case", list(LINEARS))
def test_linear_batch_norm_1d_in_the_aten_dialect(case):
    build, decompose, op = LINEARS[case]
    torch.manual_seed(0)
    model = randomize_batchnorm(build(), seed=2).eval()
    x = torch.randn(4, 5)
    captured = capture(model, (x,), method="export")
    if decompose:
        gm = torch.export.export(model, (x,)).run_decompositions().module()
        captured = dataclasses.replace(captured, graph_module=capture(gm, (x,)).graph_module)
    targets = {str(n.target) for n in captured.graph_module.graph.nodes}
    assert any(t.startswith(op) for t in targets), targets

    result = check_fold(captured)

    assert result.removed == 1 and batch_norm_nodes(result.graph_module) == []


def test_decomposed_training_batch_norm_is_refused_with_the_fix():
    model = randomize_batchnorm(LinearBn(), seed=2).train()
    gm = torch.export.export(model, (torch.randn(4, 5),)).run_decompositions().module()
    assert any("_native_batch_norm_legit_functional" in str(n.target) for n in gm.graph.nodes)
    result = apply_pass(gm, "fold_bn")
    assert not result.changed and "call model.eval() before capture" in result.skipped[0]
    (found,) = fx008(gm)
    assert "call model.eval() before capture" in found.message


@pytest.mark.parametrize("dialect", DIALECTS)
def test_same_padded_conv_that_reads_its_weight_shape(dialect):
    # timm's Conv2dSame (TF "same" padding, pnasnet's and the tf_ efficientnets' convs) computes its padding from
    # self.weight.shape, so the weight's get_attr had a second user, getattr(weight, "shape"); fold_bn counted it
    # as a second reader of the weight and refused ("the weights of conv2d are used elsewhere"). A read of the
    # shape is not a read of the value: the fold keeps it, pointed at the folded weight of the same shape.
    layers = timm.layers
    model = nn.Sequential(
        layers.create_conv2d(3, 8, 3, stride=2, padding="same"),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        layers.create_conv2d(8, 8, 5, stride=2, padding="same", bias=True),
        nn.BatchNorm2d(8),
    )
    assert isinstance(model[0], layers.Conv2dSame)
    model = randomize_batchnorm(model, seed=3).eval()
    captured = capture(model, (torch.randn(1, 3, 17, 17),), method=CAPTURE_METHOD[dialect])
    assert len(after_a_layer(captured.graph_module)) == 2

    result = check_fold(captured)

    assert result.removed == 2
    originals = {parameter.data_ptr() for parameter in model.parameters()}
    held = {parameter.data_ptr() for parameter in result.graph_module.parameters()}
    assert originals.isdisjoint(held), "the unfolded weights are still held"
    # the folded pairs are stored at the convs' own paths, as the model's state dict has them
    assert set(result.graph_module.state_dict()) == {"0.weight", "0.bias", "3.weight", "3.bias"}


def test_conv_module_also_passed_whole_to_an_opaque_call():
    # transformers' MobileNetV2 pads each conv's input with apply_tf_padding(features, self.convolution): symbolic
    # tracing keeps that function as one opaque call that receives the conv *module*, so the conv is read from two
    # places. fold_bn folds into a copy for the conv's call and leaves the opaque call the original module: exact
    # whatever that call reads, at the price of the conv's weights stored twice.
    transformers = pytest.importorskip("transformers")
    config = transformers.MobileNetV2Config(image_size=32, depth_multiplier=0.35)
    torch.manual_seed(0)
    model = transformers.MobileNetV2Model(config)
    # BatchNorm statistics measured on random images: random ones saturated every ReLU6 of this net (std-0.02
    # convs), its output was the same for every input and verification could not fail (it now says so)
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.momentum = None  # a cumulative average over the batches below
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(8, 3, 32, 32))
    model.eval()
    before = {name: p.clone() for name, p in model.state_dict().items()}
    captured = capture(model, (torch.randn(2, 3, 32, 32),), method="symbolic_trace")
    gm = captured.graph_module
    opaque = [n for n in gm.graph.nodes if n.op == "call_function" and "apply_tf_padding" in str(n.target)]
    assert len(opaque) == 52 and len(after_a_layer(gm)) == 52

    result = check_fold(captured)

    assert result.removed == 52
    folded = result.graph_module
    for call in (n for n in folded.graph.nodes if n.op == "call_function" and "apply_tf_padding" in str(n.target)):
        kept = folded.get_submodule(str(call.args[1].target))
        assert str(call.args[1].target).endswith("_unfolded")
        original = gm.get_submodule(str(call.args[1].target).removesuffix("_unfolded"))
        assert torch.equal(kept.weight, original.weight) and kept.stride == original.stride  # the conv, unfolded
    assert all(torch.equal(before[name], t) for name, t in model.state_dict().items()), "the model was changed"
