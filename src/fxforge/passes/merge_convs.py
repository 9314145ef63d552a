"""merge_convs: fold two back-to-back linear layers (conv -> conv, linear -> linear) into one.

With nothing between them, ``B(A(x))`` is one linear map of ``x``. It is one *layer* of the same kind
exactly in these cases, and only these are merged:

* linear -> linear: ``W = W2 @ W1``, ``b = W2 @ b1 + b2``;
* any conv A -> a conv B that does not pad: B's tap ``t`` at output ``i`` reads A's output at
  ``sB * i + dB * t``, which reads A's (padded) input at ``sA * (sB * i + dB * t) + dA * a``. That is one conv
  of the input with A's padding and padding mode, stride ``sA * sB`` and the two kernels composed: tap
  ``(t, a)`` lands at offset ``sA * dB * t + dA * a``, written as a kernel of dilation
  ``gcd(sA * dB, dA)``. Its output size is B's (the floors nest). Special cases: a 1x1 B (strided or
  not) keeps A's kernel; a 1x1 A keeps B's kernel, dilated by A's stride. A's padding pads the *input*,
  which the merged conv pads alike, so A's bias at the border is computed as before;
* a 1x1 conv A with stride 1 and no padding -> a conv B that pads: A maps each pixel on its own, so one conv
  with B's geometry computes both -- as long as B's padding does not see A's bias. B's zero padding pads A's
  *output* with zeros where the merged conv would produce ``A(0) = bias``: exact only when A has no bias.
  Reflect, replicate and circular padding copy pixels, which commutes with the per-pixel A: always exact.

Any other padded B is refused: it pads A's output with values no conv of the input produces there.

The bias becomes ``sum_t B[:, :, t] @ b_A + b_B``. Groups: output group ``g`` of B reads a block of the middle
channels, each of which reads one block of A's inputs, so the merged conv has ``gcd(groups_A, groups_B)``
groups (a dense conv when one of them is ungrouped). Everything is computed in float64 and cast back, so
results differ from the pair by float round-off only.

The same detection (:func:`plan_merge`, :meth:`MergePlan.refused`) drives lint rule FX009, so the rule reports
exactly the pairs this pass merges with its default options (a pair whose merged layer is larger than the two is
merged only with ``allow_larger``, and not reported).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import fx, nn

from fxforge.graphs import aten_packet, get_attr_value, node_arg, node_kind, reads_metadata_only, submodule
from fxforge.passes import PassResult, mark, register_pass, store_tensor
from fxforge.passes.dead_code import prune_attributes

NAME = "merge_convs"
_CONV_FUNCTIONS = (F.conv1d, F.conv2d, F.conv3d)
_LAYER_KINDS = ("conv", "linear")


@dataclass
class MergeConvsOptions:
    # A low-rank bottleneck (512 -> 64 -> 512) has fewer weights than its product: merging it is exact but
    # makes the model bigger and slower, so by default such pairs are skipped with their weight counts.
    allow_larger: bool = False


@dataclass
class Layer:
    """A conv or linear call in any form (module, functional, ATen), read from the graph."""

    node: fx.Node
    kind: str  # "conv" or "linear"
    form: str  # "module" (call_module) or "function" (F.conv2d / aten.conv2d with get_attr weights)
    weight: torch.Tensor
    bias: torch.Tensor | None
    owners: tuple[str, ...]  # the module path, or the get_attr targets of weight and bias: merging rewrites them
    stride: tuple[int, ...] = ()
    padding: tuple[int, ...] | str = ()
    dilation: tuple[int, ...] = ()
    groups: int = 1
    padding_mode: str = "zeros"

    @property
    def kernel(self) -> tuple[int, ...]:
        return tuple(self.weight.shape[2:])

    @property
    def in_channels(self) -> int:
        return self.weight.shape[1] * self.groups

    @property
    def out_channels(self) -> int:
        return self.weight.shape[0]

    def pads(self) -> bool:
        if isinstance(self.padding, str):
            # "same" pads dilation * (kernel - 1) in total along each dimension
            return self.padding == "same" and any(d * (k - 1) for d, k in zip(self.dilation, self.kernel))
        return any(p != 0 for p in self.padding)

    def explicit_padding(self) -> tuple[int, ...] | None:
        """The padding as one int per side and dimension; None for an asymmetric ``"same"``."""
        if not isinstance(self.padding, str):
            return tuple(self.padding)
        if self.padding == "valid":
            return (0,) * len(self.kernel)
        totals = [d * (k - 1) for d, k in zip(self.dilation, self.kernel)]
        return None if any(t % 2 for t in totals) else tuple(t // 2 for t in totals)

    def is_pointwise(self) -> bool:
        """A 1x1 conv with stride 1 and no padding: it maps every pixel on its own."""
        return all(k == 1 for k in self.kernel) and all(s == 1 for s in self.stride) and not self.pads()


@dataclass
class Geometry:
    """The merged conv's kernel size, stride, padding, dilation and padding mode."""

    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...] | str
    dilation: tuple[int, ...]
    padding_mode: str = "zeros"


@dataclass
class MergePlan:
    """Two layers that one layer computes exactly, and how."""

    first: Layer
    second: Layer
    reason: str  # why one layer computes both, for logs and FX009
    geometry: Geometry  # of the merged layer (empty tuples for linears)
    groups: int
    # per spatial dimension, where the taps land in the merged kernel: second's tap t and first's tap a at
    # t * steps[d][0] + a * steps[d][1]
    steps: tuple[tuple[int, int], ...] = ()

    @property
    def separate_weights(self) -> int:
        return self.first.weight.numel() + self.second.weight.numel()

    @property
    def merged_weights(self) -> int:
        return self.second.out_channels * (self.first.in_channels // self.groups) * math.prod(self.geometry.kernel)

    def refused(self, options: MergeConvsOptions) -> str | None:
        """Why the pass leaves this pair alone with ``options`` (a larger merged layer), else None. FX009 asks the
        same question with the default options, which ``lint --fix`` runs."""
        if self.merged_weights > self.separate_weights and not options.allow_larger:
            return (
                f"the merged layer would have {self.merged_weights:,} weights, the two together have "
                f"{self.separate_weights:,} (set allow_larger to merge anyway)"
            )
        return None


class Uses(Counter):
    """Module calls and stored-tensor reads per target (see :func:`count_uses`). ``whole``: per called module,
    the readers of the module *object* fetched by ``get_attr`` (HF MobileNetV2's ``apply_tf_padding(x,
    self.convolution)`` is an opaque call that receives the conv module); they are in the total too."""

    def __init__(self) -> None:
        super().__init__()
        self.whole: Counter[str] = Counter()
        self.tied: set[int] = set()  # ids of stored tensors registered under more than one name (tied weights)


def count_uses(graph: fx.Graph, shape_preserving: bool = False, gm: nn.Module | None = None) -> Uses:
    """How often each module is called and each stored tensor read, counted once for the whole graph; with ``gm``,
    also which stored tensors are tied (one tensor under two names: a merge would untie them).

    A ``get_attr`` of a module's parameter counts as a use of that module too: merging replaces the
    module, and the direct read would then see the merged weights. ``shape_preserving``: the caller's
    rewrite keeps every tensor's shape and dtype (fold_bn), so reads of a stored tensor's metadata only
    (timm's same-padding conv reads ``weight.shape``) are not uses.
    """
    uses = Uses()
    fetched: Counter[str] = Counter()
    called: set[str] = set()
    for node in graph.nodes:
        if node.op == "call_module":
            uses[str(node.target)] += 1
            called.add(str(node.target))
        elif node.op == "get_attr":
            target = str(node.target)
            users = len(value_users(node)) if shape_preserving else len(node.users)
            uses[target] += users
            fetched[target] += users
            owner = target.rpartition(".")[0]
            if owner:
                uses[owner] += users
    uses.whole.update({target: fetched[target] for target in called if fetched[target]})
    if gm is not None:
        names = Counter(id(t) for _, t in gm.named_parameters(remove_duplicate=False))
        names.update(id(t) for _, t in gm.named_buffers(remove_duplicate=False))
        uses.tied = {tensor for tensor, count in names.items() if count > 1}
    return uses


def tied_problem(layers: Iterable[Layer], uses: Counter[str]) -> str | None:
    """Why layers whose weight or bias is tied to another name (``c.weight = a.weight``) cannot be merged."""
    tied = getattr(uses, "tied", set())
    for layer in layers:
        if any(t is not None and id(t) in tied for t in (layer.weight, layer.bias)):
            return f"{layer.owners[0]}'s weights are tied to another module's; merging would untie them"
    return None


def _reads_rank_only(user: fx.Node, node: fx.Node) -> bool:
    """Does ``user`` read only the rank, dtype or device of ``node``: what a merged conv's output shares with the
    first conv's (its shape it does not: the channels are the second conv's)?"""
    if not reads_metadata_only(user, node):
        return False
    if user.op == "call_function" and user.target is getattr:
        return user.args[1] in ("ndim", "dtype", "device", "is_cuda", "layout")
    return user.op == "call_method" and user.target in ("dim", "ndimension", "get_device")


def value_users(node: fx.Node) -> list[fx.Node]:
    """The users of ``node`` that read its value, not only its metadata."""
    return [user for user in node.users if not reads_metadata_only(user, node)]


def _ints(value: object, n: int) -> tuple[int, ...] | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * n
    if isinstance(value, (tuple, list)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        if len(value) == 1:
            return tuple(value) * n
        return tuple(value) if len(value) == n else None
    return None


def _stored(gm: nn.Module, value: object) -> torch.Tensor | str | None:
    """The tensor a ``get_attr`` argument names; None for None; a reason string for anything else."""
    if value is None:
        return None
    if isinstance(value, fx.Node) and value.op == "get_attr":
        tensor = get_attr_value(gm, str(value.target))
        if isinstance(tensor, torch.Tensor):
            return tensor
    return "is computed in the graph, not a stored tensor"


def read_layer(gm: nn.Module, node: fx.Node) -> Layer | str | None:
    """The conv/linear ``node`` computes; None when it is neither, a reason string when it cannot be read."""
    kind = node_kind(gm, node)
    if kind not in _LAYER_KINDS:
        return None
    if node.op == "call_module":
        return _read_module(gm, node, kind)
    return _read_function(gm, node, kind)


def _read_module(gm: nn.Module, node: fx.Node, kind: str) -> Layer | str:
    module = submodule(gm, node)
    if len(node.args) != 1 or node.kwargs:
        return f"{node.name} is called with more than its input"
    owners = (str(node.target),)
    if kind == "linear":
        return Layer(node, kind, "module", module.weight, module.bias, owners)
    padding = module.padding if isinstance(module.padding, str) else tuple(module.padding)
    return Layer(
        node,
        kind,
        "module",
        module.weight,
        module.bias,
        owners,
        tuple(module.stride),
        padding,
        tuple(module.dilation),
        module.groups,
        module.padding_mode,
    )


def _read_function(gm: nn.Module, node: fx.Node, kind: str) -> Layer | str:
    weight_arg, bias_arg = node_arg(node, 1, "weight"), node_arg(node, 2, "bias")
    weight, bias = _stored(gm, weight_arg), _stored(gm, bias_arg)
    if not isinstance(weight, torch.Tensor):
        return f"the weight of {node.name} {weight or 'is missing'}"
    if isinstance(bias, str):
        return f"the bias of {node.name} {bias}"
    owners = tuple(str(arg.target) for arg in (weight_arg, bias_arg) if arg is not None)
    if kind == "linear":
        return Layer(node, kind, "function", weight, bias, owners)
    n = weight.dim() - 2
    if aten_packet(node) == "convolution":
        if len(node.args) != 9:
            return f"{node.name} has arguments fxforge cannot read"
        stride, padding, dilation, groups = node.args[3], node.args[4], node.args[5], node.args[8]
    elif aten_packet(node) in ("conv1d", "conv2d", "conv3d") or node.target in _CONV_FUNCTIONS:
        stride = node_arg(node, 3, "stride", 1)
        padding = node_arg(node, 4, "padding", 0)
        dilation = node_arg(node, 5, "dilation", 1)
        groups = node_arg(node, 6, "groups", 1)
    else:
        return f"{node.name} is a convolution form fxforge cannot read"
    stride_t, dilation_t = _ints(stride, n), _ints(dilation, n)
    padding_t = padding if isinstance(padding, str) else _ints(padding, n)
    if stride_t is None or dilation_t is None or padding_t is None or not isinstance(groups, int):
        return f"{node.name} has stride, padding, dilation or groups computed in the graph"
    return Layer(node, kind, "function", weight, bias, owners, stride_t, padding_t, dilation_t, groups)


def _kernel_text(layer: Layer) -> str:
    return _size_text(layer.kernel)


def _size_text(kernel: tuple[int, ...]) -> str:
    if len(kernel) == 1:
        return f"size-{kernel[0]}"
    return "x".join(str(k) for k in kernel)


def plan_merge(gm: nn.Module, node: fx.Node, uses: Counter[str]) -> MergePlan | str | None:
    """How to merge ``node`` with the layer feeding it; None when ``node`` is not a conv/linear fed by one
    of the same kind, a reason string when they are such a pair but cannot be merged exactly.

    ``uses`` is :func:`count_uses` of the graph, computed once by the caller to keep scans linear.
    """
    producer = node_arg(node, 0, "input")
    if not isinstance(producer, fx.Node) or node_kind(gm, node) not in _LAYER_KINDS:
        return None
    if node_kind(gm, producer) != node_kind(gm, node):
        return None
    second, first = read_layer(gm, node), read_layer(gm, producer)
    for layer in (first, second):
        if isinstance(layer, str):
            return layer
    others = [user for user in producer.users if user is not node and not _reads_rank_only(user, producer)]
    if others:
        return f"{producer.name}'s output has {len(others) + 1} users, not only {node.name}"
    if first.form != second.form:
        return "one is a module call and the other a function call"
    for layer in (first, second):
        shared = [owner for owner in layer.owners if uses[owner] > 1]
        if shared:
            what = "module" if layer.form == "module" else "stored tensor"
            return f"{what} {shared[0]} is used from more than one place; merging would change the others"
    tied = tied_problem((first, second), uses)
    if tied is not None:
        return tied
    if first.weight.dtype != second.weight.dtype:
        return f"the layers have different dtypes ({first.weight.dtype} and {second.weight.dtype})"
    if first.kind == "linear":
        reason = "linear after linear is one linear map (W2 @ W1, W2 @ b1 + b2)"
        return MergePlan(first, second, reason, Geometry((), (), (), ()), 1)
    if first.weight.dim() != second.weight.dim():
        return "the convolutions have different dimensionality"
    return _plan_convs(first, second)


def _plan_convs(first: Layer, second: Layer) -> MergePlan | str:
    groups = math.gcd(first.groups, second.groups)
    if not second.pads():
        composed = _compose(first, second)
        if isinstance(composed, str):
            return composed
        geometry, steps = composed
        return MergePlan(first, second, _composed_reason(first, second, geometry), geometry, groups, steps)
    k = _kernel_text(second)
    if not first.is_pointwise():
        return (
            f"{second.node.name} pads the output of the {_kernel_text(first)} conv {first.node.name}; no conv of "
            f"the input computes what that padding holds (only a 1x1 stride-1 unpadded first conv allows it)"
        )
    if second.padding_mode != "zeros":
        reason = (
            f"a {k} conv with {second.padding_mode} padding after a 1x1 stride-1 unpadded conv (the padding "
            f"copies pixels, which commutes with the 1x1): one {k} conv with weights W2 @ W1"
        )
    elif first.bias is None:
        reason = (
            f"a zero-padded {k} conv after a bias-free 1x1 stride-1 conv (which maps the zero padding "
            f"to zeros): one {k} conv with weights W2 @ W1"
        )
    else:
        return (
            f"{second.node.name} zero-pads the output of {first.node.name}, whose bias would then show "
            f"where the padding was"
        )
    geometry = Geometry(second.kernel, second.stride, second.padding, second.dilation, second.padding_mode)
    return MergePlan(first, second, f"{reason} computes both", geometry, groups, ((1, 0),) * len(second.kernel))


def _compose(first: Layer, second: Layer) -> tuple[Geometry, tuple[tuple[int, int], ...]] | str:
    """The one conv of the input that computes an unpadded ``second`` after ``first`` (see the module doc)."""
    kernel, dilation, steps = [], [], []
    for k_a, s_a, d_a, k_b, d_b in zip(first.kernel, first.stride, first.dilation, second.kernel, second.dilation):
        if k_b == 1:  # the second conv only picks positions: the first's kernel as it is
            kernel.append(k_a), dilation.append(d_a), steps.append((0, 1))
        elif k_a == 1:  # the first conv only picks positions: the second's kernel, spread by the first's stride
            kernel.append(k_b), dilation.append(s_a * d_b), steps.append((1, 0))
        else:
            unit = math.gcd(s_a * d_b, d_a)
            step_b, step_a = s_a * d_b // unit, d_a // unit
            kernel.append(step_b * (k_b - 1) + step_a * (k_a - 1) + 1), dilation.append(unit)
            steps.append((step_b, step_a))
    stride = tuple(a * b for a, b in zip(first.stride, second.stride))
    padding: tuple[int, ...] | str | None = first.padding
    keeps_first = tuple(kernel) == first.kernel and stride == first.stride and tuple(dilation) == first.dilation
    if isinstance(padding, str) and not keeps_first:
        padding = first.explicit_padding()
        if padding is None:
            return f'{first.node.name} pads asymmetrically (padding="same", even kernel): a strided conv cannot'
    return Geometry(tuple(kernel), stride, padding, tuple(dilation), first.padding_mode), tuple(steps)


def _composed_reason(first: Layer, second: Layer, geometry: Geometry) -> str:
    k_first, k_second = _kernel_text(first), _kernel_text(second)
    if second.is_pointwise():
        return (
            f"a 1x1 stride-1 unpadded conv after a {k_first} conv mixes channels only: "
            f"one {k_first} conv with weights W2 @ W1 computes both"
        )
    if all(k == 1 for k in second.kernel):
        stride = "x".join(str(s) for s in geometry.stride)
        return (
            f"a strided unpadded 1x1 conv after a {k_first} conv keeps some of its outputs: "
            f"one {k_first} conv with stride {stride} and weights W2 @ W1 computes both"
        )
    if first.is_pointwise():
        return (
            f"a {k_second} unpadded conv after a 1x1 stride-1 unpadded conv: "
            f"one {k_second} conv with weights W2 @ W1 computes both"
        )
    return (
        f"an unpadded {k_second} conv after a {k_first} conv reads the input through both kernels: one "
        f"{_size_text(geometry.kernel)} conv (the kernels composed, stride {list(geometry.stride)}, dilation "
        f"{list(geometry.dilation)}, the first conv's padding) computes both"
    )


def merged_parameters(plan: MergePlan) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The merged layer's (weight, bias), computed in float64 and cast back to the layers' dtype."""
    dtype, groups = plan.second.weight.dtype, plan.groups
    a = _dense_within(plan.first.weight.detach().double(), plan.first.groups, groups)  # (g, mid, in, *k_a)
    b = _dense_within(plan.second.weight.detach().double(), plan.second.groups, groups)  # (g, out, mid, *k_b)
    kernel_a, kernel_b = a.shape[3:], b.shape[3:]
    weight = a.new_zeros(groups, b.shape[1], a.shape[2], *plan.geometry.kernel)
    for tap in itertools.product(*(range(k) for k in kernel_b)):
        # second's tap t sees all of first's taps, at t * step_b + a * step_a in the merged kernel
        window = tuple(
            slice(t * step_b, t * step_b + step_a * (k - 1) + 1, max(step_a, 1))
            for t, k, (step_b, step_a) in zip(tap, kernel_a, plan.steps)
        )
        weight[(slice(None),) * 3 + window] += torch.einsum("gom,gmi...->goi...", b[(..., *tap)], a)
    weight = weight.reshape(plan.second.out_channels, -1, *plan.geometry.kernel)
    bias = _merged_bias(plan, b)
    return weight.to(dtype), None if bias is None else bias.to(dtype)


def _dense_within(weight: torch.Tensor, groups: int, merged_groups: int) -> torch.Tensor:
    """A conv weight ``(out, in / groups, *k)`` as ``merged_groups`` dense blocks ``(g, out / g, in / g, *k)``,
    zero where the layer's finer groups do not connect an output to an input."""
    sub = groups // merged_groups
    out_per, in_per, kernel = weight.shape[0] // groups, weight.shape[1], weight.shape[2:]
    blocks = weight.reshape(merged_groups, sub, out_per, in_per, *kernel)
    if sub > 1:  # block-diagonal within each merged group
        eye = torch.eye(sub, dtype=weight.dtype, device=weight.device)
        blocks = torch.einsum("gsoi...,st->gsoti...", blocks, eye)
    return blocks.reshape(merged_groups, sub * out_per, sub * in_per, *kernel)


def _merged_bias(plan: MergePlan, b: torch.Tensor) -> torch.Tensor | None:
    bias_a, bias_b = plan.first.bias, plan.second.bias
    if bias_a is None:
        return None if bias_b is None else bias_b.detach().double()
    # every tap of the second layer reads the first's bias (it does not zero-pad it, or the plan was refused)
    taps = b.flatten(3).sum(dim=3) if b.dim() > 3 else b  # (g, out, mid); sum(dim=()) would sum everything
    merged = torch.einsum("gom,gm->go", taps, bias_a.detach().double().reshape(plan.groups, -1)).reshape(-1)
    return merged if bias_b is None else merged + bias_b.detach().double()


def _apply(gm: fx.GraphModule, plan: MergePlan, uses: Counter[str]) -> set[str]:
    """Make ``plan.second``'s node compute the merged layer from ``plan.first``'s input; returns the targets
    of the stored tensors no node reads any more."""
    weight, bias = merged_parameters(plan)
    first, second = plan.first.node, plan.second.node
    source = node_arg(first, 0, "input")
    old_weight_nodes = [n for n in (*first.all_input_nodes, *second.all_input_nodes) if n.op == "get_attr"]
    if plan.first.form == "module":
        _install_module(gm, plan, weight, bias)
        second.args = (source,)
    else:
        _rewrite_call(gm, plan, weight, bias, source, uses)
    # the merged node computes what the second layer computed, so it keeps its name and origin
    mark(second, NAME, origin_of=second)
    # reads of the first layer's rank, dtype or device (timm's assert x.ndim == 4) read the same of its input: a
    # conv keeps the rank, dtype and device (plan_merge allows no other reads), and the input comes before them
    first.replace_all_uses_with(source)
    gm.graph.erase_node(first)
    stale = set()
    for node in old_weight_nodes:
        if not node.users:
            stale.add(str(node.target))
            gm.graph.erase_node(node)
    return stale


def _install_module(gm: fx.GraphModule, plan: MergePlan, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    """A new module (the old ones may be shared with the user's model) at the second layer's path."""
    geometry, second_module = plan.geometry, submodule(gm, plan.second.node)
    factory = {"device": weight.device, "dtype": weight.dtype}
    if plan.first.kind == "linear":
        merged = nn.utils.skip_init(nn.Linear, weight.shape[1], weight.shape[0], bias=bias is not None, **factory)
    else:
        merged = nn.utils.skip_init(
            type(second_module),
            plan.first.in_channels,
            plan.second.out_channels,
            geometry.kernel,
            stride=geometry.stride,
            padding=geometry.padding,
            dilation=geometry.dilation,
            groups=plan.groups,
            bias=bias is not None,
            padding_mode=geometry.padding_mode,
            **factory,
        )
    requires_grad = second_module.weight.requires_grad
    merged.weight = nn.Parameter(weight, requires_grad=requires_grad)
    if bias is not None:
        merged.bias = nn.Parameter(bias, requires_grad=requires_grad)
    merged.train(second_module.training)
    parent, _, child = str(plan.second.node.target).rpartition(".")
    setattr(gm.get_submodule(parent) if parent else gm, child, merged)


def _rewrite_call(
    gm: fx.GraphModule,
    plan: MergePlan,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    source: fx.Node,
    uses: Counter[str],
) -> None:
    """Point the second call at new stored tensors and, for convs, the geometry's call form and arguments."""
    second = plan.second.node
    names = [store_tensor(gm, f"{second.name}_merged_weight", weight)]
    if bias is not None:
        names.append(store_tensor(gm, f"{second.name}_merged_bias", bias))
    with gm.graph.inserting_before(second):
        weight_node, *bias_node = [gm.graph.get_attr(name) for name in names]
    for name in names:
        uses[name] = 1
    bias_value = bias_node[0] if bias_node else None
    if plan.first.kind == "linear":
        second.args, second.kwargs = (source, weight_node, bias_value), {}
        return
    geometry = plan.geometry
    padding = geometry.padding if isinstance(geometry.padding, str) else list(geometry.padding)
    geometry_args = [list(geometry.stride), padding, list(geometry.dilation)]
    target, packet = _call_target(plan, isinstance(padding, str))
    if packet == "convolution":
        output_padding = [0] * len(geometry.kernel)
        args = (source, weight_node, bias_value, *geometry_args, False, output_padding, plan.groups)
    else:
        args = (source, weight_node, bias_value, *geometry_args, plan.groups)
    second.target, second.args, second.kwargs = target, args, {}


def _call_target(plan: MergePlan, string_padding: bool):
    """The call that takes the merged conv's arguments: the second layer's, in the overload that takes the
    padding as given (ATen has one for ``"same"``/``"valid"`` strings and one for ints)."""
    if string_padding:  # the merged conv pads as one of the two does, string and all: take that one's call
        layer = plan.first if plan.first.padding == plan.geometry.padding else plan.second
        return layer.node.target, aten_packet(layer.node)
    node = plan.second.node
    packet = aten_packet(node)
    if packet in ("conv1d", "conv2d", "conv3d"):
        return getattr(torch.ops.aten, packet).default, packet
    return node.target, packet


def _label(node: fx.Node) -> str:
    producer = node_arg(node, 0, "input")
    return f"{producer.name} -> {node.name}"


@register_pass(
    NAME,
    summary="Merge back-to-back convs or linears with nothing between them into one layer, where one layer is exact.",
    guarantees=(
        "Outputs equal up to float round-off (merged weights computed in float64). Merges linear -> linear; any conv "
        "-> a conv that does not pad (one conv of the input with the first conv's padding and padding mode, the "
        "strides multiplied and the kernels composed: kxk then 1x1, kxk then strided 1x1, 1x1 then kxk, kxk then "
        "kxk); and a 1x1 stride-1 unpadded conv -> a padded conv, unless that conv zero-pads the output of a biased "
        "1x1 (the padding would become the bias). Conv1d/2d/3d; any groups (the merged conv has gcd(groups) groups). "
        "Never merges a conv that pads the output of any other first conv (its padding is no conv of the input), a "
        "first conv with asymmetric 'same' padding whose geometry the merge changes, a pair whose first output has "
        "other users (reads of its rank, dtype or device aside, which then read the first conv's input), a module or "
        "weight used from more than one place (or tied to another name), layers that differ in form (module vs "
        "function), dtype or dimensionality, or, unless allow_larger, a merged layer with more weights than the two "
        "together (a low-rank bottleneck, two 3x3s becoming a 5x5). Each refusal is listed with its reason. Torch and"
        " ATen dialects."
    ),
    options=MergeConvsOptions,
    ensures=lambda gm, result: _smaller_pair_left(gm),
)
def merge_convs(gm: fx.GraphModule, options: MergeConvsOptions) -> PassResult:
    result = PassResult(NAME, gm)
    uses = count_uses(gm.graph, gm=gm)  # once: per-pair scans would make the pass quadratic
    stale: set[str] = set()
    for node in list(gm.graph.nodes):
        # a merged node reads the first layer's input, which may itself be a layer it now merges with
        while True:
            plan = plan_merge(gm, node, uses)
            if plan is None:
                break
            if isinstance(plan, str):
                result.skip(f"{_label(node)}: {plan}")
                break
            refusal = plan.refused(options)
            if refusal is not None:
                result.skip(f"{_label(node)}: {refusal}")
                break
            message = f"merged {plan.first.node.name} into {node.name}: {plan.reason}"
            separate, merged = plan.separate_weights, plan.merged_weights
            stale |= _apply(gm, plan, uses)
            result.note(f"{message} ({separate:,} weights -> {merged:,})", removed=1, folded=merged)
    if result.changed:
        prune_attributes(gm, stale)
    return result


def _smaller_pair_left(gm: fx.GraphModule) -> str | None:
    """Postcondition: no pair is left whose merged layer would be no larger (those are always merged)."""
    uses = count_uses(gm.graph, gm=gm)
    for node in gm.graph.nodes:
        plan = plan_merge(gm, node, uses)
        if isinstance(plan, MergePlan) and plan.refused(MergeConvsOptions()) is None:
            return f"{_label(node)} can still be merged"
    return None
