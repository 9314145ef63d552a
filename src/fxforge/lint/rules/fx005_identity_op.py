"""FX005 identity-op: a call that returns its input unchanged (nn.Identity, x * 1, x + 0, a no-op cast) costs a
kernel for nothing. Detection is remove_identity's own (:func:`~fxforge.passes.remove_identity.plan_removals`),
so the rule reports exactly what ``lint --fix`` removes."""

from __future__ import annotations

from fxforge.lint import LintContext, rule
from fxforge.passes.remove_identity import RemoveIdentityOptions, plan_removals


@rule("FX005", "identity-op", "info", "node returns its input unchanged", fix="remove_identity")
def check(ctx: LintContext):
    """``nn.Identity`` modules, arithmetic with a neutral literal (``x * 1``, ``x + 0``, ``x - 0``, ``x / 1``), casts
    and ``.contiguous()`` that change nothing, and copies nothing can tell from their input -- each only where the
    graph's metadata proves it (a literal that could promote the dtype, a copy an in-place op writes into, a copy
    laid out unlike its input are kept; see the pass's guarantees)."""
    removals, _ = plan_removals(ctx.gm, RemoveIdentityOptions())
    for removal in removals:
        yield removal.node, f"{removal.node.name} ({removal.describe}) returns {removal.source.name} unchanged"
