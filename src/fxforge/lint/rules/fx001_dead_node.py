"""FX001 dead-node: a node whose value nobody uses and whose call has no side effect."""

from __future__ import annotations

from fxforge.graphs import has_side_effects, target_name
from fxforge.lint import LintContext, rule


@rule("FX001", "dead-node", "warning", "node computes a value that nothing uses", fix="dead_code")
def check(ctx: LintContext):
    for node in ctx.graph.nodes:
        if node.users or node.op in ("placeholder", "output", "get_attr"):
            continue
        if has_side_effects(ctx.gm, node):
            continue
        yield node, f"{node.name} ({target_name(node)}) is computed but never used"
