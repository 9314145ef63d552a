"""FX011 frozen-training-flag: dropout/norm call with a constant training flag that ignores train()/eval() and
differs from the mode the graph was captured for (training behaviour in an inference graph, or the reverse)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import fx, nn

from fxforge.graphs import aten_packet, module_path, node_arg, target_name
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
    # the in-place forms: nn.Dropout(inplace=True) (torchvision's EfficientNets and MobileNetV3) exports as these
    "dropout_": ("train", 2, None, 1),
    "feature_dropout_": ("train", 2, None, 1),
    "alpha_dropout_": ("train", 2, None, 1),
    "feature_alpha_dropout_": ("train", 2, None, 1),
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


def _captured_in_training(ctx: LintContext, node: fx.Node) -> bool:
    """Whether the module that made the call (the model when it cannot be found) was in training mode at capture.

    A traced ``training=self.training`` records exactly that module's mode; per module, because a model in eval
    mode may hold a submodule left in training mode.
    """
    model: nn.Module = ctx.original if ctx.original is not None else ctx.gm
    if isinstance(model, fx.GraphModule):
        # A graph (rewritten by lint --fix, reloaded, or linted on its own) keeps none of the model's modules on a
        # traced path: what is there holds attributes only (a bare nn.Module, in training mode by default). The
        # graph's own mode is the model's, copied at capture and set again on loading.
        return model.training
    # a path the model does not have (a module replaced since capture): the model's own mode
    with contextlib.suppress(AttributeError):
        model = model.get_submodule(module_path(node))
    return model.training


@rule(
    "FX011",
    "frozen-training-flag",
    "warning",
    "dropout/norm call with training=True baked in (or training=False, in a graph captured in training mode)",
)
def check(ctx: LintContext) -> Iterator[tuple[fx.Node, str]]:
    """A call whose ``training`` (or ``train``/``use_input_stats``) argument is a literal bool, where that
    flag changes what the call computes (dropout with ``p > 0``, batch/instance norm with running statistics;
    without them the flag must be True in both modes) and where the literal is wrong for the graph:

    * a literal True, in both dialects (a train-mode capture, or a hard-coded ``training=True``): the graph
      drops activations at random or normalises with batch statistics (and updates the running ones) at
      inference, and ``eval()`` on the graph no longer turns that off;
    * a literal False, in the torch dialect, only where the module that made the call was in training mode
      at capture (a graph captured for training; ``train()`` on the graph no longer turns the call on).
      ``F.dropout(x, p, training=self.training)`` or timm's ``BatchNormAct2d`` traced in eval mode record
      ``training=False``: that is the model's inference behaviour, exactly what an inference graph should
      compute, and is not flagged;
    * aten dialect: torch.export bakes every mode flag, so ``training=False`` is what an inference export
      is expected to contain and is never flagged.

    ``nn.Dropout``/``nn.BatchNorm*`` modules stay ``call_module`` nodes that read ``.training`` at run time and
    are not flagged. No pass fixes a finding: the call must be captured again from a model in eval mode (or
    its code fixed).
    """
    aten = ctx.dialect == "aten"
    for node in ctx.graph.nodes:
        layout = _layout(node)
        if layout is None:
            continue
        flag_name, flag_index, stats_index, p_index = layout
        flag = node_arg(node, flag_index, flag_name)
        if not isinstance(flag, bool):
            continue
        if not flag and (aten or not _captured_in_training(ctx, node)):
            continue  # eval behaviour in an inference graph: what the model computes in eval mode
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
