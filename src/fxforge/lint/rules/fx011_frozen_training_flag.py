"""FX011 frozen-training-flag: dropout/norm call with a constant training flag: it ignores train()/eval()."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import fx

from fxforge.graphs import aten_packet, node_arg, target_name
from fxforge.lint import LintContext, rule

# torch dialect: function -> (flag name, flag position, running-mean position or None, p position or None)
_FUNCTIONS = {
    F.dropout: ("training", 2, None, 1),
    F.dropout1d: ("training", 2, None, 1),
    F.dropout2d: ("training", 2, None, 1),
    F.dropout3d: ("training", 2, None, 1),
    F.alpha_dropout: ("training", 2, None, 1),
    F.feature_alpha_dropout: ("training", 2, None, 1),
    torch.dropout: ("train", 2, None, 1),
    torch.alpha_dropout: ("train", 2, None, 1),
    torch.feature_dropout: ("train", 2, None, 1),
    torch.feature_alpha_dropout: ("train", 2, None, 1),
    F.batch_norm: ("training", 5, 1, None),
    F.instance_norm: ("use_input_stats", 5, 1, None),
    torch.batch_norm: ("training", 5, 3, None),
    torch.instance_norm: ("use_input_stats", 5, 3, None),
}
# aten dialect: packet -> same layout
_ATEN = {
    "dropout": ("train", 2, None, 1),
    "native_dropout": ("train", 2, None, 1),
    "feature_dropout": ("train", 2, None, 1),
    "alpha_dropout": ("train", 2, None, 1),
    "feature_alpha_dropout": ("train", 2, None, 1),
    "batch_norm": ("training", 5, 3, None),
    "native_batch_norm": ("training", 5, 3, None),
    "_native_batch_norm_legit": ("training", 5, 3, None),
    "instance_norm": ("use_input_stats", 5, 3, None),
}


def _layout(node: fx.Node):
    if node.op != "call_function":
        return None
    packet = aten_packet(node)
    if packet is not None:
        if node.target._overloadname == "no_stats":  # _native_batch_norm_legit.no_stats: no running stats
            return None
        return _ATEN.get(packet)
    return _FUNCTIONS.get(node.target)


@rule("FX011", "frozen-training-flag", "warning", "dropout/norm call with its training flag baked in as a constant")
def check(ctx: LintContext):
    """A call whose ``training`` (or ``train``/``use_input_stats``) argument is a literal bool, where that
    flag changes what the call computes: dropout with ``p > 0``, batch/instance norm with running
    statistics (without them the flag must be True in both modes).

    * torch dialect: ``F.dropout(x, p, training=self.training)`` traced in eval mode records
      ``training=False``; ``model.train()`` on the graph no longer turns it on (and a literal True stays on
      at inference). Every literal is flagged. ``nn.Dropout``/``nn.BatchNorm*`` modules stay
      ``call_module`` nodes that read ``.training`` at run time and are not flagged.
    * aten dialect: torch.export bakes every mode flag, so ``training=False`` is what an inference export
      is expected to contain and is not flagged; a literal True is (a train-mode export, or a
      hard-coded ``training=True``): the graph drops activations at random or normalises with batch
      statistics (and updates the running ones) at inference.
    """
    aten = ctx.dialect == "aten"
    for node in ctx.graph.nodes:
        layout = _layout(node)
        if layout is None:
            continue
        flag_name, flag_index, stats_index, p_index = layout
        flag = node_arg(node, flag_index, flag_name)
        if not isinstance(flag, bool) or (aten and not flag):
            continue
        if p_index is not None:
            p = node_arg(node, p_index, "p", 0.5)
            if isinstance(p, (int, float)) and p == 0:
                continue
        if stats_index is not None and node_arg(node, stats_index, "running_mean") is None:
            continue
        if flag:
            effect = "it behaves as in training mode even in eval()"
        else:
            effect = "it behaves as in eval mode even after train()"
        yield node, f"{node.name} ({target_name(node)}) has {flag_name}={flag} baked in: {effect}"
