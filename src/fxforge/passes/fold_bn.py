"""fold_bn: fold an inference-mode batch norm into the Conv/ConvTranspose/Linear that feeds it.

For ``y = BN(conv(x))`` with running statistics, ``BN(z) = z * s + t`` per channel, with
``s = gamma / sqrt(var + eps)`` and ``t = beta - mean * s`` (``gamma = 1, beta = 0`` for ``affine=False``),
so the conv's weight is scaled by ``s`` along its output channels and its bias becomes ``b * s + t``. The
folded values are computed in float64 and cast back, so the result differs from the original only by float
round-off.

What is folded is found by one detection, :func:`find_folds` (per node: :func:`plan_fold`), which lint rule
FX008 runs too, so the rule reports exactly what this pass folds. It reads real-world forms, not a list of
classes:

* batch norms: ``nn.BatchNorm1d/2d/3d`` (and subclasses that keep ``_BatchNorm.forward``), ``F.batch_norm``
  and the ATen ops (``batch_norm``, the tuple-returning ``_native_batch_norm_legit_no_training``; the training
  forms are refused), with statistics that are stored tensors or computed from stored tensors alone;
* frozen batch norms: ``x * scale + shift`` where ``scale`` and ``shift`` are per-channel values computed from
  stored tensors alone (torchvision's ``FrozenBatchNorm2d``, timm's): the arithmetic is run at pass time;
* a batch norm inside a module that the graph calls as one node (a leaf, e.g. timm's ``BatchNormAct2d`` --
  a ``BatchNorm2d`` subclass whose forward is batch norm, drop, activation -- or ``ConvNormAct``): the module
  is traced and its graph inlined in place of the call, keeping its submodules under their qualified names,
  but only when that lets one of its batch norms fold;
* producers: conv/conv-transpose/linear modules, ``F.conv*``/``F.linear`` and their ATen ops with stored
  weights, and the decomposed ATen linear ``addmm(b, x, W.t())``, ``mm(x, W.t())`` and ``mm(x, W.t()) + b``.

Reads of the producer's rank, shape or dtype (timm's ``assert x.ndim == 4``), or of its weight's (timm's
same-padding conv reads ``weight.shape``), are not users of its value: folding keeps them. A conv module also
passed whole to an opaque call (HF MobileNetV2's ``apply_tf_padding(x, self.convolution)``) is folded into a
copy for its own call; the opaque call keeps the original, whatever it reads of it.
"""

from __future__ import annotations

import copy
import inspect
import math
import operator
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn
from torch.nn.modules.batchnorm import _BatchNorm

from fxforge.effects import impure_reason, storage_of, written_args, written_stored_tensors
from fxforge.errors import first_line
from fxforge.graphs import (
    CONV_TRANSPOSE_TYPES,
    WEIGHTED_LAYER_TYPES,
    aten_packet,
    get_attr_value,
    node_kind,
    node_value,
    runs_hooks,
    submodule,
)
from fxforge.passes import ORIGIN, PassResult, mark, register_pass, store_tensor
from fxforge.passes.dead_code import prune_attributes
from fxforge.passes.merge_convs import Uses, count_uses, value_users

_LAYER_KINDS = ("conv", "conv_transpose", "linear")
NAME = "fold_bn"
TRAINING_HINT = "call model.eval() before capture"
INLINED = "fxforge_inlined_from"  # node meta: the module call an inlined node came from


# --------------------------------------------------------------------------------------------------
# arithmetic


def bn_affine(
    mean: torch.Tensor, var: torch.Tensor, eps: float, gamma: torch.Tensor | None, beta: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-channel (scale, shift) of an inference batch norm, in float64."""
    channels = mean.numel()
    gamma64 = gamma.detach().double() if gamma is not None else torch.ones(channels, dtype=torch.float64)
    beta64 = beta.detach().double() if beta is not None else torch.zeros(channels, dtype=torch.float64)
    scale = gamma64 / torch.sqrt(var.detach().double() + eps)
    return scale, beta64 - mean.detach().double() * scale


def fold_affine(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    scale: torch.Tensor,
    shift: torch.Tensor,
    transposed: bool = False,
    groups: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Folded (weight, bias) for a conv/linear whose output channels are then mapped to ``y * scale + shift``."""
    dtype = weight.dtype
    w = weight.detach().double()
    scale, shift = scale.double(), shift.double()
    b = bias.detach().double() if bias is not None else torch.zeros_like(scale)
    if transposed:
        # ConvTranspose weight is (in, out/groups, *k): output channel g*out_g + j lives at [g-block, j]
        in_channels, out_per_group = w.shape[0], w.shape[1]
        kernel = w.shape[2:]
        w = w.reshape(groups, in_channels // groups, out_per_group, *kernel)
        w = w * scale.reshape(groups, 1, out_per_group, *([1] * len(kernel)))
        w = w.reshape(in_channels, out_per_group, *kernel)
    else:
        w = w * scale.reshape(-1, *([1] * (w.dim() - 1)))
    return w.to(dtype), (b * scale + shift).to(dtype)


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
    scale, shift = bn_affine(mean, var, eps, gamma, beta)
    return fold_affine(weight, bias, scale, shift, transposed, groups)


# --------------------------------------------------------------------------------------------------
# detection, shared with lint rule FX008


class Refusal(str):
    """Why a batch norm after a conv/linear is not folded. ``training``: it would fold after ``model.eval()``;
    ``label``: "bn after conv", for the pass's skip list."""

    training: bool = False
    label: str = ""


def _refusal(text: str, label: str = "", training: bool = False) -> Refusal:
    refusal = Refusal(text)
    refusal.training, refusal.label = training, label
    return refusal


@dataclass
class Norm:
    """A per-channel affine map read from the graph: a batch norm in any form, or a frozen one (x * s + t)."""

    node: fx.Node  # the node reported and removed: the BN call, or the add of x * scale + shift
    input: fx.Node  # the value it maps
    output: fx.Node  # the node carrying its result (getitem 0 of a tuple-returning ATen batch norm)
    frozen: bool = False  # x * scale + shift rather than a batch norm
    # the nodes only this map reads (itself, its statistics), erased once folded if nothing else reads them
    consumed: list[fx.Node] = field(default_factory=list)
    scale_arg: Any = None  # frozen form: the scale and shift operands
    shift_arg: Any = None
    # a reshape between a linear and the batch norm that flattens the leading dimensions into one, keeping the
    # features last (timm LeViT's LinearNorm: bn(linear(x).flatten(0, 1)).reshape_as(...)): the map's value
    # is then this node's, computed from the folded linear
    through: fx.Node | None = None

    @property
    def what(self) -> str:
        return "frozen batch norm" if self.frozen else "batch norm"


@dataclass
class Layer:
    """The conv/linear feeding a batch norm, read from the graph, with what the fold rewrites."""

    node: fx.Node
    kind: str  # "conv", "conv_transpose" or "linear"
    form: str  # "module", "function" (F.conv2d / aten.conv2d / aten.linear) or "matmul" (aten addmm / mm)
    weight: torch.Tensor
    bias: torch.Tensor | None
    channels: int
    transposed: bool = False
    groups: int = 1
    weight_node: fx.Node | None = None  # function and matmul forms: the stored weight and bias the fold replaces
    bias_node: fx.Node | None = None
    # module form: the module object is also passed to other calls (get_attr of the module), which keep the
    # original: the fold installs a folded copy for the call alone (the conv's weights are then stored twice)
    passed_whole: bool = False


@dataclass
class FoldPlan:
    """A batch norm that folds into the layer feeding it, with the per-channel map the fold applies."""

    bn: fx.Node
    producer: fx.Node
    kind: str  # the producer's kind: "conv", "conv_transpose" or "linear"
    scale: torch.Tensor  # float64, one per output channel
    shift: torch.Tensor
    norm: Norm
    layer: Layer | None  # None for a batch norm after a concatenation: ``parts`` then
    # a batch norm after ``cat`` of several layers along the channels (timm's MixedConv2d): one plan per layer, with
    # its slice of the scale and shift; ``producer`` is the ``cat``, which then computes the batch norm's value
    parts: list[FoldPlan] = field(default_factory=list)

    @property
    def label(self) -> str:
        return _label(self.bn, self.producer)


def display_name(node: fx.Node) -> str:
    """The node's name, or for a node inlined from a module call, that call's name (what the user's graph has)."""
    return node.meta.get(INLINED, node.name)


def _label(bn_node: fx.Node, producer: fx.Node) -> str:
    return f"{display_name(bn_node)} after {display_name(producer)}"


def plan_fold(
    gm: nn.Module,
    node: fx.Node,
    uses: Counter[str],
    folded: dict[fx.Node, fx.Node] | None = None,
    written: set[tuple[str, int]] | None = None,
) -> FoldPlan | Refusal | None:
    """How to fold ``node`` into the layer feeding it; None when it is not a batch norm (or frozen one) fed by
    a conv/conv-transpose/linear, a :class:`Refusal` when it is but cannot be folded exactly.

    ``uses`` is :func:`~fxforge.passes.merge_convs.count_uses` of the graph (module calls and stored-tensor
    reads, a parameter read counting as a use of its module too), computed once by the caller so that scanning
    every node stays linear in the graph size. ``folded`` maps the outputs of batch norms planned to fold to
    their producers, so a scan without rewriting sees ``conv -> bn -> bn`` fold twice, as the pass does.
    ``written``: :func:`~fxforge.effects.written_stored_tensors` of the graph, also computed once.
    """
    folded = folded or {}

    def is_source(candidate: Any) -> bool:
        return isinstance(candidate, fx.Node) and _layer_kind(gm, folded.get(candidate, candidate)) is not None

    norm = _match_norm(gm, node, is_source)
    if norm is None:
        return None
    if not is_source(norm.input):
        joined = _concatenated_layers(norm.input, is_source)
        if joined:
            return _plan_concatenated(gm, node, norm, [folded.get(part, part) for part in joined], uses, written)
        inner = _flattened_features(norm.input) if not norm.frozen else None
        if inner is None or not is_source(inner) or _layer_kind(gm, folded.get(inner, inner)) != "linear":
            return None
        if len(value_users(norm.input)) > 1:
            return _refusal(f"{norm.input.name} is read by more than the {norm.what}", _label(node, inner))
        norm.through, norm.input = norm.input, inner
    producer = folded.get(norm.input, norm.input)
    label = _label(node, producer)
    readers = value_users(norm.input)
    if len(readers) > 1:
        return _refusal(f"{producer.name}'s output has {len(readers)} users, not only the {norm.what}", label)
    state = _norm_state(gm, norm)
    if state is None:
        return None
    if isinstance(state, str):
        return _refusal(state, label, training=TRAINING_HINT in state)
    layer = _read_layer(gm, producer, uses)
    if isinstance(layer, str):
        return _refusal(layer, label)
    read_now = [t for t in (*state[1], layer.weight, layer.bias) if isinstance(t, torch.Tensor)]
    if written and any(storage_of(tensor) in written for tensor in read_now):
        # the fold reads them now; the graph would write them first at run time
        return _refusal(
            "its statistics or the layer's weights may be written in place in the graph (by an in-place op or a "
            "call fxforge cannot see into)",
            label,
        )
    vectors = _per_channel(gm, norm, state, layer)
    if isinstance(vectors, str):
        return _refusal(vectors, label)
    return FoldPlan(node, producer, layer.kind, *vectors, norm, layer)


def _plan_concatenated(
    gm: nn.Module,
    node: fx.Node,
    norm: Norm,
    producers: list[fx.Node],
    uses: Counter[str],
    written: set[tuple[str, int]] | None,
) -> FoldPlan | Refusal | None:
    """A batch norm after ``cat`` of conv outputs along the channels (timm's MixedConv2d: each conv of a split
    input makes some of the channels, one batch norm follows). It is per channel, so each conv takes its slice of
    the scale and shift, and the ``cat`` then computes the batch norm's value (QA: 34 in timm's mixnet_s were left)."""
    label = _label(node, norm.input)
    if norm.frozen:
        return _refusal("a frozen batch norm after a concatenation is not folded", label)
    if len(value_users(norm.input)) > 1:
        return _refusal(f"{norm.input.name} is read by more than the {norm.what}", label)
    if len(set(producers)) < len(producers):
        return _refusal(f"{norm.input.name} concatenates one layer's output twice", label)
    state = _norm_state(gm, norm)
    if state is None:
        return None
    if isinstance(state, str):
        return _refusal(state, label, training=TRAINING_HINT in state)
    layers = []
    for producer in producers:
        readers = value_users(producer)
        if len(readers) > 1:
            return _refusal(f"{producer.name}'s output has {len(readers)} users, not only the concatenation", label)
        layer = _read_layer(gm, producer, uses)
        if isinstance(layer, str):
            return _refusal(layer, label)
        if layer.kind == "linear" or not _batched_conv_output(gm, norm, layer):
            return _refusal(f"cannot prove {producer.name}'s output is batched conv channels (N, C, ...)", label)
        layers.append(layer)
    mean, var, eps, gamma, beta = state[1]
    if mean.numel() != sum(layer.channels for layer in layers):
        return _refusal(f"BN has {mean.numel()} channels, the concatenated layers produce another number", label)
    read_now = [t for t in (*state[1], *(w for layer in layers for w in (layer.weight, layer.bias))) if t is not None]
    if written and any(storage_of(t) in written for t in read_now if isinstance(t, torch.Tensor)):
        return _refusal("its statistics or the layers' weights may be written in place in the graph", label)
    scale, shift = bn_affine(mean, var, eps, gamma, beta)
    parts, start = [], 0
    for layer in layers:
        end = start + layer.channels
        parts.append(FoldPlan(node, layer.node, layer.kind, scale[start:end], shift[start:end], norm, layer))
        start = end
    return FoldPlan(node, norm.input, f"concatenation of {len(layers)} convs", scale, shift, norm, None, parts)


def _layer_kind(gm: nn.Module, node: fx.Node) -> str | None:
    kind = node_kind(gm, node)
    if kind in _LAYER_KINDS:
        return kind
    return "linear" if _matmul_parts(node) is not None else None


# ---- the batch norm side


# ATen batch norms: packet -> (weight, bias, running mean, running var, training, eps) positions (None: absent)
_ATEN_BATCH_NORMS = {
    "batch_norm": (1, 2, 3, 4, 5, 7),
    "native_batch_norm": (1, 2, 3, 4, 5, 7),
    "_native_batch_norm_legit": (1, 2, 3, 4, 5, 7),
    "_native_batch_norm_legit_functional": (1, 2, 3, 4, 5, 7),
    "_native_batch_norm_legit_no_training": (1, 2, 3, 4, None, 6),
}
_NO_STATS = (1, 2, None, None, 3, 5)  # _native_batch_norm_legit.no_stats
_TUPLE_RESULTS = {name for name in _ATEN_BATCH_NORMS if name != "batch_norm"}


def _plain_batch_norm_module(module: nn.Module | None) -> bool:
    """A BatchNorm module: a torch.nn one, or a subclass that keeps its forward (anything else may do more), that
    runs no hooks."""
    return isinstance(module, _BatchNorm) and type(module).forward is _BatchNorm.forward and not runs_hooks(module)


def _match_norm(gm: nn.Module, node: fx.Node, is_source) -> Norm | None:
    """The per-channel map ``node`` computes, read from the graph's structure alone (no statistics yet)."""
    if node.op == "call_module":
        if node_kind(gm, node) == "batch_norm" or _plain_batch_norm_module(submodule(gm, node)):
            return Norm(node, node.args[0], node, consumed=[node]) if node.args else None
        return None
    if node.op == "call_method":
        return _match_frozen(gm, node, is_source)
    if node.op != "call_function":
        return None
    if node.target is F.batch_norm or aten_packet(node) in _ATEN_BATCH_NORMS:
        if not node.args:
            return None
        output = _tuple_output(node) or node
        return Norm(node, node.args[0], output, consumed=[output, node] if output is not node else [node])
    return _match_frozen(gm, node, is_source)


def _tuple_output(node: fx.Node) -> fx.Node | None:
    """The lone ``getitem 0`` of a tuple-returning ATen batch norm; None for other forms or other reads."""
    if aten_packet(node) not in _TUPLE_RESULTS or len(node.users) != 1:
        return None
    (user,) = node.users
    return user if user.target is operator.getitem and user.args[1] == 0 else None


_ADD_FUNCTIONS = (operator.add, torch.add)
_MUL_FUNCTIONS = (operator.mul, torch.mul)


def _binary(node: fx.Node, functions: tuple, method: str, packet: str) -> tuple[Any, Any] | None:
    """The two operands of an out-of-place ``a + b`` / ``a * b`` in any form (no alpha, no out=)."""
    if node.kwargs or len(node.args) != 2:
        return None
    if node.op == "call_method" and node.target == method:
        return node.args
    if node.op != "call_function":
        return None
    if aten_packet(node) == packet or any(node.target is f for f in functions):
        return node.args
    return None


def _match_frozen(gm: nn.Module, node: fx.Node, is_source) -> Norm | None:
    """``x * scale + shift`` (either operand order) with ``x`` a layer output: a frozen batch norm's form."""
    operands = _binary(node, _ADD_FUNCTIONS, "add", "add")
    if operands is None:
        return None
    for product, shift in (operands, operands[::-1]):
        if not isinstance(product, fx.Node) or len(product.users) != 1:
            continue
        factors = _binary(product, _MUL_FUNCTIONS, "mul", "mul")
        if factors is None:
            continue
        for source, scale in (factors, factors[::-1]):
            if is_source(source) and not is_source(scale):
                return Norm(node, source, node, True, [node, product], scale, shift)
    return None


def _carries_activations(gm: nn.Module, value: Any, limit: int = 64) -> bool:
    """Whether ``value`` is computed from the graph's inputs: a graph input or a layer is among its nearest
    ``limit`` ancestors (bounded, so that scanning every node stays linear in the graph size)."""
    frontier, seen = [value] if isinstance(value, fx.Node) else [], set()
    while frontier and len(seen) < limit:
        node = frontier.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op in ("placeholder", "call_module") or _layer_kind(gm, node) is not None:
            return True
        frontier.extend(node.all_input_nodes)
    return False


def _norm_state(gm: nn.Module, norm: Norm):
    """``(kind, values)`` -- ``("bn", (mean, var, eps, gamma, beta))`` or ``("frozen", (scale, shift))`` --
    or why the map cannot fold. Reads statistics; constant subgraphs it evaluates join ``norm.consumed``."""
    node = norm.node
    if norm.frozen:
        values = []
        for arg in (norm.scale_arg, norm.shift_arg):
            value = _constant_or_literal(gm, arg, norm)
            if value is None and _carries_activations(gm, arg):
                return None  # x * scale + a residual (ConvNeXt's layer scale): no norm, nothing to say (QA)
            if value is None:
                return "its scale or shift is computed by calls fxforge cannot run at pass time"
            values.append(value)
        return "frozen", tuple(values)
    if node.op == "call_module":
        bn = submodule(gm, node)
        if bn.running_mean is None or bn.running_var is None:
            return "the BatchNorm has no running statistics (track_running_stats=False)"
        if bn.training:
            return f"the BatchNorm is in training mode (its statistics change with every batch): {TRAINING_HINT}"
        return "bn", (bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias)
    args = _bn_call_args(node)
    if args is None:
        return "the BatchNorm has arguments fxforge cannot read"
    mean_arg, var_arg, gamma_arg, beta_arg, training, eps = args
    if mean_arg is None or var_arg is None:
        # checked first: without running stats BN must use batch statistics, so the graph says training=True
        return "the BatchNorm has no running statistics (track_running_stats=False)"
    if training is not False:
        return f"the BatchNorm runs in training mode (training={training}): {TRAINING_HINT}"
    if aten_packet(node) in _TUPLE_RESULTS and norm.output is node:
        return "the BatchNorm's tuple result is read other than through one getitem 0"
    values = []
    for arg in (mean_arg, var_arg, gamma_arg, beta_arg):
        value = None if arg is None else _constant_or_literal(gm, arg, norm)
        if arg is not None and not isinstance(value, torch.Tensor):
            return "the BatchNorm takes statistics computed in the graph from its inputs, not stored tensors"
        values.append(value)
    mean, var, gamma, beta = values
    return "bn", (mean, var, eps, gamma, beta)


def _bn_call_args(node: fx.Node):
    """(mean, var, weight, bias, training, eps) of a functional or ATen batch norm call."""
    if node.target is F.batch_norm:
        names = ["input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps"]
        defaults = {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5}
        bound = {**defaults, **dict(zip(names, node.args)), **node.kwargs}
        keys = ("running_mean", "running_var", "weight", "bias", "training", "eps")
        return tuple(bound.get(key) for key in keys)
    packet = aten_packet(node)
    layout = _NO_STATS if getattr(node.target, "_overloadname", "") == "no_stats" else _ATEN_BATCH_NORMS.get(packet)
    if layout is None or node.kwargs or len(node.args) <= max(i for i in layout if i is not None):
        return None
    weight, bias, mean, var, training, eps = (None if i is None else node.args[i] for i in layout)
    return mean, var, weight, bias, False if layout[4] is None else training, eps


def _constant_or_literal(gm: nn.Module, arg: Any, norm: Norm) -> Any:
    """A number as is; a node's value when stored tensors alone compute it (its nodes join ``norm.consumed``)."""
    if isinstance(arg, (int, float)) and not isinstance(arg, bool):
        return arg
    if not isinstance(arg, fx.Node):
        return None
    found = constant_value(gm, arg)
    if found is None:
        return None
    value, nodes = found
    norm.consumed.extend(n for n in reversed(nodes) if n not in norm.consumed)
    return value


_CONSTANT_LIMIT = 64  # nodes: a frozen batch norm needs about a dozen; more is not a per-channel constant


def constant_value(gm: nn.Module, node: fx.Node) -> tuple[Any, list[fx.Node]] | None:
    """``node``'s value when it depends only on stored tensors and literals, through pure calls, with the nodes
    computing it in graph order; None otherwise.

    Frozen batch norms compute their scale and shift from buffers in the graph; running that arithmetic at
    pass time (the same calls on the same tensors) is what lets them fold. Nothing in the chain may be
    written in place by the graph: its value at run time would differ from the one read now.
    """
    order: list[fx.Node] = []
    seen: set[fx.Node] = set()

    def visit(current: fx.Node) -> bool:
        if current in seen:
            return True
        seen.add(current)
        if len(seen) > _CONSTANT_LIMIT or current.op not in ("get_attr", "call_function", "call_method"):
            return False
        if impure_reason(gm, current) is not None:
            return False
        if any(current in written_args(gm, user) for user in current.users):
            return False
        if not all(visit(source) for source in current.all_input_nodes):
            return False
        order.append(current)
        return True

    if not visit(node):
        return None
    values: dict[fx.Node, Any] = {}
    try:
        with torch.no_grad():
            for current in order:
                values[current] = _run(gm, current, values)
    except Exception:  # a call that fails at pass time is not folded; the graph would raise at run time too
        return None
    value = values[node]
    if isinstance(value, torch.Tensor) and value.device.type == "meta":
        return None
    return value, order


def _run(gm: nn.Module, node: fx.Node, values: dict[fx.Node, Any]) -> Any:
    if node.op == "get_attr":
        return get_attr_value(gm, str(node.target))
    args = fx.node.map_arg(node.args, values.__getitem__)
    kwargs = fx.node.map_arg(node.kwargs, values.__getitem__)
    if node.op == "call_method":
        return getattr(args[0], str(node.target))(*args[1:], **kwargs)
    return node.target(*args, **kwargs)


def _per_channel(gm: nn.Module, norm: Norm, state, layer: Layer) -> tuple[torch.Tensor, torch.Tensor] | str:
    """The float64 (scale, shift) per output channel of ``layer``, or why the map is not per-channel."""
    kind, values = state
    if kind == "bn":
        mean, var, eps, gamma, beta = values
        if mean.numel() != layer.channels:
            return f"BN has {mean.numel()} channels, {layer.node.name} produces {layer.channels}"
        if layer.kind == "linear" and layer.form != "matmul" and not _known_2d(norm.through or layer.node):
            return "cannot prove the linear output is 2-D, where BatchNorm1d normalises its features"
        if layer.kind != "linear" and not _batched_conv_output(gm, norm, layer):
            # an unbatched (C, L) conv output before a BatchNorm1d of C features: the norm reads L as its channels
            return (
                "cannot prove the conv output is batched (N, C, ...): a batch norm normalises dim 1, which on an "
                "unbatched (C, ...) output is not the channels"
            )
        return bn_affine(mean, var, eps, gamma, beta)
    vectors = []
    for value in values:
        vector = _channel_vector(value, layer)
        if isinstance(vector, str):
            return vector
        vectors.append(vector)
    return vectors[0], vectors[1]


def _channel_vector(value: Any, layer: Layer) -> torch.Tensor | str:
    """``value`` as one number per output channel, when broadcasting it against the layer output is exactly
    that (and cannot change the output's shape or dtype); else why not."""
    channels = layer.channels
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):  # inf * w sums +inf and -inf weights into NaN where the model gave +-inf
            return f"its scale or shift is {value}, not a finite number"
        return torch.full((channels,), float(value), dtype=torch.float64, device=layer.weight.device)
    if not isinstance(value, torch.Tensor):
        return f"its scale or shift is a {type(value).__name__}, not a tensor or a number"
    if value.device.type != "meta" and not bool(torch.isfinite(value).all()):
        return "its scale or shift holds a value that is not finite"
    if value.dtype != layer.weight.dtype:
        return f"its scale or shift is {value.dtype}, the layer computes in {layer.weight.dtype} (type promotion)"
    # the channel axis, counted from the right: (N, C, *spatial) for convs, (..., features) for linears
    axis = layer.weight.dim() - 1 if layer.kind != "linear" else 1
    shape = tuple(value.shape)
    output = getattr(node_value(layer.node), "shape", None)
    if len(shape) > axis and (output is None or len(shape) > len(output)):
        # (1, C, 1, 1) against an unbatched (C, H, W) conv output would add a dimension
        return f"cannot prove its {len(shape)}-D scale or shift keeps the shape of the layer output"
    for position, size in enumerate(reversed(shape), start=1):
        if size != 1 and not (position == axis and size == channels):
            return f"its scale or shift has shape {list(shape)}, not one value per output channel"
    vector = value.detach().double().reshape(-1)
    return vector.expand(channels).clone() if vector.numel() == 1 else vector


def _batched_conv_output(gm: nn.Module, norm: Norm, layer: Layer) -> bool:
    batched_rank = layer.weight.dim()  # (N, C, *spatial): as many dimensions as the weight
    shape = getattr(node_value(layer.node), "shape", None)
    if shape is not None:
        return len(shape) == batched_rank
    # no recorded shape (a module call inlined for the fold): the model asserting the rank proves it (timm's
    # BatchNormAct2d asserts x.ndim == 4), and BatchNorm2d and BatchNorm3d take only 4-D and 5-D inputs
    if _asserted_rank(layer.node) == batched_rank:
        return True
    module = gm.get_submodule(str(norm.node.target)) if norm.node.op == "call_module" else None
    ranks = {nn.BatchNorm2d: 4, nn.BatchNorm3d: 5}
    return any(isinstance(module, cls) and rank == batched_rank for cls, rank in ranks.items())


def _asserted_rank(node: fx.Node) -> int | None:
    """N when the graph asserts ``node.ndim == N`` (or ``node.dim() == N``) before going on, else None."""
    for reader in node.users:
        reads_rank = (reader.op == "call_function" and reader.target is getattr and reader.args[1:] == ("ndim",)) or (
            reader.op == "call_method" and reader.target == "dim" and len(reader.args) == 1
        )
        for compare in reader.users if reads_rank else ():
            asserted = any(user.target is torch._assert for user in compare.users)
            if compare.target is operator.eq and asserted and isinstance(compare.args[1], int):
                return compare.args[1]
    return None


_FLATTENING_METHODS = frozenset({"flatten", "view", "reshape"})
_FLATTENING_ATEN = frozenset({"flatten", "view", "_unsafe_view", "reshape"})


def _flattened_features(node: fx.Node) -> fx.Node | None:
    """The input of ``node`` where ``node`` reshapes it to 2-D keeping its last dimension (``x.flatten(0, 1)``
    of an (N, L, C) linear output: the features stay the features), as the recorded shapes show; else None."""
    if not node.args or not isinstance(node.args[0], fx.Node):
        return None
    reshapes = (
        (node.op == "call_method" and node.target in _FLATTENING_METHODS)
        or (node.op == "call_function" and node.target in (torch.flatten, torch.reshape))
        or aten_packet(node) in _FLATTENING_ATEN
    )
    before = getattr(node_value(node.args[0]), "shape", None)
    after = getattr(node_value(node), "shape", None)
    if not reshapes or before is None or after is None or len(after) != 2 or len(before) < 2:
        return None
    return node.args[0] if before[-1] == after[-1] and math.prod(before) == math.prod(after) else None


def _known_2d(node: fx.Node) -> bool:
    # BatchNorm1d normalises dim 1: the Linear's features only when its output is (N, C)
    shape = getattr(node_value(node), "shape", None)
    return shape is not None and len(shape) == 2


# ---- the layer side


def _read_layer(gm: nn.Module, node: fx.Node, uses: Counter[str]) -> Layer | str:
    if node.op == "call_module":
        return _read_module(gm, node, uses)
    if _matmul_parts(node) is not None:
        return _read_matmul(gm, node, uses)
    if node.op == "call_function":
        return _read_function(gm, node, uses)
    return f"{node.name} is a {node.op} node"


def _read_module(gm: nn.Module, node: fx.Node, uses: Counter[str]) -> Layer | str:
    module = submodule(gm, node)
    target = str(node.target)
    if type(module) not in WEIGHTED_LAYER_TYPES:
        return f"{type(module).__name__} is not a plain conv/linear module"
    if runs_hooks(module):
        return (
            f"module {target} runs hooks (a forward hook, or a pre-hook: pruning, weight_norm, spectral_norm), "
            "which folding would drop"
        )
    passed_whole = uses.whole[target] if isinstance(uses, Uses) else 0
    if uses[target] - passed_whole > 1:
        return (
            f"module {target} is called, or its parameters read, from more than one place; "
            "folding would change the others"
        )
    kind = node_kind(gm, node)
    channels = module.out_features if isinstance(module, nn.Linear) else module.out_channels
    transposed = isinstance(module, CONV_TRANSPOSE_TYPES)
    groups = getattr(module, "groups", 1)
    layer = Layer(node, kind, "module", module.weight, module.bias, channels, transposed, groups)
    layer.passed_whole = passed_whole > 0
    return layer


def _read_function(gm: nn.Module, node: fx.Node, uses: Counter[str]) -> Layer | str:
    """Functional conv/linear (torch dialect F.conv2d or ATen aten.conv2d): its weights must be stored, unshared."""
    args, kwargs = node.args, node.kwargs
    weight_node = args[1] if len(args) > 1 else kwargs.get("weight")
    bias_node = args[2] if len(args) > 2 else kwargs.get("bias")
    if not (isinstance(weight_node, fx.Node) and weight_node.op == "get_attr"):
        return f"the weight of {node.name} is not a stored parameter"
    if bias_node is not None and not (isinstance(bias_node, fx.Node) and bias_node.op == "get_attr"):
        return f"the bias of {node.name} is not a stored parameter"
    if any(uses[str(n.target)] > 1 for n in (weight_node, bias_node) if n is not None):
        return f"the weights of {node.name} are used elsewhere; folding would change the others"
    kind = node_kind(gm, node)
    weight = get_attr_value(gm, str(weight_node.target))
    bias = get_attr_value(gm, str(bias_node.target)) if bias_node is not None else None
    transposed, groups = kind == "conv_transpose", 1
    if aten_packet(node) == "convolution":
        transposed, groups = bool(args[6]), int(args[8])
    elif kind in ("conv", "conv_transpose"):
        groups = int(args[6]) if len(args) > 6 else int(kwargs.get("groups", 1))
    channels = weight.shape[1] * groups if transposed else weight.shape[0]
    return Layer(node, kind, "function", weight, bias, channels, transposed, groups, weight_node, bias_node)


def _matmul_parts(node: fx.Node) -> tuple[fx.Node, fx.Node | None, fx.Node] | None:
    """(transposed-weight node, bias node or None, the mm/addmm node) of a decomposed ATen linear:
    ``addmm(b, x, W.t())``, ``mm(x, W.t())`` or ``mm(x, W.t()) + b``; None for anything else."""
    if node.op != "call_function":
        return None
    bias = None
    matmul = node
    if node.target is torch.ops.aten.add.Tensor and len(node.args) == 2 and not node.kwargs:
        matmul, bias = node.args if _is_mm(node.args[0]) else node.args[::-1]
        if not (_is_mm(matmul) and len(matmul.users) == 1):
            return None
    if matmul.target is torch.ops.aten.addmm.default and not matmul.kwargs:
        bias, transposed = matmul.args[0], matmul.args[2]
    elif matmul.target is torch.ops.aten.mm.default:
        transposed = matmul.args[1]
    else:
        return None
    if not (isinstance(transposed, fx.Node) and _is_weight_transpose(transposed)):
        return None
    return transposed, bias, matmul


def _is_mm(node: Any) -> bool:
    return isinstance(node, fx.Node) and node.target is torch.ops.aten.mm.default


def _is_weight_transpose(node: fx.Node) -> bool:
    """``W.t()`` of a stored 2-D weight, in the spellings torch.export uses."""
    args = node.args
    if not (args and isinstance(args[0], fx.Node) and args[0].op == "get_attr"):
        return False
    if node.target is torch.ops.aten.t.default:
        return True
    if node.target is torch.ops.aten.permute.default:
        return list(args[1]) == [1, 0]
    if node.target is torch.ops.aten.transpose.int:
        return sorted(d % 2 for d in args[1:3]) == [0, 1]
    return False


def _read_matmul(gm: nn.Module, node: fx.Node, uses: Counter[str]) -> Layer | str:
    transposed, bias_node, _ = _matmul_parts(node)
    weight_node = transposed.args[0]
    if len(transposed.users) != 1:
        return f"the transposed weight of {node.name} has other users"
    if bias_node is not None and not (isinstance(bias_node, fx.Node) and bias_node.op == "get_attr"):
        return f"the bias of {node.name} is not a stored parameter"
    if any(uses[str(n.target)] > 1 for n in (weight_node, bias_node) if n is not None):
        return f"the weights of {node.name} are used elsewhere; folding would change the others"
    weight = get_attr_value(gm, str(weight_node.target))
    bias = get_attr_value(gm, str(bias_node.target)) if bias_node is not None else None
    if weight.dim() != 2 or (bias is not None and tuple(bias.shape) != (weight.shape[0],)):
        return f"{node.name} is not a linear layer's (out, in) weight and (out,) bias"
    return Layer(node, "linear", "matmul", weight, bias, weight.shape[0], weight_node=weight_node, bias_node=bias_node)


# ---- modules the graph calls as one node


class _ComputedConstant(Exception):
    """The traced module computes a tensor at trace time that is none of its stored tensors."""


class _CompositeTracer(fx.Tracer):
    """fx's default tracer, except that buffers read as attributes become ``get_attr`` nodes (a frozen batch
    norm computes its scale from buffers) and a tensor computed at trace time is refused: fx would store it
    on the traced module, and lint must not change the user's model."""

    def __init__(self) -> None:
        super().__init__()
        self.proxy_buffer_attributes = True

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        # a torch.nn module that hides a batch norm (SyncBatchNorm) is traced through too: a leaf inside the
        # inlined graph would be one more module call to inline after this one
        return not _hides_batch_norm(m) and super().is_leaf_module(m, module_qualified_name)

    def create_arg(self, a: Any) -> Any:
        if isinstance(a, torch.Tensor) and not self._stored(a):
            raise _ComputedConstant
        return super().create_arg(a)

    def _stored(self, tensor: torch.Tensor) -> bool:
        if isinstance(tensor, nn.Parameter) or self.tensor_attrs.get(tensor) is not None:
            return True
        return any(tensor is buffer for buffer in self.root.buffers())


def _bears_batch_norm(module: nn.Module) -> bool:
    """Holds a batch norm: a _BatchNorm, or a module with running statistics (a frozen batch norm)."""
    for inner in module.modules():
        if isinstance(inner, _BatchNorm) or {"running_mean", "running_var"} <= set(inner._buffers):
            return True
    return False


def _hides_batch_norm(module: nn.Module) -> bool:
    """Holds a batch norm that fold_bn cannot read from a call of it: not a BatchNorm module itself."""
    return not _plain_batch_norm_module(module) and _bears_batch_norm(module)


def _is_composite(gm: nn.Module, node: fx.Node) -> bool:
    """A call of a module fxforge does not read directly but that holds a batch norm."""
    return node.op == "call_module" and node_kind(gm, node) is None and _hides_batch_norm(submodule(gm, node))


def _trace_composite(gm: nn.Module, node: fx.Node, uses: Counter[str]) -> fx.Graph | Refusal:
    """The graph of the module ``node`` calls, ready to inline in its place, or why it cannot be inlined."""
    module, target = submodule(gm, node), str(node.target)
    label = f"{node.name} (a {type(module).__name__} call)"
    if runs_hooks(module):  # inlining its forward would drop them; a plain BatchNorm with a hook comes here too
        return _refusal(f"module {target} runs hooks (a forward hook or pre-hook), which folding would drop", label)
    if uses[target] > 1:
        return _refusal(f"module {target} is called, or its tensors read, from more than one place", label)
    if node.kwargs or not all(isinstance(arg, fx.Node) for arg in node.args):
        return _refusal("it is called with more than tensors by position", label)
    try:
        parameters = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return _refusal("fxforge cannot read its forward's signature", label)
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if len(parameters) != len(node.args) or any(p.kind not in positional for p in parameters):
        # a defaulted argument would be traced as a tensor, not as its default value
        return _refusal("its forward takes other arguments than the call passes", label)
    try:
        graph = _CompositeTracer().trace(module)
    except _ComputedConstant:
        return _refusal("it computes tensors at trace time that fxforge cannot keep", label)
    except Exception as exc:
        return _refusal(f"it cannot be traced to reach its batch norm ({first_line(exc)[:160]})", label)
    (output,) = [n for n in graph.nodes if n.op == "output"]
    if not isinstance(output.args[0], fx.Node):
        return _refusal("it returns a structure, not one tensor", label)
    return graph


def _inline_into(graph: fx.Graph, call: fx.Node, traced: fx.Graph, args: tuple) -> tuple[fx.Node, list[fx.Node]]:
    """Copy ``traced`` into ``graph`` at its insertion point for the module call ``call`` with ``args``;
    returns the node carrying the call's value and the new nodes.

    Attribute and module targets get the call's qualified path (``drop`` -> ``bn1.drop``), so the inlined
    nodes read the very tensors and submodules the call used. Provenance: the node carrying the call's value
    computes what ``call`` computed; the others compute values the captured graph never had, so their origin
    names no node there (verify's bisection skips them).
    """
    origin = call.meta.get(ORIGIN, call.name)
    placeholders = [n for n in traced.nodes if n.op == "placeholder"]
    env: dict[fx.Node, Any] = dict(zip(placeholders, args))
    created = []
    for inner in traced.nodes:
        if inner.op == "placeholder":
            continue
        if inner.op == "output":
            break
        target = f"{call.target}.{inner.target}" if inner.op in ("get_attr", "call_module") else inner.target
        new = graph.create_node(
            inner.op,
            target,
            fx.node.map_arg(inner.args, env.__getitem__),
            fx.node.map_arg(inner.kwargs, env.__getitem__),
            name=f"{call.name}_{inner.name}",
        )
        new.meta[ORIGIN] = f"{origin}/{inner.name}"
        new.meta[INLINED] = call.meta.get(INLINED, call.name)
        env[inner] = new
        created.append(new)
    output = env[inner.args[0]]
    if output in created:
        mark(output, NAME, origin_of=call)
    return output, created


def _scratch(gm: nn.Module, inline: dict[fx.Node, fx.Graph]) -> tuple[fx.Graph, dict[fx.Node, fx.Node]]:
    """A copy of ``gm.graph`` with the ``inline`` calls inlined, and each copied node's node in ``gm.graph``
    (the call, for inlined nodes). Targets stay qualified from ``gm``, so ``gm`` is the copy's root too."""
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}
    owner: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        if node in inline:
            env[node], created = _inline_into(graph, node, inline[node], tuple(env[a] for a in node.args))
            owner.update(dict.fromkeys(created, node))
        else:
            env[node] = graph.node_copy(node, env.__getitem__)
            owner[env[node]] = node
    return graph, owner


def _inline_in_place(gm: fx.GraphModule, call: fx.Node, traced: fx.Graph) -> None:
    """Replace the module call by its inlined graph. The module, and every module inside it that the inlined
    graph does not call, become plain containers of the same submodules and tensors: they are no longer
    called, and once the fold leaves their statistics unread those can go (a BatchNorm subclass holding
    only ``drop`` and ``act`` would still look like a BatchNorm)."""
    with gm.graph.inserting_before(call):
        output, _ = _inline_into(gm.graph, call, traced, call.args)
    call.replace_all_uses_with(output)
    gm.graph.erase_node(call)
    module, path = submodule(gm, call), str(call.target)
    called = {str(node.target) for node in traced.nodes if node.op == "call_module"}
    container = _containers(module, called, "")
    for node in traced.nodes:  # plain tensor attributes (not parameters or buffers) the inlined graph reads
        if node.op == "get_attr":
            owner_path, _, name = str(node.target).rpartition(".")
            owner = container.get_submodule(owner_path)
            if not hasattr(owner, name):
                setattr(owner, name, get_attr_value(module, str(node.target)))
    parent, _, child = path.rpartition(".")
    setattr(gm.get_submodule(parent) if parent else gm, child, container)


def _containers(module: nn.Module, called: set[str], path: str) -> nn.Module:
    """``module`` with itself and its descendants that are not in ``called`` turned into plain nn.Modules."""
    if path in called:
        return module
    container = nn.Module()
    for name, child in module.named_children():
        container.add_module(name, _containers(child, called, f"{path}.{name}" if path else name))
    for name, parameter in module._parameters.items():
        container.register_parameter(name, parameter)
    for name, buffer in module._buffers.items():
        container.register_buffer(name, buffer, persistent=name not in module._non_persistent_buffers_set)
    return container


# ---- the whole graph


@dataclass
class _Scan:
    decisions: list[tuple[fx.Node, FoldPlan | Refusal]]  # per node of the scanned graph, in graph order
    inline: dict[fx.Node, fx.Graph]  # module calls whose inlining lets a batch norm fold
    composites: set[fx.Node]


def _concatenated_layers(node: fx.Node, is_source) -> list[fx.Node]:
    """The layers ``node`` concatenates along the channels when it is ``cat`` of layer outputs alone, else []."""
    if node.op != "call_function" or node.target not in (torch.cat, torch.concat, torch.ops.aten.cat.default):
        return []
    parts = node.args[0] if node.args else node.kwargs.get("tensors")
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    shape = getattr(node_value(node), "shape", None)
    if isinstance(dim, int) and dim < 0 and shape is not None:  # cat(..., dim=-3) of (N, C, H, W): the channels
        dim += len(shape)
    if dim != 1 or not isinstance(parts, (list, tuple)) or len(parts) < 2:
        return []
    return list(parts) if all(is_source(part) for part in parts) else []


def _plans(gm: nn.Module, graph: fx.Graph, uses: Counter[str]) -> list[tuple[fx.Node, FoldPlan | Refusal]]:
    folded: dict[fx.Node, fx.Node] = {}
    plans = []
    written = written_stored_tensors(gm, graph)
    for node in graph.nodes:
        plan = plan_fold(gm, node, uses, folded, written)
        if plan is None:
            continue
        if isinstance(plan, FoldPlan):
            folded[plan.norm.output] = plan.producer
        plans.append((node, plan))
    return plans


def _scan(gm: fx.GraphModule) -> _Scan:
    """Every batch norm after a conv/linear: its plan or why not, including those inside module calls.

    Module calls that hold a batch norm are inlined into a scratch copy of the graph (the graph itself is
    not touched: lint runs this too) and planned there. A call is kept for inlining when one of its batch
    norms folds; dropping one can stop another from folding (its conv came from the dropped call), so the
    choice is repeated until it is stable.
    """
    uses = count_uses(gm.graph, shape_preserving=True)
    traces = {node: _trace_composite(gm, node, uses) for node in gm.graph.nodes if _is_composite(gm, node)}
    if not traces:
        return _Scan(_plans(gm, gm.graph, uses), {}, set())
    refused: dict[fx.Node, Refusal] = {n: t for n, t in traces.items() if isinstance(t, Refusal)}
    inline = {n: t for n, t in traces.items() if isinstance(t, fx.Graph)}
    while True:
        graph, owner = _scratch(gm, inline)
        plans = [(owner[node], plan) for node, plan in _plans(gm, graph, count_uses(graph, shape_preserving=True))]
        folding = {node for node, plan in plans if node in inline and isinstance(plan, FoldPlan)}
        for node, plan in plans:
            if node in inline and node not in folding:
                refused.setdefault(node, plan)
        if folding == set(inline):
            break
        inline = {node: inline[node] for node in folding}
    decisions = [(node, plan) for node, plan in plans if node not in refused or node in inline]
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    decisions += [(node, plan) for node, plan in refused.items() if node not in inline]
    decisions.sort(key=lambda item: order[item[0]])
    return _Scan(decisions, inline, set(traces))


def find_folds(gm: fx.GraphModule) -> list[tuple[fx.Node, FoldPlan | Refusal]]:
    """Each batch norm (or frozen one) after a conv/linear, in graph order, with its :class:`FoldPlan` or the
    :class:`Refusal` saying why it stays. Nodes are ``gm``'s own: for a batch norm inside a module call, the
    call (the plan then describes the batch norm the pass inlines). Lint rule FX008 reports these."""
    return _scan(gm).decisions


def _nothing_left_to_fold(gm: fx.GraphModule) -> str | None:
    """Postcondition: the shared detection finds no foldable batch norm (each was folded or refused)."""
    for _, plan in find_folds(gm):
        if isinstance(plan, FoldPlan):
            return f"{plan.label} can still be folded"
    return None


# --------------------------------------------------------------------------------------------------
# the pass


@register_pass(
    NAME,
    summary="Fold inference BatchNorm into the preceding Conv1d/2d/3d, ConvTranspose1d/2d/3d or Linear.",
    guarantees=(
        "Outputs equal up to fp32 round-off (weights folded in float64). Folds BatchNorm modules, F.batch_norm and "
        "ATen batch norms (batch_norm, _native_batch_norm_legit_no_training), frozen batch norms (x * scale + "
        "shift with per-channel scale and shift computed from stored tensors, e.g. torchvision/timm "
        "FrozenBatchNorm2d) and batch norms inside a module called as one node (e.g. timm BatchNormAct2d, "
        "ConvNormAct: the module is inlined, keeping its other parts, only when that lets a batch norm fold), "
        "into conv/conv-transpose/linear modules, F.conv*/F.linear and ATen convolutions/linear with stored "
        "weights, and ATen addmm/mm (+ add) linears; also a BatchNorm1d over a linear's output reshaped to 2-D with "
        "its features kept last (timm LeViT's LinearNorm: bn(linear(x).flatten(0, 1)), the reshape read by the "
        "batch norm alone); and a batch norm after torch.cat of conv outputs along the channels, each conv read by "
        "the cat alone (timm's MixedConv2d): each conv takes its slice of the channels. Reads of the layer "
        "output's or its weight's shape, rank or "
        "dtype (timm's same-padding convs read weight.shape) do not block a fold. A conv module that is also "
        "passed whole to a call fxforge cannot see into (HF MobileNetV2's apply_tf_padding(x, conv)) is folded "
        "into a copy for its own call; the opaque call keeps the original, so its weights are stored twice. "
        "Never folds a BN in training mode (the reason says: call model.eval() before capture), "
        "without running statistics, or with statistics or scale/shift computed from graph inputs, from stored "
        "tensors read elsewhere or by calls fxforge cannot run; a conv/linear whose output has other users; a "
        "conv module called from more than one place or whose weight or bias the graph also reads directly; a "
        "frozen batch norm after a concatenation of layers; a "
        "functional/ATen layer whose weights are not stored tensors or are read elsewhere; a Linear whose output "
        "is not known to be 2-D; a conv whose output is not known to be batched (N, C, ...: from its recorded "
        "shape, an assert on its rank, or a BatchNorm2d/3d that takes nothing else), where a batch norm on an "
        "unbatched (C, ...) output normalises another axis; a scale or shift that is not one value per output "
        "channel, has another dtype, is not finite, or may change the output's shape; a module call that is made "
        "more than once, passes more than tensors, cannot be traced or computes tensors at trace time. Each "
        "refusal is listed in the result with its reason. Folded weights and biases keep the layer's path in the "
        "state dict (layer1.0.conv1.weight, and a new layer1.0.conv1.bias) in both dialects, where the old weight "
        "is read by nothing else. Torch and ATen dialects."
    ),
    ensures=lambda gm, result: _nothing_left_to_fold(gm),
)
def fold_bn(gm: fx.GraphModule, options: None) -> PassResult:
    result = PassResult(NAME, gm)
    if any(_is_composite(gm, node) for node in gm.graph.nodes):  # else the sweep below sees everything
        scan = _scan(gm)
        for node, plan in scan.decisions:
            if node in scan.composites and node not in scan.inline:
                result.skip(f"{plan.label or node.name}: {plan}")
        for call, traced in scan.inline.items():
            _inline_in_place(gm, call, traced)
    fetched_before = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}  # inlined reads included
    uses = count_uses(gm.graph, shape_preserving=True)  # once: per-candidate scans would be quadratic
    erased: set[fx.Node] = set()  # by earlier folds (a frozen batch norm's arithmetic comes before it)
    written = written_stored_tensors(gm)  # folds add no writes: once
    # in graph order, so a BN after a folded BN (conv -> bn -> bn) sees the conv and folds too
    for node in list(gm.graph.nodes):
        if node in erased:
            continue
        plan = plan_fold(gm, node, uses, written=written)
        if isinstance(plan, Refusal):
            result.skip(f"{plan.label}: {plan}")
        elif plan is not None:
            erased |= _fold(gm, plan, result)
    if result.changed:
        _drop_stale_attributes(gm, fetched_before)
        _restore_layer_paths(gm)
    return result


def _fold(gm: fx.GraphModule, plan: FoldPlan, result: PassResult) -> set[fx.Node]:
    """Fold ``plan`` and log it; returns the nodes it erased."""
    parts = plan.parts or [plan]  # a batch norm after a concatenation: each layer its slice
    count = 0
    for part in parts:
        weight, bias = _FOLD_BY_FORM[part.layer.form](gm, part)
        count += weight.numel() + bias.numel()
    erased = _replace_norm(gm, plan)
    into = ", ".join(str(p.producer.target) if p.layer.form == "module" else p.producer.name for p in parts)
    what = f" ({plan.bn.name}: x * scale + shift, a frozen batch norm)" if plan.norm.frozen else ""
    where = f" ({plan.producer.name}: each its slice of the channels)" if plan.parts else ""
    result.note(f"folded {display_name(plan.bn)} into {into}{what}{where}", removed=1, folded=count)
    return erased


def _replace_norm(gm: fx.GraphModule, plan: FoldPlan) -> set[fx.Node]:
    """Make the producer compute the map's value; erase the map and what only it read (returned)."""
    output = plan.norm.output
    mark(plan.producer, NAME, origin_of=output)
    output.replace_all_uses_with(plan.norm.through or plan.producer)
    erased: set[fx.Node] = set()
    left = list(plan.norm.consumed)
    while True:  # the scale feeds the shift's arithmetic too: erase until nothing more goes
        unused = [node for node in left if not node.users]
        if not unused:
            return erased
        for node in unused:
            gm.graph.erase_node(node)
        erased.update(unused)
        left = [node for node in left if node not in erased]


def _drop_stale_attributes(gm: fx.GraphModule, fetched_before: set[str]) -> None:
    """Delete the tensors and submodules that the folded BNs and replaced weights leave unreferenced.

    torch.export also fetches each BN's ``num_batches_tracked``, which nothing reads: it goes once the BN's
    other statistics have gone.
    """
    fetched = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    for node in list(gm.graph.nodes):
        owner, _, attr = str(node.target).rpartition(".")
        if node.op != "get_attr" or attr != "num_batches_tracked" or not owner or node.users:
            continue
        if not any(f"{owner}.{name}" in fetched for name in ("running_mean", "running_var")):
            gm.graph.erase_node(node)
    prune_attributes(gm, fetched_before - {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"})


def _folded(plan: FoldPlan) -> tuple[torch.Tensor, torch.Tensor]:
    layer = plan.layer
    return fold_affine(layer.weight, layer.bias, plan.scale, plan.shift, layer.transposed, layer.groups)


def _fold_module(gm: fx.GraphModule, plan: FoldPlan) -> tuple[torch.Tensor, torch.Tensor]:
    module = submodule(gm, plan.producer)
    weight, bias = _folded(plan)
    # A new module with new Parameters: the old ones may be shared with the user's model.
    fused = copy.deepcopy(module)
    fused.weight = nn.Parameter(weight, requires_grad=module.weight.requires_grad)
    fused.bias = nn.Parameter(bias, requires_grad=module.weight.requires_grad)
    target = str(plan.producer.target)
    parent_name, _, child = target.rpartition(".")
    parent = gm.get_submodule(parent_name) if parent_name else gm
    if plan.layer.passed_whole:
        # Whatever the opaque calls read of the module (HF's apply_tf_padding reads only its stride and kernel
        # size, but fxforge cannot see that), they keep reading the original. One scan per such fold only.
        kept = child + "_unfolded"
        while hasattr(parent, kept):
            kept += "_"
        parent.add_module(kept, module)
        for node in gm.graph.nodes:
            if node.op == "get_attr" and node.target == target:
                node.target = f"{parent_name}.{kept}" if parent_name else kept
    setattr(parent, child, fused)
    return weight, bias


def _store_pair(gm: fx.GraphModule, plan: FoldPlan, weight: torch.Tensor, bias: torch.Tensor, reader: fx.Node):
    """New stored tensors for the folded weight and bias, read by new get_attr nodes placed before ``reader``
    (the node that reads the weight) and the producer."""
    producer = plan.producer
    weight_name = store_tensor(gm, f"{producer.name}_folded_weight", weight)
    bias_name = store_tensor(gm, f"{producer.name}_folded_bias", bias)
    with gm.graph.inserting_before(reader):
        weight_node = gm.graph.get_attr(weight_name)
    with gm.graph.inserting_before(producer):
        bias_node = gm.graph.get_attr(bias_name)
    if plan.layer.weight_node.op == "get_attr":  # where the pair may move once the old weights are gone
        weight_node.meta[_LAYER_PATH] = ("weight", str(plan.layer.weight_node.target))
        bias_node.meta[_LAYER_PATH] = ("bias", str(plan.layer.weight_node.target))
    return weight_node, bias_node


_LAYER_PATH = "fxforge_fold_bn_layer_path"  # node meta, while the pass runs: (weight|bias, the old weight's path)


def _restore_layer_paths(gm: fx.GraphModule) -> None:
    """Store each folded pair where the layer's own weight was (``layer1.0.conv1.weight`` and ``...conv1.bias``),
    once the old weight is gone: an ATen graph's state dict then keeps the model's module paths, as the torch
    dialect's folded modules do, instead of ``conv2d_12_folded_weight`` (QA). Only where both paths are free and
    their owners are the plain containers fx and torch.export build (never a module of the user's); a weight read
    elsewhere, or not named ``weight``, keeps the pair's own names."""
    fetched = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    pairs: dict[str, dict[str, fx.Node]] = {}
    for node in gm.graph.nodes:
        if node.op == "get_attr" and _LAYER_PATH in node.meta:
            role, original = node.meta.pop(_LAYER_PATH)
            pairs.setdefault(original, {})[role] = node
    for original, nodes in pairs.items():
        owner_path, _, attr = original.rpartition(".")
        targets = {"weight": original, "bias": f"{owner_path}.bias" if owner_path else "bias"}
        if attr != "weight" or set(nodes) != set(targets) or any(t in fetched for t in targets.values()):
            continue
        owner = _plain_container(gm, owner_path)
        if owner is None or any(hasattr(owner, role) for role in targets):
            continue
        for role, node in nodes.items():
            stored = str(node.target)
            owner.register_parameter(role, gm.get_parameter(stored))
            delattr(gm, stored)
            node.target = targets[role]
            fetched.add(targets[role])


def _plain_container(gm: fx.GraphModule, path: str) -> nn.Module | None:
    """The module at ``path``, made of plain ``nn.Module`` containers where it is missing; None where a module on
    the way is anything else (it may be the user's own)."""
    owner: nn.Module = gm
    for part in path.split(".") if path else []:
        child = owner._modules.get(part)
        if child is None:
            if hasattr(owner, part):
                return None
            child = nn.Module()
            owner.add_module(part, child)
        elif type(child) is not nn.Module:
            return None
        owner = child
    return owner


def _erase_if_unused(gm: fx.GraphModule, *nodes: fx.Node | None) -> None:
    for node in nodes:
        if node is not None and not node.users:
            gm.graph.erase_node(node)


def _fold_function(gm: fx.GraphModule, plan: FoldPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """Functional conv/linear (torch dialect F.conv2d or ATen aten.conv2d) with stored weights."""
    producer, layer = plan.producer, plan.layer
    weight, bias = _folded(plan)
    # Before the old weight's get_attr: its metadata reads (timm's same padding reads weight.shape) move too.
    weight_node, bias_node = _store_pair(gm, plan, weight, bias, layer.weight_node)
    layer.weight_node.replace_all_uses_with(weight_node)
    if layer.bias_node is not None:
        producer.replace_input_with(layer.bias_node, bias_node)
    else:
        _set_missing_bias(producer, bias_node)
    _erase_if_unused(gm, layer.weight_node, layer.bias_node)
    return weight, bias


def _fold_matmul(gm: fx.GraphModule, plan: FoldPlan) -> tuple[torch.Tensor, torch.Tensor]:
    """Decomposed ATen linear: the stored ``W`` behind ``W.t()`` is scaled row by row, and the bias is
    replaced -- ``mm(x, W.t())`` becomes ``addmm(b, x, W.t())`` to take one."""
    layer = plan.layer
    transposed, _, matmul = _matmul_parts(plan.producer)
    weight, bias = _folded(plan)
    weight_node, bias_node = _store_pair(gm, plan, weight, bias, transposed)
    transposed.replace_input_with(layer.weight_node, weight_node)
    if layer.bias_node is not None:  # addmm's first argument, or the add after mm
        plan.producer.replace_input_with(layer.bias_node, bias_node)
    else:
        matmul.target = torch.ops.aten.addmm.default
        matmul.args = (bias_node, *matmul.args)
    _erase_if_unused(gm, layer.weight_node, layer.bias_node)
    return weight, bias


_FOLD_BY_FORM = {"module": _fold_module, "function": _fold_function, "matmul": _fold_matmul}


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
