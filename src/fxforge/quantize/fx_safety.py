"""Rewrites that keep FX graph-mode quantization from changing what a model computes, before it runs.

Two things ``prepare_fx`` / ``convert_fx`` (torch 2.14.1) do behind the user's back, both found by QA on user
models that ran through ``quantize`` with exit 0 and a model that computed something else:

* **in-place writes with an unused result are deleted.** Their dead-code elimination goes by users alone, so
  ``y.add_(1.0)`` followed by ``y * 2`` lost the ``add_`` (80% relative error, "quantized (0): none" in dynamic
  mode). :func:`in_place_results_used` makes every later reader of the written tensor read the in-place op's
  result instead -- the same tensor object, as an in-place method returns its input -- so the op has users and
  stays. An in-place write nothing reads afterwards (a buffer counter) cannot be kept so, and is refused by name.
* **fusion swaps a module object.** A conv followed by a batch norm is fused by putting a conv-with-bn module at
  the conv's path; a conv called from a second place then runs the batch norm there too (77% error).
  :func:`calls_unshared` gives every call of a layer after the first its own copy (the same weights), so each
  call is fused, quantized or kept in float on its own. Not for QAT, where the copies would train apart.
"""

from __future__ import annotations

import copy
import operator

from torch import fx, nn

from fxforge.effects import INPLACE_OPERATORS, bound_inplace, written_args
from fxforge.errors import FxforgeError, format_location, option, recorded_user_frame, said
from fxforge.graphs import WEIGHTED_LAYER_TYPES, submodule


def _returns_what_it_writes(gm: fx.GraphModule, node: fx.Node) -> bool:
    """An in-place call whose result is the tensor it writes: ``x.add_(1)``, ``x += y``, ``torch.relu_(x)``,
    ``F.relu(x, inplace=True)``, ``nn.ReLU(inplace=True)`` (a call fxforge cannot see into, which may write its
    inputs, is not one)."""
    first = node.args[0] if node.args else None
    if not isinstance(first, fx.Node) or "out" in node.kwargs:
        return False
    if node.op == "call_module":
        module = submodule(gm, node)
        return type(module).__module__.startswith("torch.nn.modules") and getattr(module, "inplace", False) is True
    if node.op not in ("call_method", "call_function"):
        return False
    name = str(node.target) if node.op == "call_method" else getattr(node.target, "__name__", "")
    # x[i] = v (operator.setitem) writes x too, but returns None: it has no result to read x through
    says_so = (name.endswith("_") and not name.endswith("__")) or (
        node.target in INPLACE_OPERATORS and node.target is not operator.setitem
    )
    if node.op == "call_function" and not says_so:
        says_so = bound_inplace(node)
    return says_so and first in written_args(gm, node)


_VIEW_METHODS = {
    "view", "view_as", "reshape", "narrow", "select", "transpose", "permute", "flatten", "squeeze", "unsqueeze",
    "expand", "expand_as", "t", "detach", "contiguous", "split", "chunk", "unbind", "unflatten", "movedim",
}  # fmt: skip


def _viewed(node: fx.Node) -> fx.Node | None:
    """The tensor ``node`` is a view of (``y`` for ``y[:, :2]``, ``y.view(-1)``, a piece of ``y.split(4)``), else
    None."""
    getitem = node.op == "call_function" and node.target is operator.getitem
    source = node.args[0] if getitem or (node.op == "call_method" and node.target in _VIEW_METHODS) else None
    if not isinstance(source, fx.Node):
        return None
    pieces = source.op == "call_method" and source.target in ("split", "chunk", "unbind")
    if pieces and isinstance(source.args[0], fx.Node):
        return source.args[0]  # the tuple of pieces: the tensor they are views of
    if getitem and isinstance(node.args[1], int):
        return None  # out, h = self.lstm(x): an item of a tuple, not a view (a tensor's row would be one: not told)
    return source


def in_place_results_used(gm: fx.GraphModule, quantizes_activations: bool = True) -> tuple[fx.GraphModule, int]:
    """``gm`` (a copy, where anything changes) with every reader of a tensor written in place, after the write,
    pointed at the in-place op's result (the same object), and how many in-place ops were rewired. Raises where
    the write cannot be kept: nothing reads the result or the written tensor afterwards (FX quantization deletes
    such an op), or, where activations are quantized, the write goes through a view whose base is read afterwards
    (int8 would write a float copy)."""
    found = [node.name for node in gm.graph.nodes if _returns_what_it_writes(gm, node)]
    if not found:
        return gm, 0
    gm = copy.deepcopy(gm)
    nodes = {node.name: node for node in gm.graph.nodes}
    order = {node: index for index, node in enumerate(gm.graph.nodes)}
    rewired = 0
    for name in found:
        node = nodes[name]
        written = node.args[0]
        later = [user for user in written.users if user is not node and order[user] > order[node]]
        base = _viewed(written)
        base_read_later = base is not None and any(
            order[user] > order[node] and user is not written for user in base.users
        )
        stored = next((n for n in (written, base) if n is not None and n.op == "get_attr"), None)
        if stored is not None:
            # QA: `self.step.add_(1)` read after it came out of quantize as a step frozen at 1, with no word:
            # prepare_fx traces the graph again with buffers as plain tensors, and the write runs at that trace
            _refuse(node, f"it writes {stored.target}, a tensor the model keeps, and FX quantization traces the graph "
                    "again with such tensors as plain values: the write would run once, while quantizing, and never "
                    "in the int8 model", stored=True)  # fmt: skip
        if not node.users and not later:
            read = f", only {base.name}, which it is a view of" if base_read_later else ""
            _refuse(node, f"nothing reads its result or {written.name} after it{read}, and FX quantization deletes "
                    "an in-place op whose result is unused")  # fmt: skip
        if base_read_later and quantizes_activations:
            _refuse(node, f"it writes through {written.name}, a view of {base.name}, which is read after it: in "
                    "int8 the write would land on a float copy of the int8 tensor")  # fmt: skip
        if later:
            for user in later:
                user.replace_input_with(written, node)
            rewired += 1
    gm.recompile()
    return gm, rewired


def _refuse(node: fx.Node, why: str, stored: bool = False) -> None:
    where = recorded_user_frame(node.meta.get("stack_trace") or "")
    at = f" ({format_location(*where)})" if where else ""
    raise FxforgeError(
        f"quantize cannot keep the in-place write {node.name}{at}: {why}",
        hint=(
            f"keep the submodule that writes it whole and in float ({said('--leaf NAME', 'leaf_modules=[NAME]')}"
            f"), or quantize in dynamic mode a capture by torch.export ({option('--method', 'export')}), which swaps "
            "the layers in the model itself"
            if stored
            else "write it out of place and use its result (y = y + 1 rather than y.add_(1); for a piece of a "
            "tensor, compute the piece and torch.cat it back)"
        ),
    )


def calls_unshared(gm: fx.GraphModule) -> tuple[fx.GraphModule, list[str]]:
    """``gm`` (a copy, where anything changes) with every call of a weighted layer (conv, linear, batch norm...)
    after its first given its own copy of the layer, at ``<path>_call<k>``, and those paths."""
    calls: dict[str, list[str]] = {}
    for node in gm.graph.nodes:
        module = submodule(gm, node)
        if isinstance(module, (*WEIGHTED_LAYER_TYPES, nn.modules.batchnorm._BatchNorm)):
            calls.setdefault(str(node.target), []).append(node.name)
    shared = {path: names for path, names in calls.items() if len(names) > 1}
    if not shared:
        return gm, []
    gm = copy.deepcopy(gm)
    nodes = {node.name: node for node in gm.graph.nodes}
    made: list[str] = []
    for path, names in shared.items():
        for k, name in enumerate(names[1:], start=2):
            copy_path = f"{path}_call{k}"
            while _exists(gm, copy_path):
                copy_path += "_"
            gm.add_submodule(copy_path, copy.deepcopy(gm.get_submodule(path)))
            nodes[name].target = copy_path
            made.append(copy_path)
    gm.recompile()
    return gm, made


def shared_layers_fusion_would_change(gm: fx.GraphModule) -> list[str]:
    """The weighted layers called from more than one place where one call is followed by what FX fusion joins to
    it (a batch norm or a ReLU): fused, the layer would run that at every call. What QAT, which must keep shared
    weights shared, cannot prepare."""
    calls: dict[str, list[fx.Node]] = {}
    for node in gm.graph.nodes:
        if isinstance(submodule(gm, node), (*WEIGHTED_LAYER_TYPES, nn.modules.batchnorm._BatchNorm)):
            calls.setdefault(str(node.target), []).append(node)
    fused = [path for path, nodes in calls.items() if len(nodes) > 1 and any(_fused_after(gm, n) for n in nodes)]
    return fused


def _fused_after(gm: fx.GraphModule, node: fx.Node) -> bool:
    return len(node.users) == 1 and _fusion_partner(gm, next(iter(node.users)))


def _fusion_partner(gm: fx.GraphModule, node: fx.Node) -> bool:
    if node.op == "call_module":
        return isinstance(submodule(gm, node), (nn.modules.batchnorm._BatchNorm, nn.ReLU))
    if node.op == "call_method":
        return node.target == "relu"
    return node.op == "call_function" and getattr(node.target, "__name__", "") == "relu"


def _exists(gm: fx.GraphModule, path: str) -> bool:
    try:
        gm.get_submodule(path)
    except AttributeError:
        return False
    return True
