"""Helpers shared by every part that reads a graph, in both dialects.

* the **torch** dialect: graphs from ``torch.fx.symbolic_trace`` (``call_module`` nodes for leaf
  modules, ``torch.*``/``F.*`` functions and tensor methods);
* the **aten** dialect: graphs from ``torch.export`` (``call_function`` nodes on ``torch.ops.aten``
  overloads, parameters as ``get_attr`` nodes, module ownership kept in ``node.meta["nn_module_stack"]``).

Code elsewhere asks these helpers "what does this node compute?" instead of matching targets itself,
so that lint rules and passes work on both dialects.
"""

from __future__ import annotations

import contextlib
import copy
import operator
from collections.abc import Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

TORCH = "torch"
ATEN = "aten"

# The layers with a weight a rewrite can fold into or quantize: convolutions, transposed convolutions, linear.
CONV_TYPES: tuple[type[nn.Module], ...] = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
CONV_TRANSPOSE_TYPES: tuple[type[nn.Module], ...] = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
WEIGHTED_LAYER_TYPES: tuple[type[nn.Module], ...] = (*CONV_TYPES, *CONV_TRANSPOSE_TYPES, nn.Linear)


# The submodule torch.export's ``ExportedProgram.module()`` calls first to check the input shapes a program was
# exported for: a graph node, but none of the user's model.
INPUT_GUARDS = "_guards_fn"


def is_input_guard(node: fx.Node) -> bool:
    """Whether ``node`` calls torch.export's input-shape check (:data:`INPUT_GUARDS`)."""
    return node.op == "call_module" and node.target == INPUT_GUARDS


def without_input_guards(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` that does not call torch.export's input-shape check: TorchScript's trace froze the
    check's Python assertions as if they were the model's control flow, and its script cannot compile them."""
    # a copy of the graph on the same modules: a deep copy of the modules refused a model with the old weight_norm
    # or pruning (their recomputed weight is not a leaf tensor, QA), and duplicated every weight
    copied = fx.GraphModule(gm, copy.deepcopy(gm.graph), gm.__class__.__name__)
    for node in list(copied.graph.nodes):
        if is_input_guard(node) and not node.users:
            copied.graph.erase_node(node)
    copied.recompile()
    return copied


def dialect_of(gm: fx.GraphModule) -> str:
    """``"aten"`` when any call targets an ATen operator overload, else ``"torch"``."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            return ATEN
    return TORCH


def submodule(gm: nn.Module, node: fx.Node) -> nn.Module | None:
    """The module a ``call_module`` node calls (None for other nodes)."""
    if node.op != "call_module":
        return None
    return gm.get_submodule(str(node.target))


def get_attr_value(gm: nn.Module, target: str) -> Any:
    """Resolve a dotted ``get_attr`` target to the tensor or module it names."""
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def branch_graphs(gm: nn.Module) -> list[str]:
    """The graphs an exported graph hands to higher-order ops (``torch.cond``'s ``true_graph_0``...), which lint and
    the passes do not look into: their names, for the note that says so."""
    graph = getattr(gm, "graph", None)
    if graph is None:
        return []
    found = []
    for node in graph.nodes:
        if node.op == "get_attr":
            with contextlib.suppress(AttributeError):  # a target nothing holds: FX000's to report
                if isinstance(get_attr_value(gm, str(node.target)), fx.GraphModule):
                    found.append(str(node.target))
    return found


def module_path(node: fx.Node) -> str:
    """Dotted path of the innermost user module that produced ``node`` ("" for the root)."""
    if is_input_guard(node):
        return ""  # torch.export's, run by the program's root before the model
    if node.op == "call_module":
        return str(node.target)
    if node.op == "get_attr":
        return str(node.target).rpartition(".")[0]
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    # torch.export spells nested paths as L__self___layer1_0 in older releases and adds "@N" call
    # counters for modules called more than once; neither is part of the user's module name.
    return str(path).split("@")[0]


def target_name(node: fx.Node) -> str:
    """A readable name for what a node calls: ``conv1``, ``torch.relu``, ``aten.conv2d.default``, ``view``."""
    target = node.target
    if node.op in ("call_module", "call_method", "get_attr", "placeholder", "output"):
        return str(target)
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target.__name__}" if target.namespace == "aten" else str(target)
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", str(target))
    if module.startswith("torch.nn.functional"):
        return f"F.{name}"
    if module in ("torch", "torch._C._VariableFunctions") or getattr(torch, name, None) is target:
        return f"torch.{name}"
    if module == "_operator":
        return f"operator.{name}"
    return f"{module}.{name}" if module else name


def aten_packet(node: fx.Node) -> str | None:
    """For an ATen node, the op name without overload (``"conv2d"``); None otherwise."""
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        return node.target._overloadpacket.__name__
    return None


# What a node computes, independent of dialect. Each kind lists its module types, functions,
# tensor methods and ATen op names (overload packets).
NODE_KINDS: dict[str, tuple[tuple[type, ...], tuple[Any, ...], tuple[str, ...], tuple[str, ...]]] = {
    "relu": ((nn.ReLU,), (F.relu, torch.relu, torch.relu_, F.relu_), ("relu", "relu_"), ("relu", "relu_")),
    "relu6": ((nn.ReLU6,), (F.relu6,), (), ("relu6", "hardtanh")),
    "sigmoid": ((nn.Sigmoid,), (torch.sigmoid, F.sigmoid), ("sigmoid", "sigmoid_"), ("sigmoid", "sigmoid_")),
    "softmax": ((nn.Softmax,), (F.softmax, torch.softmax), ("softmax",), ("softmax", "_softmax")),
    "gelu": ((nn.GELU,), (F.gelu,), (), ("gelu",)),
    "dropout": (
        (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout),
        (F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout, torch.dropout),
        (),
        # with the in-place forms (nn.Dropout(inplace=True): torchvision's EfficientNets and MobileNetV3)
        (
            *("dropout", "native_dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"),
            *("dropout_", "feature_dropout_", "alpha_dropout_", "feature_alpha_dropout_"),
        ),
    ),
    "identity": ((nn.Identity,), (), (), ()),
    "conv": (
        CONV_TYPES,
        (F.conv1d, F.conv2d, F.conv3d),
        (),
        ("conv1d", "conv2d", "conv3d", "convolution"),
    ),
    "conv_transpose": (
        CONV_TRANSPOSE_TYPES,
        (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d),
        (),
        ("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"),
    ),
    "linear": ((nn.Linear,), (F.linear,), (), ("linear",)),
    "batch_norm": (
        (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d),
        (F.batch_norm,),
        (),
        ("batch_norm", "_native_batch_norm_legit_no_training", "native_batch_norm"),
    ),
    "add": ((), (operator.add, operator.iadd, torch.add), ("add", "add_"), ("add", "add_")),
    "mul": ((), (operator.mul, operator.imul, torch.mul), ("mul", "mul_"), ("mul", "mul_")),
}


def graph_fingerprint(graph: fx.Graph) -> list[tuple[Any, ...]]:
    """Every node with its operation and arguments: equal before and after code that must not change the graph (a
    lint rule, a pass that reports no change)."""
    return [(node, node.op, node.target, node.args, node.kwargs) for node in graph.nodes]


class MethodCall(nn.Module):
    """One call of a module's method other than ``forward`` (``self.gate(x)``), kept by capture as one
    ``call_module`` node because the method's code cannot be traced (it branches on a tensor's value).

    ``owner`` is the module the method is called on. Where the graph holds that module itself (``block``), it is a
    plain attribute here (``registered=False``): the graph moves, copies, saves and counts it already, and registered
    a second time it would have two names (torch's quantization names a module by its first path, and lost
    ``block``). Otherwise it is registered, so that the weights only the method reads move, save and count with the
    graph: capture then passes a shell of the module (a copy of the instance whose submodules the graph holds are
    plain attributes too), never the user's model itself, whose mode ``gm.train()`` would otherwise set.
    """

    def __init__(self, owner: nn.Module, method: str, registered: bool = True) -> None:
        super().__init__()
        if registered:
            self.owner = owner
        else:
            object.__setattr__(self, "owner", owner)
        self.method = method

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.owner, self.method)(*args, **kwargs)

    def extra_repr(self) -> str:
        return f"{type(self.owner).__name__}.{self.method}"


def called_parameters(gm: nn.Module, path: str) -> list[tuple[str, nn.Parameter]]:
    """The parameters a call of the submodule at ``path`` is counted as reading, named: all of its own; for a
    :class:`MethodCall`, only those no other module of ``gm`` holds (what the method reads is not known, and a
    weight the graph reads elsewhere would count twice, in inspect and lint)."""
    if isinstance(gm.get_submodule(path), MethodCall):
        # named_parameters names each tensor once, by the first module holding it; MethodCalls are added last
        return [(name, p) for name, p in gm.named_parameters() if name.startswith(f"{path}.")]
    return list(gm.get_submodule(path).named_parameters(prefix=path))


def runs_hooks(module: Any) -> bool:
    """Whether calling ``module`` runs hooks besides its ``forward``: a forward hook (a user's feature hook, one that
    rescales the output) or a forward pre-hook (pruning's mask, the old ``weight_norm`` and ``spectral_norm``,
    which recompute the weight on every call). Such a module computes more than its type says, so passes treat it
    as opaque: folding, merging or removing it dropped the hook (QA: fold_bn wrote a model 0.35 off)."""
    return bool(getattr(module, "_forward_hooks", None) or getattr(module, "_forward_pre_hooks", None))


def node_kind(gm: nn.Module, node: fx.Node) -> str | None:
    """Classify ``node`` as one of the kinds above (``"conv"``, ``"relu"``...), or None (a module that runs hooks
    is none of them: :func:`runs_hooks`)."""
    if node.op == "call_module":
        module = submodule(gm, node)
        if runs_hooks(module):
            return None
        for kind, (types, _, _, _) in NODE_KINDS.items():
            # exact type for module kinds: a subclass may override forward with anything
            if type(module) in types:
                return kind
        return None
    if node.op == "call_function":
        packet = aten_packet(node)
        for kind, (_, functions, _, aten_names) in NODE_KINDS.items():
            if packet is not None:
                if packet in aten_names:
                    if packet == "convolution" and len(node.args) > 6 and node.args[6]:
                        return "conv_transpose"
                    return kind
            elif any(node.target is f for f in functions):
                return kind
        return None
    if node.op == "call_method":
        for kind, (_, _, methods, _) in NODE_KINDS.items():
            if node.target in methods:
                return kind
    return None


def is_kind(gm: nn.Module, node: fx.Node, *kinds: str) -> bool:
    return node_kind(gm, node) in kinds


# Calls known to mutate their inputs or global state: never dropped or merged by analyses.
_SIDE_EFFECT_FUNCTIONS: set[Any] = {
    torch._assert,
    operator.setitem,
    operator.iadd,
    operator.isub,
    operator.imul,
    operator.itruediv,
    torch.manual_seed,
    print,
}
for _name in ("_assert_async", "_assert_scalar", "sym_constrain_range_for_size", "_check", "_check_is_size"):
    if hasattr(torch, _name):
        _SIDE_EFFECT_FUNCTIONS.add(getattr(torch, _name))
# symbolic_trace's guard on an argument fixed to None (``forward(x, mask=None)``): without it the graph runs as if
# the mask were None when one is passed (QA: timm's ViT ignored its attn_mask after dead_code), silently
_SIDE_EFFECT_FUNCTIONS.add(getattr(fx._symbolic_trace, "_assert_is_none", torch._assert))

# Random Python-level calls with no ATen op of the same name to read the nondeterministic_seeded tag from.
_RANDOM_PYTHON_NAMES = frozenset(
    {
        "gumbel_softmax",
        "dropout1d",
        "dropout2d",
        "dropout3d",
        "fractional_max_pool2d",
        "fractional_max_pool3d",
        "fractional_max_pool2d_with_indices",
        "fractional_max_pool3d_with_indices",
    }
)
_SEEDED_ATEN_NAMES: dict[str, bool] = {}


def draws_random_numbers(name: str) -> bool:
    """Whether a call named ``name`` (function, method or ATen packet: ``rand_like``, ``dropout``, ``normal_``) draws
    from the RNG: some overload of ``aten.<name>`` is tagged ``nondeterministic_seeded``, or it is one of the few
    Python-level random calls without an ATen op of that name. Random ops give a new value on each call: they are
    not pure even without writing memory."""
    if name in _RANDOM_PYTHON_NAMES:
        return True
    if name.startswith("_") or not name.isidentifier():
        return False
    if name not in _SEEDED_ATEN_NAMES:
        try:
            packet = getattr(torch.ops.aten, name)
            seeded = any(torch.Tag.nondeterministic_seeded in getattr(packet, o).tags for o in packet.overloads())
        except Exception:  # no such ATen op
            seeded = False
        _SEEDED_ATEN_NAMES[name] = seeded
    return _SEEDED_ATEN_NAMES[name]


def has_side_effects(gm: nn.Module, node: fx.Node) -> bool:
    """True when removing or deduplicating ``node`` could change behaviour.

    In-place methods and ops (trailing ``_``), ``out=`` calls, setitem, asserts, random ops and
    calls into modules we cannot see through (leaf modules other than stateless torch.nn ones) are
    all treated as effectful; this is deliberately conservative.
    """
    if node.op in ("placeholder", "output"):
        return True
    if node.op == "get_attr":
        return False
    if "out" in node.kwargs:
        return True
    if node.op == "call_method":
        name = str(node.target)
        in_place = name.endswith("_") and not name.endswith("__")
        return in_place or draws_random_numbers(name) or name in ("copy_", "fill_")
    if node.op == "call_function":
        target = node.target
        if target in _SIDE_EFFECT_FUNCTIONS:
            return True
        if isinstance(target, torch._ops.OpOverload):
            schema = target._schema
            if any(arg.alias_info is not None and arg.alias_info.is_write for arg in schema.arguments):
                return True
            if schema.is_mutable or draws_random_numbers(target._overloadpacket.__name__):
                return True
            return bool(target.namespace not in ("aten", "prims"))
        name = getattr(target, "__name__", "")
        if name.endswith("_") and not name.endswith("__"):
            return True
        if draws_random_numbers(name):
            return True
        return node.kwargs.get("inplace") is True
    if node.op == "call_module":
        module = submodule(gm, node)
        if getattr(module, "inplace", False):
            return True
        if isinstance(module, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)):
            return module.training and module.track_running_stats  # updates running stats
        if type(module).__module__.startswith("torch.nn.modules"):
            return isinstance(module, (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)) and module.training
        return True  # a user leaf module could do anything (buffer writes, prints, RNG)
    return True


# Reads of a tensor's metadata only: rewriting how the tensor is computed (same shape and dtype) keeps them right,
# and an unused one can go (no effects). Their value is not constant: in-place ops (unsqueeze_, t_, resize_) change
# a tensor's shape, so two reads around one are not the same value.
_METADATA_ATTRIBUTES = frozenset({"ndim", "shape", "dtype", "device", "is_cuda", "layout"})
_METADATA_METHODS = frozenset({"dim", "ndimension", "size", "numel", "nelement", "get_device"})
_METADATA_ATEN = frozenset({"sym_size", "sym_numel", "_assert_tensor_metadata"})
_SHAPED_LIKE_METHODS = frozenset({"reshape_as", "view_as", "expand_as"})  # x.view_as(other): other's shape only
# (methods, and the ATen ops of the same names)


def reads_metadata_only(user: fx.Node, node: fx.Node) -> bool:
    """Does ``user`` read only the shape, rank, dtype or device of ``node`` (timm's ``assert x.ndim == 4``, or
    ``y.reshape_as(node)``, which reads the shape of its ``other``)?"""
    shaped_like = (user.op == "call_method" and user.target in _SHAPED_LIKE_METHODS) or (
        aten_packet(user) in _SHAPED_LIKE_METHODS
    )
    if shaped_like and len(user.args) == 2 and not user.kwargs:
        return user.args[1] is node and user.args[0] is not node
    if not user.args or user.args[0] is not node or node in user.args[1:] or node in user.kwargs.values():
        return False
    if user.op == "call_function" and user.target is getattr:
        return user.args[1] in _METADATA_ATTRIBUTES
    if user.op == "call_method":
        return user.target in _METADATA_METHODS
    return aten_packet(user) in _METADATA_ATEN


def tensor_inputs(node: fx.Node) -> Iterable[fx.Node]:
    return node.all_input_nodes


def node_arg(node: fx.Node, index: int | None, name: str, default: Any = None) -> Any:
    """A call's argument ``name``: ``node.args[index]`` when given positionally, else the keyword, else ``default``."""
    if index is not None and len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def node_value(node: fx.Node) -> Any:
    """What capture recorded about ``node``'s value: the fake tensor in ``meta["val"]`` (torch.export),
    else ``meta["tensor_meta"]`` (ShapeProp), else None. Both have ``.shape`` and ``.dtype`` for tensors."""
    value = node.meta.get("val")
    if value is None:
        value = node.meta.get("tensor_meta")
    return value


def outside_torch(target: Any) -> bool:
    """A callable from outside torch and Python's operators and math: a user's or a library's function, which a
    symbolically traced graph calls only where capture kept it whole (``--wrap``)."""
    module = getattr(target, "__module__", None) or "torch"
    return not module.startswith(("torch", "_operator", "operator", "builtins", "math"))


class MutableArguments:
    """An ``fx.Interpreter`` mix-in that calls functions from outside torch with plain lists and dicts.

    The Interpreter hands a node's arguments over as fx's immutable containers, as they sit in the graph; the
    GraphModule's generated code builds fresh ones. A traced T5 rebuilds its config in the graph
    (``T5Config(id2label={...})``), whose validator writes to that dict: every node-by-node run (inspect, profile,
    graph, split) ended in an internal error, though the GraphModule itself ran (QA)."""

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        if outside_torch(target):
            args, kwargs = _mutable(args), _mutable(kwargs)
        return super().call_function(target, args, kwargs)  # type: ignore[misc]


def _mutable(value: Any) -> Any:
    if isinstance(value, dict):  # immutable_dict is a dict
        return {key: _mutable(item) for key, item in value.items()}
    if isinstance(value, list):  # and immutable_list a list
        return [_mutable(item) for item in value]
    if type(value) is tuple:
        return tuple(_mutable(item) for item in value)
    return value


def is_var_keyword(target: Any) -> bool:
    """Whether a placeholder's target is a forward's ``**kwargs``, which no positional value fills."""
    return str(target).startswith("**")


class GraphRunner(MutableArguments, fx.Interpreter):
    """``fx.Interpreter`` that gives a ``**kwargs`` placeholder an empty dict (and plain arguments to functions
    from outside torch: :class:`MutableArguments`).

    A traced ``forward(self, x, **kwargs)`` keeps ``kwargs`` as a placeholder, which torch's Interpreter fills with
    the leftover positional values -- a list: ``kwargs.get("scale", 1.0)`` then failed on every run fxforge makes
    node by node (inspect, profile, verify's bisection), though the GraphModule itself runs.
    """

    def placeholder(self, target: Any, args: Any, kwargs: Any) -> Any:
        if is_var_keyword(target):
            return {}
        return super().placeholder(target, args, kwargs)


# Ops that pass a tensor's values through unchanged (only its shape or layout changes): an input reaches an
# embedding through them as the same indices.
_SAME_VALUES_METHODS = frozenset({"view", "reshape", "flatten", "unsqueeze", "squeeze", "contiguous", "expand", "long"})
_SAME_VALUES_ATEN = frozenset({"view", "reshape", "_unsafe_view", "flatten", "unsqueeze", "squeeze", "clone"})
_SAME_VALUES_ATEN |= {"contiguous", "expand", "alias", "_to_copy"}


def index_bounds(gm: fx.GraphModule) -> dict[int, int]:
    """For each positional input (its placeholder's position) that an embedding looks up directly (or through
    reshapes), the number of rows of the smallest such table: indices of that input must lie in ``[0, rows)``.
    Compiled code checks such bounds inside a parallel loop, where a failed check cannot be raised as a Python
    error: an out-of-range token id aborted the whole process (torch.compile and AOTInductor alike)."""
    bounds: dict[int, int] = {}
    placeholders = [node for node in gm.graph.nodes if node.op == "placeholder"]
    for position, placeholder in enumerate(placeholders):
        reached, frontier = {placeholder}, [placeholder]
        while frontier:
            node = frontier.pop()
            for user in node.users:
                rows = _embedding_rows(gm, user, node)
                if rows is not None:
                    bounds[position] = min(rows, bounds.get(position, rows))
                elif user not in reached and _passes_values(user, node):
                    reached.add(user)
                    frontier.append(user)
    return bounds


def _passes_values(user: fx.Node, node: fx.Node) -> bool:
    if not user.args or user.args[0] is not node:
        return False
    if user.op == "call_method":
        return user.target in _SAME_VALUES_METHODS
    if user.op == "call_function" and user.target in (torch.flatten, torch.reshape, torch.unsqueeze, torch.squeeze):
        return True
    return aten_packet(user) in _SAME_VALUES_ATEN


def _embedding_rows(gm: fx.GraphModule, user: fx.Node, indices: fx.Node) -> int | None:
    """The rows of the table ``user`` looks ``indices`` up in, where ``user`` is an embedding lookup of them."""
    weight: Any = None
    if user.op == "call_module" and user.args and user.args[0] is indices:
        module = submodule(gm, user)
        weight = module.weight if type(module) is nn.Embedding else None
    elif user.op == "call_function" and user.target is F.embedding and node_arg(user, 0, "input") is indices:
        weight = node_arg(user, 1, "weight")
    elif aten_packet(user) == "embedding" and node_arg(user, 1, "indices") is indices:
        weight = node_arg(user, 0, "weight")
    if isinstance(weight, fx.Node):
        weight = get_attr_value(gm, weight.target) if weight.op == "get_attr" else node_value(weight)
    shape = getattr(weight, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) == 2 and isinstance(shape[0], int) else None


def builds_namedtuple(node: fx.Node) -> bool:
    """Whether ``node`` only builds a namedtuple: symbolic_trace records ``Out(a, b)`` as a call of the class."""
    target = node.target
    return (
        node.op == "call_function"
        and isinstance(target, type)
        and issubclass(target, tuple)
        and hasattr(target, "_fields")
    )
