"""FX007 duplicate-subexpression: two pure nodes compute the same value from the same inputs; one is wasted work."""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from fxforge.graphs import has_side_effects, target_name
from fxforge.lint import LintContext, rule


class _Unhashable(Exception):
    pass


def _key(value: Any, canonical: dict[fx.Node, str]) -> Any:
    """A hashable stand-in for an argument; equal keys mean equal arguments.

    Nodes map to the name of their canonical (first) equivalent node, so chains of duplicates are found
    in one pass. Scalars carry their type, since ``1 == 1.0 == True`` in Python but not as tensor args.
    """
    if isinstance(value, fx.Node):
        return ("node", canonical.get(value, value.name))
    if value is None or isinstance(value, (bool, int, float, str, complex)):
        return (type(value).__name__, value)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_key(v, canonical) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _key(v, canonical)) for k, v in value.items()))
    if isinstance(value, slice):
        return ("slice", _key(value.start, canonical), _key(value.stop, canonical), _key(value.step, canonical))
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return (type(value).__name__, str(value))
    raise _Unhashable  # tensors, modules, arbitrary objects: no cheap sound equality


@rule(
    "FX007",
    "duplicate-subexpression",
    "info",
    "node computes the same value as an earlier node",
    fix="cse",
)
def check(ctx: LintContext):
    """Pure ``call_*`` nodes with the same op, target, args and kwargs (arguments compared after mapping
    earlier duplicates to their first occurrence). Effectful nodes (``has_side_effects``: in-place ops,
    random ops, user modules, training-mode dropout/BN) are never merged; nodes with arguments that have
    no cheap equality (constant tensors, objects) are skipped. One dict lookup per node: linear time.
    Both dialects: in torch dialect typically repeated ``x.size(0)`` or stateless modules applied twice to
    the same value, in aten dialect repeated ops on the same inputs.
    """
    gm = ctx.gm
    seen: dict[Any, fx.Node] = {}
    canonical: dict[fx.Node, str] = {}
    for node in ctx.graph.nodes:
        if node.op not in ("call_function", "call_method", "call_module"):
            continue
        if has_side_effects(gm, node):
            continue
        try:
            key = (node.op, node.target, _key(node.args, canonical), _key(dict(node.kwargs), canonical))
            hash(key)
        except (_Unhashable, TypeError):
            continue
        first = seen.get(key)
        if first is None:
            seen[key] = node
            continue
        canonical[node] = canonical.get(first, first.name)
        yield node, f"{node.name} ({target_name(node)}) computes the same value as {first.name}; reuse it"
