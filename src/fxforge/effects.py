"""What a graph's calls do besides their value: effects, in-place writes, storage aliasing, tensor facts.

Shared by the simplification passes and by the artifact writer (:func:`fxforge.artifacts.reload_bakes`: which
calls of a pickled GraphModule ``torch.load`` would run once at load instead of recording).

Removing a copy (``x * 1``), merging two equal nodes (CSE) or turning a computed value into a stored
buffer (constant folding) is only exact if no in-place write can tell the difference. The rewrites
ask :class:`AliasClasses` three questions about a node: may its storage be written by some in-place
op in the graph (:meth:`~AliasClasses.written`), does it share storage with a graph output
(:meth:`~AliasClasses.escapes`), and with a graph input or stored attribute
(:meth:`~AliasClasses.external`). The analysis is one union-find pass over the graph (linear in its
size) and errs towards "may alias": an op not known to return a new tensor is assumed to return a
view of its inputs.
"""

from __future__ import annotations

import contextlib
import heapq
import inspect
import operator
from bisect import bisect_left, bisect_right
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from fxforge.graphs import (
    WEIGHTED_LAYER_TYPES,
    aten_packet,
    draws_random_numbers,
    get_attr_value,
    has_side_effects,
    node_arg,
    runs_hooks,
    submodule,
)

# fx's own list of calls with effects beyond their value (asserts, autocast and grad-mode switches,
# profiler ranges); `has_side_effects` misses some of them, e.g. aten._assert_tensor_metadata.
_FX_EFFECTFUL: frozenset[Any] = frozenset(getattr(fx.node, "_side_effectful_functions", ()))


def is_effectful(gm: nn.Module, node: fx.Node) -> bool:
    """``has_side_effects`` plus fx's list of effectful calls and every ATen ``_assert*`` op."""
    if has_side_effects(gm, node):
        return True
    if node.op != "call_function":
        return False
    try:
        if node.target in _FX_EFFECTFUL:
            return True
    except TypeError:  # an unhashable callable
        return False
    packet = aten_packet(node)
    return packet is not None and packet.startswith("_assert")


# --------------------------------------------------------------------------------------------------
# in-place writes

INPLACE_OPERATORS = {  # x += y and the like: they write x in place
    operator.iadd,
    operator.isub,
    operator.imul,
    operator.itruediv,
    operator.ifloordiv,
    operator.imod,
    operator.ipow,
    operator.iand,
    operator.ior,
    operator.ixor,
    operator.ilshift,
    operator.irshift,
    operator.imatmul,
    operator.setitem,
}
_SIGNATURES: dict[Any, inspect.Signature | None] = {}


def _signature(target: Any) -> inspect.Signature | None:
    try:
        return _SIGNATURES[target]
    except (KeyError, TypeError):
        pass
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        signature = None
    with contextlib.suppress(TypeError):  # an unhashable callable: not cached
        _SIGNATURES[target] = signature
    return signature


def bound_inplace(node: fx.Node) -> bool:
    """``inplace=True`` given by keyword or by position (``F.relu(x, True)``)."""
    if node.kwargs.get("inplace") is True:
        return True
    signature = _signature(node.target)
    if signature is None or "inplace" not in signature.parameters:
        return False
    try:
        bound = signature.bind(*node.args, **node.kwargs)
    except TypeError:
        return True  # cannot tell: assume the worst
    return bound.arguments.get("inplace") is True


def _nodes_in(value: Any) -> list[fx.Node]:
    found: list[fx.Node] = []
    fx.node.map_arg(value, found.append)
    return found


# Norm calls that update their running statistics in place when training, which their schemas do not say:
# (positions of running_mean/running_var, position and name of the training flag, the flag's default).
_ATEN_STATS_UPDATES = {
    name: ((3, 4), 5, "training", True)
    for name in ("batch_norm", "native_batch_norm", "_batch_norm_impl_index", "cudnn_batch_norm", "miopen_batch_norm")
}
_ATEN_STATS_UPDATES["instance_norm"] = ((3, 4), 5, "use_input_stats", True)
_FUNCTION_STATS_UPDATES: dict[Any, tuple[tuple[int, int], int, str, bool]] = {
    F.batch_norm: ((1, 2), 5, "training", False),
    F.instance_norm: ((1, 2), 5, "use_input_stats", True),
    torch.batch_norm: _ATEN_STATS_UPDATES["batch_norm"],
    torch.instance_norm: _ATEN_STATS_UPDATES["instance_norm"],
}


def _updated_running_stats(node: fx.Node) -> list[fx.Node]:
    """The running_mean/running_var nodes a training-mode norm call updates in place."""
    if node.op != "call_function":
        return []
    packet = aten_packet(node)
    try:
        spec = _ATEN_STATS_UPDATES.get(packet) if packet is not None else _FUNCTION_STATS_UPDATES.get(node.target)
    except TypeError:  # an unhashable callable
        return []
    if spec is None:
        return []
    (mean_at, var_at), flag_at, flag_name, default = spec
    if node_arg(node, flag_at, flag_name, default) is False:
        return []
    return _nodes_in(node_arg(node, mean_at, "running_mean")) + _nodes_in(node_arg(node, var_at, "running_var"))


# Functional embeddings that renormalise the looked-up rows of their weight in place when given max_norm,
# which neither their names nor an inplace flag say: function -> position of max_norm (weight is second).
_WEIGHT_RENORMS: dict[Any, int] = {F.embedding: 3, F.embedding_bag: 3}


def _renormalised_weights(node: fx.Node) -> list[fx.Node]:
    """The weight node that ``F.embedding``/``F.embedding_bag`` with ``max_norm`` rewrites in place."""
    if node.op != "call_function":
        return []
    try:
        max_norm_at = _WEIGHT_RENORMS.get(node.target)
    except TypeError:  # an unhashable callable
        return []
    if max_norm_at is None or node_arg(node, max_norm_at, "max_norm") is None:
        return []
    return _nodes_in(node_arg(node, 1, "weight"))


def written_args(gm: nn.Module, node: fx.Node) -> list[fx.Node]:
    """The input nodes whose storage ``node`` writes in place (empty for a pure call)."""
    written: list[fx.Node] = _updated_running_stats(node) + _renormalised_weights(node)
    if "out" in node.kwargs:
        written += _nodes_in(node.kwargs["out"])
    first = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    if node.op == "call_method":
        name = str(node.target)
        if first is not None and ((name.endswith("_") and not name.endswith("__")) or name == "__setitem__"):
            written.append(first)
    elif node.op == "call_function":
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            schema = target._schema
            for i, arg in enumerate(schema.arguments):
                if arg.alias_info is not None and arg.alias_info.is_write:
                    value = node.kwargs.get(arg.name, node.args[i] if i < len(node.args) else None)
                    written += _nodes_in(value)
        elif target in INPLACE_OPERATORS:
            if first is not None:
                written.append(first)
        else:
            name = getattr(target, "__name__", "")
            if first is not None and ((name.endswith("_") and not name.endswith("__")) or bound_inplace(node)):
                written.append(first)
    elif node.op == "call_module":
        module = submodule(gm, node)
        if runs_hooks(module):
            written += node.all_input_nodes  # a hook may write into what the module is given
        elif getattr(module, "inplace", False) is True and first is not None:
            written.append(first)
        elif _is_export_guard(module):
            pass  # torch.export's input guard only reads shapes
        elif isinstance(module, fx.GraphModule):
            if _graph_writes(module):
                written += node.all_input_nodes
        elif not type(module).__module__.startswith("torch.nn.modules"):
            written += node.all_input_nodes  # a user leaf module may write into what it is given
    if is_opaque(node):
        # so may a function or method fxforge cannot see into (a user helper captured as one call): QA found
        # dead_code removing one whose only effect was buf.add_(1), fold_bn folding statistics it updated
        written += [n for n in node.all_input_nodes if n not in written and not holds_no_tensor(n)]
    return written


def _is_export_guard(module: nn.Module) -> bool:
    return type(module).__name__ == "GuardsFn" and type(module).__module__.startswith("torch.export")


def _graph_writes(gm: fx.GraphModule) -> bool:
    # a nested GraphModule (torch.export's _guards_fn) writes nothing unless some node in it does
    return any(written_args(gm, n) for n in gm.graph.nodes if n.op.startswith("call"))


# --------------------------------------------------------------------------------------------------
# fresh outputs: calls known to allocate a new tensor rather than return a view of an input

_FRESH_FUNCTIONS: set[Any] = {
    operator.add,
    operator.sub,
    operator.mul,
    operator.truediv,
    operator.floordiv,
    operator.mod,
    operator.pow,
    operator.matmul,
    operator.neg,
    operator.abs,
    operator.invert,
    operator.and_,
    operator.or_,
    operator.xor,
    operator.lt,
    operator.le,
    operator.gt,
    operator.ge,
    operator.eq,
    operator.ne,
}
_FRESH_TORCH_NAMES = (
    "add sub mul div true_divide floor_divide remainder pow matmul mm bmm addmm baddbmm cat concat stack relu "
    "sigmoid tanh softmax log_softmax exp log sqrt rsqrt abs neg clamp clip where sum mean prod amax amin "
    "erf sin cos conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d batch_norm layer_norm "
    "group_norm sign reciprocal square maximum minimum lerp addcmul addcdiv cumsum logsumexp norm"
).split()
for _name in _FRESH_TORCH_NAMES:
    if hasattr(torch, _name):
        _FRESH_FUNCTIONS.add(getattr(torch, _name))
_FRESH_F_NAMES = (
    "conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d linear bilinear batch_norm layer_norm "
    "group_norm instance_norm max_pool1d max_pool2d max_pool3d avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d "
    "adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool1d adaptive_max_pool2d adaptive_max_pool3d gelu silu "
    "relu relu6 elu selu celu leaky_relu hardswish hardsigmoid hardtanh mish sigmoid tanh softmax log_softmax "
    "softplus embedding scaled_dot_product_attention normalize"
).split()
_FRESH_F: set[Any] = {getattr(F, n) for n in _FRESH_F_NAMES if hasattr(F, n)}
_FRESH_METHODS = set(
    (
        "add sub mul div true_divide floor_divide remainder pow matmul mm bmm relu sigmoid tanh softmax log_softmax "
        "exp log sqrt rsqrt abs neg clamp clip sum mean prod amax amin clone erf sin cos sign reciprocal square "
        "__add__ __sub__ __mul__ __truediv__ __matmul__ __radd__ __rmul__ __rsub__ __neg__ cumsum norm"
    ).split()
)
# Methods whose result may alias ``self`` only (views, no-op casts): their other inputs are sizes.
_SELF_ALIAS_METHODS = set(
    (
        "view view_as reshape reshape_as flatten unflatten transpose permute movedim swapaxes t contiguous to type "
        "float double half bfloat16 int long short bool byte char cpu cuda expand expand_as squeeze unsqueeze narrow "
        "select chunk split tensor_split unbind detach __getitem__ as_strided diagonal unfold real imag"
    ).split()
)
_FRESH_MODULES: tuple[type, ...] = (
    *WEIGHTED_LAYER_TYPES,
    nn.Bilinear,
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
    nn.MaxPool1d,
    nn.MaxPool2d,
    nn.MaxPool3d,
    nn.AvgPool1d,
    nn.AvgPool2d,
    nn.AvgPool3d,
    nn.AdaptiveAvgPool1d,
    nn.AdaptiveAvgPool2d,
    nn.AdaptiveAvgPool3d,
    nn.AdaptiveMaxPool1d,
    nn.AdaptiveMaxPool2d,
    nn.AdaptiveMaxPool3d,
    nn.ReLU,
    nn.ReLU6,
    nn.GELU,
    nn.SiLU,
    nn.Sigmoid,
    nn.Tanh,
    nn.Hardswish,
    nn.Hardsigmoid,
    nn.Hardtanh,
    nn.LeakyReLU,
    nn.ELU,
    nn.SELU,
    nn.CELU,
    nn.Mish,
    nn.Softplus,
    nn.Softmax,
    nn.LogSoftmax,
    nn.Embedding,
)


# ATen ops whose schema promises new tensors although they may return an input itself or a view of it:
# dropout with train=False (as torch.export records eval-mode dropout), a no-op type_as/to_dense/sum_to_size/
# _cast_*/conj_physical/lift, atleast_*d, einsum of a plain permutation, broadcast_tensors/meshgrid (expands),
# and the unsafe_* splits and _unsafe_view, which leave the annotation out on purpose. set_ makes its first
# argument share the second's storage. Checked by comparing storages (data_ptr) on the running kernels.
_UNANNOTATED_ALIASES = frozenset(
    {
        "dropout",
        "feature_dropout",
        "alpha_dropout",
        "feature_alpha_dropout",
        "_unsafe_view",
        "_reshape_from_tensor",
        "type_as",
        "to_dense",
        "sum_to_size",
        "conj_physical",
        "lift",
        "data",
        "atleast_1d",
        "atleast_2d",
        "atleast_3d",
        "einsum",
        "broadcast_tensors",
        "meshgrid",
        "cartesian_prod",
        "flatten_dense_tensors",
        "unsafe_split",
        "unsafe_split_with_sizes",
        "unsafe_chunk",
        "_to_cpu",
        "set_",
    }
)


def _unannotated_alias(target: torch._ops.OpOverload) -> bool:
    name = target._overloadpacket.__name__
    return name in _UNANNOTATED_ALIASES or name.startswith("_cast_")


def returns_fresh(gm: nn.Module, node: fx.Node) -> bool:
    """True when ``node`` is known to return a newly allocated tensor, never a view of an input."""
    if node.op == "call_function":
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            returns = target._schema.returns
            return bool(returns) and all(r.alias_info is None for r in returns) and not _unannotated_alias(target)
        try:
            known = target in _FRESH_FUNCTIONS or target in _FRESH_F
        except TypeError:
            return False
        return known and not bound_inplace(node)
    if node.op == "call_method":
        return str(node.target) in _FRESH_METHODS
    if node.op == "call_module":
        module = submodule(gm, node)
        return type(module) in _FRESH_MODULES and not getattr(module, "inplace", False) and not runs_hooks(module)
    return False


_NO_STORAGE = (bool, int, float, complex, str, torch.Size, torch.dtype, torch.device, torch.memory_format, type(None))


def holds_no_tensor(node: fx.Node) -> bool:
    """Is ``node``'s recorded value a number, shape or other value without storage (``weight.shape[-2:]``,
    ``x.size(0)``)? Such a value shares no memory and cannot be written in place. Unrecorded: no."""
    if "val" in node.meta:  # torch.export's record (None where the value is None)
        return isinstance(node.meta["val"], (torch.SymInt, torch.SymFloat, torch.SymBool, *_NO_STORAGE))
    kind = node.meta.get("type")  # symbolic_trace + shape propagation: the value's class
    return isinstance(kind, type) and issubclass(kind, _NO_STORAGE)


def _aliased_inputs(gm: nn.Module, node: fx.Node) -> list[fx.Node]:
    """The inputs whose storage ``node``'s result may share."""
    if node.op in ("placeholder", "get_attr", "output") or returns_fresh(gm, node) or holds_no_tensor(node):
        return []
    if _is_real_cast(node):
        return []
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        if _unannotated_alias(node.target):
            return list(node.all_input_nodes)
        aliased: list[fx.Node] = []
        for i, arg in enumerate(node.target._schema.arguments):
            if arg.alias_info is not None:
                aliased += _nodes_in(node.kwargs.get(arg.name, node.args[i] if i < len(node.args) else None))
        return aliased
    if node.op == "call_method" and str(node.target) in _SELF_ALIAS_METHODS:
        first = node.args[0] if node.args else None
        return [first] if isinstance(first, fx.Node) else []
    return list(node.all_input_nodes)


_CAST_NAMES = {"to", "type", "float", "double", "half", "bfloat16", "int", "long", "short", "bool", "byte", "char"}


def _is_real_cast(node: fx.Node) -> bool:
    """A cast whose recorded output dtype differs from its input's: it must have made a new tensor."""
    if node.op == "call_method":
        name = str(node.target)
    elif node.op == "call_function" and aten_packet(node) == "to":
        name = "to"
    else:
        return False
    if name not in _CAST_NAMES or not node.args or not isinstance(node.args[0], fx.Node):
        return False
    before, after = tensor_facts(node.args[0]), tensor_facts(node)
    return before is not None and after is not None and before["dtype"] != after["dtype"]


# In-place ops that change a tensor object's shape or strides rather than its values (the inplace_view tag
# marks most of them). They act on the one tensor object they are given, not on every view of its storage.
_METADATA_WRITES = frozenset(
    {"t_", "transpose_", "swapdims_", "swapaxes_", "squeeze_", "unsqueeze_", "as_strided_"}
    | {"resize_", "resize_as_", "_resize_output_", "set_"}
)


def writes_metadata(node: fx.Node) -> bool:
    """Does ``node`` change the shape or strides of a tensor in place (``t_``, ``unsqueeze_``, ``resize_``...)?"""
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        target = node.target
        return torch.Tag.inplace_view in target.tags or target._overloadpacket.__name__ in _METADATA_WRITES
    if node.op == "call_method":
        return str(node.target) in _METADATA_WRITES
    return False


def storage_of(tensor: torch.Tensor) -> tuple[str, int] | None:
    """(device, address) of the memory ``tensor`` views, or None when it has none to share (meta, empty, sparse)."""
    try:
        if tensor.device.type == "meta" or tensor.untyped_storage().nbytes() == 0:
            return None
        return str(tensor.device), tensor.untyped_storage().data_ptr()
    except Exception:  # sparse, nested or other tensors without a plain storage
        return None


def overlaps_itself(tensor: torch.Tensor) -> bool:
    """May two elements of ``tensor`` share memory (an ``expand``, a stride-0 or overlapping ``as_strided``)?

    Such a tensor cannot be written in place: ``copy_``, ``add_``, ``load_state_dict`` into it all fail
    ("more than one element of the written-to tensor refers to a single memory location"). Unsure is yes.
    """
    try:
        return torch._debug_has_internal_overlap(tensor) != 0  # 0: no overlap, 1: overlap, 2: too hard to tell
    except Exception:
        return any(stride == 0 and size > 1 for size, stride in zip(tensor.shape, tensor.stride()))


def _stored_tensor(gm: nn.Module, node: fx.Node) -> torch.Tensor | None:
    try:
        value = get_attr_value(gm, str(node.target))
    except AttributeError:
        return None
    return value if isinstance(value, torch.Tensor) else None


class AliasClasses:
    """Which nodes may share storage with each other, with in-place writes, graph outputs and inputs."""

    def __init__(self, gm: fx.GraphModule, graph: fx.Graph | None = None) -> None:
        """The classes of ``graph`` (default ``gm.graph``; another graph whose stored tensors are ``gm``'s). A
        function or method fxforge cannot see into (:func:`is_opaque`, e.g. a user helper captured as one call)
        may write into what it is given, as a user leaf module may (:func:`written_args`)."""
        self._parent: dict[fx.Node, fx.Node] = {}
        self._position: dict[fx.Node, int] = {}
        writes: list[tuple[fx.Node, int]] = []  # (written node, position of the writer), in graph order
        metadata_writes: list[fx.Node] = []
        external_roots: list[fx.Node] = []
        escaping_roots: list[fx.Node] = []
        stored: dict[tuple[str, int], fx.Node] = {}  # storage -> the first get_attr reading it
        for position, node in enumerate((graph or gm.graph).nodes):
            self._parent[node] = node
            self._position[node] = position
            if node.op in ("placeholder", "get_attr"):
                external_roots.append(node)
                if node.op == "get_attr":
                    self._union_stored(gm, node, stored)
            elif node.op == "output":
                escaping_roots += node.all_input_nodes
            else:
                for source in _aliased_inputs(gm, node):
                    self._union(node, source)
                written = written_args(gm, node)
                writes += [(target, position) for target in written]
                if writes_metadata(node):
                    metadata_writes += written
        self._writes: dict[fx.Node, list[int]] = {}  # class root -> ascending positions of writes into it
        for target, position in writes:
            self._writes.setdefault(self._find(target), []).append(position)
        self._written = set(self._writes)
        self._reshaped = {self._find(n) for n in metadata_writes}
        self._external = {self._find(n) for n in external_roots}
        self._escaping = {self._find(n) for n in escaping_roots}

    def _union_stored(self, gm: nn.Module, node: fx.Node, stored: dict[tuple[str, int], fx.Node]) -> None:
        """Two stored tensors can share memory (one buffer a view of another, tied weights under two names):
        a write through one is a write into the other, so their reads join one class."""
        tensor = _stored_tensor(gm, node)
        address = storage_of(tensor) if tensor is not None else None
        if address is not None:
            self._union(node, stored.setdefault(address, node))

    def _find(self, node: fx.Node) -> fx.Node:
        parent = self._parent.setdefault(node, node)
        while parent is not node:
            grand = self._parent[parent]
            self._parent[node] = grand  # path halving keeps the structure near-flat
            node, parent = parent, grand
        return node

    def _union(self, a: fx.Node, b: fx.Node) -> None:
        root_a, root_b = self._find(a), self._find(b)
        if root_a is not root_b:
            self._parent[root_a] = root_b

    def merge(self, a: fx.Node, b: fx.Node) -> None:
        """Record that ``a`` and ``b`` now share storage (a rewrite made one stand for the other)."""
        root_a, root_b = self._find(a), self._find(b)
        if root_a is root_b:
            return
        self._parent[root_a] = root_b
        for flags in (self._written, self._reshaped, self._external, self._escaping):
            if root_a in flags:
                flags.add(root_b)
        if root_a in self._writes:
            self._writes[root_b] = list(heapq.merge(self._writes.pop(root_a), self._writes.get(root_b, [])))

    def same(self, a: fx.Node, b: fx.Node) -> bool:
        return self._find(a) is self._find(b)

    def written(self, node: fx.Node) -> bool:
        """May some in-place op in the graph write the storage ``node`` reads or returns?"""
        return self._find(node) in self._written

    def written_between(self, node: fx.Node, start: fx.Node | None, end: fx.Node | None) -> bool:
        """May an in-place op placed strictly between ``start`` and ``end`` (None: the graph's beginning or end)
        write the storage ``node`` reads or returns? Both bounds must be nodes of the analysed graph."""
        positions = self._writes.get(self._find(node), [])
        low = bisect_right(positions, self._position[start]) if start is not None else 0
        high = bisect_left(positions, self._position[end]) if end is not None else len(positions)
        return low < high

    def write_positions(self, node: fx.Node) -> list[int]:
        """Where in the graph (node positions, ascending) in-place ops may write the storage ``node`` reads."""
        return list(self._writes.get(self._find(node), []))

    def reshaped(self, node: fx.Node) -> bool:
        """May an in-place view op (``t_``, ``unsqueeze_``, ``resize_``...) change the shape or strides of some
        tensor object sharing ``node``'s storage? Such an op changes only the object it is given, so making
        two objects one (removing an ``aten.alias``) is observable there."""
        return self._find(node) in self._reshaped

    def escapes(self, node: fx.Node) -> bool:
        """May ``node`` share storage with a value the graph returns?"""
        return self._find(node) in self._escaping

    def external(self, node: fx.Node) -> bool:
        """May ``node`` share storage with a graph input or a stored parameter/buffer?"""
        return self._find(node) in self._external


def written_stored_tensors(gm: fx.GraphModule, graph: fx.Graph | None = None) -> set[tuple[str, int]]:
    """The storages (:func:`storage_of`) of the stored tensors that some node of ``graph`` (default ``gm.graph``)
    may write in place, directly or through a view: an in-place op, or a call fxforge cannot see into that is given
    them. A pass that bakes such a tensor's value in at pass time (fold_bn) would miss the write."""
    graph = graph or gm.graph
    aliases = AliasClasses(gm, graph)
    written: set[tuple[str, int]] = set()
    for node in graph.nodes:
        if node.op == "get_attr" and aliases.written(node):
            tensor = _stored_tensor(gm, node)
            address = storage_of(tensor) if tensor is not None else None
            if address is not None:
                written.add(address)
    return written


# --------------------------------------------------------------------------------------------------
# tensor facts recorded by shape propagation (torch dialect) or torch.export (meta["val"])


def tensor_facts(node: Any, gm: nn.Module | None = None) -> dict[str, Any] | None:
    """dtype, shape, device (None when unknown) and contiguity of a node's tensor value, or None.

    With ``gm``, a ``get_attr`` node's facts come from the stored tensor itself.
    """
    if not isinstance(node, fx.Node):
        return None
    val = node.meta.get("val")
    if val is None and gm is not None and node.op == "get_attr":
        try:
            val = get_attr_value(gm, str(node.target))
        except AttributeError:
            val = None
    if isinstance(val, torch.Tensor):
        try:
            contiguous = bool(val.is_contiguous())
            shape = tuple(int(s) for s in val.shape)
        except Exception:  # symbolic sizes: no fact we can rely on for every input
            contiguous, shape = None, None
        return {"dtype": val.dtype, "shape": shape, "device": val.device, "contiguous": contiguous}
    meta = node.meta.get("tensor_meta")
    if meta is not None and hasattr(meta, "dtype") and hasattr(meta, "shape"):
        contiguous = getattr(meta, "memory_format", None) == torch.contiguous_format
        return {"dtype": meta.dtype, "shape": tuple(meta.shape), "device": None, "contiguous": contiguous}
    return None


def _layout(node: fx.Node, gm: nn.Module | None) -> list[tuple[str, str]] | None:
    """(size, stride) per dimension, as text so symbolic sizes compare too; None when not recorded."""
    value = node.meta.get("val", node.meta.get("tensor_meta"))
    if value is None and gm is not None and node.op == "get_attr":
        value = _stored_tensor(gm, node)
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided:
            return None
        shape, stride = value.shape, value.stride()
    else:
        shape, stride = getattr(value, "shape", None), getattr(value, "stride", None)
    if shape is None or stride is None or len(shape) != len(stride):
        return None
    return [(str(size), str(step)) for size, step in zip(shape, stride)]


def copy_layout_problem(copy: fx.Node, source: fx.Node, gm: nn.Module | None = None) -> str | None:
    """Why ``copy`` (``clone``, ``x * 1``...) may be laid out differently from ``source``; None when the recorded
    strides agree. A copy of an expanded tensor, or of a slice with gaps, is dense: a ``view`` that works on the
    copy (torch.export records reshapes as views where the layout allowed it) can fail on the source, and
    ``.stride()`` tells them apart. Strides of size-1 dimensions are ignored: they never matter."""
    own, theirs = _layout(copy, None), _layout(source, gm)
    if own is None or theirs is None:
        return "the memory layout of the input or the copy is unknown (no stride metadata)"
    if [size for size, _ in own] != [size for size, _ in theirs]:
        return "its recorded shape differs from the input's"
    if any(size != "1" and mine != other for (size, mine), (_, other) in zip(own, theirs)):
        strides = ", ".join(step for _, step in own), ", ".join(step for _, step in theirs)
        return f"the copy is laid out differently (strides ({strides[0]}) vs the input's ({strides[1]}))"
    return None


# --------------------------------------------------------------------------------------------------
# pure calls: values that depend on the arguments alone. CSE merges two pure calls with equal arguments;
# constant folding runs a pure call once at pass time. Both need the same answer, so it lives here.

_DROPOUT_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
_NORMS_WITH_RUNNING_STATS = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.SyncBatchNorm,
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
)
# Exact types (a subclass may override forward). Pure in any mode: stateless layers, and layers whose only
# state is their parameters. Loss modules, RNNs, attention and containers are left out on purpose.
_PURE_MODULES: frozenset[type] = frozenset(
    {
        *_FRESH_MODULES,
        nn.Identity,
        nn.Flatten,
        nn.Unflatten,
        nn.PReLU,
        nn.GLU,
        nn.LogSigmoid,
        nn.Softmin,
        nn.Softmax2d,
        nn.Softsign,
        nn.Softshrink,
        nn.Hardshrink,
        nn.Tanhshrink,
        nn.Threshold,
        nn.RMSNorm,
        nn.LocalResponseNorm,
        nn.LPPool1d,
        nn.LPPool2d,
        nn.LPPool3d,
        nn.EmbeddingBag,
        nn.Upsample,
        nn.UpsamplingNearest2d,
        nn.UpsamplingBilinear2d,
        nn.PixelShuffle,
        nn.PixelUnshuffle,
        nn.ChannelShuffle,
        nn.ZeroPad1d,
        nn.ZeroPad2d,
        nn.ZeroPad3d,
        nn.ConstantPad1d,
        nn.ConstantPad2d,
        nn.ConstantPad3d,
        nn.ReflectionPad1d,
        nn.ReflectionPad2d,
        nn.ReflectionPad3d,
        nn.ReplicationPad1d,
        nn.ReplicationPad2d,
        nn.ReplicationPad3d,
        nn.CircularPad1d,
        nn.CircularPad2d,
        nn.CircularPad3d,
        nn.Fold,
        nn.Unfold,
        nn.CosineSimilarity,
        nn.PairwiseDistance,
    }
)
# Python modules whose functions are pure unless named as random, in-place or global-state calls below.
_PURE_FUNCTION_HOMES = frozenset(
    {
        "torch",
        "torch.functional",
        "torch.nn.functional",
        "torch._C._nn",
        "torch._C._linalg",
        "torch._C._fft",
        "torch._C._special",
        "torch._C._VariableFunctions",
        "torch.linalg",
        "torch.fft",
        "torch.special",
        "math",
        "_operator",
        "operator",
    }
)
_PURE_BUILTINS = frozenset(
    {getattr, hasattr, isinstance, len, abs, min, max, int, float, bool, round, divmod, pow, tuple, range, slice}
)
_IMPURE_OPERATORS = {"setitem", "delitem"}
_IMPURE_METHODS = frozenset(
    {"register_hook", "register_post_accumulate_grad_hook", "retain_grad", "backward", "record_stream", "data_ptr"}
    | {"storage", "untyped_storage"}
)
# The value of these is whatever was in memory: two calls need not agree.
_UNINITIALISED = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"})
_MODE_SWITCH_NAMES = {
    "_enter_autocast",
    "_exit_autocast",
    "_set_grad_enabled",
    "_enter_dual_level",
    "_exit_dual_level",
    "_jvp_increment_nesting",
    "_jvp_decrement_nesting",
}
_MODE_SWITCHES = frozenset(f for f in _FX_EFFECTFUL if getattr(f, "__name__", "") in _MODE_SWITCH_NAMES)


def random_reason(node: fx.Node) -> str | None:
    """Why ``node`` may return a different value on each run with the same arguments (RNG, uninitialised memory)."""
    if node.op == "call_function":
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            if torch.Tag.nondeterministic_seeded in target.tags:
                return "random op"
            name = target._overloadpacket.__name__
        else:
            name = getattr(target, "__name__", "")
    elif node.op == "call_method":
        name = str(node.target)
    else:
        return None  # modules: see _module_impurity
    if name in _UNINITIALISED:
        return "returns uninitialised memory"
    if draws_random_numbers(name):
        return "random op"
    return None


def _reads_global_state(name: str) -> bool:
    # torch.is_grad_enabled(), torch.get_default_dtype(), torch.initial_seed()...: same arguments, other answers
    return name.endswith("_enabled") or name.startswith(("get_", "set_")) or name in ("seed", "initial_seed")


def _known_function(target: Any) -> bool:
    """A Python-level function fxforge knows the effects of (torch, F, math, operator, a few builtins)."""
    try:
        if target in _PURE_BUILTINS:
            return True
    except TypeError:  # unhashable callable
        return False
    owner = getattr(target, "__objclass__", None)
    if isinstance(owner, type) and issubclass(owner, torch._C.TensorBase):
        return True  # torch.Tensor.add and friends, called as functions
    return getattr(target, "__module__", None) in _PURE_FUNCTION_HOMES


def is_opaque(node: fx.Node) -> bool:
    """A function or method call fxforge cannot see into: a user helper captured as one call, a method that
    ``torch.Tensor`` does not have, a higher-order op. (User leaf modules are handled by :func:`written_args`.)"""
    if node.op == "call_function":
        return not isinstance(node.target, torch._ops.OpOverload) and not _known_function(node.target)
    if node.op == "call_method":
        return not hasattr(torch.Tensor, str(node.target))
    return False


def is_mode_switch(node: fx.Node) -> bool:
    """Enters or leaves autocast, grad mode or forward-AD levels: identical calls on either side may differ."""
    if node.op != "call_function":
        return False
    try:
        return node.target in _MODE_SWITCHES
    except TypeError:
        return False


def module_state_write(module: nn.Module) -> str | None:
    """How calling a torch.nn ``module`` writes its own stored tensors (a training-mode norm's running
    statistics, an embedding's max_norm renormalisation), or None. The tensors are the module's, not
    inputs of the call node, so :func:`written_args` cannot name them."""
    kind = type(module)
    if kind in _NORMS_WITH_RUNNING_STATS and module.training and module.track_running_stats:
        return f"{kind.__name__} in training mode updates its running statistics"
    if kind in (nn.Embedding, nn.EmbeddingBag) and module.max_norm is not None:
        return f"{kind.__name__} with max_norm renormalises its weight in place"
    return None


def _module_impurity(module: nn.Module) -> str | None:
    kind = type(module)
    if runs_hooks(module):
        return f"module {kind.__name__} runs hooks, which fxforge cannot see into"
    if kind in _DROPOUT_MODULES or kind is nn.RReLU:
        return f"{kind.__name__} in training mode is random" if module.training else None
    state_write = module_state_write(module)
    if state_write is not None:
        return state_write
    if kind in _NORMS_WITH_RUNNING_STATS:
        return None
    if kind in _PURE_MODULES:
        return None
    return f"module {kind.__name__} is not on fxforge's list of pure modules"


def impure_reason(gm: nn.Module, node: fx.Node) -> str | None:
    """Why ``node``'s value may not be a function of its arguments alone; None when it is.

    Pure calls with equal arguments give equal values (CSE may merge them) and may run at pass time
    (constant folding). Impure: random ops and uninitialised memory, in-place writes, effects (asserts,
    prints, mode switches), reads of global state, modules not on the known-pure list or in a stateful
    training mode, and functions or methods fxforge cannot see into. ``get_attr`` reads are pure.
    """
    if node.op in ("placeholder", "output"):
        return f"a graph {node.op}"
    if node.op == "get_attr":
        return None
    random = random_reason(node)
    if random is not None:
        return random
    if node.op == "call_module":
        unknown = _module_impurity(submodule(gm, node))
        if unknown is not None:
            return unknown
    if written_args(gm, node) and not is_opaque(node):  # an opaque call's reason says more, below
        return "writes its input in place"
    if node.op == "call_module":
        return None
    if is_effectful(gm, node):
        return "has side effects"
    if node.op == "call_function":
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            return None  # is_effectful refused mutable, custom-namespace and assert ops
        name = getattr(target, "__name__", "")
        if not _known_function(target):
            where = getattr(target, "__module__", None) or "?"
            return f"calls {where}.{name or target!r}, which fxforge cannot see into"
        if name in _IMPURE_OPERATORS or _reads_global_state(name):
            return f"{name} reads or changes state outside its arguments"
        return None
    if node.op == "call_method":
        name = str(node.target)
        if not hasattr(torch.Tensor, name):
            return f"calls method .{name}(), which fxforge cannot see into"
        if name in _IMPURE_METHODS or _reads_global_state(name):
            return f".{name}() reads or changes state outside its arguments"
        return None
    return f"unknown node kind {node.op}"
