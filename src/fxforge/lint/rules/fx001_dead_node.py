"""FX001 dead-node: a node whose value nobody uses and whose call has no side effect.

Liveness is the ``dead_code`` pass's own (:func:`fxforge.passes.dead_code.live_nodes`), so every finding is one
that ``lint --fix`` can remove and nothing the pass must keep (a training-mode BatchNorm updating its running
statistics, an in-place write) is reported.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Node
from torch.fx.passes.shape_prop import TensorMetadata

from fxforge.graphs import aten_packet, target_name
from fxforge.lint import LintContext, rule
from fxforge.passes.dead_code import live_nodes


@rule("FX001", "dead-node", "warning", "node computes a value that nothing uses", fix="dead_code")
def check(ctx: LintContext):
    live = live_nodes(ctx.gm)
    for node in ctx.graph.nodes:
        if node.users or node in live or node.op in ("placeholder", "output", "get_attr"):
            continue
        if _discarded_unpacked_item(node, live):
            continue
        if (aten_packet(node) or "").startswith("_assert"):
            # a check torch.export writes (and writes again on every re-export: QA, an optimized T5 linted with a
            # warning), not a value the code computes; dead_code still removes those the recorded value proves
            continue
        yield node, f"{node.name} ({target_name(node)}) is computed but never used"


def _discarded_unpacked_item(node: Node, live: set) -> bool:
    """An item of a live tuple that the code unpacked and dropped (``a, _ = x.chunk(2)``, ``out, _ = self.gate(x)``).

    Indexing costs nothing and the tuple is computed anyway; the ``_`` is how Python spells "not needed", so
    reporting it would be noise that no edit of the user's code could clear.
    """
    if node.op != "call_function" or node.target is not operator.getitem or not isinstance(node.args[0], Node):
        return False
    source = node.args[0]
    if source not in live:
        return False
    # a tuple, not a tensor indexed (a dead `y[0]` or `y[:, :4]` is reported, QA): every reader of it takes one item
    # by position, and what it holds is not recorded as one tensor
    if isinstance(source.meta.get("val", source.meta.get("tensor_meta")), (torch.Tensor, TensorMetadata)):
        return False
    return all(
        user.op == "call_function" and user.target is operator.getitem and isinstance(user.args[1], int)
        for user in source.users
    )
