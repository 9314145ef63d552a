"""fold_bn: fold an inference-mode BatchNorm into the Conv/ConvTranspose/Linear that feeds it.

For ``y = BN(conv(x))`` with running statistics, ``BN(z) = z * s + (beta - mean * s)`` where
``s = gamma / sqrt(var + eps)`` per channel, so the conv's weight is scaled by ``s`` along its
output channels and its bias becomes ``(b - mean) * s + beta`` (``gamma = 1, beta = 0`` for
``affine=False``). The folded values are computed in float64 and cast back, so the result differs
from the original only by float round-off.

The same detection (:func:`plan_fold`) drives lint rule FX008, so the rule reports exactly the
BatchNorms this pass folds.
"""

from __future__ import annotations

import copy
import operator
from collections import Counter
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import fx, nn

from fxforge.graphs import aten_packet, get_attr_value, node_kind, node_value, submodule
from fxforge.passes import PassResult, mark, register_pass, store_tensor
from fxforge.passes.merge_convs import count_uses

_CONV_TYPES = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_TRANSPOSE_TYPES = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_LAYER_KINDS = ("conv", "conv_transpose", "linear")
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


# --------------------------------------------------------------------------------------------------
# detection, shared with lint rule FX008


@dataclass
class FoldPlan:
    """A BatchNorm that folds into the layer feeding it, with everything the fold reads."""

    bn: fx.Node
    producer: fx.Node
    kind: str  # the producer's kind: "conv", "conv_transpose" or "linear"
    mean: torch.Tensor
    var: torch.Tensor
    eps: float
    gamma: torch.Tensor | None
    beta: torch.Tensor | None
    weight_node: fx.Node | None = None  # function form: the stored weight and bias the fold replaces
    bias_node: fx.Node | None = None

    @property
    def label(self) -> str:
        return _label(self.bn, self.producer)


def _label(bn_node: fx.Node, producer: fx.Node) -> str:
    return f"{bn_node.name} after {producer.name}"


def plan_fold(gm: nn.Module, bn_node: fx.Node, uses: Counter[str]) -> FoldPlan | str | None:
    """How to fold ``bn_node`` into the layer feeding it; None when it is not a BatchNorm fed by a
    conv/conv-transpose/linear, a reason string when it is but cannot be folded exactly.

    ``uses`` is :func:`~fxforge.passes.merge_convs.count_uses` of the graph (module calls and stored-tensor
    reads, a parameter read counting as a use of its module too), computed once by the caller so that
    scanning every BN stays linear in the graph size.
    """
    if node_kind(gm, bn_node) != "batch_norm" or not bn_node.args:
        return None
    producer = bn_node.args[0]
    if not isinstance(producer, fx.Node):
        return None
    kind = node_kind(gm, producer)
    if kind not in _LAYER_KINDS:
        return None
    if len(producer.users) > 1:
        return f"{producer.name}'s output has {len(producer.users)} users, not only the BN"
    stats, reason = _bn_state(gm, bn_node)
    if stats is None:
        return f"the BatchNorm {reason}"
    reason = _tuple_result_reason(bn_node)
    if reason is not None:
        return reason
    plan = FoldPlan(bn_node, producer, kind, *stats)
    if producer.op == "call_module":
        reason = _module_reason(gm, plan, uses)
    elif producer.op == "call_function":
        reason = _function_reason(gm, plan, uses)
    else:
        reason = f"{producer.name} is a {producer.op} node"
    return plan if reason is None else reason


def _bn_state(gm: nn.Module, bn_node: fx.Node):
    """((mean, var, eps, gamma, beta), None) for a BN node in any form, or (None, why it can't fold)."""
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


def _tuple_result_reason(bn_node: fx.Node) -> str | None:
    """The decomposed ATen BN returns (out, save_mean, save_invstd): only a lone ``getitem 0`` can be rewired."""
    if aten_packet(bn_node) != "_native_batch_norm_legit_no_training":
        return None
    outputs = [u for u in bn_node.users if u.target is operator.getitem and u.args[1] == 0]
    if len(outputs) != 1 or len(bn_node.users) != 1:
        return "the BatchNorm's tuple result is read other than through one getitem 0"
    return None


def _bn_output(node: fx.Node) -> fx.Node:
    """The node carrying BN's value: the BN itself, or getitem 0 of the tuple-returning ATen form."""
    if aten_packet(node) == "_native_batch_norm_legit_no_training":
        (user,) = node.users
        return user
    return node


def _module_reason(gm: nn.Module, plan: FoldPlan, uses: Counter[str]) -> str | None:
    module = submodule(gm, plan.producer)
    target = str(plan.producer.target)
    if type(module) not in (*_CONV_TYPES, *_TRANSPOSE_TYPES, nn.Linear):
        return f"{type(module).__name__} is not a plain conv/linear module"
    if uses[target] > 1:
        return (
            f"module {target} is called, or its parameters read, from more than one place; "
            "folding would change the others"
        )
    out_channels = module.out_features if isinstance(module, nn.Linear) else module.out_channels
    if plan.mean.numel() != out_channels:
        return f"BN has {plan.mean.numel()} channels, {target} produces {out_channels}"
    if plan.kind == "linear" and not _known_2d(plan.producer):
        return "cannot prove the Linear output is 2-D, where BatchNorm1d normalises its features"
    return None


def _function_reason(gm: nn.Module, plan: FoldPlan, uses: Counter[str]) -> str | None:
    """Functional conv/linear (torch dialect F.conv2d or ATen aten.conv2d): its weights must be stored, unshared."""
    producer = plan.producer
    args, kwargs = producer.args, producer.kwargs
    weight_node = args[1] if len(args) > 1 else kwargs.get("weight")
    bias_node = args[2] if len(args) > 2 else kwargs.get("bias")
    if not (isinstance(weight_node, fx.Node) and weight_node.op == "get_attr"):
        return f"the weight of {producer.name} is not a stored parameter"
    if bias_node is not None and not (isinstance(bias_node, fx.Node) and bias_node.op == "get_attr"):
        return f"the bias of {producer.name} is not a stored parameter"
    if any(uses[str(n.target)] > 1 for n in (weight_node, bias_node) if n is not None):
        return f"the weights of {producer.name} are used elsewhere; folding would change the others"
    if plan.kind == "linear" and not _known_2d(producer):
        return "cannot prove the linear output is 2-D, where BatchNorm1d normalises its features"
    plan.weight_node, plan.bias_node = weight_node, bias_node
    return None


def _known_2d(node: fx.Node) -> bool:
    # BatchNorm1d normalises dim 1: the Linear's features only when its output is (N, C)
    shape = getattr(node_value(node), "shape", None)
    return shape is not None and len(shape) == 2


def _nothing_left_to_fold(gm: fx.GraphModule) -> str | None:
    """Postcondition: the shared detection finds no foldable BatchNorm (each was folded or refused)."""
    uses = count_uses(gm.graph)
    for node in gm.graph.nodes:
        plan = plan_fold(gm, node, uses)
        if isinstance(plan, FoldPlan):
            return f"{plan.label} can still be folded"
    return None


# --------------------------------------------------------------------------------------------------
# the pass


@register_pass(
    NAME,
    summary="Fold inference BatchNorm into the preceding Conv1d/2d/3d, ConvTranspose1d/2d/3d or Linear.",
    guarantees=(
        "Outputs equal up to fp32 round-off (weights folded in float64). Never folds a BN in training mode, "
        "without running statistics or with statistics computed in the graph; a conv/linear whose output has "
        "other users; a conv module called from more than one place or whose weight or bias the graph also "
        "reads directly; a functional/ATen conv whose weights are not stored tensors or are read elsewhere; "
        "a Linear whose output is not known to be 2-D. Each refusal is listed in the result with its reason. "
        "Torch and ATen dialects."
    ),
    ensures=lambda gm, result: _nothing_left_to_fold(gm),
)
def fold_bn(gm: fx.GraphModule, options: None) -> PassResult:
    result = PassResult(NAME, gm)
    uses = count_uses(gm.graph)  # once: per-candidate scans would make the pass quadratic in graph size
    fetched_before = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    # in graph order, so a BN after a folded BN (conv -> bn -> bn) sees the conv and folds too
    for bn_node in list(gm.graph.nodes):
        plan = plan_fold(gm, bn_node, uses)
        if plan is None:
            continue
        if isinstance(plan, str):
            result.skip(f"{_label(bn_node, bn_node.args[0])}: {plan}")
        elif plan.producer.op == "call_module":
            _fold_module(gm, plan, result)
        else:
            _fold_function(gm, plan, result)
    if result.changed:
        _drop_stale_attributes(gm, fetched_before)
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


def _fold_module(gm: fx.GraphModule, plan: FoldPlan, result: PassResult) -> None:
    producer, target = plan.producer, str(plan.producer.target)
    module = submodule(gm, producer)
    transposed = isinstance(module, _TRANSPOSE_TYPES)
    groups = getattr(module, "groups", 1)
    weight, bias = fold_weights(
        module.weight, module.bias, plan.mean, plan.var, plan.eps, plan.gamma, plan.beta, transposed, groups
    )
    # A new module with new Parameters: the old ones may be shared with the user's model.
    fused = copy.deepcopy(module)
    fused.weight = nn.Parameter(weight, requires_grad=module.weight.requires_grad)
    fused.bias = nn.Parameter(bias, requires_grad=module.weight.requires_grad)
    parent_name, _, child = target.rpartition(".")
    setattr(gm.get_submodule(parent_name) if parent_name else gm, child, fused)
    _replace_bn(gm, producer, plan.bn)
    result.note(f"folded {plan.bn.name} into {target}", removed=1, folded=bias.numel() + weight.numel())


def _fold_function(gm: fx.GraphModule, plan: FoldPlan, result: PassResult) -> None:
    """Functional conv/linear (torch dialect F.conv2d or ATen aten.conv2d) with stored weights."""
    producer, weight_node, bias_node = plan.producer, plan.weight_node, plan.bias_node
    packet = aten_packet(producer)
    args, kwargs = producer.args, producer.kwargs
    transposed = plan.kind == "conv_transpose"
    groups = 1
    if packet == "convolution":
        transposed, groups = bool(args[6]), int(args[8])
    elif plan.kind in ("conv", "conv_transpose"):
        groups = int(args[6]) if len(args) > 6 else int(kwargs.get("groups", 1))
    weight = get_attr_value(gm, str(weight_node.target))
    bias = get_attr_value(gm, str(bias_node.target)) if bias_node is not None else None
    new_weight, new_bias = fold_weights(
        weight, bias, plan.mean, plan.var, plan.eps, plan.gamma, plan.beta, transposed, groups
    )
    weight_name = store_tensor(gm, f"{producer.name}_folded_weight", new_weight)
    bias_name = store_tensor(gm, f"{producer.name}_folded_bias", new_bias)
    with gm.graph.inserting_before(producer):
        new_weight_node = gm.graph.get_attr(weight_name)
        new_bias_node = gm.graph.get_attr(bias_name)
    producer.replace_input_with(weight_node, new_weight_node)
    if bias_node is not None:
        producer.replace_input_with(bias_node, new_bias_node)
    else:
        _set_missing_bias(producer, new_bias_node)
    _replace_bn(gm, producer, plan.bn)
    for stale in (weight_node, bias_node):
        if stale is not None and not stale.users:
            gm.graph.erase_node(stale)
    result.note(f"folded {plan.bn.name} into {producer.name}", removed=1, folded=new_weight.numel() + new_bias.numel())


def _set_missing_bias(producer: fx.Node, bias: fx.Node) -> None:
    """Give a bias-less conv/linear call (bias omitted, or None by position or keyword) the folded bias.

    Every form fold_bn reads (``F.conv*``, ``F.conv_transpose*``, ``F.linear`` and their ATen ops) takes
    the bias third, after the input and the weight.
    """
    args = producer.args
    if "bias" in producer.kwargs or len(args) < 2:  # passed by keyword, or the weight was: stay keyword
        producer.kwargs = {**producer.kwargs, "bias": bias}
    else:
        producer.args = (*args[:2], bias, *args[3:])
