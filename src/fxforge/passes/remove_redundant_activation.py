"""remove_redundant_activation: remove clamp-like activations that provably return their input's value.

A clamp-like activation -- ``relu``, ``relu6``, ``hardtanh(lo, hi)``, ``clamp(lo, hi)``/``clip`` with literal
bounds, in any form (module, function, method, in-place, ATen) -- returns every value inside ``[lo, hi]`` as it
is (bit for bit: ``-0.0`` stays ``-0.0``, checked on torch's kernels) and NaN as NaN. Two patterns make one
redundant:

* **outer**: ``clamp(lo, hi)`` applied to the output of an activation whose values always lie in ``[lo, hi]``:
  relu of relu, relu of relu6/sigmoid/softmax/hardsigmoid, relu6 of sigmoid, ``hardtanh(-1, 1)`` of tanh... The
  clamp returns its input's value; its users read the input instead.
* **inner**: ``clamp2(clamp1(x))`` with ``[lo2, hi2]`` inside ``[lo1, hi1]`` (relu6 of relu) equals ``clamp2(x)``;
  ``clamp1`` goes when ``clamp2`` is its only user (another user still needs its value).

Exactness beyond the values (the same proofs as :mod:`~fxforge.passes.remove_identity`, through
:class:`~fxforge.effects.AliasClasses`):

* an in-place outer activation (``relu_``, ``inplace=True``) returns its input tensor itself and writes nothing
  that changes: removing it changes nothing else;
* an out-of-place outer activation returns a copy: it stays when an in-place op writes its input after it or
  writes the copy, when the caller would get one tensor twice or an input back, or when the input is a view
  that may be laid out unlike a fresh copy (then strides must be recorded and equal);
* an in-place inner activation writes its input: it goes only when nothing else reads that storage after it
  (the graph's output included) and it is no graph input or stored tensor; an in-place outer one whose inner
  goes would write the inner's input instead: the same conditions;
* ``clamp`` with a float bound promotes integer tensors: a clamp goes (or is the inner of a removal) only when
  recorded metadata shows it keeps its input's dtype. relu, relu6 and hardtanh never change the dtype.

Lint rule FX003 reports exactly what this pass removes: both use :func:`plan_removals`, which repeats its scan
until nothing more can go (a removed in-place relu no longer writes the value before it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from fxforge.effects import AliasClasses, copy_layout_problem, returns_fresh, tensor_facts, written_args
from fxforge.graphs import aten_packet, node_arg, node_kind, runs_hooks, submodule, target_name
from fxforge.passes import PassResult, mark, register_pass

NAME = "remove_redundant_activation"
_INF = math.inf

# clamp in its torch-level forms (functions of the same names too) and ATen ops: name -> which bounds it takes
_CLAMP_METHODS = {
    "clamp": "clamp",
    "clip": "clamp",
    "clamp_": "clamp",
    "clip_": "clamp",
    "clamp_min": "clamp_min",
    "clamp_min_": "clamp_min",
    "clamp_max": "clamp_max",
    "clamp_max_": "clamp_max",
}
_CLAMP_ATEN = _CLAMP_METHODS  # the ATen packets carry the same names
_CLAMP_FUNCTIONS = {getattr(torch, name): form for name, form in _CLAMP_METHODS.items() if hasattr(torch, name)}
_HARDTANH_FUNCTIONS = (F.hardtanh, F.hardtanh_)
# activations with a bounded range that are not clamps (their output is not their input anywhere)
_BOUNDED_MODULES: dict[type, tuple[str, float, float]] = {
    nn.Tanh: ("tanh", -1.0, 1.0),
    nn.Hardsigmoid: ("hardsigmoid", 0.0, 1.0),
}
_BOUNDED_FUNCTIONS: dict[Any, tuple[str, float, float]] = {
    torch.tanh: ("tanh", -1.0, 1.0),
    F.tanh: ("tanh", -1.0, 1.0),
    F.hardsigmoid: ("hardsigmoid", 0.0, 1.0),
}
_BOUNDED_NAMES: dict[str, tuple[str, float, float]] = {
    "tanh": ("tanh", -1.0, 1.0),
    "tanh_": ("tanh", -1.0, 1.0),
    "hardsigmoid": ("hardsigmoid", 0.0, 1.0),
    "hardsigmoid_": ("hardsigmoid", 0.0, 1.0),
}


@dataclass(frozen=True)
class Clamp:
    """What a clamp-like node computes: ``clamp(x, low, high)``; ``form`` is how it is named in messages and
    ``promotes`` says whether a float bound could turn an integer input into a float output (torch.clamp)."""

    low: float
    high: float
    form: str
    promotes: bool = False

    def label(self) -> str:
        if self.form in ("relu", "relu6"):
            return self.form
        return f"{self.form}({self.low:g}, {self.high:g})"


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _bounds(low: Any, high: Any, form: str, promotes: bool = False) -> Clamp | None:
    """A :class:`Clamp` for literal bounds (None: no bound on that side); None when a bound is computed in the
    graph or the range is empty (torch.clamp with min > max returns max everywhere: no clamp of the input)."""
    if any(bound is not None and not _is_number(bound) for bound in (low, high)):
        return None
    lo = -_INF if low is None else float(low)
    hi = _INF if high is None else float(high)
    if lo > hi or (low is None and high is None):
        return None
    return Clamp(lo, hi, form, promotes and (isinstance(low, float) or isinstance(high, float)))


def clamp_of(gm: nn.Module, node: fx.Node) -> Clamp | None:
    """The clamp ``node`` computes when it is relu, relu6, hardtanh or clamp/clip with literal bounds, in any form."""
    if node.op not in ("call_module", "call_function", "call_method"):
        return None
    kind = node_kind(gm, node)
    if kind == "relu":
        return Clamp(0.0, _INF, "relu")
    packet = aten_packet(node)
    if packet is not None:
        if packet in ("hardtanh", "hardtanh_"):  # aten.hardtanh(x, min_val=-1, max_val=1); relu6 becomes it
            low, high = node_arg(node, 1, "min_val", -1.0), node_arg(node, 2, "max_val", 1.0)
            return _bounds(low, high, "relu6" if (low, high) == (0.0, 6.0) else "hardtanh")
        if packet in ("relu6", "relu6_"):
            return Clamp(0.0, 6.0, "relu6")
        if packet in _CLAMP_ATEN and node.target._overloadname == "default":
            return _clamp_call(node, _CLAMP_ATEN[packet])
        return None
    if node.op == "call_module":
        module = submodule(gm, node)
        if runs_hooks(module):
            return None
        if type(module) is nn.ReLU6:
            return Clamp(0.0, 6.0, "relu6")
        if type(module) is nn.Hardtanh:
            return _bounds(module.min_val, module.max_val, "hardtanh")
        return None
    if node.op == "call_function":
        target = node.target
        if any(target is f for f in _HARDTANH_FUNCTIONS):
            return _bounds(node_arg(node, 1, "min_val", -1.0), node_arg(node, 2, "max_val", 1.0), "hardtanh")
        if kind == "relu6":  # F.relu6
            return Clamp(0.0, 6.0, "relu6")
        form = next((name for f, name in _CLAMP_FUNCTIONS.items() if target is f), None)
        return _clamp_call(node, form) if form is not None else None
    if node.op == "call_method" and str(node.target) in _CLAMP_METHODS:
        return _clamp_call(node, _CLAMP_METHODS[str(node.target)])
    return None


def _clamp_call(node: fx.Node, form: str) -> Clamp | None:
    if form == "clamp_min":
        return _bounds(node_arg(node, 1, "min"), None, "clamp", promotes=True)
    if form == "clamp_max":
        return _bounds(None, node_arg(node, 1, "max"), "clamp", promotes=True)
    return _bounds(node_arg(node, 1, "min"), node_arg(node, 2, "max"), "clamp", promotes=True)


def output_range(gm: nn.Module, node: fx.Node) -> tuple[float, float] | None:
    """Bounds every output value of ``node`` lies in (NaN aside), when it is an activation with a bounded range:
    a clamp, sigmoid, softmax, tanh or hardsigmoid."""
    clamp = clamp_of(gm, node)
    if clamp is not None:
        return clamp.low, clamp.high
    bounded = _bounded(gm, node)
    return (bounded[1], bounded[2]) if bounded is not None else None


def _bounded(gm: nn.Module, node: fx.Node) -> tuple[str, float, float] | None:
    kind = node_kind(gm, node)
    if kind in ("sigmoid", "softmax"):
        return kind, 0.0, 1.0
    if node.op == "call_module":
        module = submodule(gm, node)
        return None if runs_hooks(module) else _BOUNDED_MODULES.get(type(module))
    if node.op == "call_method":
        return _BOUNDED_NAMES.get(str(node.target))
    if node.op == "call_function":
        packet = aten_packet(node)
        if packet is not None:
            return _BOUNDED_NAMES.get(packet)
        return next((v for f, v in _BOUNDED_FUNCTIONS.items() if node.target is f), None)
    return None


def describe(gm: nn.Module, node: fx.Node) -> str:
    """``relu_1 (relu)``, ``hardtanh (hardtanh(-1, 1))``, ``sigmoid (sigmoid)``: a node and what it computes."""
    clamp = clamp_of(gm, node)
    if clamp is not None:
        return f"{node.name} ({clamp.label()})"
    bounded = _bounded(gm, node)
    return f"{node.name} ({bounded[0] if bounded else node_kind(gm, node) or target_name(node)})"


@dataclass
class Removal:
    """An activation the pass removes: ``node``'s users read ``source`` instead. ``what`` names it and ``why`` says
    why it is redundant; ``rewired`` is the outer activation that now reads ``source`` (inner removals) or None."""

    node: fx.Node
    source: fx.Node
    what: str
    why: str
    rewired: fx.Node | None = None

    @property
    def message(self) -> str:
        """What lint rule FX003 reports."""
        return f"{self.what} is redundant: {self.why}"


class _Planner:
    """Decides the removals on the unchanged graph, remembering each as "``node`` is ``source``" (for the inputs
    and users of later candidates, and for the alias classes) instead of applying it."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.position = {node: i for i, node in enumerate(gm.graph.nodes)}
        self.stands_for: dict[fx.Node, fx.Node] = {}
        self.removed: set[fx.Node] = set()
        self._users: dict[fx.Node, set[fx.Node]] = {}
        self._aliases: AliasClasses | None = None
        self.removals: list[Removal] = []
        self.skipped: list[str] = []

    @property
    def aliases(self) -> AliasClasses:
        if self._aliases is None:  # built on first need: most graphs have no candidate at all
            self._aliases = AliasClasses(self.gm)
        return self._aliases

    def resolve(self, value: Any) -> Any:
        while isinstance(value, fx.Node) and value in self.stands_for:
            value = self.stands_for[value]
        return value

    def users(self, node: fx.Node) -> set[fx.Node]:
        if node not in self._users:
            self._users[node] = set(node.users)
        return self._users[node]

    def inplace(self, node: fx.Node) -> bool:
        return bool(written_args(self.gm, node))

    def readers(self, value: fx.Node, after: fx.Node, before: fx.Node | None, exclude: set[fx.Node]) -> fx.Node | None:
        """A node (not removed, not in ``exclude``) placed strictly between ``after`` and ``before`` (None: the
        end) that reads the storage ``value`` may share."""
        low = self.position[after]
        high = self.position[before] if before is not None else len(self.position)
        for member in self.position:
            if member in self.removed or not self.aliases.same(member, value):
                continue
            for user in self.users(member):
                if user not in self.removed and user not in exclude and low < self.position.get(user, -1) < high:
                    return user
        return None

    def dtype_problem(self, node: fx.Node, clamp: Clamp, source: fx.Node) -> str | None:
        if not clamp.promotes:
            return None
        own, theirs = tensor_facts(node, self.gm), tensor_facts(source, self.gm)
        if own is None or theirs is None:
            return "a float bound may promote an integer input and the dtypes are not recorded (no shape metadata)"
        if own["dtype"] != theirs["dtype"]:
            return f"it converts {theirs['dtype']} to {own['dtype']}"
        return None

    def remove(self, node: fx.Node, source: fx.Node, what: str, why: str, rewired: fx.Node | None = None) -> None:
        self.stands_for[node] = source
        self.removed.add(node)
        moved = self.users(node) if rewired is None else {rewired}
        self.users(source).discard(node)
        self.users(source).update(moved)
        self.aliases.merge(node, source)
        self.removals.append(Removal(node, source, what, why, rewired))

    # ----------------------------------------------------------------------------------------------

    def visit(self, node: fx.Node) -> None:
        outer = clamp_of(self.gm, node)
        if outer is None or not node.args or not isinstance(node.args[0], fx.Node):
            return
        inner = self.resolve(node.args[0])
        inner_range = output_range(self.gm, inner)
        if inner_range is None:
            return
        if outer.low <= inner_range[0] and inner_range[1] <= outer.high:
            self._outer(node, outer, inner, inner_range)
            return
        inner_clamp = clamp_of(self.gm, inner)
        if inner_clamp is not None and inner_range[0] <= outer.low and outer.high <= inner_range[1]:
            self._inner(node, outer, inner, inner_clamp)

    def _outer(self, node: fx.Node, outer: Clamp, inner: fx.Node, inner_range: tuple[float, float]) -> None:
        what = describe(self.gm, node)
        why = f"its input from {describe(self.gm, inner)} already lies in [{inner_range[0]:g}, {inner_range[1]:g}]"
        reason = self.dtype_problem(node, outer, inner)
        if reason is None and self.aliases.written_between(inner, inner, node):
            # the range is the one inner computed, not what the storage holds once written
            reason = "an in-place op (or a call fxforge cannot see into) may write its input before it reads it"
        if reason is None and not self.inplace(node):  # in place, it returns its input tensor itself
            reason = self._copy_problem(node, inner)
        if reason is not None:
            self.skipped.append(f"{what}: {reason}")
            return
        self.remove(node, inner, what, why)

    def _copy_problem(self, node: fx.Node, source: fx.Node) -> str | None:
        """Why the fresh tensor ``node`` returns cannot be replaced by ``source`` itself (see remove_identity)."""
        aliases = self.aliases
        if aliases.written_between(source, node, None):
            return "an in-place op writes its input after it, which its users would then see"
        if aliases.written(node):
            return "an in-place op writes its result, which would then write its input"
        if aliases.escapes(node) and (aliases.external(source) or aliases.escapes(source)):
            return "the graph returns it, and its input is a graph input, a parameter or another output"
        if not returns_fresh(self.gm, source):
            # a fresh elementwise result has its input's strides when that input is dense; a view may not be
            layout = copy_layout_problem(node, source, self.gm)
            if layout is not None:
                return f"its input is a view and {layout}"
        return None

    def _inner(self, node: fx.Node, outer: Clamp, inner: fx.Node, inner_clamp: Clamp) -> None:
        what = describe(self.gm, inner)
        narrower = f"[{outer.low:g}, {outer.high:g}]"
        why = f"its only user {describe(self.gm, node)} clamps to a narrower range {narrower} anyway"
        if self.users(inner) != {node}:
            return  # other users need the inner value: not redundant, nothing to report
        source = self.resolve(inner.args[0]) if inner.args else None
        if not isinstance(source, fx.Node):
            return
        reason = self.dtype_problem(inner, inner_clamp, source) or self._rewire_problem(node, inner, source)
        if reason is not None:
            self.skipped.append(f"{what}: {reason}")
            return
        outer_inplace = self.inplace(node)
        self.remove(inner, source, what, why, rewired=node)
        if outer_inplace:
            self.aliases.merge(node, source)  # the outer activation now writes (and returns) the inner's input

    def _rewire_problem(self, node: fx.Node, inner: fx.Node, source: fx.Node) -> str | None:
        """Why ``node`` may not read ``source`` in place of ``inner``'s value."""
        aliases = self.aliases
        if aliases.written_between(source, inner, node):
            return f"an in-place op writes its input between it and {node.name}"
        inner_inplace, outer_inplace = self.inplace(inner), self.inplace(node)
        keep = {inner, node}
        if inner_inplace and outer_inplace:
            # the storage ends up holding the outer clamp of the input either way; nobody may look in between
            reader = self.readers(source, inner, node, keep)
            if reader is not None:
                return f"it writes its input in place and {reader.name} reads that storage before {node.name}"
        elif inner_inplace:
            if aliases.external(source):
                return "it writes a graph input or stored tensor in place, which the caller would see undone"
            reader = self.readers(source, inner, None, keep)
            if reader is not None:
                return f"it writes its input in place and {reader.name} reads that storage after it"
        elif outer_inplace:
            if aliases.external(source):
                return f"{node.name} works in place and would then write a graph input or stored tensor"
            reader = self.readers(source, node, None, keep)
            if reader is not None:
                return f"{node.name} works in place and would then write storage that {reader.name} reads"
        return None


def _plan_once(gm: fx.GraphModule) -> tuple[list[Removal], list[str]]:
    planner = _Planner(gm)
    for node in gm.graph.nodes:
        planner.visit(node)
    return planner.removals, planner.skipped


def _apply(gm: fx.GraphModule, removals: list[Removal], result: PassResult | None = None) -> None:
    """Remove ``removals`` from ``gm`` in order (with provenance and log lines when given a ``result``)."""
    for removal in removals:
        node, source = removal.node, removal.source
        if result is not None:
            if removal.rewired is None and source.op.startswith("call"):
                # the input now stands for this node's value as well: blame this pass if they ever differ
                mark(source, NAME, origin_of=node)
            elif removal.rewired is not None:
                mark(removal.rewired, NAME)  # same value, computed from another input now
            result.note(f"removed {removal.what}: {removal.why}", removed=1)
        node.replace_all_uses_with(source)
        gm.graph.erase_node(node)


def plan_removals(gm: fx.GraphModule) -> tuple[list[Removal], list[str]]:
    """The activations :func:`remove_redundant_activation` removes, in the order it removes them, and a line for
    each redundant one it keeps (with the reason). Lint rule FX003 reports the removals.

    ``gm`` is not changed. One scan in graph order decides most removals; a removal can make another possible
    (an in-place relu that goes no longer writes the relu before it), so the scan is repeated on a copy with the
    removals applied until it finds nothing more -- afterwards the pass's own postcondition, nothing left to
    remove, holds by construction. Removals found on the copy name ``gm``'s nodes (the copy keeps node names)."""
    removals, skipped = _plan_once(gm)
    if not removals:
        return removals, skipped
    by_name = {node.name: node for node in gm.graph.nodes}
    work = _working_copy(gm)
    work_nodes = {node.name: node for node in work.graph.nodes}
    pending = [_renamed(r, work_nodes) for r in removals]
    for _ in range(len(by_name)):  # each round removes at least one node
        _apply(work, pending)
        more, skipped = _plan_once(work)
        if not more:
            break
        removals += [_renamed(r, by_name) for r in more]
        pending = more
    return removals, skipped


def _working_copy(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm``'s graph (node names and metadata kept) on the same modules and tensors, to plan on."""
    graph = fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    return fx.GraphModule(gm, graph)


def _renamed(removal: Removal, nodes: dict[str, fx.Node]) -> Removal:
    """``removal`` with its nodes looked up by name in another copy of the graph."""
    rewired = nodes[removal.rewired.name] if removal.rewired is not None else None
    return Removal(nodes[removal.node.name], nodes[removal.source.name], removal.what, removal.why, rewired)


def _nothing_left(gm: fx.GraphModule) -> str | None:
    """Postcondition: the shared detection finds nothing more to remove (each was removed or refused)."""
    removals, _ = plan_removals(gm)
    return f"{removals[0].node.name} can still be removed" if removals else None


@register_pass(
    NAME,
    summary="Remove activations whose input already lies in their range (relu of relu/sigmoid, relu6 of relu...).",
    guarantees=(
        "Exact: a clamp-like activation (relu, relu6, hardtanh, clamp/clip with literal bounds; module, function, "
        "method, in-place and ATen forms) returns values inside its range bit for bit and NaN as NaN, so it is "
        "removed when its input comes from an activation whose range lies inside its own (relu after relu, relu6, "
        "sigmoid, softmax, hardsigmoid; hardtanh(-1, 1) after tanh...), and an inner clamp is removed when its only "
        "user clamps to a range inside its own (relu before relu6). Never removes an out-of-place activation whose "
        "input an in-place op writes later or whose result one writes, one the caller would get back as an input, "
        "a parameter or twice, or one after a view of unrecorded or different layout; an in-place inner clamp "
        "whose input storage anything else reads after it or that is a graph input or stored tensor; a clamp that "
        "could change the dtype (float bounds on integers) unless metadata shows it does not. Each refusal is "
        "listed with its reason; afterwards lint rule FX003 (the same detection) finds nothing more to remove. "
        "Torch and ATen dialects."
    ),
    ensures=lambda gm, result: _nothing_left(gm),
)
def remove_redundant_activation(gm: fx.GraphModule, options: None) -> PassResult:
    result = PassResult(NAME, gm)
    removals, skipped = plan_removals(gm)
    for reason in skipped:
        result.skip(reason)
    _apply(gm, removals, result)
    if any(removal.node.op == "call_module" for removal in removals):
        gm.delete_all_unused_submodules()
    return result
