"""FX000 invalid-graph: the graph fails torch.fx's own structural check (``Graph.lint``)."""

from __future__ import annotations

from fxforge.lint import LintContext, rule


@rule("FX000", "invalid-graph", "error", "graph is structurally invalid (Graph.lint fails)")
def check(ctx: LintContext):
    try:
        ctx.graph.lint()
    except Exception as exc:  # Graph.lint raises RuntimeError or AssertionError with a description
        yield None, f"torch.fx Graph.lint failed: {exc}"
