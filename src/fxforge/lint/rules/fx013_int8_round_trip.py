"""FX013 int8-round-trip: an int8 graph dequantizes a value only to quantize it again a few ops later.

FX graph-mode quantization leaves an op it has no int8 form for (``Tensor.flatten``, a ``torch.relu``
that does not fuse into the conv before it...) in float, with a ``dequantize`` before it and a
``quantize_per_tensor`` after it. Between two int8 layers that costs two conversions on every run
and a second rounding to a new scale, for ops that int8 could often run directly.
"""

from __future__ import annotations

import torch
from torch import fx, nn

from fxforge.graphs import submodule, target_name
from fxforge.lint import LintContext, rule
from fxforge.vocabulary import int8_weights, quant_kind

# A float region larger than this is a deliberate float section, not a conversion left by accident.
MAX_REGION = 16

# Spellings FX graph mode leaves in float, and the ones it quantizes (checked with torch 2.14.1).
_HINTS = (
    (
        lambda n: n.op == "call_method" and n.target == "flatten",
        "torch.flatten(x, 1) stays int8 where x.flatten(1) does not",
    ),
    (
        lambda n: n.op == "call_function" and n.target is torch.relu,
        "F.relu or nn.ReLU after a conv or linear fuses into it, torch.relu does not",
    ),
)


def _float_region(gm: nn.Module, quantize: fx.Node) -> tuple[list[fx.Node], list[fx.Node]] | None:
    """(dequantize nodes, float nodes) when every value ``quantize`` requantizes comes, through
    parameter-free float ops used nowhere else, from ``dequantize`` nodes; None otherwise."""
    source = quantize.args[0] if quantize.args else None
    if not isinstance(source, fx.Node):
        return None
    dequantized: dict[fx.Node, None] = {}
    region: dict[fx.Node, None] = {}
    pending = [source]
    while pending:
        node = pending.pop()
        if node in dequantized or node in region:
            continue
        kind = quant_kind(gm, node)
        if kind == "dequantize":
            dequantized[node] = None
            continue
        if kind is not None or node.op not in ("call_function", "call_method", "call_module"):
            return None  # int8 data, an observer, a graph input or a constant enters the region
        if node.op == "call_module" and _has_weights(submodule(gm, node)):
            return None  # a weighted layer in float: kept there on purpose (--float-layer)
        region[node] = None
        if len(region) > MAX_REGION:
            return None
        pending.extend(node.all_input_nodes)
    if not dequantized:
        return None
    inside = set(region) | {quantize}
    if any(user not in inside for node in region for user in node.users):
        return None  # the float values are used elsewhere too: the dequantize is needed anyway
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    return sorted(dequantized, key=order.get), sorted(region, key=order.get)


def _has_weights(module: nn.Module | None) -> bool:
    return module is not None and (any(True for _ in module.parameters()) or bool(int8_weights(module)))


def _describe(node: fx.Node) -> str:
    target = target_name(node)
    return node.name if node.op == "call_module" or target == node.name else f"{node.name} ({target})"


@rule(
    "FX013",
    "int8-round-trip",
    "info",
    "an int8 value is dequantized for parameter-free float ops and quantized again",
    dialects=("torch",),
)
def check(ctx: LintContext):
    """Every ``quantize`` node whose input is computed, by parameter-free float ops used nowhere else
    (or by nothing at all), from ``dequantize`` nodes. Float regions with a weighted layer (kept in
    float on purpose) or with other float inputs are left alone. Torch dialect only: an ATen graph
    from torchao's PT2E flow represents *every* int8 op as dequantize -> float op -> quantize, which
    Inductor fuses away, so there the pattern is the representation, not a finding."""
    gm = ctx.gm
    for node in ctx.graph.nodes:
        if quant_kind(gm, node) != "quantize":
            continue
        found = _float_region(gm, node)
        if found is None:
            continue
        dequantized, region = found
        sources = ", ".join(d.name for d in dequantized)
        if not region:
            yield node, f"{sources} feeds {node.name} directly: two conversions that only round again to a new scale"
            continue
        ops = ", ".join(_describe(n) for n in region)
        hint = "".join(f"; {text}" for matches, text in _HINTS if any(matches(n) for n in region))
        yield (
            node,
            f"{sources} -> {ops} -> {node.name}: int8 -> float -> int8 round trip, "
            f"two conversions and an extra rounding per run{hint}",
        )
