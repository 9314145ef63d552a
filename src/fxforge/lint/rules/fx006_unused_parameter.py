"""FX006 unused-parameter: parameters of the original model that the graph never reads: dead weight in exports."""

from __future__ import annotations

from torch import nn

from fxforge.graphs import get_attr_value
from fxforge.lint import LintContext, rule


def _used_parameter_ids(gm: nn.Module, graph) -> set[int]:
    """ids of the tensors the graph reads: those of called modules, and ``get_attr`` values that have users."""
    used: set[int] = set()
    for node in graph.nodes:
        if node.op == "call_module":
            used.update(id(p) for p in gm.get_submodule(str(node.target)).parameters())
        elif node.op == "get_attr" and node.users:
            try:
                value = get_attr_value(gm, str(node.target))
            except AttributeError:
                continue
            if isinstance(value, nn.Module):
                used.update(id(p) for p in value.parameters())
            else:
                used.add(id(value))
    return used


@rule("FX006", "unused-parameter", "warning", "parameter of the original model that the graph never uses")
def check(ctx: LintContext):
    """Compares the original model's parameters with those the captured graph reads, by identity.

    Both dialects share the original's ``Parameter`` objects: symbolic_trace's GraphModule copies only
    the submodules it calls (unused ones are simply absent), torch.export's ``module()`` keeps every
    parameter but reads the unused ones through ``get_attr`` nodes without users. A parameter counts
    as used when a called module owns it or a ``get_attr`` with users fetches it. When the graph holds
    none of the original's parameter objects (a copied model) names are compared instead.

    One finding per wholly unused submodule (the outermost one), else one per unused parameter; no
    node (the finding is about the model). Skipped when the original model is unknown.
    """
    original = ctx.original
    if original is None:
        return
    gm = ctx.gm
    used = _used_parameter_ids(gm, ctx.graph)
    named = list(original.named_parameters())
    if not named:
        return
    if not any(id(p) in used for _, p in named):
        # The graph holds copies (a reloaded program): fall back to matching by qualified name.
        gm_params = dict(gm.named_parameters(remove_duplicate=False))
        by_name = {name for name, p in gm_params.items() if id(p) in used}
        if not by_name:
            return
        used = {id(p) for name, p in original.named_parameters(remove_duplicate=False) if name in by_name}
    unused = {id(p) for _, p in named if id(p) not in used}
    if not unused:
        return
    reported: list[str] = []
    covered: set[int] = set()
    for name, module in original.named_modules():
        if not name or any(name.startswith(prefix + ".") for prefix in reported):
            continue
        params = list(module.parameters())
        if params and all(id(p) in unused for p in params):
            count = sum(p.numel() for p in params)
            reported.append(name)
            covered.update(id(p) for p in params)
            yield (
                None,
                f"submodule {name} ({type(module).__name__}, {count:,} parameters) is never used by the graph",
            )
    for name, param in named:
        if id(param) in unused and id(param) not in covered:
            yield None, f"parameter {name} ({tuple(param.shape)}) is never used by the graph"
