"""FX005 identity-op: a node that returns its input unchanged (nn.Identity, x * 1, x + 0) costs a kernel for nothing."""

from __future__ import annotations

import operator

import torch
from torch import fx, nn

from fxforge.graphs import aten_packet, node_kind, node_value, target_name
from fxforge.lint import LintContext, rule

# (name, neutral literal, literal may be on the left); names are tensor methods, torch functions and ATen packets
_ARITH = {
    "mul": (1, True),
    "add": (0, True),
    "sub": (0, False),
    "div": (1, False),
    "true_divide": (1, False),
}
_FUNCTIONS = {
    operator.mul: "mul",
    operator.add: "add",
    operator.sub: "sub",
    operator.truediv: "div",
    torch.mul: "mul",
    torch.add: "add",
    torch.sub: "sub",
    torch.div: "div",
    torch.true_divide: "true_divide",
}


def _operation(node: fx.Node) -> str | None:
    if node.op == "call_method":
        return str(node.target) if node.target in _ARITH else None
    if node.op != "call_function":
        return None
    packet = aten_packet(node)
    if packet is not None:
        return packet if packet in _ARITH else None
    return _FUNCTIONS.get(node.target)


def _dtype(node: fx.Node) -> torch.dtype | None:
    value = node_value(node)
    return getattr(value, "dtype", None)


def _neutral(literal: object, neutral: int, operand: fx.Node, op: str) -> bool:
    """``literal`` is the neutral element for ``op`` and applying it cannot change ``operand``'s dtype."""
    if isinstance(literal, bool) or not isinstance(literal, (int, float)) or literal != neutral:
        return False
    dtype = _dtype(operand)
    if op in ("div", "true_divide") or isinstance(literal, float):
        # true division and float literals promote integer tensors to float: only for known float inputs
        return dtype is not None and dtype.is_floating_point
    return dtype is not torch.bool  # bool + 0 and bool * 1 give int64; unknown dtype: assume not bool


def _identity_operand(node: fx.Node, op: str) -> tuple[fx.Node, object] | None:
    neutral, commutes = _ARITH[op]
    if node.kwargs.get("rounding_mode") is not None or len(node.args) != 2:
        return None
    if set(node.kwargs) - {"alpha"}:
        return None
    left, right = node.args
    if isinstance(left, fx.Node) and _neutral(right, neutral, left, op):
        return left, right
    if commutes and isinstance(right, fx.Node) and _neutral(left, neutral, right, op):
        return right, left
    return None


@rule("FX005", "identity-op", "info", "node returns its input unchanged", fix="remove_identity")
def check(ctx: LintContext):
    """``nn.Identity`` modules (torch dialect; torch.export drops them) and arithmetic with the neutral
    literal: ``x * 1``, ``1 * x``, ``x + 0``, ``0 + x``, ``x - 0``, ``x / 1`` as operators, torch functions,
    tensor methods or ATen ops (both dialects). Only non-in-place forms, and only where the literal cannot
    change the dtype (``x / 1`` and float literals need a known floating-point input; ``bool + 0`` is int).

    Deliberately not flagged: ``clone`` (it guarantees a separate buffer; dropping it can create aliasing
    an in-place op later relies on not having) and ``contiguous``/``to`` (they may change memory layout).
    """
    gm: nn.Module = ctx.gm
    for node in ctx.graph.nodes:
        if node.op == "call_module" and node_kind(gm, node) == "identity":
            yield node, f"{node.name} is an nn.Identity module ({node.target}); it returns its input"
            continue
        op = _operation(node)
        if op is None:
            continue
        found = _identity_operand(node, op)
        if found is None:
            continue
        operand, literal = found
        yield node, f"{node.name} ({target_name(node)}) with the literal {literal!r} returns {operand.name} unchanged"
