"""fold_constants: compute once, at pass time, what depends only on stored tensors and literals.

A node is constant when it is a ``get_attr`` of a stored tensor, or a pure call
(:func:`~fxforge.effects.impure_reason`) whose inputs are all constant -- including calls with no
inputs at all, such as ``torch.ones(3)``. One forward sweep evaluates the constant nodes with the graph's own
interpreter (the same kernels on the same values, so the results are bit-identical to what the graph would
compute). Each *root* -- a constant node read by a non-constant node or by the output -- is then replaced:

* a tensor by a ``get_attr`` of a new buffer holding it (a view of a stored tensor stays a view of it, so
  ``self.weight.t()`` costs no memory; a call that returns a stored tensor itself becomes a read of it);
  a value whose elements share memory (``self.cls_token.expand(batch, -1, -1)``) is not stored: anything that
  writes a stored tensor in place (``load_state_dict``, the buffer restore after a check run) fails on it, so
  it stays in the graph, a free view of its folded or stored input (:func:`_kept_views`);
* an ``int``/``bool``/finite ``float``/``torch.Size`` (``self.weight.shape[0]``, ``.item()``) by the literal
  in its users.

The constant nodes only the roots needed are erased, and stored tensors nothing reads any more are deleted.
Folded values are buffers, not parameters: a parameter-derived value is frozen (no gradient reaches the
parameters it came from), so fold a model for inference, not before training.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import torch
from torch import fx

from fxforge.effects import (
    AliasClasses,
    impure_reason,
    is_mode_switch,
    overlaps_itself,
    returns_fresh,
    storage_of,
    tensor_facts,
)
from fxforge.errors import first_line
from fxforge.graphs import get_attr_value, target_name
from fxforge.passes import PassResult, mark, register_pass, store_tensor
from fxforge.passes.dead_code import prune_attributes

NAME = "fold_constants"
_CALLS = ("call_function", "call_method", "call_module")


@dataclass
class FoldConstantsOptions:
    # the most new memory one constant may take, in bytes (views of stored tensors take none); larger
    # constants are neither computed nor stored: a small parameter can expand into a huge tensor
    max_bytes: int = 64 * 2**20


@dataclass
class _Constants:
    """The result of the sweep: evaluated constants, and constants that cannot be evaluated, with why."""

    values: dict[fx.Node, Any] = field(default_factory=dict)
    # node -> (the node the problem starts at, the problem); the problem spreads to everything computed from it
    blocked: dict[fx.Node, tuple[fx.Node, str]] = field(default_factory=dict)
    mode_switch: fx.Node | None = None

    def __contains__(self, node: fx.Node) -> bool:
        return node in self.values or node in self.blocked


def _requires(gm: fx.GraphModule, options: FoldConstantsOptions) -> str | None:
    return f"max_bytes must be >= 0, got {options.max_bytes}" if options.max_bytes < 0 else None


@register_pass(
    NAME,
    summary="Compute subgraphs that depend only on parameters, buffers and literals once; store the results.",
    guarantees=(
        "Bit-identical: each folded value is the graph's own computation on the same stored tensors, run once at "
        "pass time, then read from a buffer (tensors, with the strides the graph computed) or written as a literal "
        "(int/bool/finite float/torch.Size). Never folds anything that reads a graph input, random ops (rand*, "
        "randn*, bernoulli, dropout...), uninitialised memory (empty*), calls with effects or that fxforge cannot "
        "see into, values or stored tensors an in-place op in the graph (or a module that updates its state, e.g. "
        "BatchNorm in training) may write, through any view or any other stored tensor sharing their memory, "
        "fresh values the graph returns, anything after an autocast/grad-mode switch, or a constant needing more "
        "than max_bytes of new memory (views of stored tensors need none); weights on the meta device are skipped "
        "with a reason. Never stores a tensor whose elements share memory (an expand): it stays in the graph as a "
        "view of its folded input, so writing the stored tensors (load_state_dict) keeps working. Folded values "
        "become buffers, not parameters: a parameter-derived value is frozen for training, and parameters only the "
        "folded values read are deleted. Buffers follow .to()/.half() like any buffer, which is not bit-identical "
        "to recomputing them in the new dtype. Torch and ATen dialects."
    ),
    options=FoldConstantsOptions,
    requires=_requires,
)
def fold_constants(gm: fx.GraphModule, options: FoldConstantsOptions) -> PassResult:
    result = PassResult(NAME, gm)
    aliases = AliasClasses(gm)
    constants = _sweep(gm, aliases, options.max_bytes)
    if constants.mode_switch is not None:
        switch = constants.mode_switch
        result.skip(f"nothing after {switch.name} ({target_name(switch)}) is folded: values may depend on the mode")
    had_users = {node for node in constants.values if node.users}
    stored = {id(tensor): name for name, tensor in reversed(_stored_tensors(gm))}  # first name wins
    kept = _kept_views(gm, constants)
    for node in [n for n in gm.graph.nodes if n in kept]:  # graph order: the report reads the same every run
        result.skip(
            f"{node.name} ({target_name(node)}): kept as a view in the graph, its inputs folded: its elements share "
            "memory (an expand), and a stored tensor like that breaks writes into it (load_state_dict)"
        )
    for root in [node for node in gm.graph.nodes if _is_root(node, constants, kept)]:
        label = f"{root.name} ({target_name(root)})"
        if root in constants.blocked:
            origin, problem = constants.blocked[root]
            result.skip(f"{label}: {problem}" if origin is root else f"{label}: depends on {origin.name}, {problem}")
            continue
        reason = _fold(gm, root, constants.values[root], aliases, stored, result)
        if reason is not None:
            result.skip(f"{label}: {reason}")
    if result.changed:
        erased, dropped = _erase_unused(gm, [n for n in reversed(gm.graph.nodes) if n in had_users])
        if erased:
            result.note(f"removed {erased} node(s) that only computed folded values", removed=erased)
        deleted = prune_attributes(gm, dropped)
        if deleted:
            result.log.append(f"deleted {deleted} stored tensor(s)/submodule(s) nothing reads any more")
    return result


# --------------------------------------------------------------------------------------------------
# the sweep


def _sweep(gm: fx.GraphModule, aliases: AliasClasses, max_bytes: int) -> _Constants:
    constants = _Constants()
    stateful: dict[str, str] = {}  # module path -> why it may update its own tensors
    for node in gm.graph.nodes:
        reason = impure_reason(gm, node) if node.op == "call_module" else None
        if reason is not None:
            stateful[str(node.target)] = reason
    stored_storages = {storage_of(tensor) for _, tensor in _stored_tensors(gm)} - {None}
    interpreter = fx.Interpreter(gm, garbage_collect_values=False)
    for node in gm.graph.nodes:
        if is_mode_switch(node):
            constants.mode_switch = node  # autocast changes what later calls compute: fold nothing after it
            break
        if node.op == "get_attr":
            _sweep_attribute(gm, node, aliases, stateful, constants)
            continue
        if node.op not in _CALLS or not all(source in constants for source in node.all_input_nodes):
            continue
        problem = _problem(gm, node, aliases, constants, max_bytes)
        if problem is not None:
            constants.blocked[node] = problem
            continue
        try:
            with torch.no_grad():
                interpreter.env = {n: constants.values[n] for n in node.all_input_nodes}
                value = interpreter.run_node(node)
        except Exception as exc:
            constants.blocked[node] = (node, f"fails when run at pass time ({first_line(exc)[:200]})")
            continue
        size_problem = _value_problem(value, stored_storages, max_bytes)
        if size_problem is not None:
            constants.blocked[node] = (node, size_problem)
            continue
        constants.values[node] = value
    return constants


def _sweep_attribute(
    gm: fx.GraphModule, node: fx.Node, aliases: AliasClasses, stateful: dict[str, str], constants: _Constants
) -> None:
    target = str(node.target)
    try:
        value = get_attr_value(gm, target)
    except AttributeError:
        return
    if not isinstance(value, torch.Tensor):
        return  # a submodule or an opaque object: not a value to compute with
    owner = next((p for p in _prefixes(target) if p in stateful), None)
    if owner is not None:
        constants.blocked[node] = (node, f"belongs to {owner}, which may update it ({stateful[owner]})")
    elif aliases.written(node):
        constants.blocked[node] = (node, "may be written in place, by an in-place op or a call fxforge cannot see into")
    elif value.device.type == "meta":
        constants.blocked[node] = (node, "is on the meta device (weights not materialised)")
    else:
        constants.values[node] = value


def _problem(
    gm: fx.GraphModule, node: fx.Node, aliases: AliasClasses, constants: _Constants, max_bytes: int
) -> tuple[fx.Node, str] | None:
    """Why a call on constant inputs is not itself an evaluable constant, or None."""
    for source in node.all_input_nodes:
        if source in constants.blocked:
            return constants.blocked[source]
    impure = impure_reason(gm, node)
    if impure is not None:
        return node, impure
    if aliases.written(node):
        return node, "an in-place op in the graph may write into its value"
    facts = tensor_facts(node)
    if facts is not None and facts["shape"] is not None and returns_fresh(gm, node):
        size = math.prod(facts["shape"]) * facts["dtype"].itemsize
        if size > max_bytes:
            return node, f"would need {_mib(size)} of new memory, over max_bytes ({_mib(max_bytes)})"
    return None


def _value_problem(value: Any, stored_storages: set[tuple[str, int]], max_bytes: int) -> str | None:
    if not isinstance(value, torch.Tensor):
        return None
    if value.device.type == "meta":
        return "is on the meta device (no data to store)"
    storage = storage_of(value)
    if storage is not None and storage in stored_storages:
        return None  # a view of a stored tensor: no new memory
    size = _nbytes(value)
    if size > max_bytes:
        return f"needs {_mib(size)} of new memory, over max_bytes ({_mib(max_bytes)})"
    return None


def _kept_views(gm: fx.GraphModule, constants: _Constants) -> set[fx.Node]:
    """Constant calls whose elements share memory (expands) that the rest of the graph reads, directly or
    through another kept one. Stored as a buffer such a value breaks every later write into it -- in the
    graph, by ``load_state_dict`` or by fxforge's own buffer restore after a check run ("more than one
    element of the written-to tensor refers to a single memory location"). Materialising it would cost
    memory and change the strides later ops see; left in the graph it stays a free view of its inputs,
    which fold as roots of their own. Constants computed *from* a kept value still fold."""
    kept: set[fx.Node] = set()
    for node in reversed(gm.graph.nodes):
        value = constants.values.get(node)
        if node.op not in _CALLS or not isinstance(value, torch.Tensor) or not overlaps_itself(value):
            continue
        if any(user not in constants.values or user in kept for user in node.users):
            kept.add(node)
    return kept


def _is_root(node: fx.Node, constants: _Constants, kept: set[fx.Node]) -> bool:
    """A constant call the rest of the graph (or a kept view) reads. A stored tensor read directly is as folded
    as it gets; a blocked node is reported where its problem leaves the constant part, not along the whole chain."""
    if node.op not in _CALLS or node in kept:
        return False
    if node in constants.values:
        return any(user not in constants.values or user in kept for user in node.users)
    return node in constants.blocked and any(user not in constants for user in node.users)


# --------------------------------------------------------------------------------------------------
# replacing one root


def _fold(
    gm: fx.GraphModule,
    root: fx.Node,
    value: Any,
    aliases: AliasClasses,
    stored: dict[int, str],
    result: PassResult,
) -> str | None:
    """Replace ``root`` by a stored tensor or a literal; return why not, or None when done."""
    label = f"{root.name} ({target_name(root)})"
    if isinstance(value, torch.Tensor):
        if aliases.escapes(root) and not aliases.external(root):
            return "the graph returns this fresh value; a stored buffer handed out could be changed by the caller"
        existing = stored.get(id(value))
        target = (
            existing
            if existing is not None
            else store_tensor(gm, f"{root.name}_folded", value.detach(), parameter=False)
        )
        with gm.graph.inserting_before(root):
            read = gm.graph.get_attr(target)
        for key in ("val", "tensor_meta"):
            if key in root.meta:
                read.meta[key] = root.meta[key]
        mark(read, NAME, origin_of=root)
        _redirect(root, read)
        if existing is not None:
            result.note(f"replaced {label} by a read of {target}, the stored tensor it returns", replaced=1)
        else:
            shape = "x".join(str(s) for s in value.shape) or "scalar"
            result.note(
                f"folded {label} into buffer {target} ({shape} {str(value.dtype).removeprefix('torch.')})",
                inserted=1,
                folded=value.numel(),
            )
        return None
    if _is_literal(value):
        _redirect(root, value)
        result.note(f"replaced {label} by the literal {value!r}", replaced=1)
        return None
    return f"its value is a {type(value).__name__}, neither a tensor to store nor a number to write as a literal"


def _is_literal(value: Any) -> bool:
    if type(value) in (bool, int):
        return True
    if type(value) is torch.Size:  # self.weight.shape: sizes do not change when the module is moved or cast
        return all(type(size) is int for size in value)
    return type(value) is float and math.isfinite(value)


def _redirect(root: fx.Node, replacement: Any) -> None:
    """Make every user of ``root`` read ``replacement`` (a node or a literal); users are what this pass changed."""
    for user in list(root.users):
        mark(user, NAME)
        user.args = fx.node.map_arg(user.args, lambda n: replacement if n is root else n)
        user.kwargs = fx.node.map_arg(user.kwargs, lambda n: replacement if n is root else n)


def _erase_unused(gm: fx.GraphModule, candidates: Iterable[fx.Node]) -> tuple[int, set[str]]:
    """Erase the candidates (pure constant nodes, users first) that nothing reads any more."""
    erased = 0
    dropped: set[str] = set()
    for node in candidates:
        if node.users:
            continue
        if node.op == "get_attr":
            dropped.add(str(node.target))
        gm.graph.erase_node(node)
        erased += 1
    return erased, dropped


# --------------------------------------------------------------------------------------------------
# stored tensors and sizes


def _stored_tensors(gm: fx.GraphModule) -> list[tuple[str, torch.Tensor]]:
    """(attribute path, tensor) for parameters, buffers and plain tensor attributes read by get_attr."""
    stored = list(chain(gm.named_parameters(remove_duplicate=False), gm.named_buffers(remove_duplicate=False)))
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            try:
                value = get_attr_value(gm, str(node.target))
            except AttributeError:
                continue
            if isinstance(value, torch.Tensor):
                stored.append((str(node.target), value))
    return stored


def _nbytes(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().nbytes()
    except Exception:
        return tensor.numel() * tensor.element_size()


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def _prefixes(path: str) -> list[str]:
    parts = path.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]
