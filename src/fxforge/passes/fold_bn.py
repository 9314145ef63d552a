"""fold_bn: fold an inference-mode BatchNorm into the Conv/ConvTranspose/Linear that feeds it.

For ``y = BN(conv(x))`` with running statistics, ``BN(z) = z * s + (beta - mean * s)`` where
``s = gamma / sqrt(var + eps)`` per channel, so the conv's weight is scaled by ``s`` along its
output channels and its bias becomes ``(b - mean) * s + beta`` (``gamma = 1, beta = 0`` for
``affine=False``). The folded values are computed in float64 and cast back, so the result differs
from the original only by float round-off.
"""

from __future__ import annotations

import copy
import operator
from collections import Counter

import torch
import torch.nn.functional as F
from torch import fx, nn

from fxforge.graphs import aten_packet, get_attr_value, node_kind, submodule
from fxforge.passes import PassResult, mark, register_pass

_BN_TYPES = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_TRANSPOSE_TYPES = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
NAME = "fold_bn"


def fold_weights(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    mean: torch.Tensor,
    var: torch.Tensor,
    eps: float,
    gamma: torch.Tensor | None,
    beta: torch.Tensor | None,
    transposed: bool = False,
    groups: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Folded (weight, bias) for a conv/linear followed by BN; computed in float64."""
    dtype = weight.dtype
    w = weight.detach().double()
    channels = mean.numel()
    gamma64 = gamma.detach().double() if gamma is not None else torch.ones(channels, dtype=torch.float64)
    beta64 = beta.detach().double() if beta is not None else torch.zeros(channels, dtype=torch.float64)
    scale = gamma64 / torch.sqrt(var.detach().double() + eps)
    b = bias.detach().double() if bias is not None else torch.zeros(channels, dtype=torch.float64)
    if transposed:
        # ConvTranspose weight is (in, out/groups, *k): output channel g*out_g + j lives at [g-block, j]
        in_channels, out_per_group = w.shape[0], w.shape[1]
        kernel = w.shape[2:]
        w = w.reshape(groups, in_channels // groups, out_per_group, *kernel)
        w = w * scale.reshape(groups, 1, out_per_group, *([1] * len(kernel)))
        w = w.reshape(in_channels, out_per_group, *kernel)
    else:
        w = w * scale.reshape(-1, *([1] * (w.dim() - 1)))
    new_bias = (b - mean.detach().double()) * scale + beta64
    return w.to(dtype), new_bias.to(dtype)


def _bn_state(gm: fx.GraphModule, bn_node: fx.Node):
    """(mean, var, eps, gamma, beta, reason) for a BN node in any form; reason is set when it can't fold."""
    if bn_node.op == "call_module":
        bn = submodule(gm, bn_node)
        if bn.training:
            return None, "is in training mode (its statistics change with every batch)"
        if bn.running_mean is None or bn.running_var is None:
            return None, "has no running statistics (track_running_stats=False)"
        return (bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias), None
    args = _bn_call_args(bn_node)
    if args is None:
        return None, "has arguments fxforge cannot read"
    mean_node, var_node, gamma_node, beta_node, training, eps = args
    if mean_node is None or var_node is None:
        # checked first: without running stats BN must use batch statistics, so the graph says training=True
        return None, "has no running statistics (track_running_stats=False)"
    if training:
        return None, "runs in training mode (training=True)"
    values = []
    for arg in (mean_node, var_node, gamma_node, beta_node):
        if arg is None:
            values.append(None)
        elif isinstance(arg, fx.Node) and arg.op == "get_attr":
            values.append(get_attr_value(gm, str(arg.target)))
        else:
            return None, "takes statistics computed in the graph, not stored tensors"
    if values[0] is None or values[1] is None:
        return None, "has no running statistics"
    return (values[0], values[1], eps, values[2], values[3]), None


def _bn_call_args(node: fx.Node):
    """(mean, var, weight, bias, training, eps) of a functional or ATen batch norm call."""
    packet = aten_packet(node)
    if node.target is F.batch_norm:
        names = ["input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"]
        defaults = {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5}
        bound = {**defaults, **dict(zip(names, node.args)), **node.kwargs}
        return (
            bound["running_mean"],
            bound["running_var"],
            bound["weight"],
            bound["bias"],
            bound["training"],
            bound["eps"],
        )
    if packet == "batch_norm":  # (input, weight, bias, mean, var, training, momentum, eps, cudnn)
        a = node.args
        return a[3], a[4], a[1], a[2], a[5], a[7]
    if packet == "_native_batch_norm_legit_no_training":  # (input, weight, bias, mean, var, momentum, eps)
        a = node.args
        return a[3], a[4], a[1], a[2], False, a[6]
    return None


def _bn_output(node: fx.Node) -> fx.Node:
    """The node carrying BN's value: the BN itself, or getitem 0 of the tuple-returning ATen form."""
    if aten_packet(node) == "_native_batch_norm_legit_no_training":
        (user,) = [u for u in node.users if u.target is operator.getitem and u.args[1] == 0]
        return user
    return node


@register_pass(
    NAME,
    summary="Fold inference BatchNorm into the preceding Conv1d/2d/3d, ConvTranspose1d/2d/3d or Linear.",
    guarantees=(
        "Outputs equal up to fp32 round-off (weights folded in float64). Never folds a BN in training mode or "
        "without running stats, a conv whose output has other users, or a conv module called from more than "
        "one place; each refusal is listed in the result with its reason. Torch and ATen dialects."
    ),
)
def fold_bn(gm: fx.GraphModule, options: None) -> PassResult:
    result = PassResult(NAME, gm)
    # Counted once up front: per-candidate scans would make the pass quadratic in graph size.
    calls: Counter[str] = Counter()
    fetches: Counter[str] = Counter()
    for node in gm.graph.nodes:
        if node.op == "call_module":
            calls[str(node.target)] += 1
        elif node.op == "get_attr":
            fetches[str(node.target)] += 1
            owner = str(node.target).rpartition(".")[0]
            if owner:
                calls[owner] += 1  # reading conv.weight directly sees the folded weight too: a second use
    for bn_node in list(gm.graph.nodes):
        if node_kind(gm, bn_node) != "batch_norm":
            continue
        if bn_node.op == "call_module" and type(submodule(gm, bn_node)) not in _BN_TYPES:
            continue
        producer = bn_node.args[0] if bn_node.args else None
        if not isinstance(producer, fx.Node):
            continue
        kind = node_kind(gm, producer)
        if kind not in ("conv", "conv_transpose", "linear"):
            continue
        label = f"{bn_node.name} after {producer.name}"
        if len(producer.users) > 1:
            result.skip(f"{label}: {producer.name}'s output has {len(producer.users)} users, not only the BN")
            continue
        state, reason = _bn_state(gm, bn_node)
        if state is None:
            result.skip(f"{label}: the BatchNorm {reason}")
            continue
        if producer.op == "call_module":
            _fold_module(gm, producer, bn_node, state, result, label, calls)
        elif producer.op == "call_function":
            _fold_function(gm, producer, bn_node, state, result, label, fetches)
        else:
            result.skip(f"{label}: {producer.name} is a {producer.op} node")
    if result.changed:
        _drop_stale_attributes(gm, set(fetches))
    return result


def _replace_bn(gm: fx.GraphModule, producer: fx.Node, bn_node: fx.Node) -> None:
    output = _bn_output(bn_node)
    mark(producer, NAME, origin_of=output)
    output.replace_all_uses_with(producer)
    if output is not bn_node:
        gm.graph.erase_node(output)
    stored = [n for n in bn_node.all_input_nodes if n.op == "get_attr"]
    gm.graph.erase_node(bn_node)
    for node in stored:  # functional/ATen BN: its statistics were get_attr nodes read by it alone
        if not node.users:
            gm.graph.erase_node(node)


def _drop_stale_attributes(gm: fx.GraphModule, fetched_before: set[str]) -> None:
    """Delete the tensors and submodules that the folded BNs and replaced weights leave unreferenced.

    torch.export also fetches each BN's ``num_batches_tracked``, which nothing reads: it goes once the BN's
    other statistics have gone.
    """
    from fxforge.passes.dead_code import prune_attributes

    fetched = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    for node in list(gm.graph.nodes):
        owner, _, attr = str(node.target).rpartition(".")
        if node.op != "get_attr" or attr != "num_batches_tracked" or not owner or node.users:
            continue
        if not any(f"{owner}.{name}" in fetched for name in ("running_mean", "running_var")):
            gm.graph.erase_node(node)
    prune_attributes(gm, fetched_before - {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"})


def _fold_module(gm, producer, bn_node, state, result, label, calls: Counter[str]) -> None:
    module = submodule(gm, producer)
    target = str(producer.target)
    if type(module) not in (*_CONV_TYPES, *_TRANSPOSE_TYPES, nn.Linear):
        result.skip(f"{label}: {type(module).__name__} is not a plain conv/linear module")
        return
    if calls[target] > 1:
        result.skip(
            f"{label}: module {target} is called, or its parameters read, from more than one place; "
            "folding would change the others"
        )
        return
    mean, var, eps, gamma, beta = state
    out_channels = module.out_features if isinstance(module, nn.Linear) else module.out_channels
    if mean.numel() != out_channels:
        result.skip(f"{label}: BN has {mean.numel()} channels, {target} produces {out_channels}")
        return
    if isinstance(module, nn.Linear):
        shape = producer.meta.get("tensor_meta")
        rank = len(shape.shape) if shape is not None and hasattr(shape, "shape") else None
        if rank != 2:
            result.skip(f"{label}: cannot prove the Linear output is 2-D, where BatchNorm1d normalises its features")
            return
    transposed = isinstance(module, _TRANSPOSE_TYPES)
    groups = getattr(module, "groups", 1)
    weight, bias = fold_weights(module.weight, module.bias, mean, var, eps, gamma, beta, transposed, groups)
    # A new module with new Parameters: the old ones may be shared with the user's model.
    fused = copy.deepcopy(module)
    fused.weight = nn.Parameter(weight, requires_grad=module.weight.requires_grad)
    fused.bias = nn.Parameter(bias, requires_grad=module.weight.requires_grad)
    parent_name, _, child = target.rpartition(".")
    setattr(gm.get_submodule(parent_name) if parent_name else gm, child, fused)
    _replace_bn(gm, producer, bn_node)
    result.note(f"folded {bn_node.name} into {target}", removed=1, folded=bias.numel() + weight.numel())


def _fold_function(gm, producer, bn_node, state, result, label, fetches: Counter[str]) -> None:
    """Functional conv/linear (torch dialect F.conv2d or ATen aten.conv2d) with stored weights."""
    packet = aten_packet(producer)
    args = list(producer.args)
    kwargs = dict(producer.kwargs)
    weight_node = args[1] if len(args) > 1 else kwargs.get("weight")
    bias_node = args[2] if len(args) > 2 else kwargs.get("bias")
    if not (isinstance(weight_node, fx.Node) and weight_node.op == "get_attr"):
        result.skip(f"{label}: the weight of {producer.name} is not a stored parameter")
        return
    if bias_node is not None and not (isinstance(bias_node, fx.Node) and bias_node.op == "get_attr"):
        result.skip(f"{label}: the bias of {producer.name} is not a stored parameter")
        return
    shared = [n for n in (weight_node, bias_node) if n is not None and len(n.users) > 1]
    if shared or fetches[str(weight_node.target)] > 1:
        result.skip(f"{label}: the weights of {producer.name} are used elsewhere; folding would change the others")
        return
    transposed = node_kind(gm, producer) == "conv_transpose"
    groups = 1
    if packet == "convolution":
        transposed, groups = bool(args[6]), int(args[8])
    elif packet in ("conv1d", "conv2d", "conv3d") or producer.target in (F.conv1d, F.conv2d, F.conv3d) or transposed:
        groups = int(args[6]) if len(args) > 6 else int(kwargs.get("groups", 1))
    if node_kind(gm, producer) == "linear":
        shape = producer.meta.get("val", producer.meta.get("tensor_meta"))
        if shape is None or len(shape.shape) != 2:
            result.skip(f"{label}: cannot prove the linear output is 2-D, where BatchNorm1d normalises its features")
            return
    weight = get_attr_value(gm, str(weight_node.target))
    bias = get_attr_value(gm, str(bias_node.target)) if bias_node is not None else None
    mean, var, eps, gamma, beta = state
    new_weight, new_bias = fold_weights(weight, bias, mean, var, eps, gamma, beta, transposed, groups)
    weight_name = _register(gm, f"{producer.name}_folded_weight", new_weight)
    bias_name = _register(gm, f"{producer.name}_folded_bias", new_bias)
    with gm.graph.inserting_before(producer):
        new_weight_node = gm.graph.get_attr(weight_name)
        new_bias_node = gm.graph.get_attr(bias_name)
    producer.replace_input_with(weight_node, new_weight_node)
    if bias_node is not None:
        producer.replace_input_with(bias_node, new_bias_node)
    elif len(args) > 2:
        args[2] = new_bias_node
        producer.args = (args[0], new_weight_node, *args[2:])
    else:
        if packet is not None or producer.target in (F.conv1d, F.conv2d, F.conv3d, F.linear):
            producer.args = (args[0], new_weight_node, new_bias_node, *args[3:])
            kwargs.pop("bias", None)
            producer.kwargs = kwargs
    _replace_bn(gm, producer, bn_node)
    for stale in (weight_node, bias_node):
        if stale is not None and not stale.users:
            gm.graph.erase_node(stale)
    result.note(f"folded {bn_node.name} into {producer.name}", removed=1, folded=new_weight.numel() + new_bias.numel())


def _register(gm: fx.GraphModule, base: str, value: torch.Tensor) -> str:
    name, i = base, 0
    while hasattr(gm, name):
        i += 1
        name = f"{base}_{i}"
    gm.register_parameter(name, nn.Parameter(value, requires_grad=False))
    return name
