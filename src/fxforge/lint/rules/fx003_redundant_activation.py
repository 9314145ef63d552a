"""FX003 redundant-activation: an activation applied to a value that is already in its range does nothing."""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import fx, nn

from fxforge.graphs import aten_packet, node_arg, node_kind, submodule, target_name
from fxforge.lint import LintContext, rule

_INF = math.inf


def _clamp_bounds(gm: nn.Module, node: fx.Node) -> tuple[float, float] | None:
    """(lo, hi) when ``node`` computes ``clamp(x, lo, hi)``: relu, relu6 and hardtanh in any form."""
    kind = node_kind(gm, node)
    if kind == "relu":
        return 0.0, _INF
    packet = aten_packet(node)
    if packet in ("hardtanh", "hardtanh_"):  # aten.hardtanh(x, min_val=-1, max_val=1); relu6 becomes it
        lo, hi = node_arg(node, 1, "min_val", -1.0), node_arg(node, 2, "max_val", 1.0)
        return (float(lo), float(hi)) if _is_number(lo) and _is_number(hi) else None
    if node.op == "call_module":
        module = submodule(gm, node)
        if type(module) in (nn.ReLU6, nn.Hardtanh):
            return float(module.min_val), float(module.max_val)
        return None
    if node.op == "call_function" and node.target is F.hardtanh:
        lo, hi = node_arg(node, 1, "min_val", -1.0), node_arg(node, 2, "max_val", 1.0)
        return (float(lo), float(hi)) if _is_number(lo) and _is_number(hi) else None
    if kind == "relu6":  # F.relu6, aten.relu6
        return 0.0, 6.0
    return None


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _output_range(gm: nn.Module, node: fx.Node) -> tuple[float, float] | None:
    """Bounds every output value of ``node`` lies in, when it is an activation with a bounded range."""
    bounds = _clamp_bounds(gm, node)
    if bounds is not None:
        return bounds
    if node_kind(gm, node) in ("sigmoid", "softmax"):
        return 0.0, 1.0
    return None


def _name(gm: nn.Module, node: fx.Node) -> str:
    kind = node_kind(gm, node)
    bounds = _clamp_bounds(gm, node)
    if bounds is not None and kind != "relu":
        lo, hi = bounds
        label = "relu6" if (lo, hi) == (0.0, 6.0) else f"hardtanh({lo:g}, {hi:g})"
        return f"{node.name} ({label})"
    return f"{node.name} ({kind or target_name(node)})"


@rule("FX003", "redundant-activation", "warning", "activation applied to a value already in its output range")
def check(ctx: LintContext):
    """Clamp-like activations (relu, relu6, hardtanh) after an activation with a bounded range.

    * outer redundant: ``clamp(lo, hi)`` applied to a value already within ``[lo, hi]`` (relu of relu,
      relu of sigmoid/softmax/relu6, relu6 of sigmoid...) returns its input; always safe to drop;
    * inner redundant: ``clamp(lo2, hi2)(clamp(lo1, hi1)(x))`` with ``[lo2, hi2]`` inside ``[lo1, hi1]``
      (relu6 of relu) equals the outer clamp alone; reported only when the outer is the inner's
      single user, since other users still need the inner value.

    Works on both dialects: ``node_kind`` classifies modules, functions, methods and ATen ops, and
    ATen ``hardtanh`` (what relu6 becomes) is read with its bounds.
    """
    gm = ctx.gm
    for node in ctx.graph.nodes:
        if node.op not in ("call_module", "call_function", "call_method"):
            continue
        outer = _clamp_bounds(gm, node)
        if outer is None or not node.args or not isinstance(node.args[0], fx.Node):
            continue
        inner = node.args[0]
        inner_range = _output_range(gm, inner)
        if inner_range is None:
            continue
        lo, hi = outer
        if lo <= inner_range[0] and inner_range[1] <= hi:
            yield (
                node,
                f"{_name(gm, node)} is redundant: its input from {_name(gm, inner)} already lies in "
                f"[{inner_range[0]:g}, {inner_range[1]:g}]",
            )
        elif (
            _clamp_bounds(gm, inner) is not None
            and len(inner.users) == 1
            and inner_range[0] <= lo
            and hi <= inner_range[1]
        ):
            yield (
                inner,
                f"{_name(gm, inner)} is redundant: its only user {_name(gm, node)} clamps to a narrower range "
                f"[{lo:g}, {hi:g}] anyway",
            )
