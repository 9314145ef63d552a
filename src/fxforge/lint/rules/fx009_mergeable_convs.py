"""FX009 mergeable-convs: back-to-back convs (or linears) that one layer computes exactly; the second is wasted work."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import fx, nn

from fxforge.graphs import aten_packet, get_attr_value, node_arg, node_kind, submodule
from fxforge.lint import LintContext, rule

_CONV_FUNCTIONS = (F.conv1d, F.conv2d, F.conv3d)


@dataclass
class _Layer:
    """What the rule needs to know about a conv or linear call, in any form."""

    kind: str  # "conv" or "linear"
    weight: torch.Tensor
    bias: torch.Tensor | None
    stride: tuple[int, ...] = ()
    padding: tuple[int, ...] | str = ()
    groups: int = 1
    padding_mode: str = "zeros"
    owner: str = ""  # the module path or weight target: merging rewrites it

    @property
    def kernel(self) -> tuple[int, ...]:
        return tuple(self.weight.shape[2:])

    def no_padding(self) -> bool:
        if isinstance(self.padding, str):
            return self.padding == "valid" or (self.padding == "same" and all(k == 1 for k in self.kernel))
        return all(p == 0 for p in self.padding)


def _tuple(value: object, n: int) -> tuple[int, ...] | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * n
    if isinstance(value, (tuple, list)) and all(isinstance(v, int) for v in value):
        return tuple(value) * n if len(value) == 1 else tuple(value)
    return None


def _stored(gm: nn.Module, value: object) -> torch.Tensor | bool | None:
    """The tensor a ``get_attr`` argument names; None for None; False for anything computed in the graph."""
    if value is None:
        return None
    if isinstance(value, fx.Node) and value.op == "get_attr":
        tensor = get_attr_value(gm, str(value.target))
        return tensor if isinstance(tensor, torch.Tensor) else False
    return False


def _layer(gm: nn.Module, node: fx.Node) -> _Layer | None:
    kind = node_kind(gm, node)
    if kind not in ("conv", "linear"):
        return None
    if node.op == "call_module":
        module = submodule(gm, node)
        if kind == "linear":
            return _Layer("linear", module.weight, module.bias, owner=str(node.target))
        return _Layer(
            "conv",
            module.weight,
            module.bias,
            tuple(module.stride),
            module.padding if isinstance(module.padding, str) else tuple(module.padding),
            module.groups,
            module.padding_mode,
            str(node.target),
        )
    weight = _stored(gm, node_arg(node, 1, "weight"))
    bias = _stored(gm, node_arg(node, 2, "bias"))
    if weight is None or weight is False or bias is False:
        return None
    owner = str(node_arg(node, 1, "weight").target)
    if kind == "linear":
        return _Layer("linear", weight, bias, owner=owner)
    n = weight.dim() - 2
    packet = aten_packet(node)
    if packet == "convolution":  # (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
        stride, padding, groups = node.args[3], node.args[4], node.args[8]
    elif packet in ("conv1d", "conv2d", "conv3d") or node.target in _CONV_FUNCTIONS:
        # (input, weight, bias, stride=1, padding=0, dilation=1, groups=1)
        stride = node_arg(node, 3, "stride", 1)
        padding = node_arg(node, 4, "padding", 0)
        groups = node_arg(node, 6, "groups", 1)
    else:
        return None
    stride_t = _tuple(stride, n)
    padding_t = padding if isinstance(padding, str) else _tuple(padding, n)
    if stride_t is None or padding_t is None or not isinstance(groups, int):
        return None
    return _Layer("conv", weight, bias, stride_t, padding_t, groups, "zeros", owner)


def _why_exact(first: _Layer, second: _Layer) -> str | None:
    """Why ``second(first(x))`` equals a single layer exactly, or None when the rule cannot be sure."""
    if first.kind == "linear" and second.kind == "linear":
        return "linear after linear is one linear map (W2 @ W1, W2 @ b1 + b2)"
    if first.kind != "conv" or second.kind != "conv" or first.weight.dim() != second.weight.dim():
        return None
    if first.groups != 1 or second.groups != 1:
        return None
    pointwise_second = all(k == 1 for k in second.kernel) and all(s == 1 for s in second.stride)
    if pointwise_second and second.no_padding():
        return (
            f"a 1x1 stride-1 unpadded conv after a {_k(first)} conv mixes channels only: "
            f"one {_k(first)} conv with weights W2 @ W1 computes both"
        )
    pointwise_first = all(k == 1 for k in first.kernel) and all(s == 1 for s in first.stride)
    if pointwise_first and first.no_padding():
        if second.no_padding():
            return (
                f"a {_k(second)} unpadded conv after a 1x1 stride-1 unpadded conv: "
                f"one {_k(second)} conv with weights W2 @ W1 computes both"
            )
        if first.bias is None and second.padding_mode == "zeros":
            return (
                f"a zero-padded {_k(second)} conv after a bias-free 1x1 stride-1 conv (which maps the zero padding "
                f"to zeros): one {_k(second)} conv with weights W2 @ W1 computes both"
            )
    return None


def _k(layer: _Layer) -> str:
    return "x".join(str(k) for k in layer.kernel)


@rule(
    "FX009",
    "mergeable-convs",
    "info",
    "two consecutive linear layers that one layer computes exactly",
    fix="merge_convs",
)
def check(ctx: LintContext):
    """Conv then conv (same dimensionality, ``groups=1``) or linear then linear, where the first one's
    output goes only to the second and merging is exact:

    * linear -> linear, always;
    * kxk conv (any stride/padding/dilation) -> 1x1 conv with stride 1 and no padding;
    * 1x1 conv with stride 1 and no padding -> kxk conv with no padding, or with zero padding when the
      first conv has no bias (otherwise the bias would show up where the second conv pads with zeros).

    Modules, ``F.conv*``/``F.linear`` with stored weights, and ATen ``conv1d/2d/3d``, ``convolution`` and
    ``linear`` (arguments read from the call, weights from the ``get_attr`` nodes). Layers whose
    module or weights are used elsewhere are skipped: merging would change the other use. The merged
    layer is not always cheaper (a bottleneck pair has fewer weights than its product); the message
    gives both weight counts.
    """
    gm = ctx.gm
    uses: Counter = Counter()
    for node in ctx.graph.nodes:
        if node.op == "call_module":
            uses[str(node.target)] += 1
        elif node.op == "get_attr":
            uses[str(node.target)] += len(node.users)
    for node in ctx.graph.nodes:
        second = _layer(gm, node)
        if second is None or not node.args or not isinstance(node.args[0], fx.Node):
            continue
        producer = node.args[0]
        if len(producer.users) != 1:
            continue
        first = _layer(gm, producer)
        if first is None or uses[first.owner] > 1 or uses[second.owner] > 1:
            continue
        reason = _why_exact(first, second)
        if reason is None:
            continue
        separate = first.weight.numel() + second.weight.numel()
        # the merged layer maps the first's inputs to the second's outputs with the combined kernel
        merged = second.weight.shape[0] * first.weight.shape[1] * _numel(_merged_kernel(first, second))
        yield (
            node,
            f"{producer.name} and {node.name} can be merged into one layer: {reason} "
            f"({separate:,} weights now, {merged:,} merged)",
        )


def _numel(shape: tuple[int, ...]) -> int:
    total = 1
    for s in shape:
        total *= s
    return total


def _merged_kernel(first: _Layer, second: _Layer) -> tuple[int, ...]:
    # one of the two kernels is 1x1 (or both are linear, with no kernel): the merged kernel is the other
    return tuple(a + b - 1 for a, b in zip(first.kernel, second.kernel))
