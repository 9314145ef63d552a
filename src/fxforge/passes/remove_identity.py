"""remove_identity: remove calls that provably return their input's value unchanged.

Two families, with different proofs:

* calls that return the input tensor itself when they are no-ops -- ``nn.Identity``, ``.contiguous()`` on a
  contiguous tensor, ``.to(dtype)``/``.float()``... to the dtype (and device) it already has, ``aten.alias``,
  ``aten.detach_`` of a fresh copy of a constant (``lift_fresh_copy``: no one else holds it).
  Their users can read the input directly; values and aliasing are unchanged. (``aten.alias`` returns a new
  tensor object on the same memory: it stays when an in-place view op such as ``t_`` or ``unsqueeze_``,
  which changes only the object it is given, may reshape either.)
* arithmetic with a neutral literal scalar -- ``x * 1``, ``1 * x``, ``x + 0``, ``0 + x``, ``x - 0``,
  ``x / 1`` -- or with a stored tensor of zeros that does not broadcast ``x`` (``x + Z``, ``Z + x``,
  ``x - Z``: the all-zero attention mask torch.export materialises for an unpadded transformer) -- and
  copies (``aten.clone``, a no-op ``aten._to_copy``). These return a *new* tensor equal to the input, so
  they go only when (a) the input's dtype is known and the literal cannot promote it
  (``bool_tensor * 1`` is int64, ``int_tensor / 1`` and ``int_tensor * 1.0`` are float), (b) no
  in-place op in the graph writes into either tensor and the result is not returned next to its input or
  as a graph input/parameter itself, where the caller could see they became one tensor, and (c) the copy has
  the input's strides: a copy of an expanded tensor or of a slice with gaps is dense, and a ``view`` recorded
  on the copy may not work on the input (:func:`~fxforge.effects.copy_layout_problem`).

Dtype, device and layout facts come from ``node.meta`` (``tensor_meta`` from shape propagation, which
``Pipeline`` runs on the example inputs, or torch.export's ``val``); without them the call is kept.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from fxforge.effects import AliasClasses, copy_layout_problem, tensor_facts
from fxforge.graphs import ATEN, aten_packet, dialect_of, get_attr_value, node_kind
from fxforge.passes import PassResult, mark, register_pass

NAME = "remove_identity"


@dataclass
class RemoveIdentityOptions:
    # x + 0 turns -0.0 into +0.0; removing it keeps -0.0 (equal as a value, but 1/x and copysign differ)
    signed_zeros: bool = False


_CAST_METHODS = {
    "float": torch.float32,
    "double": torch.float64,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "int": torch.int32,
    "long": torch.int64,
    "short": torch.int16,
    "char": torch.int8,
    "byte": torch.uint8,
    "bool": torch.bool,
}
# (operation, which operand may hold the neutral literal): "either" for commutative operations
_ARITHMETIC: dict[Any, str] = {
    operator.mul: "mul",
    operator.add: "add",
    operator.sub: "sub",
    operator.truediv: "div",
    torch.mul: "mul",
    torch.add: "add",
    torch.sub: "sub",
    torch.div: "div",
    torch.true_divide: "div",
}
_ARITHMETIC_METHODS = {"mul": "mul", "add": "add", "sub": "sub", "div": "div", "true_divide": "div"}
_NEUTRAL = {"mul": 1, "add": 0, "sub": 0, "div": 1}
_COMMUTATIVE = {"mul", "add"}
_PRESERVE = (None, torch.preserve_format)


@register_pass(
    NAME,
    summary=(
        "Remove no-op calls: nn.Identity, x*1, x+0, x-0, x/1, no-op .contiguous()/.to()/.float(), aten.alias/clone."
    ),
    guarantees=(
        "Exact: each removed call returns a value equal to its input with the same dtype, shape and device. Casts, "
        "contiguous and arithmetic go only when node metadata proves the dtype (and device, where one is named) "
        "unchanged and the literal cannot promote it -- in the torch dialect, not on a graph input, whose dtype the "
        "caller chooses (an exported program refuses other dtypes); besides literal int/float scalars, x + Z and x - "
        "Z count for a stored real tensor Z (a buffer or constant, not a parameter) that is all zeros when the pass "
        "runs, that no in-place op writes, that cannot promote x and whose broadcast leaves x's recorded shape as it "
        "is (torch.export's all-zero attention masks, once fold_constants stored them). Calls that return a copy "
        "(x*1, clone) stay when an in-place op could write into either tensor, when the caller would get an input, a "
        "parameter or another output back, or when the copy's strides differ from the input's (an expanded or gapped "
        "input; a later view could fail). aten.alias stays when an in-place view op (t_, unsqueeze_, resize_...) may "
        "reshape it or its input. aten.detach_ goes only on a fresh copy of a constant (lift_fresh_copy), whose "
        "autograd flag nothing outside the graph sees. x + 0 on floats maps -0.0 to +0.0: kept with "
        "signed_zeros=True. Layout facts in the torch dialect come from the example inputs. Torch and ATen dialects."
    ),
    options=RemoveIdentityOptions,
)
def remove_identity(gm: fx.GraphModule, options: RemoveIdentityOptions) -> PassResult:
    result = PassResult(NAME, gm)
    removals, skipped = plan_removals(gm, options)
    for reason in skipped:
        result.skip(reason)
    removed_modules = False
    for removal in removals:
        node, source = removal.node, removal.source
        if source.op.startswith("call"):
            # the input now stands for this node's value as well: blame this pass if they ever differ
            mark(source, NAME, origin_of=node)
        node.replace_all_uses_with(source)
        gm.graph.erase_node(node)
        removed_modules |= node.op == "call_module"
        result.note(f"removed {node.name} ({removal.describe})", removed=1)
    if removed_modules:
        gm.delete_all_unused_submodules()
    return result


@dataclass
class Removal:
    """A call the pass removes: ``node``'s users read ``source`` instead."""

    node: fx.Node
    source: fx.Node
    describe: str


def plan_removals(gm: fx.GraphModule, options: RemoveIdentityOptions) -> tuple[list[Removal], list[str]]:
    """The calls :func:`remove_identity` removes, in graph order, and a line for each candidate it keeps.

    Decided without changing the graph, so that lint rule FX005 reports exactly what the pass removes: a removal
    is remembered as "``node`` is ``source``" (for the inputs of later candidates and for the alias classes)
    instead of being applied.
    """
    static_shapes = dialect_of(gm) == ATEN  # torch.export specialises (and guards) every size it did not mark dynamic
    aliases: AliasClasses | None = None
    stored_zeros = _StoredZeros(gm)
    stands_for: dict[fx.Node, fx.Node] = {}  # removed node -> the node its users will read
    removals: list[Removal] = []
    skipped: list[str] = []
    for node in gm.graph.nodes:
        if not node.op.startswith("call"):
            continue
        found = _classify(gm, node, stored_zeros)
        if found is None:
            continue
        kind, source, describe = found
        if not isinstance(source, fx.Node):
            continue
        source = stands_for.get(source, source)
        if aliases is None and (kind == "copy" or aten_packet(node) == "alias"):
            aliases = AliasClasses(gm)
        if kind == "copy":
            reason = _copy_check(gm, node, source, options, aliases, stored_zeros)
        elif aten_packet(node) == "alias":
            reason = _alias_check(node, aliases)
        elif kind == "layout":
            reason = _contiguous_check(source, static_shapes)
        elif kind == "cast":
            reason = _cast_check(gm, node, source)
        else:
            reason = None
        if reason is None and not static_shapes and _dtype_matters(gm, kind, node, source):
            reason = _CALLERS_DTYPE.format(dtype=tensor_facts(source, gm)["dtype"])  # type: ignore[index]
        if reason is not None:
            skipped.append(f"{node.name} ({describe}): {reason}")
            continue
        if aliases is not None:
            aliases.merge(node, source)
        stands_for[node] = source
        removals.append(Removal(node, source, describe))
    return removals, skipped


# A torch-dialect graph runs any dtype it is given, as the model does; an exported program refuses another dtype
# than its example's. The example's dtype proves a cast or a literal neutral for that dtype only: x.float() on a
# float64 input, x * 1.0 on an int one, are not no-ops (QA: the output of `lin(x.float())` refused float64 input).
_CALLERS_DTYPE = (
    "its input is a graph input, whose dtype the caller chooses (the example's is {dtype}): for another dtype it "
    "may change the value"
)


def _dtype_matters(gm: fx.GraphModule, kind: str, node: fx.Node, source: fx.Node) -> bool:
    """Is ``node`` a cast or arithmetic with a literal applied to a graph input (whose dtype may be another)?"""
    if source.op != "placeholder" or tensor_facts(source, gm) is None:
        return False
    return kind == "cast" or (kind == "copy" and node.op != "call_module" and _is_arithmetic(node))


def _is_arithmetic(node: fx.Node) -> bool:
    if node.op == "call_method":
        return str(node.target) in _ARITHMETIC_METHODS
    return node.op == "call_function" and node.target in _ARITHMETIC


def _classify(gm: fx.GraphModule, node: fx.Node, stored_zeros: _StoredZeros) -> tuple[str, Any, str] | None:
    """(kind, input, description) for a candidate, kind one of identity/layout/cast/copy; None otherwise."""
    if node.op == "call_module":
        if node_kind(gm, node) == "identity" and len(node.args) == 1 and not node.kwargs:
            return "identity", node.args[0], "nn.Identity"
        return None
    packet = aten_packet(node)
    if packet is not None:
        return _classify_aten(node, packet, stored_zeros)
    if node.op == "call_method":
        name = str(node.target)
        source = node.args[0] if node.args else None
        if name == "contiguous":
            if len(node.args) == 1 and node.kwargs.get("memory_format", torch.contiguous_format) is (
                torch.contiguous_format
            ):
                return "layout", source, ".contiguous()"
            return None
        if name == "to" or name in _CAST_METHODS:
            return "cast", source, f".{name}()"
        if name in _ARITHMETIC_METHODS:
            return _classify_arithmetic(node, _ARITHMETIC_METHODS[name], stored_zeros, method=True)
        return None
    if node.op == "call_function":
        try:
            operation = _ARITHMETIC.get(node.target)
        except TypeError:
            return None
        if operation is not None:
            return _classify_arithmetic(node, operation, stored_zeros, method=False)
    return None


def _classify_arithmetic(
    node: fx.Node, operation: str, stored_zeros: _StoredZeros, method: bool
) -> tuple[str, Any, str] | None:
    kwargs = dict(node.kwargs)
    if kwargs.pop("alpha", 1) != 1 or kwargs:  # rounding_mode, out=, other= ...: not a plain neutral op
        return None
    if len(node.args) != 2:
        return None
    a, b = node.args
    symbol = {"mul": "*", "add": "+", "sub": "-", "div": "/"}[operation]
    if _is_neutral(b, operation) and isinstance(a, fx.Node):
        return "copy", a, f"x {symbol} {b!r}"
    if not method and operation in _COMMUTATIVE and _is_neutral(a, operation) and isinstance(b, fx.Node):
        return "copy", b, f"{a!r} {symbol} x"
    if operation in ("add", "sub") and isinstance(a, fx.Node) and stored_zeros(b) is not None:
        return "copy", a, f"x {symbol} {b.target} (a stored tensor of zeros)"
    if not method and operation == "add" and isinstance(b, fx.Node) and stored_zeros(a) is not None:
        return "copy", b, f"{a.target} (a stored tensor of zeros) + x"
    return None


_ZERO_TENSOR_LIMIT = 1 << 24  # elements read to prove a stored tensor all zeros: keeps the pass linear in practice


def _zero_tensor(gm: fx.GraphModule, value: fx.Node) -> torch.Tensor | None:
    """The stored tensor the ``get_attr`` node ``value`` fetches, if it is a real-valued tensor of zeros.

    torch.export materialises the attention mask transformers builds when there is no padding: a constant
    ``where(True, 0, -inf)`` that fold_constants turns into a stored tensor of zeros, added to the scores.
    Adding it changes nothing but keeps Inductor's attention fusion from matching (measured on vit_small).
    """
    try:
        tensor = get_attr_value(gm, str(value.target))
    except AttributeError:
        return None
    if not isinstance(tensor, torch.Tensor) or tensor.is_complex() or tensor.device.type == "meta":
        return None
    if isinstance(tensor, nn.Parameter):  # a weight that happens to be zero now (a fresh bias) is still a weight
        return None
    if tensor.numel() > _ZERO_TENSOR_LIMIT or bool(tensor.any()):
        return None
    return tensor


class _StoredZeros:
    """The stored tensors of zeros a graph fetches, each proven once per plan: the proof reads the whole tensor."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self._gm = gm
        self._proven: dict[fx.Node, torch.Tensor | None] = {}

    def __call__(self, value: Any) -> torch.Tensor | None:
        """What :func:`_zero_tensor` says of ``value``, read once per ``get_attr`` node."""
        if not isinstance(value, fx.Node) or value.op != "get_attr":
            return None
        if value not in self._proven:
            self._proven[value] = _zero_tensor(self._gm, value)
        return self._proven[value]


def _is_neutral(value: Any, operation: str) -> bool:
    # bool is an int subclass, and True * x is a logical op on bool tensors: literal ints/floats only
    return type(value) in (int, float) and value == _NEUTRAL[operation]


def _classify_aten(node: fx.Node, packet: str, stored_zeros: _StoredZeros) -> tuple[str, Any, str] | None:
    target = node.target
    source = node.args[0] if node.args else None
    overload = target._overloadname
    if packet == "alias":
        return "identity", source, "aten.alias"
    if packet == "detach_" and _is_fresh_constant(_before_detaches(source)):
        # returns its input itself and only clears the autograd flag of a fresh copy of a constant, which nothing
        # outside the graph holds (transformers 5.17 builds its attention mask on ``torch.tensor(0.0).detach_()``;
        # left, it keeps fold_constants from storing the mask, and the mask from going)
        return "identity", source, "aten.detach_ of a fresh constant"
    if packet == "contiguous":
        if node.kwargs.get("memory_format", torch.contiguous_format) is torch.contiguous_format:
            return "layout", source, "aten.contiguous"
        return None
    if packet == "to":
        return "cast", source, f"aten.to.{overload}"
    if packet in ("clone", "_to_copy"):
        if node.kwargs.get("memory_format") not in _PRESERVE or len(node.args) != 1:
            return None
        return "copy", source, f"aten.{packet}"
    if packet in _NEUTRAL and overload in ("Tensor", "Scalar"):
        # torch.export keeps torch.add(0, x) as aten.add.Tensor(0, x): a literal first operand is possible here
        return _classify_arithmetic(node, packet, stored_zeros, method=False)
    return None


def _is_fresh_constant(value: Any) -> bool:
    return isinstance(value, fx.Node) and aten_packet(value) == "lift_fresh_copy"


def _before_detaches(value: Any) -> Any:
    """What ``value`` is once the ``aten.detach_`` calls it went through are skipped (torch.export may chain two)."""
    while isinstance(value, fx.Node) and aten_packet(value) == "detach_" and value.args:
        value = value.args[0]
    return value


# --------------------------------------------------------------------------------------------------
# proofs; each returns None when the call is a no-op, else the reason it is kept


def _contiguous_check(source: fx.Node, static_shapes: bool) -> str | None:
    facts = tensor_facts(source)
    if facts is None or facts["contiguous"] is None:
        return "the input's layout is unknown (no shape metadata)"
    if not facts["contiguous"]:
        return "the input is not contiguous"
    if not static_shapes and any(size <= 1 for size in facts["shape"]):
        # a size-1 dimension makes any stride look contiguous: another input shape may not be
        return "the input has a size-1 dimension, so its contiguity may hold only for the example shape"
    return None


def _alias_check(node: fx.Node, aliases: AliasClasses) -> str | None:
    # aten.alias is a second tensor object on the same memory: values written through either are shared, but
    # t_/unsqueeze_/resize_ change only the object they are given, so merging the two objects could be seen
    if aliases.reshaped(node):
        return "an in-place view op (t_, unsqueeze_...) may reshape it or its input, which would then be one tensor"
    return None


def _cast_check(gm: fx.GraphModule, node: fx.Node, source: fx.Node) -> str | None:
    wanted = _cast_target(node)
    if isinstance(wanted, str):
        return wanted
    dtype, device = wanted
    facts = tensor_facts(source, gm)
    if facts is None:
        return "the input's dtype is unknown (no shape metadata)"
    if dtype is not None and facts["dtype"] != dtype:
        return f"converts {facts['dtype']} to {dtype}"
    if device is not None:
        if facts["device"] is None:
            return "the input's device is unknown"
        if torch.device(facts["device"]) != device:
            return f"moves the tensor from {facts['device']} to {device}"
    return None


def _cast_target(node: fx.Node) -> tuple[torch.dtype | None, torch.device | None] | str:
    """(dtype, device) a cast asks for, or the reason it cannot be read as a possible no-op."""
    kwargs = dict(node.kwargs)
    kwargs.pop("non_blocking", None)
    if kwargs.pop("copy", False) is not False:
        return "copy=True always makes a copy"
    if kwargs.pop("memory_format", None) not in _PRESERVE:
        return "it may change the memory format"
    name = str(node.target) if node.op == "call_method" else "to"
    if name in _CAST_METHODS:
        return (_CAST_METHODS[name], None) if len(node.args) == 1 and not kwargs else "unexpected arguments"
    dtype = kwargs.pop("dtype", None)
    device = kwargs.pop("device", None)
    if kwargs.pop("layout", torch.strided) is not torch.strided or kwargs.pop("pin_memory", None) or kwargs:
        return "unexpected arguments"
    for value in node.args[1:]:
        if isinstance(value, torch.dtype):
            dtype = value
        elif isinstance(value, (torch.device, str)):
            device = value
        elif isinstance(value, bool):
            if value:
                return "non_blocking/copy flags given by position"
        elif value is not None:
            return "converts to the dtype/device of a value computed in the graph"
    try:
        return dtype, torch.device(device) if device is not None else None
    except (RuntimeError, TypeError):
        return f"unreadable device {device!r}"


def _copy_check(
    gm: fx.GraphModule,
    node: fx.Node,
    source: fx.Node,
    options: RemoveIdentityOptions,
    aliases: AliasClasses,
    stored_zeros: _StoredZeros,
) -> str | None:
    facts = tensor_facts(source, gm)
    if facts is None:
        return "the input's dtype is unknown (no shape metadata), so the literal could promote it"
    dtype = facts["dtype"]
    packet = aten_packet(node)
    if packet == "_to_copy":
        reason = _cast_check(gm, node, source)
        if reason is not None:
            return reason
    elif packet != "clone":
        operation = _arithmetic_operation(node)
        literal = next((arg for arg in node.args if isinstance(arg, (int, float))), None)
        zeros, values = next(((arg, t) for arg in node.args if (t := stored_zeros(arg)) is not None), (None, None))
        neutral: Any = literal if values is None else torch.empty(1, dtype=values.dtype)
        if dtype.is_complex:
            return "complex arithmetic with a literal is not exact (inf * 0 terms)"
        if torch.result_type(torch.empty(1, dtype=dtype), neutral) != dtype:
            return f"{dtype} {operation} {literal if zeros is None else zeros.target} promotes the dtype"
        if zeros is not None:
            reason = _zeros_check(node, source, zeros, aliases)
            if reason is not None:
                return reason
        if operation == "div" and not dtype.is_floating_point:
            return f"true division turns {dtype} into a floating dtype"
        if operation == "add" and options.signed_zeros and dtype.is_floating_point:
            return "x + 0 maps -0.0 to +0.0 and signed_zeros=True"
        own = tensor_facts(node)
        if own is not None and (own["dtype"] != dtype or (own["shape"] and own["shape"] != facts["shape"])):
            return "its recorded dtype or shape differs from the input's"
    if aliases.written(node) or aliases.written(source):
        # a user's leaf module or a call fxforge cannot see into counts as a writer (fxforge.effects.written_args)
        return (
            "it returns a copy and an in-place op writes into the copy or its input (a user's leaf module or a call "
            "fxforge cannot see into counts as one: it may write into what it is given)"
        )
    if aliases.escapes(node) and (aliases.external(source) or aliases.escapes(source)):
        return "it returns a copy that the graph returns, and the input is a graph input, a parameter or an output"
    return copy_layout_problem(node, source, gm)


def _zeros_check(node: fx.Node, source: fx.Node, zeros: fx.Node, aliases: AliasClasses) -> str | None:
    """x + zeros is x only if the zeros stay zeros and broadcasting them does not change x's shape."""
    if aliases.written(zeros):
        return f"an in-place op writes into {zeros.target}"
    own, given = _shape_text(node), _shape_text(source)
    if own is None or given is None:
        return "the shapes are not recorded, so adding the zeros may broadcast x to a larger shape"
    if own != given:
        return f"adding {zeros.target} broadcasts x to another shape"
    return None


def _shape_text(node: fx.Node) -> list[str] | None:
    """A node's recorded shape, as text so that symbolic sizes compare too; None when not recorded."""
    value = node.meta.get("val", node.meta.get("tensor_meta"))
    shape = getattr(value, "shape", None)
    return None if shape is None else [str(size) for size in shape]


def _arithmetic_operation(node: fx.Node) -> str:
    packet = aten_packet(node)
    if packet is not None:
        return packet
    if node.op == "call_method":
        return _ARITHMETIC_METHODS[str(node.target)]
    return _ARITHMETIC[node.target]
