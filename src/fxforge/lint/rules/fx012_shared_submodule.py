"""FX012 shared-submodule: a module or parameter used from several places: rewriting one use changes all."""

from __future__ import annotations

from collections import Counter

from torch import fx, nn

from fxforge.graphs import called_parameters, get_attr_value, is_input_guard, reads_metadata_only
from fxforge.lint import LintContext, rule


def _module_calls(graph: fx.Graph) -> tuple[dict[str, set[str]], dict[str, fx.Node]]:
    """For each module path, the distinct calls of it seen in the graph, and the first node of each path.

    Calls come from ``nn_module_stack`` (both dialects record it; a module's second call has a key
    ending in ``@1``) and, for graphs without it, from ``call_module`` targets (one call per node).
    """
    calls: dict[str, set[str]] = {}
    first: dict[str, fx.Node] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            path = str(node.target)
            if is_input_guard(node):  # torch.export's, not the user's
                continue
            calls.setdefault(path, set()).add(f"node:{node.name}")
            first.setdefault(path, node)
        stack = node.meta.get("nn_module_stack") or {}
        for key, entry in stack.items():
            path = str(entry[0]).split("@")[0] if isinstance(entry, tuple) and entry else ""
            if not path:
                continue
            calls.setdefault(path, set()).add(f"stack:{key}")
            first.setdefault(path, node)
    return calls, first


def _count(keys: set[str]) -> int:
    # a call_module node and its own nn_module_stack entry describe the same call: count either kind
    by_node = sum(1 for k in keys if k.startswith("node:"))
    by_stack = sum(1 for k in keys if k.startswith("stack:"))
    return max(by_node, by_stack)


@rule("FX012", "shared-submodule", "info", "module or parameter used from more than one place")
def check(ctx: LintContext):
    """Modules called more than once (a ``self.relu`` applied twice, one Linear used for two inputs) and
    parameters read by more than one compute node outside such a module (tied weights; a read of a weight's
    shape, dtype or device only is no use of its values). Rewrites that
    change a module or its weights in place (folding, merging) would change every call.

    torch dialect: repeated ``call_module`` targets, plus ``nn_module_stack`` for modules that are not
    leaves; aten dialect: ``nn_module_stack`` call keys (``fc``, ``fc@1``) and parameter ``get_attr``
    nodes with several users. One finding per outermost shared module (a shared block's children are
    not reported again), on the first node it produced.
    """
    gm: nn.Module = ctx.gm
    calls, first = _module_calls(ctx.graph)
    shared: list[str] = []
    for path in sorted(calls, key=lambda p: (p.count("."), p)):
        count = _count(calls[path])
        if count < 2 or any(path.startswith(s + ".") for s in shared):
            continue
        shared.append(path)
        yield first[path], f"module {path} is called from {count} places; rewrites must treat it with care"
    # Parameters by identity: a called module reads all of its own, a get_attr node is read by its users.
    readers: Counter[int] = Counter()
    names: dict[int, str] = {}
    first_reader: dict[int, fx.Node] = {}
    order = {node: i for i, node in enumerate(ctx.graph.nodes)}
    for node in ctx.graph.nodes:
        if node.op == "call_module" and not is_input_guard(node):
            prefix = str(node.target)
            params = called_parameters(gm, prefix)
            reading = [node]
        elif node.op == "get_attr":
            try:
                value = get_attr_value(gm, str(node.target))
            except AttributeError:
                continue
            if not isinstance(value, nn.Parameter):
                continue
            params = [(str(node.target), value)]
            # a read of the weight's shape (timm's "same" padding sizes it) is no second use of its values
            computing = (u for u in node.users if u.op.startswith("call_") and not reads_metadata_only(u, node))
            reading = sorted(computing, key=order.__getitem__)
        else:
            continue
        for name, param in params:
            names.setdefault(id(param), name)
            readers[id(param)] += len(reading)
            if reading and (id(param) not in first_reader or order[reading[0]] < order[first_reader[id(param)]]):
                first_reader[id(param)] = reading[0]
    for key, count in readers.items():
        name = names[key]
        if count < 2 or any(name.startswith(s + ".") for s in shared):
            continue
        yield first_reader[key], f"parameter {name} is read by {count} nodes; rewrites must treat it with care"
