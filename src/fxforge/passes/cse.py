"""cse: merge nodes that compute the same value (common subexpression elimination), and the duplicate finder.

Two nodes compute the same value when they make the same pure call (:func:`~fxforge.effects.impure_reason`:
no randomness, no effects, no in-place writes, no state outside the arguments) on equal arguments. Arguments
are compared through a hashable key (:func:`call_key`) in which every node stands for the first node of its
class of equals, so chains of duplicates (``x.sin().cos()`` twice) merge in one sweep: linear time, one dict
lookup per node. ``FX007`` (duplicate-subexpression) reports exactly the merges :func:`find_duplicates` proposes,
so after ``cse`` the rule finds nothing.

Equal calls are still kept apart when merging could be observed: an in-place op may write into either value
once the first is computed, or into one of their inputs between the two calls (writes before the first call
are seen by both), both values are returned by the graph (the caller would get one tensor twice), or an
autocast/grad-mode switch lies between them.
"""

from __future__ import annotations

import struct
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from fxforge.effects import AliasClasses, impure_reason, is_mode_switch
from fxforge.graphs import target_name
from fxforge.passes import PassResult, mark, register_pass

NAME = "cse"
_CANDIDATE_OPS = ("get_attr", "call_function", "call_method", "call_module")
_SCALARS = (bool, int, str, type(None))
_SYMBOLS = (torch.dtype, torch.device, torch.layout, torch.memory_format)


class _Unhashable(Exception):
    pass


def _value_key(value: Any, canonical: dict[fx.Node, fx.Node]) -> Hashable:
    """A hashable stand-in for one argument; equal keys mean interchangeable arguments.

    Scalars carry their type (``1 == 1.0 == True`` in Python, not as tensor arguments); floats are keyed by
    their bits, so ``0.0`` and ``-0.0`` differ and a NaN equals itself. Raises :class:`_Unhashable` for
    values with no cheap sound equality (tensor constants, arbitrary objects).
    """
    if isinstance(value, fx.Node):
        return ("node", canonical.get(value, value))
    if isinstance(value, _SCALARS):
        return (type(value).__name__, value)
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    if isinstance(value, complex):
        return ("complex", struct.pack("<dd", value.real, value.imag))
    if isinstance(value, (tuple, list)):  # torch.Size too, keyed apart from tuples by its type name
        return (type(value).__name__, tuple(_value_key(v, canonical) for v in value))
    if isinstance(value, dict):
        items = [(k, _value_key(v, canonical)) for k, v in value.items()]
        if all(isinstance(k, str) for k, _ in items):
            items.sort(key=lambda item: item[0])  # f(a=1, b=2) is f(b=2, a=1)
        return ("dict", tuple(items))
    if isinstance(value, slice):
        return ("slice", *(_value_key(v, canonical) for v in (value.start, value.stop, value.step)))
    if value is Ellipsis:
        return ("ellipsis",)
    if isinstance(value, _SYMBOLS):
        return (type(value).__name__, str(value))
    raise _Unhashable


def call_key(node: fx.Node, canonical: dict[fx.Node, fx.Node] | None = None) -> Hashable | None:
    """The key under which ``node`` equals every earlier node making the same call, or None if it has none.

    ``canonical`` maps nodes already found equal to an earlier node onto that node.
    """
    canonical = canonical if canonical is not None else {}
    if node.op == "get_attr":
        return ("get_attr", str(node.target))
    try:
        key = (node.op, node.target, _value_key(node.args, canonical), _value_key(dict(node.kwargs), canonical))
        hash(key)
    except (_Unhashable, TypeError):
        return None
    return key


@dataclass(frozen=True)
class Duplicate:
    """``node`` makes the same call as the earlier ``first``; ``refused`` says why they stay apart (None: merge)."""

    node: fx.Node
    first: fx.Node
    refused: str | None = None


class _Checks:
    """Per-node reasons (cached) and the pairwise check, on one alias analysis that merges update."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.aliases = AliasClasses(gm)
        self._reasons: dict[fx.Node, str | None] = {}

    def reason(self, node: fx.Node) -> str | None:
        if node not in self._reasons:
            self._reasons[node] = self._reason(node)
        return self._reasons[node]

    def _reason(self, node: fx.Node) -> str | None:
        return None if node.op == "get_attr" else impure_reason(self.gm, node)

    def pair(self, node: fx.Node, first: fx.Node) -> tuple[str | None, bool]:
        """(why ``node`` must not be merged into ``first``, whether the problem lies with ``first``)."""
        own = self.reason(node)
        if own is not None:
            return own, False
        earlier = self.reason(first)
        if earlier is not None:
            return f"{first.name}: {earlier}", True
        if node.op == "get_attr":
            return None, False  # two reads of one attribute are the same object, writes or not
        aliases = self.aliases
        # Writes before ``first`` are seen by both calls; from ``first`` on they could tell the two apart.
        if aliases.written_between(first, first, None):
            return f"an in-place op may write into the value of {first.name} after it is computed", True
        if aliases.written_between(node, first, None):
            return "an in-place op may write into its value", False
        if any(aliases.written_between(source, first, node) for source in node.all_input_nodes):
            return "an in-place op may write into one of its inputs between the two calls", False
        if aliases.escapes(node) and aliases.escapes(first) and not aliases.same(node, first):
            return "both are returned by the graph; merging would hand the caller one tensor twice", False
        return None, False


def find_duplicates(gm: fx.GraphModule) -> Iterator[Duplicate]:
    """Every node that makes the same call as an earlier one, in graph order, with the reason it must stay
    if it must. Proposed merges are recorded as they are found (later keys see the merged node), so the
    caller applies them all, or none. Placeholders, outputs and calls with arguments that have no key
    (:func:`call_key`) are never compared."""
    checks = _Checks(gm)
    seen: dict[Hashable, fx.Node] = {}
    canonical: dict[fx.Node, fx.Node] = {}
    for node in gm.graph.nodes:
        if is_mode_switch(node):
            seen.clear()  # autocast/grad mode differs on either side: no merges across
            continue
        if node.op not in _CANDIDATE_OPS:
            continue
        key = call_key(node, canonical)
        if key is None:
            continue
        first = seen.get(key)
        if first is None:
            seen[key] = node
            continue
        refused, first_is_the_problem = checks.pair(node, first)
        if refused is not None:
            if first_is_the_problem and checks.reason(node) is None:
                seen[key] = node  # a clean twin can stand for the ones after it
            yield Duplicate(node, first, refused)
            continue
        canonical[node] = first
        checks.aliases.merge(node, first)
        yield Duplicate(node, first)


def _no_duplicates_left(gm: fx.GraphModule, result: PassResult) -> str | None:
    for duplicate in find_duplicates(gm):
        if duplicate.refused is None:
            return f"{duplicate.node.name} still computes the same value as {duplicate.first.name}"
    return None


@register_pass(
    NAME,
    summary="Merge nodes that make the same pure call on the same arguments (common subexpressions).",
    guarantees=(
        "Exact: a node is merged into an earlier one only when both make the same deterministic, side-effect-free "
        "call (same op, target, args and kwargs; literals compared with their type, floats by their bits) on the "
        "same values. Never merges placeholders, random ops (rand*, randn*, bernoulli, dropout in training, "
        "native_dropout...), in-place ops or other calls with effects, calls to functions or modules fxforge cannot "
        "see into (user helpers; modules other than stateless torch.nn layers, conv/linear, pooling, norms outside "
        "a stats-updating training mode, Identity/Flatten...), values an in-place op may write once the first is "
        "computed, calls whose inputs may be written between them, two values that are both returned, or calls on "
        "opposite sides of an autocast/grad-mode switch. Two reads of one attribute merge. Linear in graph size; "
        "afterwards FX007 finds nothing. Torch and ATen dialects."
    ),
    ensures=_no_duplicates_left,
)
def cse(gm: fx.GraphModule, options: None) -> PassResult:
    result = PassResult(NAME, gm)
    merges: list[Duplicate] = []
    for duplicate in find_duplicates(gm):
        if duplicate.refused is None:
            merges.append(duplicate)
        else:
            node = duplicate.node
            result.skip(f"{node.name} ({target_name(node)}) equals {duplicate.first.name}, kept: {duplicate.refused}")
    for duplicate in merges:
        node, first = duplicate.node, duplicate.first
        # ``first`` still computes its own value; the removed node's users now read it instead, so they
        # are what this pass changed (verify names cse if one of them diverges).
        for user in node.users:
            mark(user, NAME)
        node.replace_all_uses_with(first)
        gm.graph.erase_node(node)
        result.note(f"merged {node.name} into {first.name} ({target_name(node)})", removed=1)
    return result
