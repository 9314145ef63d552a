"""Fallback units: the pieces of a graph that FX graph-mode quantization quantizes, each of which can be kept
in float on its own.

A conv/linear layer is not the only thing static int8 quantizes: functional ops (ResNet's ``out +=
identity``, ``torch.cat``, ``torch.relu``, ``x.mean()``...), pooling and the points where activations are
quantized are int8 too, so keeping every *layer* in float still leaves a quantized model (resnet18: 2.7%
relative error). A unit here is one quantized op of the graph ``prepare_fx`` builds -- a layer with the
BatchNorm/ReLU fused into it, an op and the ops fused with it (add + relu), a pooling layer -- and
"every unit in float" is the float model.

How units are found: ``prepare_fx`` is run once with the full qconfig mapping (a probe, nothing is
calibrated). Every op that ``prepare_fx`` made int8 (its output observer observes an int8 dtype; an op with
a qconfig but no int8 pattern in the backend, such as ``torch.relu`` after a Linear on x86, stays float and
is no unit) and whose output is observed ends a unit; the int8 ops feeding only it, which ``prepare_fx``
fused into the same pattern (``add`` before ``relu``), belong to it too. An op whose output shares its
input's observer (max pooling, average pooling: int8 in, int8 out, same scale) joins the unit that makes
its input: it computes in whatever its input is computed in, so quantized alone it would not be quantized
at all.

How a unit is kept in float: by ``QConfigMapping`` entries with qconfig ``None`` that address exactly its
nodes, the way ``torch/ao/quantization/fx/qconfig_mapping_utils.py`` looks qconfigs up:

* a called module: ``set_module_name(path, None)``. ``convert_fx`` swaps the module object itself, so a
  module called more than once (a shared activation) is float or int8 as a whole: its calls form one unit;
* a function call: ``set_module_name_object_type_order(module_path, function, index, None)``, counting
  calls of that function per module path (``prepare_fx`` re-traces the flat GraphModule fxforge captured,
  so the module path of a function call is ``""`` and the index is its position among the calls of that
  function in the graph). Indices are counted on the graph ``prepare_fx`` matched (after fusion), read back
  from the probe, so they are the ones torch computes;
* a method call: torch looks method qconfigs up by name only (no index), so ``set_object_type("flatten",
  None)`` keeps *every* ``.flatten()`` in float: all calls of one method form one unit.

A unit kept in float between int8 neighbours must also stay float through ``convert_fx``: its lowering step
rewrites every ``dequantize -> op -> quantize`` of an op it has an int8 kernel for (sigmoid, tanh, softmax,
hardswish, layer norm, pooling, ``cat``...) into the int8 op, whatever the op's qconfig -- timm's SE gate
``nn.Sigmoid`` "kept in float" ran on int8 all the same. :func:`stay_float` puts a ``.float()`` (a no-op on the
fp32 tensors int8 models work in) between the ``dequantize`` and such an op, which that pattern does not match.

Unit names: a layer's module path, a function call's graph node (``add_3``), a method's name; made unique
with ``#2`` where two would clash. BatchNorm folded into a conv by ``prepare_fx`` stays folded when the conv
is kept in float, so "every unit in float" matches the float model up to fp32 rounding (not bit for bit).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

ORDER = "order"  # set_module_name_object_type_order(path, object type, index)
MODULE = "module"  # set_module_name(path)
METHOD = "method"  # set_object_type(method name)
_INT_DTYPES = (torch.quint8, torch.qint8, torch.uint8, torch.int8)


@dataclass
class Unit:
    """One piece of the graph quantized as a whole; ``keys`` are the QConfigMapping entries that address it."""

    name: str  # the module path of a layer, the graph node of an op, the method's name for method calls
    kind: str  # how it is called in the graph: "module" (a layer), "function" or "method" (every call of one method)
    type: str  # the float module's type, the function's name or the method's name
    nodes: list[str] = field(default_factory=list)  # the prepared graph's nodes it covers
    keys: list[tuple[Any, ...]] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "type": self.type, "nodes": list(self.nodes)}


def keep_in_float(mapping: Any, units: Iterable[Unit]) -> Any:
    """``mapping`` with every node of ``units`` kept in float (qconfig ``None``); returns ``mapping``."""
    for unit in units:
        for key in unit.keys:
            if key[0] == MODULE:
                mapping.set_module_name(key[1], None)
            elif key[0] == METHOD:
                mapping.set_object_type(key[1], None)
            else:
                mapping.set_module_name_object_type_order(key[1], key[2], key[3], None)
    return mapping


def stay_float(prepared: fx.GraphModule, units: Iterable[Unit]) -> fx.GraphModule:
    """``prepared`` (from ``prepare_fx`` with ``units`` in float) with each of their ops' first input read through
    a ``.float()``, so that ``convert_fx`` cannot lower the op to int8 (see the module's docstring); returns it."""
    kept = {name for unit in units for name in unit.nodes}
    modules = dict(prepared.named_modules(remove_duplicate=False))
    qconfigs = prepared.meta["_observed_graph_module_attrs"].node_name_to_qconfig
    changed = False
    for node in list(prepared.graph.nodes):
        if node.name not in kept or node.op not in ("call_module", "call_function", "call_method") or not node.args:
            continue
        first = node.args[0]
        sources = [first] if isinstance(first, fx.Node) else list(first) if isinstance(first, (list, tuple)) else []
        # only an observed input becomes int8 (and so a ``dequantize`` the lowering matches); others are no tensors
        # or float already
        for source in dict.fromkeys(s for s in sources if isinstance(s, fx.Node) and _is_observer(s, modules)):
            with prepared.graph.inserting_before(node):
                barrier = prepared.graph.call_method("float", (source,))
            qconfigs[barrier.name] = None  # convert_fx looks every node's qconfig up by name
            node.args = (_replaced(first, source, barrier), *node.args[1:])
            changed = True
    if changed:
        prepared.recompile()
    return prepared


def _replaced(arg: Any, old: fx.Node, new: fx.Node) -> Any:
    if arg is old:
        return new
    return type(arg)(new if item is old else item for item in arg)


def find_units(prepared: fx.GraphModule, source: nn.Module) -> list[Unit]:
    """The units of ``prepared``, the result of ``prepare_fx`` with the full qconfig mapping, in graph order.

    ``source`` is the float module ``prepared`` was made from: a layer's ``type`` is its float module's
    type (``Conv2d``, not the fused ``ConvReLU2d``).
    """
    attrs = prepared.meta["_observed_graph_module_attrs"]
    qconfigs: dict[str, Any] = attrs.node_name_to_qconfig
    modules = dict(prepared.named_modules(remove_duplicate=False))  # shared observers have two names
    nodes = [n for n in prepared.graph.nodes if not _is_observer(n, modules)]
    keys = _mapping_keys(nodes, attrs.node_name_to_scope)
    # the observer (one module instance, possibly under several names) that quantizes each observed output
    observer_nodes = {n for n in prepared.graph.nodes if _is_observer(n, modules) and n.args}
    observer = {n.args[0]: modules[str(n.target)] for n in observer_nodes}

    units: list[Unit] = []
    unit_of: dict[fx.Node, Unit] = {}
    for node in nodes:
        if node in unit_of or not _quantized_op(node, qconfigs) or node not in observer:
            continue
        members = _pattern(node, set(observer), qconfigs, set(unit_of))
        unit = _unit(members, keys, source, modules)
        owner = _followed(node, observer, observer_nodes, unit_of)
        if owner is not None and unit.kind != "method" and owner.kind != "method":
            owner.nodes += unit.nodes
            owner.keys += unit.keys
            unit = owner
        else:
            units.append(unit)
        unit_of.update(dict.fromkeys(members, unit))
    return _merge_shared(units)


def _followed(
    node: fx.Node, observer: dict[fx.Node, nn.Module], observers: set[fx.Node], unit_of: dict[fx.Node, Unit]
) -> Unit | None:
    """The unit ``node`` follows: an op whose output shares its input's observer (max pooling, ReLU, identity...)
    computes in whatever its input is computed in, so it goes with the unit that makes its input. (Method calls
    are not merged: a method's unit holds every call of that method, which would tie unrelated units together.)"""
    first = node.args[0] if node.args else None
    if not isinstance(first, fx.Node):
        return None
    # in the prepared graph an observed input is read through its observer: look through it
    made = first.args[0] if first.op == "call_module" and first.args and first in observers else first
    if isinstance(made, fx.Node) and made in unit_of and observer.get(made) is observer[node]:
        return unit_of[made]
    return None


def _is_observer(node: fx.Node, modules: dict[str, nn.Module]) -> bool:
    from torch.ao.quantization.observer import _is_activation_post_process

    return node.op == "call_module" and _is_activation_post_process(modules.get(str(node.target)))


def _quantized_op(node: fx.Node, qconfigs: dict[str, Any]) -> bool:
    """Whether ``prepare_fx`` made ``node`` an int8 op: a qconfig alone is not enough (an op the backend has no
    int8 pattern for, such as ``torch.relu`` after a Linear on x86, stays float with a float32 placeholder
    observer, and the observer after it is its user's input observer)."""
    if node.op not in ("call_module", "call_function", "call_method") or qconfigs.get(node.name) is None:
        return False
    make = (node.meta.get("target_dtype_info") or {}).get("output_act_obs_or_fq_ctr")
    return make is not None and getattr(make(), "dtype", torch.float32) in _INT_DTYPES


def _mapping_keys(nodes: Sequence[fx.Node], scopes: dict[str, tuple[str, type]]) -> dict[fx.Node, tuple[Any, ...]]:
    """The QConfigMapping key of each call. A module is switched by its name, all its calls at once: convert
    swaps the module object itself, so a module called twice is float or int8 as a whole. A function call is
    switched by its position among the calls of that function in its module, counted as
    ``_generate_node_name_to_qconfig`` counts them; a method by its name."""
    seen: dict[tuple[str, Any], int] = {}
    keys: dict[fx.Node, tuple[Any, ...]] = {}
    for node in nodes:
        if node.op == "call_method":
            keys[node] = (METHOD, str(node.target))
        elif node.op == "call_module":
            keys[node] = (MODULE, str(node.target))
        elif node.op == "call_function":
            path = scopes.get(node.name, ("", None))[0]
            index = seen.get((path, node.target), 0)
            seen[(path, node.target)] = index + 1
            keys[node] = (ORDER, path, node.target, index)
    return keys


def _pattern(end: fx.Node, observed: set[fx.Node], qconfigs: dict[str, Any], taken: set[fx.Node]) -> list[fx.Node]:
    """``end`` and the quantized ops that feed only the unit, unobserved (fused with it: add before relu)."""
    members = [end]
    frontier = [end]
    while frontier:
        node = frontier.pop()
        for arg in node.all_input_nodes:
            if arg in members or arg in taken or arg in observed or not _quantized_op(arg, qconfigs):
                continue
            if all(user in members for user in arg.users):
                members.append(arg)
                frontier.append(arg)
    return sorted(members, key=_position(end.graph))


def _position(graph: fx.Graph):
    order = {node: i for i, node in enumerate(graph.nodes)}
    return lambda node: order[node]


def _unit(members: list[fx.Node], keys: dict[fx.Node, tuple[Any, ...]], source: nn.Module, modules: dict) -> Unit:
    first = members[0]
    if first.op == "call_module":
        name, kind = str(first.target), "module"
        try:
            type_name = type(source.get_submodule(name)).__name__
        except AttributeError:
            type_name = type(modules[name]).__name__
    elif first.op == "call_method":
        name, kind, type_name = str(first.target), "method", str(first.target)
    else:
        name, kind = first.name, "function"
        type_name = getattr(first.target, "__name__", str(first.target))
    return Unit(name, kind, type_name, [n.name for n in members], [keys[n] for n in members if n in keys])


def _merge_shared(units: list[Unit]) -> list[Unit]:
    """Merge the units that share a key -- the calls of one method (torch keeps every call of a method in float,
    or none), the calls of one module object -- into the first of them; names are made unique."""
    merged: list[Unit] = []
    owner_of: dict[tuple[Any, ...], Unit] = {}
    for unit in units:
        owner = next((owner_of[key] for key in unit.keys if key in owner_of), None)
        if owner is None:
            merged.append(unit)
            owner = unit
        else:
            owner.nodes += unit.nodes
            owner.keys += [key for key in unit.keys if key not in owner.keys]
        for key in unit.keys:
            owner_of[key] = owner
    names: set[str] = set()
    for unit in merged:
        base, n = unit.name, 1
        while unit.name in names:  # a method and a module, or a node, of the same name
            n += 1
            unit.name = f"{base}#{n}"
        names.add(unit.name)
    return merged
