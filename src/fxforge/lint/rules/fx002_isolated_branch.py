"""FX002 isolated-branch: a chain of nodes that feed each other but never the output, so all of it is wasted work."""

from __future__ import annotations

from fxforge.graphs import target_name
from fxforge.lint import LintContext, rule
from fxforge.passes.dead_code import live_nodes

_NOT_COMPUTE = ("placeholder", "output", "get_attr")


@rule(
    "FX002",
    "isolated-branch",
    "warning",
    "nodes that are used, but only by nodes whose values never reach the output",
    fix="dead_code",
)
def check(ctx: LintContext):
    """One finding per isolated branch (a connected group of non-live compute nodes), on its first node.

    A node with no users at all is FX001's; a branch is reported here only when at least one of its
    nodes has users, and then only once, however many nodes it has.
    """
    graph = ctx.graph
    live = live_nodes(ctx.gm)  # the dead_code pass's own liveness, so lint --fix clears every finding
    order = {node: i for i, node in enumerate(graph.nodes)}
    # Union-find over the dead compute nodes, joined along their data edges: linear in graph size.
    parent: dict = {}

    def find(node):
        root = node
        while parent[root] is not root:
            root = parent[root]
        while parent[node] is not root:
            parent[node], node = root, parent[node]
        return root

    dead = [n for n in graph.nodes if n not in live and n.op not in _NOT_COMPUTE]
    for node in dead:
        parent[node] = node
    for node in dead:
        for source in node.all_input_nodes:
            if source in parent:
                a, b = find(source), find(node)
                if a is not b:
                    if order[a] > order[b]:
                        a, b = b, a
                    parent[b] = a
    branches: dict = {}
    for node in dead:
        branches.setdefault(find(node), []).append(node)
    for members in branches.values():
        used = [n for n in members if n.users]
        if not used:
            continue  # lone unused nodes: FX001 reports them
        root = used[0]
        ends = [n.name for n in members if not n.users]
        size = len(members)
        extent = f"a branch of {size} nodes" if size > 1 else "a branch"
        tail = f" (it ends at {', '.join(ends[:3])}{', ...' if len(ends) > 3 else ''})" if ends else ""
        yield (
            root,
            f"{root.name} ({target_name(root)}) starts {extent} whose value never reaches the output "
            f"or an effectful node{tail}",
        )
