"""FX004 leftover-dropout: dropout in an inference graph is a no-op at best and random noise at worst."""

from __future__ import annotations

from collections.abc import Iterator

from torch import fx, nn

from fxforge.graphs import aten_packet, node_arg, node_kind, submodule, target_name
from fxforge.lint import LintContext, rule


def _mode(gm: nn.Module, node: fx.Node) -> bool | None:
    """Whether the dropout node is active (True), a no-op (False) or depends on something unknown (None)."""
    if node.op == "call_module":
        module = submodule(gm, node)
        return bool(module.training) and float(getattr(module, "p", 1.0)) > 0
    packet = aten_packet(node)
    if packet is not None:  # aten.dropout(input, p, train); native_dropout(input, p, train | None)
        p, train = node_arg(node, 1, "p"), node_arg(node, 2, "train")
    elif node.op == "call_function":
        # F.dropout*(input, p, training, inplace) and torch.dropout(input, p, train)
        p = node_arg(node, 1, "p", 0.5)
        train = node_arg(node, 2, "training", node.kwargs.get("train"))
    else:
        return None
    if isinstance(p, (int, float)) and p == 0:
        return False
    return train if isinstance(train, bool) else None


@rule("FX004", "leftover-dropout", "warning", "dropout left in an inference graph", fix="remove_dropout")
def check(ctx: LintContext) -> Iterator[tuple[fx.Node, str]]:
    """Every dropout node: ``nn.Dropout*`` modules (torch dialect), ``F.dropout*``/``torch.dropout`` calls
    and the ATen dropout ops (``aten.dropout``, ``native_dropout``..., and the in-place ``aten.dropout_``... of
    ``nn.Dropout(inplace=True)``). torch.export keeps an eval-mode dropout as ``aten.dropout(x, p, False)``
    (``aten.dropout_`` when in place), so the rule sees it in both dialects. The message says
    whether the dropout is a no-op (eval mode, p=0) or active (it zeroes activations at random)."""
    gm = ctx.gm
    for node in ctx.graph.nodes:
        if node_kind(gm, node) != "dropout":  # the pass's own test: node_kind knows the in-place ATen forms
            continue
        active = _mode(gm, node)
        what = f"{node.name} ({target_name(node) if node.op != 'call_module' else type(submodule(gm, node)).__name__})"
        if active is True:
            # remove_dropout keeps an active dropout (removing it changes what the model computes): no fix to name
            yield (
                node,
                f"{what} is active (training mode): it zeroes activations at random at inference; call "
                "model.eval() before capture (remove_dropout leaves an active dropout in place)",
                None,
            )
        elif active is False:
            yield node, f"{what} is a no-op at inference; remove it"
        else:
            yield node, f"{what} is left in the graph; whether it is active depends on a value computed at run time"
