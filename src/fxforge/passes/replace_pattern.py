"""replace_pattern: rewrite every occurrence of a pattern subgraph with a replacement subgraph.

``pattern`` and ``replacement`` are functions of the same inputs (or ``"module:function"`` strings from
YAML/CLI), traced with ``torch.fx.symbolic_trace``. The pattern's inputs are wildcards that match any
node; everything else must match by op, target and literal arguments (same type and value), position
for position, as in ``torch.fx.subgraph_rewriter``.

The matcher stays linear in the graph size: one scan collects the nodes that call what the pattern's
output node calls (the anchors), and each anchor is matched backwards along its inputs, so the work per
anchor is bounded by the pattern's size. A match is accepted only when none of its intermediate nodes is
used outside it (the replacement computes only the output) and it shares no node with an earlier
accepted match (anchors are tried in graph order). All matches are found on the original graph before
any rewrite, so a replacement that contains the pattern is not rewritten again.

ATen graphs (``torch.export``) are matched when the pattern is written with ATen ops
(``torch.ops.aten.relu.default``; an overload packet such as ``torch.ops.aten.add`` matches any of its
overloads); the replacement must name overloads. A torch-level pattern on an ATen graph, or the reverse,
is refused with that hint rather than silently matching nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from fxforge.errors import first_line
from fxforge.graphs import ATEN, dialect_of, get_attr_value
from fxforge.passes import ORIGIN, PassError, PassResult, free_attribute_name, mark, register_pass
from fxforge.passes.replace_modules import import_reference

NAME = "replace_pattern"
_OVERLOAD = torch._ops.OpOverload
_PACKET = torch._ops.OpOverloadPacket


def _as_graph_module(value: Any, role: str) -> fx.GraphModule:
    if isinstance(value, str):
        value = import_reference(value, role, NAME)
    if isinstance(value, fx.GraphModule):
        return value
    if isinstance(value, fx.Graph):
        return fx.GraphModule(value.owning_module or nn.Module(), value)
    if not callable(value):
        raise PassError(f"{NAME}: the {role} must be a function, an nn.Module or 'module:function', got {value!r}")
    try:
        return fx.symbolic_trace(value)
    except Exception as exc:
        raise PassError(
            f"{NAME}: cannot trace the {role} with torch.fx.symbolic_trace: {first_line(exc)}",
            hint="write it as a plain function of its inputs, without data-dependent control flow",
        ) from None


def _output_value(gm: fx.GraphModule, role: str) -> Any:
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    value = output.args[0]
    if isinstance(value, (tuple, list)) and len(value) == 1:
        value = value[0]
    if not isinstance(value, fx.Node):
        raise PassError(f"{NAME}: the {role} must return one tensor (multi-output patterns are not supported)")
    return value


def _is_torch_level(node: fx.Node) -> bool:
    """A call spelled at the torch level (``torch.relu``, ``x.relu()``), which no ATen graph contains."""
    if node.op == "call_method":
        return True
    if node.op != "call_function" or isinstance(node.target, (_OVERLOAD, _PACKET)):
        return False
    return getattr(node.target, "__module__", "") not in ("_operator", "operator", "builtins")


def _is_aten_level(node: fx.Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, (_OVERLOAD, _PACKET))


@dataclass
class ReplacePatternOptions:
    """``pattern`` and ``replacement``: functions taking the same inputs, in the same order, each returning one
    tensor; or ``pkg.module:function`` / ``path/to/file.py:function`` strings. The pattern's inputs match any
    node (not literals); its calls must match op, target and literal arguments exactly. On ATen graphs, write
    both with ``torch.ops.aten`` ops (the replacement with overloads, e.g. ``torch.ops.aten.add.Tensor``).
    """

    pattern: Callable[..., Any] | str | None = None
    replacement: Callable[..., Any] | str | None = None

    def __post_init__(self) -> None:
        if self.pattern is None or self.replacement is None:
            raise PassError(
                f"{NAME} needs a pattern and a replacement",
                hint="e.g. --option replace_pattern.pattern=my_patterns.py:pattern "
                "--option replace_pattern.replacement=my_patterns.py:replacement",
            )
        self.pattern_gm = _as_graph_module(self.pattern, "pattern")
        self.replacement_gm = _as_graph_module(self.replacement, "replacement")
        self.inputs = [n for n in self.pattern_gm.graph.nodes if n.op == "placeholder"]
        self.replacement_inputs = [n for n in self.replacement_gm.graph.nodes if n.op == "placeholder"]
        self.anchor = _output_value(self.pattern_gm, "pattern")
        self.result = _output_value(self.replacement_gm, "replacement")
        self._check()
        # pattern nodes in reverse order: erasing matched nodes in this order never erases a used node
        self.body = [n for n in self.pattern_gm.graph.nodes if n.op not in ("placeholder", "output")]
        self.replacement_body = [n for n in self.replacement_gm.graph.nodes if n.op not in ("placeholder", "output")]

    def _check(self) -> None:
        if self.anchor.op == "placeholder":
            raise PassError(f"{NAME}: the pattern returns one of its inputs, so it would match every node")
        for node in self.pattern_gm.graph.nodes:
            if node.op in ("get_attr", "call_module"):
                raise PassError(
                    f"{NAME}: the pattern uses {node.op} {node.target!r}; patterns match calls on their inputs only",
                    hint="write the pattern with functions (F.relu, torch.add, torch.ops.aten...), not modules",
                )
            if node.op == "placeholder" and not node.users:
                raise PassError(f"{NAME}: pattern input {node.target!r} is unused, so nothing can bind it")
        if len(self.inputs) != len(self.replacement_inputs):
            raise PassError(
                f"{NAME}: the pattern takes {len(self.inputs)} inputs and the replacement "
                f"{len(self.replacement_inputs)}; they must take the same inputs, in the same order"
            )

    def dialect(self) -> str | None:
        """``"aten"``/``"torch"`` when the pattern's calls pin a dialect, None when they fit both."""
        nodes = list(self.pattern_gm.graph.nodes)
        if any(_is_aten_level(n) for n in nodes):
            return ATEN
        if any(_is_torch_level(n) for n in nodes):
            return "torch"
        return None


# --------------------------------------------------------------------------------------------------
# matching


def _same_target(pattern_target: Any, target: Any) -> bool:
    if pattern_target is target:
        return True
    if isinstance(pattern_target, _PACKET):
        return isinstance(target, _OVERLOAD) and target.overloadpacket is pattern_target
    if isinstance(pattern_target, str) or isinstance(target, str):
        return pattern_target == target  # call_method names
    return False


def _same_literal(a: Any, b: Any) -> bool:
    # 0 == 0.0 == False in Python, but they promote differently in torch: same type and value
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a is b
    try:
        return bool(a == b)
    except Exception:  # values whose == is not a truth value
        return a is b


@dataclass
class _Match:
    anchor: fx.Node
    nodes: dict[fx.Node, fx.Node]  # pattern node -> graph node, pattern inputs included


class _Matcher:
    def __init__(self, options: ReplacePatternOptions) -> None:
        self.options = options

    def match(self, anchor: fx.Node) -> _Match | None:
        """Match the pattern backwards from ``anchor``; None when the structure differs."""
        nodes: dict[fx.Node, fx.Node] = {}
        claimed: set[fx.Node] = set()  # graph nodes taken by pattern calls: one pattern node each
        pending: list[tuple[Any, Any]] = [(self.options.anchor, anchor)]
        while pending:
            pattern, node = pending.pop()
            if isinstance(pattern, fx.Node):
                if not isinstance(node, fx.Node):
                    return None  # a pattern input binds nodes only, never a literal
                bound = nodes.get(pattern)
                if bound is not None:
                    if bound is not node:
                        return None
                    continue
                if pattern.op != "placeholder":
                    if node.op != pattern.op or node in claimed or not _same_target(pattern.target, node.target):
                        return None
                    if not _push_arguments(pattern, node, pending):
                        return None
                    claimed.add(node)
                nodes[pattern] = node
            elif not _push_literal(pattern, node, pending):
                return None
        inputs = {nodes[p] for p in self.options.inputs}
        if inputs & claimed:
            return None  # a pattern input bound to a node the match replaces
        return _Match(anchor, nodes)


def _push_arguments(pattern: fx.Node, node: fx.Node, pending: list[tuple[Any, Any]]) -> bool:
    if len(pattern.args) != len(node.args) or pattern.kwargs.keys() != node.kwargs.keys():
        return False
    pending.extend(zip(pattern.args, node.args))
    pending.extend((value, node.kwargs[key]) for key, value in pattern.kwargs.items())
    return True


def _push_literal(pattern: Any, value: Any, pending: list[tuple[Any, Any]]) -> bool:
    """Compare a literal argument; containers push their items (which may hold nodes)."""
    if isinstance(pattern, (tuple, list)):
        if type(pattern) is not type(value) or len(pattern) != len(value):
            return False
        pending.extend(zip(pattern, value))
        return True
    if isinstance(pattern, dict):
        if not isinstance(value, dict) or pattern.keys() != value.keys():
            return False
        pending.extend((item, value[key]) for key, item in pattern.items())
        return True
    return not isinstance(value, fx.Node) and _same_literal(pattern, value)


def _escaping_user(match: _Match, options: ReplacePatternOptions) -> tuple[fx.Node, fx.Node] | None:
    """(intermediate, outside user) when an intermediate node of the match is used outside it."""
    inside = {match.nodes[p] for p in options.body}
    for pattern in options.body:
        node = match.nodes[pattern]
        if node is match.anchor:
            continue
        for user in node.users:
            if user not in inside:
                return node, user
    return None


def find_matches(gm: fx.GraphModule, options: ReplacePatternOptions, result: PassResult) -> list[_Match]:
    """Non-overlapping matches in graph order; rejected structural matches are logged as skips."""
    matcher = _Matcher(options)
    anchor = options.anchor
    taken: set[fx.Node] = set()
    matches: list[_Match] = []
    for node in _candidates(gm, anchor):
        match = matcher.match(node)
        if match is None:
            continue
        escape = _escaping_user(match, options)
        if escape is not None:
            inner, user = escape
            result.skip(f"{node.name}: matches, but its intermediate {inner.name} is also used by {user.name}")
            continue
        covered = [match.nodes[p] for p in options.body]
        overlap = next((n for n in covered if n in taken), None)
        if overlap is not None:
            result.skip(f"{node.name}: matches, but shares {overlap.name} with an earlier match")
            continue
        taken.update(covered)
        matches.append(match)
    return matches


def _candidates(gm: fx.GraphModule, anchor: fx.Node) -> Iterator[fx.Node]:
    """The graph nodes that call what the pattern's output node calls, in graph order (one scan)."""
    op, target = anchor.op, anchor.target
    for node in gm.graph.nodes:
        if node.op == op and _same_target(target, node.target):
            yield node


# --------------------------------------------------------------------------------------------------
# rewriting


@register_pass(
    NAME,
    summary="Rewrite every match of a pattern function with a replacement function (subgraph rewriting).",
    guarantees=(
        "Exact when the replacement computes what the pattern computes; fxforge does not prove that: run with "
        "verify. Matches by structure (op, target, literal arguments of the same type and value, positions as "
        "written), like torch.fx.subgraph_rewriter; never rewrites a match whose intermediate values are used "
        "outside it, nor two overlapping matches (the earlier wins; both are logged with the reason). The "
        "replacement's output takes the provenance of the pattern's output, so verify names the rewritten node. "
        "Linear in graph size. Torch and ATen dialects (on ATen graphs, write the pattern with torch.ops.aten ops)."
    ),
    options=ReplacePatternOptions,
)
def replace_pattern(gm: fx.GraphModule, options: ReplacePatternOptions) -> PassResult:
    result = PassResult(NAME, gm)
    _check_dialect(gm, options)
    matches = find_matches(gm, options, result)
    replaced_by: dict[fx.Node, fx.Node] = {}
    for index, match in enumerate(matches, 1):
        output = _rewrite(gm, match, options, replaced_by)
        result.note(
            f"match {index} at {match.anchor.name}: {len(options.body)} nodes -> "
            f"{len(options.replacement_body)} nodes, output {output.name}",
            replaced=1,
        )
    result.artifacts["matches"] = len(matches)
    if matches and any(n.op == "call_module" for n in options.replacement_body):
        gm.delete_all_unused_submodules()
    return result


def _check_dialect(gm: fx.GraphModule, options: ReplacePatternOptions) -> None:
    graph_dialect, pattern_dialect = dialect_of(gm), options.dialect()
    if pattern_dialect is None or pattern_dialect == graph_dialect:
        if graph_dialect == ATEN and any(isinstance(n.target, _PACKET) for n in options.replacement_body):
            raise PassError(
                f"{NAME}: the replacement calls an ATen overload packet; an ATen graph needs overloads",
                hint="e.g. torch.ops.aten.add.Tensor instead of torch.ops.aten.add",
            )
        return
    if graph_dialect == ATEN:
        raise PassError(
            f"{NAME}: the pattern is written with torch-level calls, but this graph is ATen (torch.export)",
            hint="write the pattern with torch.ops.aten ops (torch.ops.aten.relu.default), or capture with "
            "--method symbolic_trace",
        )
    raise PassError(
        f"{NAME}: the pattern is written with ATen ops, but this graph is torch-level (symbolic_trace)",
        hint="write the pattern with torch functions (torch.relu, F.gelu), or capture with --method export",
    )


def _rewrite(
    gm: fx.GraphModule, match: _Match, options: ReplacePatternOptions, replaced_by: dict[fx.Node, fx.Node]
) -> fx.Node:
    graph = gm.graph
    env: dict[fx.Node, Any] = {}
    for pattern_input, replacement_input in zip(options.inputs, options.replacement_inputs):
        env[replacement_input] = _current(match.nodes[pattern_input], replaced_by)
    attributes = _AttributeCopier(gm, options.replacement_gm)
    with graph.inserting_before(match.anchor):
        for node in options.replacement_body:
            new = graph.node_copy(node, lambda n: env[n])
            if new.op in ("get_attr", "call_module"):
                new.target = attributes.copy(str(node.target))
            new.meta.pop("nn_module_stack", None)  # the replacement's own module stack, not the model's
            mark(new, NAME)
            new.meta[ORIGIN] = None  # computes no value of the original graph: verify must not compare it
            env[node] = new
    output = env[options.result]
    if output.op.startswith("call"):
        mark(output, NAME, origin_of=match.anchor)
    match.anchor.replace_all_uses_with(output)
    replaced_by[match.anchor] = output
    for pattern in reversed(options.body):
        graph.erase_node(match.nodes[pattern])
    return output


def _current(node: fx.Node, replaced_by: dict[fx.Node, fx.Node]) -> fx.Node:
    """The node standing for ``node`` now: an earlier match may have replaced it."""
    while node in replaced_by:
        node = replaced_by[node]
    return node


class _AttributeCopier:
    """Copies the replacement's stored tensors and submodules into ``gm``, a fresh copy per match."""

    def __init__(self, gm: fx.GraphModule, source: fx.GraphModule) -> None:
        self.gm, self.source = gm, source
        self.copied: dict[str, str] = {}

    def copy(self, target: str) -> str:
        if target not in self.copied:
            value = copy.deepcopy(get_attr_value(self.source, target))
            name = free_attribute_name(self.gm, "replacement_" + target.replace(".", "_"))
            if isinstance(value, nn.Module):
                self.gm.add_module(name, value)
            elif isinstance(value, nn.Parameter):
                self.gm.register_parameter(name, value)
            elif isinstance(value, torch.Tensor):
                self.gm.register_buffer(name, value)
            else:
                setattr(self.gm, name, value)
            self.copied[target] = name
        return self.copied[target]
