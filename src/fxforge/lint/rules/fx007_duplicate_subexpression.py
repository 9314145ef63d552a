"""FX007 duplicate-subexpression: two pure nodes compute the same value from the same inputs; one is wasted work."""

from __future__ import annotations

from fxforge.graphs import target_name
from fxforge.lint import LintContext, rule
from fxforge.passes.cse import find_duplicates


@rule(
    "FX007",
    "duplicate-subexpression",
    "info",
    "node computes the same value as an earlier node",
    fix="cse",
)
def check(ctx: LintContext):
    """Pure ``call_*`` nodes with the same op, target, args and kwargs (arguments compared after mapping
    earlier duplicates to their first occurrence). The analysis is the ``cse`` pass's own
    (``fxforge.passes.cse.find_duplicates``), so every finding is a merge ``cse`` makes: random ops, effectful
    nodes, modules not known to be pure, values an in-place op may write and pairs both returned are never
    reported; nodes with arguments that have no cheap equality (constant tensors, objects) are skipped. One
    dict lookup per node: linear time. Both dialects: in torch dialect typically repeated ``x.size(0)`` or
    stateless modules applied twice to the same value, in aten dialect repeated ops on the same inputs.
    """
    for duplicate in find_duplicates(ctx.gm):
        node, first = duplicate.node, duplicate.first
        if duplicate.refused is None and node.op != "get_attr":  # a second read of an attribute costs nothing
            yield node, f"{node.name} ({target_name(node)}) computes the same value as {first.name}; reuse it"
