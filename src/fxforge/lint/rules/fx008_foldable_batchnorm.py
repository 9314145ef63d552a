"""FX008 foldable-batchnorm: an inference BatchNorm right after a conv/linear folds into its weights for free."""

from __future__ import annotations

from collections import Counter

import torch.nn.functional as F
from torch import fx, nn

from fxforge.graphs import aten_packet, node_arg, node_kind, node_value, submodule
from fxforge.lint import LintContext, rule


def _bn_reason(gm: nn.Module, bn: fx.Node) -> str | None:
    """Why this BatchNorm cannot be folded (training mode, no stored statistics), or None when it can."""
    if bn.op == "call_module":
        module = submodule(gm, bn)
        if module.training:
            return "is in training mode"
        if module.running_mean is None or module.running_var is None:
            return "has no running statistics"
        return None
    packet = aten_packet(bn)
    if bn.target is F.batch_norm:  # (input, running_mean, running_var, weight, bias, training, momentum, eps)
        stats = (node_arg(bn, 1, "running_mean"), node_arg(bn, 2, "running_var"))
        params = (node_arg(bn, 3, "weight"), node_arg(bn, 4, "bias"))
        training = node_arg(bn, 5, "training", False)
    elif packet in ("batch_norm", "native_batch_norm"):  # (input, weight, bias, mean, var, training, ...)
        stats, params, training = bn.args[3:5], bn.args[1:3], node_arg(bn, 5, "training")
    elif packet == "_native_batch_norm_legit_no_training":  # (input, weight, bias, mean, var, momentum, eps)
        stats, params, training = bn.args[3:5], bn.args[1:3], False
    else:
        return "has a form fxforge cannot read"
    if training is not False:
        return "runs in training mode"
    if any(not (isinstance(s, fx.Node) and s.op == "get_attr") for s in stats):
        return "has no stored running statistics"
    if any(p is not None and not (isinstance(p, fx.Node) and p.op == "get_attr") for p in params):
        return "has affine parameters computed in the graph"
    return None


def _producer_reason(gm: nn.Module, producer: fx.Node, calls: Counter, fetches: Counter) -> str | None:
    """Why the conv/linear's weights cannot absorb the BN (shared, computed in the graph), or None."""
    if producer.op == "call_module":
        if calls[str(producer.target)] > 1:
            return f"module {producer.target} is called from more than one place"
        return None
    weight = node_arg(producer, 1, "weight")
    bias = node_arg(producer, 2, "bias")
    if not (isinstance(weight, fx.Node) and weight.op == "get_attr"):
        return "its weight is not a stored parameter"
    if bias is not None and not (isinstance(bias, fx.Node) and bias.op == "get_attr"):
        return "its bias is not a stored parameter"
    if len(weight.users) > 1 or fetches[str(weight.target)] > 1:
        return "its weight is used elsewhere"
    return None


@rule(
    "FX008",
    "foldable-batchnorm",
    "info",
    "inference BatchNorm that can be folded into the preceding conv/linear",
    fix="fold_bn",
)
def check(ctx: LintContext):
    """A BatchNorm (module, ``F.batch_norm`` or ATen ``batch_norm``) in inference mode whose input is a
    conv, conv-transpose or linear output used by nothing else, with weights that belong to that one call.
    Same conditions as the ``fold_bn`` pass, so ``lint --fix`` clears what this rule reports. A linear
    followed by BatchNorm1d is reported only when its output is known to be 2-D (the ATen dialect
    records shapes; a plain symbolic trace does not), because BatchNorm1d on 3-D input normalises
    another dimension.
    """
    gm = ctx.gm
    calls: Counter = Counter()
    fetches: Counter = Counter()
    for node in ctx.graph.nodes:
        if node.op == "call_module":
            calls[str(node.target)] += 1
        elif node.op == "get_attr":
            fetches[str(node.target)] += 1
    for bn in ctx.graph.nodes:
        if node_kind(gm, bn) != "batch_norm" or not bn.args or not isinstance(bn.args[0], fx.Node):
            continue
        producer = bn.args[0]
        kind = node_kind(gm, producer)
        if kind not in ("conv", "conv_transpose", "linear") or len(producer.users) != 1:
            continue
        if _bn_reason(gm, bn) is not None or _producer_reason(gm, producer, calls, fetches) is not None:
            continue
        if kind == "linear":
            value = node_value(producer)
            if value is None or len(value.shape) != 2:
                continue
        yield bn, f"{bn.name} (batch norm) can be folded into {producer.name} ({kind}): inference statistics, sole user"
